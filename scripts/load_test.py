#!/usr/bin/env python3
"""Load test of the real llama-server with turbo caches (python3 stdlib only).

Starts target/release/llama-server on loopback (a free port in 18000-18999) with
-np slots and continuous batching, warms every slot up, then sends a few hundred mixed chat
requests from many client threads: short and long prompts, 8 to 96 tokens, streamed or not,
some streams cut off by the client mid-way. Then it sends the same prompts one at a time
at temperature 0 and counts how many batched answers are identical. Prints requests,
errors, p50/p99 latency, resident memory after warm-up / peak / after the load; exits 1 on
any 5xx, transport error, incomplete or cut answer (streams carry their usage and are
length-checked), completed != requested - cancelled, a crash, resident memory growing past
--rss-slack + 16 MiB after warm-up, or batched-vs-alone agreement below --agree-floor.

    scripts/load_test.py                         # turbo4 K / turbo3 V, 300 requests
    scripts/load_test.py --ctk f16 --ctv f16     # the same on f16 caches
    scripts/load_test.py --requests 600 --clients 24 --compare 100
"""
import argparse
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPICS = ["the sea", "a small robot", "autumn leaves", "the moon", "a lighthouse keeper",
          "bread baking", "mountain trails", "a city at night", "bees", "old libraries",
          "trains", "a chess game", "rain", "a violin", "deserts", "the first snow"]
FILLER = "Here is some background that the answer does not need. "


def free_port():
    start = random.randrange(1000)
    for i in range(1000):
        port = 18000 + (start + i * 7) % 1000
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    sys.exit("no free port in 18000-18999")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def mixed_request(i):
    """The i-th request: (prompt, max_tokens, streamed, cancel after n events or None)."""
    topic = TOPICS[i % len(TOPICS)]
    kind = i % 5
    if kind == 0:
        prompt = f"Write one sentence about {topic}."
    elif kind == 1:
        prompt = f"Tell a short story about {topic}."
    elif kind == 2:
        prompt = FILLER * (3 + i % 23) + f"Now list three facts about {topic}."
    elif kind == 3:
        prompt = f"Explain {topic} to a child, step by step."
    else:
        prompt = f"Write a poem about {topic} and {TOPICS[(i * 7) % len(TOPICS)]}."
    max_tokens = [8, 24, 48, 16, 64, 32, 96][i % 7]
    streamed = i % 2 == 1
    cancel = 2 + i % 4 if streamed and i % 6 == 3 else None
    return prompt, max_tokens, streamed, cancel


class Failure(Exception):
    pass


def chat(port, i, allow_cancel=True, timeout=300):
    """Returns dict(text, finish, tokens, latency) or None for a cancelled request."""
    prompt, max_tokens, streamed, cancel = mixed_request(i)
    if not allow_cancel:
        cancel = None
    req = {"messages": [{"role": "user", "content": prompt}],
           "max_tokens": max_tokens, "temperature": 0, "stream": streamed}
    if streamed:
        req["stream_options"] = {"include_usage": True}  # the token count, to length-check
    body = json.dumps(req)
    t0 = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise Failure(f"request {i}: HTTP {resp.status}: {resp.read()[:300]!r}")
        if not streamed:
            v = json.loads(resp.read())
            c = v["choices"][0]
            return {"text": c["message"]["content"] or "", "finish": c["finish_reason"],
                    "tokens": v["usage"]["completion_tokens"], "latency": time.monotonic() - t0,
                    "max": max_tokens}
        text, finish, tokens, events, deltas, done = "", None, 0, 0, 0, False
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            e = json.loads(data)
            events += 1
            if e.get("choices"):
                c = e["choices"][0]
                piece = (c.get("delta") or {}).get("content") or ""
                text += piece
                deltas += bool(piece)
                finish = c.get("finish_reason") or finish
            if e.get("usage"):
                tokens = e["usage"].get("completion_tokens", tokens)
            if cancel is not None and events >= cancel:
                conn.sock.shutdown(socket.SHUT_RDWR)
                return None
        if not done:
            raise Failure(f"request {i}: stream ended without [DONE]")
        if tokens <= 0:
            raise Failure(f"request {i}: stream without a usage chunk (include_usage)")
        if deltas > tokens:
            raise Failure(f"request {i}: {deltas} content deltas for {tokens} tokens")
        return {"text": text, "finish": finish, "tokens": tokens,
                "latency": time.monotonic() - t0, "max": max_tokens}
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise Failure(f"request {i}: {type(e).__name__}: {e}")
    finally:
        conn.close()


def check_complete(i, a):
    if a["finish"] not in ("stop", "length"):
        raise Failure(f"request {i}: finish_reason {a['finish']!r}")
    if a["finish"] == "length" and a["tokens"] != a["max"]:
        raise Failure(f"request {i}: {a['tokens']} of {a['max']} tokens")
    if not a["text"].strip():
        raise Failure(f"request {i}: empty answer")


