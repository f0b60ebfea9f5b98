#!/usr/bin/env python3
"""Replays a seeded multi-turn chat trace through `dsinfer serve`, once without the prefix cache
and once with it (--kv-store in a fresh directory, the server restarted half way through the
trace), and reports per run: prompt tokens computed vs cached, hit rate per tier (/metrics),
TTFT p50/p99 (streamed Chat Completions, client side) and wall time.

Each conversation resends its whole history every turn (system prompt + all earlier turns, the
model's own replies included), as chat clients and agent loops do. Conversations run
concurrently (--concurrency), turns within one conversation in order.

  python3 tools/kv_replay/replay.py --bin build/bin/dsinfer --model models/dsv4-mini \
      --conversations 200 --turns 8
"""

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

WORDS = ("python list dict error value index string file return import class function loop "
         "test data key parse read write buffer token cache thread queue socket server client "
         "request response header json number array sort search merge split join format").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, args, extra):
        self.port = free_port()
        cmd = [args.bin, "serve", "--model", args.model, "--port", str(self.port),
               "--served-model-name", "m", "--state-memory", args.state_memory,
               "--max-queue", "4096", "--log-level", "warn"] + extra
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=sys.stderr)
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(self.url("/health"), timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("dsinfer serve did not start")
            time.sleep(0.1)

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def metrics(self):
        out = {}
        with urllib.request.urlopen(self.url("/metrics"), timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line and not line.startswith("#"):
                    k, v = line.rsplit(" ", 1)
                    out[k] = float(v)
        return out

    def stop(self):
        self.proc.terminate()
        self.proc.wait(120)


def chat(server, messages, max_tokens):
    """Streams one Chat Completion; returns (reply text, usage, ttft seconds)."""
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True},
            "thinking": {"type": "disabled"}}
    req = urllib.request.Request(server.url("/v1/chat/completions"), data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    t0 = time.perf_counter()
    ttft = None
    text, usage = [], None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                piece = ch.get("delta", {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    text.append(piece)
    if ttft is None:
        ttft = time.perf_counter() - t0
    return "".join(text), usage, ttft


def trace(args):
    """[(system prompt, [user message per turn])] from the seed."""
    rnd = random.Random(args.seed)
    out = []
    for c in range(args.conversations):
        system = f"You are assistant {c % 7}. " + " ".join(rnd.choice(WORDS) for _ in range(60))
        turns = [" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(8, 40)))
                 for _ in range(args.turns)]
        out.append((system, turns))
    return out


def run(args, conversations, cached):
    store = tempfile.mkdtemp(prefix="dsinfer-replay-") if cached else None
    extra = ["--kv-store", store, "--kv-store-bytes", args.kv_store_bytes] if cached else []
    stats = {"prompt": 0, "cached": 0, "ttft": [], "requests": 0, "hits_device": 0,
             "hits_host": 0, "hits_ssd": 0,
             "lookups": 0, "restore_failures": 0, "corrupt": 0, "evictions_ssd": 0}
    histories = [[{"role": "system", "content": s}] for s, _ in conversations]
    lock = threading.Lock()
    server = Server(args, extra)
    t_start = time.time()

    def collect_metrics():
        if not cached:
            return
        m = server.metrics()
        stats["hits_device"] += m.get('dsinfer_prefix_cache_hits_total{tier="device"}', 0)
        stats["hits_host"] += m.get('dsinfer_prefix_cache_hits_total{tier="host"}', 0)
        stats["hits_ssd"] += m.get('dsinfer_prefix_cache_hits_total{tier="ssd"}', 0)
        stats["lookups"] += m.get("dsinfer_prefix_cache_lookups_total", 0)
        stats["restore_failures"] += m.get("dsinfer_prefix_cache_restore_failures_total", 0)
        stats["corrupt"] += m.get("dsinfer_kv_store_corrupt_total", 0)
        stats["evictions_ssd"] += m.get('dsinfer_kv_store_evictions_total{tier="ssd"}', 0)

    def one_turn(ci, t):
        msgs = histories[ci] + [{"role": "user", "content": conversations[ci][1][t]}]
        reply, usage, ttft = chat(server, msgs, args.max_tokens)
        with lock:
            histories[ci] = msgs + [{"role": "assistant", "content": reply}]
            stats["prompt"] += usage["prompt_tokens"]
            stats["cached"] += usage["prompt_tokens_details"]["cached_tokens"]
            stats["ttft"].append(ttft)
            stats["requests"] += 1

    def run_turns(turns):
        work = [(ci, turns) for ci in range(len(conversations))]
        it = iter(work)
        it_lock = threading.Lock()

        def worker():
            while True:
                with it_lock:
                    item = next(it, None)
                if item is None:
                    return
                ci, ts = item
                for t in ts:
                    one_turn(ci, t)

        threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()

    half = args.turns // 2
    run_turns(range(0, half))
    if cached:  # restart in the middle: the second half must hit what the first half stored
        collect_metrics()
        server.stop()
        server = Server(args, extra)
    run_turns(range(half, args.turns))
    collect_metrics()
    server.stop()
    stats["wall_s"] = time.time() - t_start
    if store:
        stats["store_bytes"] = sum(os.path.getsize(os.path.join(store, f))
                                   for f in os.listdir(store))
        shutil.rmtree(store, ignore_errors=True)
    return stats


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bin", default="build/bin/dsinfer")
    ap.add_argument("--model", default="models/dsv4-mini")
    ap.add_argument("--conversations", type=int, default=200)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--state-memory", default="1GiB")
    ap.add_argument("--kv-store-bytes", default="8GiB")
    args = ap.parse_args()
    conversations = trace(args)
    results = {}
    for name, cached in (("no cache", False), ("kv-store", True)):
        results[name] = run(args, conversations, cached)
    print(f"trace: {args.conversations} conversations x {args.turns} turns, seed {args.seed}, "
          f"max_tokens {args.max_tokens}, concurrency {args.concurrency}")
    print("| run | requests | prompt tokens | computed | cached | device hits | host hits | "
          "SSD hits | TTFT p50 (s) | TTFT p99 (s) | wall (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, s in results.items():
        lookups = max(1, s["lookups"])
        hits = (f"{s['hits_device'] / lookups:.1%}", f"{s['hits_host'] / lookups:.1%}",
                f"{s['hits_ssd'] / lookups:.1%}") if s["lookups"] else ("-", "-", "-")
        print(f"| {name} | {s['requests']} | {s['prompt']} | {s['prompt'] - s['cached']} | "
              f"{s['cached']} ({s['cached'] / max(1, s['prompt']):.1%}) | {hits[0]} | {hits[1]} | "
              f"{hits[2]} | "
              f"{pct(s['ttft'], 50):.3f} | {pct(s['ttft'], 99):.3f} | {s['wall_s']:.0f} |")
    k = results["kv-store"]
    print(f"SSD tier after the run: {k.get('store_bytes', 0) / 2**20:.1f} MiB; SSD evictions "
          f"{k['evictions_ssd']:.0f}, units found but not restored {k['restore_failures']:.0f}, "
          f"corrupt {k['corrupt']:.0f}")


if __name__ == "__main__":
    main()
