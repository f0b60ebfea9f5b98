#!/usr/bin/env python3
"""Does the dsinfer CPU engine reproduce PyTorch's validation loss on the exported checkpoint?

For each saved validation window ([BOS] + 512 tokens, val_sample.safetensors from evaluate.py):
  * PyTorch: transformers' DeepseekV4ForCausalLM + MTP block loaded with the exactly
    dequantised official weights (common.load_official), fp32, CPU;
  * dsinfer: `dsinfer score --model DIR --input-ids ... --mtp [--numerics N]` logits;
then the cross-entropy of both (main head: next token; MTP head: token i+2) and the max |diff|
of the logits. Writes a JSON report.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import tempfile
import time

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import common as C


def ce(logits: torch.Tensor, targets: torch.Tensor) -> float:
    return float(F.cross_entropy(logits.double(), targets, reduction="sum"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dsinfer", required=True, help="path to build/bin/dsinfer")
    ap.add_argument("--val-sample", required=True)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--numerics", action="append", help="reference (default) and/or deepseek")
    ap.add_argument("--chunk", type=int, default=0, help="also pass --chunk N to dsinfer (0 = full forward)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args(argv)
    import transformers
    transformers.utils.logging.set_verbosity_error()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.set_float32_matmul_precision("highest")
    wins = load_file(a.val_sample)["windows"].long()[: a.windows]
    _, model, mtp = C.load_official(a.model, "cpu")
    numerics = a.numerics or ["reference"]
    rep = {"model": os.path.abspath(a.model), "windows": int(wins.shape[0]), "tokens_per_window": int(wins.shape[1]),
           "pytorch": {}, "dsinfer": {n: {} for n in numerics}, "max_abs_logit_diff": {n: 0.0 for n in numerics},
           "max_abs_mtp_logit_diff": {n: 0.0 for n in numerics}}
    tot = {"pt": 0.0, "pt_mtp": 0.0, **{n: 0.0 for n in numerics}, **{n + "_mtp": 0.0 for n in numerics}}
    n_tok = n_mtp = 0
    t0 = time.time()
    with tempfile.TemporaryDirectory() as td, torch.no_grad():
        for w in range(wins.shape[0]):
            x = wins[w]
            inp = x[:-1]
            logits, ml = C.forward_with_mtp(model, mtp, inp[None])
            logits, ml = logits[0].float(), ml[0].float()
            tot["pt"] += ce(logits, x[1:])
            tot["pt_mtp"] += ce(ml, x[2:])
            n_tok += inp.numel()
            n_mtp += inp.numel() - 1
            for n in numerics:
                out = os.path.join(td, f"w{w}_{n}.safetensors")
                cmd = [a.dsinfer, "score", "--model", a.model, "--input-ids", ",".join(map(str, inp.tolist())),
                       "--output", out, "--mtp", "--numerics", n]
                if a.chunk:
                    cmd += ["--chunk", str(a.chunk)]
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                d = load_file(out)
                cl, cm = d["logits"].float(), d["mtp_logits"].float()
                tot[n] += ce(cl, x[1:])
                tot[n + "_mtp"] += ce(cm, x[2:])
                rep["max_abs_logit_diff"][n] = max(rep["max_abs_logit_diff"][n], float((cl - logits).abs().max()))
                rep["max_abs_mtp_logit_diff"][n] = max(rep["max_abs_mtp_logit_diff"][n], float((cm - ml).abs().max()))
            print(f"window {w}: done ({time.time() - t0:.0f}s)", flush=True)
    rep["pytorch"] = {"loss": tot["pt"] / n_tok, "mtp_loss": tot["pt_mtp"] / n_mtp}
    for n in numerics:
        rep["dsinfer"][n] = {"loss": tot[n] / n_tok, "mtp_loss": tot[n + "_mtp"] / n_mtp,
                             "loss_minus_pytorch": tot[n] / n_tok - tot["pt"] / n_tok,
                             "mtp_loss_minus_pytorch": tot[n + "_mtp"] / n_mtp - tot["pt_mtp"] / n_mtp}
    rep["pytorch"]["ppl"] = math.exp(rep["pytorch"]["loss"])
    rep["chunk"] = a.chunk
    rep["seconds"] = round(time.time() - t0, 1)
    with open(a.out, "w") as f:
        json.dump(rep, f, indent=1)
    print(json.dumps({k: rep[k] for k in ("pytorch", "dsinfer", "max_abs_logit_diff", "max_abs_mtp_logit_diff")}, indent=1))


if __name__ == "__main__":
    main()
