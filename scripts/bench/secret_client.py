"""The client of scripts/bench/secrets_bench.py: the same requests, either
straight to the stand-in over HTTPS with the key, or to the secret door
inside the sandbox with the placeholder. Prints one JSON line of figures.

    python secret_client.py https://api.openai.com|door REQUESTS FRESH SIZE_MIB
"""
import http.client
import json
import os
import ssl
import statistics
import sys
import time

DOOR = ("127.0.0.1", 47801)


def connection(target):
    if target == "door":
        return http.client.HTTPConnection(*DOOR, timeout=60)
    host = target.split("://", 1)[1]
    return http.client.HTTPSConnection(host, 443, timeout=60, context=ssl.create_default_context())


def headers():
    return {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}", "Content-Type": "application/json"}


def timed(conn, method, path, body=None, first_byte=False):
    started = time.perf_counter()
    conn.request(method, path, body=body, headers=headers())
    answer = conn.getresponse()
    if answer.status != 200:
        raise SystemExit(f"{method} {path}: {answer.status} {answer.read()[:200]!r}")
    if first_byte:
        answer.read1(1)     # the first event of the stream
        ttfb = time.perf_counter() - started
        answer.read()
        return ttfb
    answer.read()
    return time.perf_counter() - started


def main():
    target, requests, fresh, size_mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    conn = connection(target)
    timed(conn, "GET", "/v1/models")        # the connection made (and TLS, direct) before timing
    kept = sorted(timed(conn, "GET", "/v1/models") for _ in range(requests))
    stream_body = json.dumps({"model": "gpt-world", "stream": True,
                              "messages": [{"role": "user", "content": "hi"}]})
    ttfb = [timed(conn, "POST", "/v1/chat/completions", stream_body, first_byte=True) for _ in range(50)]
    news = []
    for _ in range(fresh):
        other = connection(target)
        news.append(timed(other, "GET", "/v1/models"))
        other.close()
    size = size_mib << 20
    body = os.urandom(1 << 20) * size_mib
    started = time.perf_counter()
    conn.request("POST", "/v1/upload", body=body, headers=headers())
    answer = json.loads(conn.getresponse().read())
    up = time.perf_counter() - started
    assert answer["length"] == size, answer
    started = time.perf_counter()
    conn.request("GET", f"/v1/bytes/{size}", headers=headers())
    got = conn.getresponse()
    n = 0
    while True:
        chunk = got.read1(1 << 20)
        if not chunk:
            break
        n += len(chunk)
    down = time.perf_counter() - started
    assert n == size, n
    ms = lambda s: s * 1000
    print(json.dumps({"kept_p50_ms": ms(statistics.median(kept)),
                      "kept_p99_ms": ms(kept[int(len(kept) * 0.99) - 1]),
                      "fresh_p50_ms": ms(statistics.median(news)), "ttfb_p50_ms": ms(statistics.median(ttfb)),
                      "upload_mibps": size_mib / up, "download_mibps": size_mib / down}), flush=True)


if __name__ == "__main__":
    main()
