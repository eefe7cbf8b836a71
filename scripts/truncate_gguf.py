#!/usr/bin/env python3
"""Keep the first N blocks of a GGUF model: a trained model small enough to travel.

A GPU machine lent to this project can be handed 64 MiB per call; SmolLM2-135M Q4_1 is 94 MiB.
Its first 12 of 30 blocks (with the embeddings and the output norm) are about 50 MiB. The
result is a worse language model but still a trained one: its keys have the real models'
structure (attention sinks, a large common component, RoPE pairs that differ by orders of
magnitude), which is what a turbo cache and its K terms meet, and what a random-weight model
lacks (its attention is nearly uniform). scripts/gpu-bench.sh compares the CUDA backend's KLD
with the CPU's on it (same binary, -ngl 99 against -ngl 0); the two should agree, whatever the
model's own quality.

    PYTHONPATH=vendor/llama.cpp/gguf-py python3 scripts/truncate_gguf.py SmolLM2.gguf -o small.gguf --blocks 12
"""
import argparse

import gguf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--blocks", type=int, required=True, help="blocks kept (the first N)")
    a = ap.parse_args()

    r = gguf.GGUFReader(a.model)
    arch = r.fields["general.architecture"].contents()
    key = f"{arch}.block_count"
    n = r.fields[key].contents()
    if not 0 < a.blocks <= n:
        raise SystemExit(f"truncate_gguf: --blocks {a.blocks} outside 1..{n}")

    w = gguf.GGUFWriter(a.out, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vt = f.types[0]
        if name == key:
            w.add_key_value(name, a.blocks, vt)
        elif vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, f.contents(), vt, sub_type=f.types[-1])
        else:
            w.add_key_value(name, f.contents(), vt)
    w.add_string("general.transform", f"first {a.blocks} of {n} blocks")
    kept = 0
    for t in r.tensors:
        parts = t.name.split(".")
        if parts[0] == "blk" and int(parts[1]) >= a.blocks:
            continue
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
        kept += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"truncate_gguf: {kept} tensors, {a.blocks} of {n} blocks -> {a.out}")


if __name__ == "__main__":
    main()
