"""The official `openai` Python client against llama-server with turbo caches: model list,
chat, streaming with include_usage (token counts checked against the deltas and against
the same request unstreamed), and a context overflow the client sees as an API error.
Run by tests/openai_client.rs; prints one JSON line of what it saw; asserts fail loudly.
usage: python client_check.py BASE_URL CTX"""
import json
import sys

import openai

base, n_ctx = sys.argv[1], int(sys.argv[2])
client = openai.OpenAI(base_url=base, api_key="unused", timeout=300, max_retries=0)
seen = {"openai": openai.__version__}

models = client.models.list()
ids = [m.id for m in models.data]
assert ids and all(ids), f"/v1/models listed {ids}"
seen["models"] = ids
model = ids[0]

msgs = [{"role": "user", "content": "Write one sentence about the sea."}]
# greedy and a fixed seed: the streamed answer must be the same text, token for token
opts = dict(model=model, messages=msgs, max_tokens=24, temperature=0, seed=7)

chat = client.chat.completions.create(**opts)
text = chat.choices[0].message.content or ""
assert text.strip(), f"empty answer: {chat}"
u = chat.usage
assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 24, f"usage {u}"
assert u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage {u}"
assert chat.choices[0].finish_reason in ("stop", "length"), chat.choices[0].finish_reason
seen["chat"] = {"text": text, "usage": u.model_dump()}

stream = client.chat.completions.create(**opts, stream=True, stream_options={"include_usage": True})
pieces, usage, n_usage = [], None, 0
for chunk in stream:
    if chunk.usage is not None:
        usage, n_usage = chunk.usage, n_usage + 1
        assert not chunk.choices, "the usage chunk carries no choices"
    for c in chunk.choices:
        if c.delta.content:
            pieces.append(c.delta.content)
streamed = "".join(pieces)
assert n_usage == 1 and usage is not None, f"{n_usage} usage chunks"
assert streamed == text, f"streamed {streamed!r} != unstreamed {text!r}"
assert usage.completion_tokens == u.completion_tokens, f"{usage} vs {u}"
assert usage.prompt_tokens == u.prompt_tokens, f"{usage} vs {u}"
# llama-server sends one delta per generated token (a token that ends mid-UTF-8 or the
# end-of-generation token may send nothing), so the deltas bound the count from below
assert usage.completion_tokens - 2 <= len(pieces) <= usage.completion_tokens, (
    f"{len(pieces)} content deltas for {usage.completion_tokens} tokens")
seen["stream"] = {"deltas": len(pieces), "usage": usage.model_dump()}

long = "The quick brown fox jumps over the lazy dog. " * (n_ctx // 5)
try:
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": long}], max_tokens=8)
    raise AssertionError(f"a prompt of about {2 * n_ctx} tokens in a {n_ctx}-token context was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400, e.status_code
    seen["overflow"] = {"status": e.status_code, "type": type(e).__name__, "message": str(e)[:300]}

print(json.dumps(seen))
