"""A Python agent's network calls, as agents make them: one GET of URL with
each of the HTTP clients agents are built on, configured from the environment
the way they are by default. Prints one JSON line per client:

    {"client": "httpx", "ok": true, "status": 200, "detail": "..."}

Clients: httpx (sync Client; trust_env is its default), httpx-async
(AsyncClient), aiohttp (ClientSession(trust_env=True), what agents pass: its
default is False) and aiohttp-default (ClientSession() as it comes: it reads
no proxy variable, so inside vpnw it has no way out).

    python agent_http.py URL
"""
import asyncio
import json
import sys


def report(client, fn):
    try:
        status = fn()
        out = {"client": client, "ok": status == 200, "status": status, "detail": ""}
    except BaseException as exc:  # noqa: BLE001 - what failed is the measurement
        out = {"client": client, "ok": False, "status": None, "detail": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out), flush=True)


def httpx_sync(url):
    import httpx
    with httpx.Client(timeout=20) as client:
        return client.get(url).status_code


def httpx_async(url):
    import httpx

    async def get():
        async with httpx.AsyncClient(timeout=20) as client:
            return (await client.get(url)).status_code
    return asyncio.run(get())


def aiohttp_get(url, trust_env):
    import aiohttp

    async def get():
        timeout = aiohttp.ClientTimeout(total=20)
        async with aiohttp.ClientSession(trust_env=trust_env, timeout=timeout) as session:
            async with session.get(url) as response:
                await response.read()
                return response.status
    return asyncio.run(get())


def main():
    url = sys.argv[1]
    report("httpx", lambda: httpx_sync(url))
    report("httpx-async", lambda: httpx_async(url))
    report("aiohttp", lambda: aiohttp_get(url, True))
    report("aiohttp-default", lambda: aiohttp_get(url, False))


if __name__ == "__main__":
    main()
