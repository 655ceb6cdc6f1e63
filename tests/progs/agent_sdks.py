"""One request with one of the Python SDKs agents are built on, each given
only its base URL (from the environment, as a user points it at a gateway)
and a key, and no proxy setting of its own: it must find vpnw's doors the way
it finds them by default. Prints one JSON line:

    {"sdk": "openai", "answered": true, "status": 404, "detail": "..."}

`answered`: an HTTP answer came back from the API host (any status: the
request went out and back); false on a connection error (refused at a door,
no route), which litellm wraps in a 500 of its own, so the status alone
cannot tell.

    python agent_sdks.py openai|anthropic|litellm
"""
import json
import os
import sys


def openai_models():
    import openai
    client = openai.OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key="sk-vpnw-test",
                           timeout=20, max_retries=0)
    return client.models.with_raw_response.list().status_code


def anthropic_models():
    import anthropic
    client = anthropic.Anthropic(base_url=os.environ["ANTHROPIC_BASE_URL"], api_key="sk-ant-vpnw-test",
                                 timeout=20, max_retries=0)
    return client.models.with_raw_response.list().status_code


def litellm_completion():
    import litellm
    litellm.completion(model="openai/gpt-4o", api_base=os.environ["OPENAI_BASE_URL"],
                       api_key="sk-vpnw-test", messages=[{"role": "user", "content": "hi"}],
                       timeout=20, num_retries=0)
    return 200


CALLS = {"openai": openai_models, "anthropic": anthropic_models, "litellm": litellm_completion}


def main():
    sdk = sys.argv[1]
    try:
        status, answered, detail = CALLS[sdk](), True, ""
    except Exception as exc:  # noqa: BLE001 - what failed is the measurement
        status = getattr(exc, "status_code", None)
        detail = f"{type(exc).__name__}: {str(exc)[:300]}"
        answered = status is not None and not _connection_error(exc)
    print(json.dumps({"sdk": sdk, "answered": answered, "status": status, "detail": detail}), flush=True)


def _connection_error(exc) -> bool:
    """The SDKs' connection errors (openai's and anthropic's APIConnectionError,
    and litellm's wrapping of openai's), through the exception's causes."""
    while exc is not None:
        if "ConnectionError" in type(exc).__name__ or "Connection error" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


if __name__ == "__main__":
    main()
