#!/usr/bin/env python3
"""Perplexity of a model on text windows through `dsinfer score`, for several (device, numerics)
runs side by side: the quality check behind the CUDA speed work (issue 12/13 acceptance: the CUDA
path in `deepseek` numerics within 0.5% of the CPU reference numerics on the bundled model).

Usage (repo root; numpy and safetensors needed):
  python3 tools/bench/perplexity.py --dsinfer build/bin/dsinfer --model models/dsv4-mini \
      --text /usr/lib/python3*/json/decoder.py /usr/lib/python3*/argparse.py \
      --runs cpu:reference cuda:deepseek cpu:deepseek --windows 8 --length 512

Each window is [BOS] + `length` consecutive tokens of the concatenated texts (non-overlapping);
the loss is the mean next-token cross-entropy over all predicted positions of all windows. Prints
a JSON object: per run, loss (nats/token), perplexity, and the relative perplexity difference to
the first run; --output also writes it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file


def tokenize(dsinfer: str, tokenizer: str, path: str) -> list[int]:
    out = subprocess.run(
        [dsinfer, "tokenize", "--tokenizer", tokenizer, "--file", path],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


def window_loss(dsinfer: str, model: str, ids: list[int], device: str, numerics: str) -> tuple:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logits.safetensors")
        subprocess.run(
            [
                dsinfer,
                "score",
                "--model",
                model,
                "--input-ids",
                ",".join(map(str, ids)),
                "--output",
                out,
                "--device",
                device,
                "--numerics",
                numerics,
            ],
            check=True,
            capture_output=True,
        )
        logits = load_file(out)["logits"].astype(np.float64)
    pred = logits[:-1]
    target = np.asarray(ids[1:])
    m = pred.max(axis=1, keepdims=True)
    lse = (m[:, 0] + np.log(np.exp(pred - m).sum(axis=1)))
    nll = lse - pred[np.arange(len(target)), target]
    return float(nll.sum()), len(target)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dsinfer", default="build/bin/dsinfer")
    ap.add_argument("--model", default="models/dsv4-mini")
    ap.add_argument("--text", nargs="+", required=True, help="text files, concatenated")
    ap.add_argument("--runs", nargs="+", default=["cpu:reference", "cuda:deepseek"],
                    help="device:numerics pairs; the first is the baseline")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--bos", type=int, default=0, help="id put before each window")
    ap.add_argument("--output")
    a = ap.parse_args()

    tok = os.path.join(a.model, "tokenizer.json")
    ids: list[int] = []
    for path in a.text:
        ids += tokenize(a.dsinfer, tok, path)
    need = a.windows * a.length
    if len(ids) < need:
        print(f"perplexity: {len(ids)} tokens, {need} needed", file=sys.stderr)
        return 2
    windows = [[a.bos] + ids[i * a.length:(i + 1) * a.length] for i in range(a.windows)]
    result = {"model": a.model, "windows": a.windows, "length": a.length, "runs": []}
    base = None
    for run in a.runs:
        device, numerics = run.split(":")
        total, count = 0.0, 0
        for w in windows:
            s, c = window_loss(a.dsinfer, a.model, w, device, numerics)
            total += s
            count += c
        loss = total / count
        ppl = float(np.exp(loss))
        entry = {"device": device, "numerics": numerics, "loss": loss, "perplexity": ppl}
        if base is None:
            base = ppl
        entry["relative_to_first"] = ppl / base - 1.0
        result["runs"].append(entry)
        print(f"[ppl] {device} {numerics}: loss {loss:.5f} ppl {ppl:.4f} "
              f"({100 * entry['relative_to_first']:+.3f}%)", file=sys.stderr)
    text = json.dumps(result, indent=2)
    print(text)
    if a.output:
        with open(a.output, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