def run_mix(port, indices, clients, failures):
    todo = list(indices)
    lock = threading.Lock()
    out = {}

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            try:
                a = chat(port, i)
                if a is not None:
                    check_complete(i, a)
            except Failure as e:
                with lock:
                    failures.append(str(e))
                continue
            if a is not None:  # None: cancelled on purpose
                with lock:
                    out[i] = a

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))] if v else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default=os.path.join(ROOT, "target/release/llama-server"))
    ap.add_argument("-m", "--model", help="GGUF (default: `tq fetch`, SmolLM2-135M)")
    ap.add_argument("--ctk", default="turbo4")
    ap.add_argument("--ctv", default="turbo3")
    ap.add_argument("--np", type=int, default=8, help="server slots")
    ap.add_argument("-c", "--ctx", type=int, default=8192, help="total context (all slots)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--compare", type=int, default=64,
                    help="answers re-asked one at a time to compare (0: none)")
    ap.add_argument("--cache-ram", default="0",
                    help="llama-server --cache-ram MiB (0: off, so resident memory must stay flat)")
    ap.add_argument("--rss-slack", type=float, default=0.05,
                    help="allowed RSS growth after warm-up (fraction, plus 16 MiB)")
    ap.add_argument("--agree-floor", type=float, default=0.5,
                    help="least share of batched answers identical to one-at-a-time ones (cross-talk "
                         "between slots breaks it; summation order alone does not, docs/RELIABILITY.md)")
    args = ap.parse_args()

    model = args.model or subprocess.run([os.path.join(os.path.dirname(args.server), "tq"), "fetch"],
                                         check=True, capture_output=True, text=True,
                                         timeout=900).stdout.strip()
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="tq-load-server-", suffix=".log", delete=False)
    cmd = [args.server, "-m", model, "--host", "127.0.0.1", "--port", str(port),
           "-c", str(args.ctx), "-np", str(args.np), "-t", str(args.threads), "-cb",
           "-ctk", args.ctk, "-ctv", args.ctv, "-fa", "on", "--cache-ram", args.cache_ram]
    print("server:", " ".join(cmd), flush=True)
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    failures = []
    try:
        t0 = time.monotonic()
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if srv.poll() is not None:
                sys.exit(f"llama-server exited ({srv.returncode}); log {log.name}")
            if time.monotonic() - t0 > 180:
                sys.exit("llama-server not healthy after 180 s")
            time.sleep(0.25)

        run_mix(port, range(args.np), args.np, failures)  # warm-up: every slot once
        rss_warm = rss_kib(srv.pid)
        peak = [rss_warm]
        stop = threading.Event()

        def sample():
            while not stop.wait(0.5):
                if srv.poll() is None:
                    peak[0] = max(peak[0], rss_kib(srv.pid))

        sampler = threading.Thread(target=sample)
        sampler.start()
        t_load = time.monotonic()
        first = args.np
        batched = run_mix(port, range(first, first + args.requests), args.clients, failures)
        wall = time.monotonic() - t_load
        stop.set()
        sampler.join()
        if srv.poll() is not None:
            failures.append(f"llama-server died under load ({srv.returncode})")
            rss_end = 0
        else:
            rss_end = rss_kib(srv.pid)

        cancelled = sum(1 for i in range(first, first + args.requests)
                        if mixed_request(i)[3] is not None)
        lat = [a["latency"] for a in batched.values()]
        tokens = sum(a["tokens"] for a in batched.values())
        http5 = sum(1 for f in failures if "HTTP 5" in f)

        same = compared = 0
        diffs = []
        if srv.poll() is None:
            for i in sorted(batched)[: args.compare]:
                try:
                    alone = chat(port, i, allow_cancel=False)
                    check_complete(i, alone)
                except Failure as e:
                    failures.append(str(e))
                    continue
                compared += 1
                if alone["text"] == batched[i]["text"]:
                    same += 1
                elif len(diffs) < 3:
                    diffs.append((i, batched[i]["text"][:120], alone["text"][:120]))

        print(f"cache              K {args.ctk} / V {args.ctv}, {args.np} slots, ctx {args.ctx}, "
              f"{args.clients} clients")
        print(f"requests           {args.requests} ({cancelled} cancelled mid-stream by the client)")
        print(f"completed          {len(batched)} complete answers, {tokens} tokens in {wall:.1f} s "
              f"({tokens / wall:.1f} tok/s)")
        print(f"errors             {len(failures)} ({http5} HTTP 5xx)")
        print(f"latency            p50 {pct(lat, 50):.2f} s, p99 {pct(lat, 99):.2f} s, max {max(lat or [0]):.2f} s")
        print(f"RSS                after warm-up {rss_warm / 1024:.1f} MiB, peak {peak[0] / 1024:.1f} MiB, "
              f"after load {rss_end / 1024:.1f} MiB")
        print(f"batched == alone   {same}/{compared} identical at temperature 0")
        for i, b, a in diffs:
            print(f"  e.g. request {i}:\n    batched {b!r}\n    alone   {a!r}")
        for f in failures[:10]:
            print("FAIL", f)
        if rss_end > rss_warm * (1 + args.rss_slack) + 16 * 1024:
            failures.append("resident memory grew")
            print(f"FAIL resident memory grew by more than {args.rss_slack:.0%} + 16 MiB")
        if len(batched) != args.requests - cancelled:
            failures.append("completed != requested - cancelled")
            print(f"FAIL {len(batched)} complete answers, expected {args.requests} - {cancelled}")
        if args.compare and (compared == 0 or same < args.agree_floor * compared):
            failures.append("batched-vs-alone agreement below the floor")
            print(f"FAIL batched == alone for {same}/{compared}, floor {args.agree_floor:.0%}")
    finally:
        if srv.poll() is None:
            srv.send_signal(signal.SIGTERM)
            try:
                rc = srv.wait(30)
            except subprocess.TimeoutExpired:
                srv.kill()
                rc = "killed after 30 s"
            if rc != 0:
                failures.append(f"llama-server exit {rc}")
                print(f"FAIL llama-server exit {rc}")
    print(f"server log         {log.name}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
