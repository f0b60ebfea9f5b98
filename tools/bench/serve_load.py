#!/usr/bin/env python3
"""Total generation throughput of a running `dsinfer serve` at several concurrency levels.

For each level C, C clients each send streaming Chat Completions requests back to back (thinking
off, `max_tokens` fixed, usage requested in the stream) until --seconds have passed since the
level started; a request still running then is awaited (each is bounded by max_tokens). Per
level it prints: requests completed / 429 / failed, p50 and p99 request latency, and total
generated tokens per second (the usage counts of the completed requests over the level's wall
time). Loopback only; standard library only; not part of ./test.sh.

  build/bin/dsinfer serve --model models/dsv4-mini --port 8123 &
  python3 tools/bench/serve_load.py --port 8123 --levels 1,8,64 --seconds 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time


async def one_request(port: int, model: str, max_tokens: int, prompt: str):
    """(status, completion_tokens, latency_s) of one streaming request."""
    t0 = time.monotonic()
    body = json.dumps({
        "model": model, "stream": True, "stream_options": {"include_usage": True},
        "max_tokens": max_tokens, "thinking": {"type": "disabled"},
        "messages": [{"role": "user", "content": prompt}],
    }).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n").encode()
        writer.write(head + body)
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        data = await reader.read()  # until the server closes (Connection: close)
    finally:
        writer.close()
    tokens = 0
    if status == 200:
        # Chunked framing around SSE: the usage object is in the last data frame before [DONE].
        m = re.search(rb'"completion_tokens":(\d+)', data[data.rfind(b'"usage":{'):])
        tokens = int(m.group(1)) if m else 0
    return status, tokens, time.monotonic() - t0


async def level(port: int, model: str, clients: int, seconds: float, max_tokens: int):
    results = []
    end = time.monotonic() + seconds

    async def client(i: int):
        n = 0
        while time.monotonic() < end:
            prompt = f"def function_{i}_{n}(x):"
            try:
                results.append(await one_request(port, model, max_tokens, prompt))
            except (OSError, ValueError, IndexError):
                results.append((0, 0, 0.0))
            n += 1

    t0 = time.monotonic()
    await asyncio.gather(*(client(i) for i in range(clients)))
    wall = time.monotonic() - t0
    ok = sorted(r[2] for r in results if r[0] == 200)
    tokens = sum(r[1] for r in results if r[0] == 200)

    def pct(p):
        return ok[min(len(ok) - 1, int(p * len(ok)))] if ok else float("nan")

    return {
        "concurrency": clients, "completed": len(ok),
        "429": sum(1 for r in results if r[0] == 429),
        "failed": sum(1 for r in results if r[0] not in (200, 429)),
        "p50_s": pct(0.50), "p99_s": pct(0.99), "wall_s": wall,
        "tokens": tokens, "tokens_per_s": tokens / wall if wall > 0 else 0.0,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default="dsv4-mini", help="served model name")
    ap.add_argument("--levels", default="1,8,64")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()
    print("| streams | completed | 429 | failed | p50 s | p99 s | tokens/s |")
    print("|---|---|---|---|---|---|---|")
    for c in (int(x) for x in a.levels.split(",")):
        r = asyncio.run(level(a.port, a.model, c, a.seconds, a.max_tokens))
        print(f"| {c} | {r['completed']} | {r['429']} | {r['failed']} | {r['p50_s']:.2f} | "
              f"{r['p99_s']:.2f} | {r['tokens_per_s']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
