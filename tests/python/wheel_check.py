"""The llama-cpp-python wheel of scripts/python-wheel.sh, in a fresh virtualenv: the turbo
type ids, a few tokens with turbo4 K / turbo3 V and flash attention, and turbo V without
flash attention refused with a Python exception (not an abort). Run by
tests/python_wheel.rs; prints one JSON line.  usage: python wheel_check.py MODEL.gguf"""
import json
import sys

import llama_cpp
from llama_cpp import Llama

model = sys.argv[1]
ids = {n: getattr(llama_cpp, n) for n in ("GGML_TYPE_TURBO2", "GGML_TYPE_TURBO3", "GGML_TYPE_TURBO4")}
assert ids == {"GGML_TYPE_TURBO2": 96, "GGML_TYPE_TURBO3": 97, "GGML_TYPE_TURBO4": 98}, ids

llm = Llama(model_path=model, n_ctx=512, n_threads=1, verbose=False,
            type_k=llama_cpp.GGML_TYPE_TURBO4, type_v=llama_cpp.GGML_TYPE_TURBO3, flash_attn=True)
out = llm("The capital of France is", max_tokens=8, temperature=0)
text = out["choices"][0]["text"]
assert out["usage"]["completion_tokens"] > 0 and text.strip(), out
del llm

try:
    Llama(model_path=model, n_ctx=512, n_threads=1, verbose=False,
          type_k=llama_cpp.GGML_TYPE_TURBO4, type_v=llama_cpp.GGML_TYPE_TURBO3, flash_attn=False)
    raise AssertionError("turbo V without flash attention was accepted")
except ValueError as e:
    refused = str(e)

print(json.dumps({"version": llama_cpp.__version__, "ids": ids, "text": text, "refused": refused}))
