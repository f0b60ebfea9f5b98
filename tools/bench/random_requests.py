#!/usr/bin/env python3
"""Writes a seeded synthetic workload for `dsinfer generate --input`: N requests of random token
ids (a fixed input length) each generating a fixed number of tokens, the shape of vLLM's random
throughput benchmark. Run generate with --ignore-eos so every request produces all its tokens.

  python3 tools/bench/random_requests.py --num 256 --input-len 1024 --output-len 256 \\
      --vocab 129280 --out /tmp/req.jsonl
  dsinfer generate --device cuda --model /tmp/flash4 --input /tmp/req.jsonl --ignore-eos \\
      --output /tmp/out.jsonl --max-num-seqs 256 --max-tokens-per-step 8192

generate's summary line reports TTFT and TPOT percentiles and total tokens/s.
"""
import argparse
import json
import random
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num", type=int, default=256, help="requests (default 256)")
    ap.add_argument("--input-len", type=int, default=1024, help="prompt tokens (default 1024)")
    ap.add_argument("--output-len", type=int, default=256, help="generated tokens (default 256)")
    ap.add_argument("--vocab", type=int, default=129280,
                    help="token ids are drawn from [--low, vocab) (default 129280, V4's)")
    ap.add_argument("--low", type=int, default=16,
                    help="smallest id drawn: keeps clear of the special tokens (default 16)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="-", help="JSONL file (default stdout)")
    a = ap.parse_args()
    if a.num < 1 or a.input_len < 1 or a.output_len < 1 or a.vocab <= a.low or a.low < 0:
        ap.error("need --num, --input-len, --output-len >= 1 and 0 <= --low < --vocab")
    rng = random.Random(a.seed)
    out = sys.stdout if a.out == "-" else open(a.out, "w")
    for _ in range(a.num):
        ids = [rng.randrange(a.low, a.vocab) for _ in range(a.input_len)]
        out.write(json.dumps({"prompt_token_ids": ids, "max_tokens": a.output_len}) + "\n")
    if out is not sys.stdout:
        out.close()


if __name__ == "__main__":
    main()
