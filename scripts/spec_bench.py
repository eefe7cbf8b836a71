#!/usr/bin/env python3
"""Speculative decoding's tokens/s with turbo caches against q8_0 (python3 stdlib only).

The bench of docs/SPECULATIVE.md: target/release/llama-server with SmolLM2 drafting for itself
(`--spec-type draft-simple`, the draft's cache the target's), one fresh server per run, an
8-token warm-up, then the prose prompt for --tokens tokens at temperature 0 with ignore_eos.
Each round runs every configuration once, in turn, so that a slow spell of a shared machine
falls on all of them; per round it prints tokens/s (`timings.predicted_per_second`), drafts
accepted/drafted and whether the text equals that configuration's plain decoding (the same
server without a draft, run first in the round), and the turbo/q8_0 ratio of the round.

    scripts/spec_bench.py                                   # CPU, 2 rounds
    scripts/spec_bench.py --device Vulkan0 --rounds 3       # eval "$(scripts/lavapipe.sh)" first
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = "The history of the printing press begins"
CACHES = [("q8_0", "q8_0"), ("turbo4", "turbo3")]


def model_path():
    cache = os.environ.get("TQ_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "turboquant")
    return os.path.join(cache, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def post(port, body, timeout):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def run(args, ctk, ctv, spec):
    port = random.randrange(18000, 19000)
    cmd = [os.path.join(ROOT, "target/release/llama-server"), "-m", args.model, "--port", str(port),
           "-c", "2048", "-fa", "on", "-np", "1", "-t", str(args.threads), "-ctk", ctk, "-ctv", ctv]
    if args.device:
        cmd += ["-ngl", "99", "--device", args.device]
    if spec:
        cmd += ["-md", args.model, "--spec-type", "draft-simple", "-ctkd", ctk, "-ctvd", ctv, "-td", "1"]
        if args.device:
            cmd += ["-ngld", "99", "-devd", args.device]
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + args.timeout
        while True:
            if srv.poll() is not None:
                sys.exit(f"llama-server exited ({srv.returncode}): {' '.join(cmd)}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).read()
                break
            except Exception:
                if time.time() > deadline:
                    sys.exit("llama-server did not come up")
                time.sleep(0.5)
        body = {"prompt": PROMPT, "temperature": 0, "ignore_eos": True, "cache_prompt": False}
        post(port, dict(body, n_predict=8), args.timeout)
        r = post(port, dict(body, n_predict=args.tokens), args.timeout)
        t = r["timings"]
        return t["predicted_per_second"], t.get("draft_n_accepted", 0), t.get("draft_n", 0), r["content"]
    finally:
        # a server that does not stop (upstream's SIGTERM deadlock before
        # 0006-fix-server-signal-deadlock.patch, or a hung device) is killed after a grace period
        srv.terminate()
        try:
            srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--device", default="", help="e.g. Vulkan0 (both models on it); default the CPU")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--model", default=model_path())
    args = ap.parse_args()
    if not os.path.exists(args.model):
        sys.exit(f"no {args.model}: run `tq fetch` first")
    for rnd in range(1, args.rounds + 1):
        rate = {}
        for ctk, ctv in CACHES:
            plain = run(args, ctk, ctv, False)
            spec = run(args, ctk, ctv, True)
            rate[ctk] = (plain[0], spec[0])
            same = "same text" if spec[3] == plain[3] else "TEXT DIFFERS"
            print(f"round {rnd} {ctk}/{ctv}: plain {plain[0]:.3f} tok/s, draft-simple {spec[0]:.3f} tok/s "
                  f"({spec[1]}/{spec[2]} accepted, {same} as plain)", flush=True)
        (tp, ts), (qp, qs) = rate["turbo4"], rate["q8_0"]
        print(f"round {rnd}: turbo/q8_0 plain {tp / qp:.2f}x, draft-simple {ts / qs:.2f}x", flush=True)


if __name__ == "__main__":
    main()
