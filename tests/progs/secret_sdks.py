"""The OpenAI and Anthropic Python SDKs through their secret doors
(tests/test_e2e_secrets.py), configured by the environment alone, as an
agent built on them is: OPENAI_BASE_URL / ANTHROPIC_BASE_URL (the doors)
and OPENAI_API_KEY / ANTHROPIC_API_KEY (placeholders). Prints one JSON line:

    {"openai": {"models": [...], "chat": "...", "stream": ["...", ...]}, "anthropic": {...}}

The streamed answers come as lists of the pieces the SDK gave, in order.
"""
import json
import sys


def openai_calls():
    import openai
    client = openai.OpenAI(timeout=30, max_retries=0)
    out = {"models": [m.id for m in client.models.list()]}
    chat = client.chat.completions.create(model="gpt-world", messages=[{"role": "user", "content": "hi"}])
    out["chat"] = chat.choices[0].message.content
    pieces = []
    for chunk in client.chat.completions.create(model="gpt-world", stream=True,
                                                messages=[{"role": "user", "content": "hi"}]):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    out["stream"] = pieces
    return out


def anthropic_calls():
    import anthropic
    client = anthropic.Anthropic(timeout=30, max_retries=0)
    out = {"models": [m.id for m in client.models.list()]}
    message = client.messages.create(model="claude-world", max_tokens=16,
                                     messages=[{"role": "user", "content": "hi"}])
    out["chat"] = message.content[0].text
    pieces = []
    with client.messages.stream(model="claude-world", max_tokens=16,
                                messages=[{"role": "user", "content": "hi"}]) as stream:
        for text in stream.text_stream:
            pieces.append(text)
    out["stream"] = pieces
    return out


def litellm_calls():
    """litellm, as aider uses it: the OpenAI provider, its base URL and key
    from the environment alone."""
    import litellm
    answer = litellm.completion(model="openai/gpt-world", messages=[{"role": "user", "content": "hi"}],
                                timeout=30, num_retries=0)
    pieces = []
    for chunk in litellm.completion(model="openai/gpt-world", messages=[{"role": "user", "content": "hi"}],
                                    timeout=30, num_retries=0, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    return {"chat": answer.choices[0].message.content, "stream": pieces}


def main():
    result = {}
    wanted = sys.argv[1:] or ["openai", "anthropic"]
    for name, calls in (("openai", openai_calls), ("anthropic", anthropic_calls), ("litellm", litellm_calls)):
        if name not in wanted:
            continue
        try:
            result[name] = calls()
        except Exception as exc:  # noqa: BLE001 - what failed is the result
            result[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
