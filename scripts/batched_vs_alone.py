#!/usr/bin/env python3
"""Do a sequence's answers depend on what is batched with it? (python3 stdlib only)

Talks to a running llama-server (start it yourself, e.g.
  target/release/llama-server -m MODEL -ctk turbo4 -ctv turbo3 -fa on -c 8192 -np 8 \\
      --cache-ram 0 -t 2 --port 18111
). Sends one prompt of more than 32 tokens first (so a turbo cache's K mean is set from
a full ubatch, tq-kmean.h), then 8 short prompts one at a time and then all 8 at once, at
temperature 0 with the top-3 log-probabilities of every token. Prints, per prompt, whether
the texts are identical and the largest log-prob difference of a token both runs scored on
their common prefix. On a batch-invariant cache every line says True and 0.00000
(docs/RELIABILITY.md, "Batched and lone answers").

    scripts/batched_vs_alone.py 18111
"""
import json
import sys
import threading
import urllib.request

PROMPTS = [
    "The history of the steam engine begins",
    "Write a short poem about the sea and the moon at night",
    "Explain how a bicycle works to a child",
    "List three facts about volcanoes",
    "Once upon a time there was a small robot who",
    "Describe the taste of fresh bread",
    "Why is the sky blue? Answer briefly.",
    "Tell me about bees",
]
WARM = ("In the beginning of the twentieth century, engineers across Europe and America raced "
        "to build faster, lighter and more reliable engines for cars, ships and the first "
        "aeroplanes, and many of their ideas are still used today.")


def complete(port, prompt, n=8):
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "n_probs": 3, "cache_prompt": False}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    r = json.loads(urllib.request.urlopen(req, timeout=300).read())
    steps = []
    for t in r["completion_probabilities"]:
        top = t.get("top_logprobs", t.get("probs", []))
        steps.append((t["token"], {x["token"]: x.get("logprob", x.get("prob")) for x in top}))
    return r["content"], steps


def largest_gap(a, b):
    gap = 0.0
    for (ta, pa), (tb, pb) in zip(a, b):
        if ta != tb:
            break
        gap = max([gap] + [abs(pa[k] - pb[k]) for k in pa if k in pb])
    return gap


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 18111
    complete(port, WARM, 4)
    alone = [complete(port, p) for p in PROMPTS]
    batched = [None] * len(PROMPTS)

    def run(i):
        batched[i] = complete(port, PROMPTS[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    same = 0
    for i, (a, b) in enumerate(zip(alone, batched)):
        same += a[0] == b[0]
        print(f"{i} {a[0] == b[0]} {largest_gap(a[1], b[1]):.5f} {a[0][:40]!r} | {b[0][:40]!r}")
    print(f"identical {same}/{len(PROMPTS)}")


if __name__ == "__main__":
    main()
