#!/usr/bin/env python3
"""Checks transformers_eager.py's checkpoint loading and cache handling against dsinfer.

For each golden fixture (tests/fixtures/tiny-a and tiny-b: official FP8/MXFP4 layout, one file
and three shards, seeds chosen so that no indexer or router top-k is a near-tie; see
tools/reference/README.md), loads `official/` with transformers_eager.load_model, scores the
fixture's input_ids with `dsinfer score --numerics reference` (fp32, weights dequantised: what
transformers computes in fp32), and compares logits:

  1. full prefill (through a DynamicCache, as the benchmark does) at every position, against
     dsinfer and against the fixture's own transformers logits (reference.safetensors);
  2. the last --decode positions fed one token at a time after a prefill of the rest
     (the benchmark's decode path), and the prompt prefilled 16 tokens at a time (the fallback
     for a decode context too large for one forward);
  3. one decode step at batch 3 from the cache repeated with expand_cache: row 0 fed the true
     next token must match dsinfer, rows 1-2 fed other tokens must match batch-1 steps;

in fp32 (tolerance --tol, max |diff| / max |logit|) for each experts implementation, then in
bf16 (all but the batch checks, looser --bf16-tol). --model DIR checks another checkpoint on
random ids instead; on a random-weight model (`make-checkpoint --preset tiny`) expect
mismatches from the first exact tie in the indexer's top-k (its scores are often exactly 0 with
two index heads), which the fixtures avoid by construction.

Needs torch, transformers and safetensors (tools/reference/requirements.txt); not part of
./test.sh. Exit status 1 on failure.

  python tools/bench/check_eager_load.py --dsinfer build/bin/dsinfer
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformers_eager as te  # noqa: E402


def dsinfer_logits(dsinfer: str, model_dir: str, ids: list[int], tmp: str) -> torch.Tensor:
    out = os.path.join(tmp, "score.safetensors")
    cmd = [dsinfer, "score", "--model", model_dir, "--numerics", "reference"]
    cmd += ["--input-ids", ",".join(map(str, ids)), "--output", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
    return load_file(out)["logits"].float()


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.float() - ref).abs().max() / ref.abs().max())


@torch.inference_mode()
def run_checks(model, ids: list[int], ref: torch.Tensor, n_decode: int) -> dict:
    """Relative max |diff| of each path against dsinfer's logits `ref` [T, V]."""
    dev = next(model.parameters()).device
    T = len(ids)
    x = torch.tensor([ids], device=dev)
    res = {}
    full = model(input_ids=x, past_key_values=te.new_cache(model), use_cache=True).logits[0]
    res["prefill"] = rel_err(full, ref)

    # Decode: prefill T - n_decode tokens, then one token at a time.
    p = T - n_decode
    cache = te.new_cache(model)
    steps = [te.forward(model, x[:, :p], cache)[0, -1]]
    base = te.expand_cache(cache, 1)  # a copy of the cache after the prefill, for check 3
    for t in range(p, T - 1):
        steps.append(te.forward(model, x[:, t : t + 1], cache)[0, -1])
    res["decode"] = rel_err(torch.stack(steps), ref[p - 1 : T - 1])

    # Chunked prefill (the decode context's fallback): all positions, chunks of 16.
    cache = te.new_cache(model)
    chunks = [
        model(input_ids=x[:, i : i + 16], past_key_values=cache, use_cache=True).logits[0]
        for i in range(0, T, 16)
    ]
    res["chunked_prefill"] = rel_err(torch.cat(chunks), ref)

    # Batch decode from the repeated cache: row 0 gets the true token p, rows 1-2 others.
    toks = [ids[p], (ids[p] + 101) % ref.shape[1], (ids[p] + 202) % ref.shape[1]]
    batch = te.expand_cache(base, 3)
    rows = te.forward(model, torch.tensor([[t] for t in toks], device=dev), batch)[:, -1]
    single = [
        te.forward(model, torch.tensor([[tok]], device=dev), te.expand_cache(base, 1))[0, -1]
        for tok in toks
    ]
    res["batch_decode_row0"] = rel_err(rows[0], ref[p])
    res["batch_vs_single"] = max(rel_err(rows[i], single[i].float()) for i in range(3))
    return res


def cases(args):
    """(name, checkpoint dir, ids, fixture logits or None) to check."""
    if args.model:
        vocab = int(te.read_config(args.model)["vocab_size"])
        yield args.model, args.model, [0] + te.random_tokens(args.tokens - 1, vocab, 5), None
        return
    for name in args.fixtures.split(","):
        d = os.path.join(args.fixtures_dir, name)
        ref = load_file(os.path.join(d, "reference.safetensors"))
        yield name, os.path.join(d, "official"), ref["input_ids"].tolist(), ref["logits"].float()


def main(argv=None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dsinfer", default="build/bin/dsinfer")
    ap.add_argument(
        "--fixtures-dir",
        default=os.path.normpath(os.path.join(here, "..", "..", "tests", "fixtures")),
    )
    ap.add_argument("--fixtures", default="tiny-a,tiny-b")
    ap.add_argument("--model", help="check this checkpoint on random ids instead")
    ap.add_argument("--tokens", type=int, default=67, help="--model: prompt length (default 67)")
    ap.add_argument("--decode", type=int, default=12, help="positions checked by decode steps")
    ap.add_argument("--tol", type=float, default=1e-4, help="fp32: max |diff| / max |logit|")
    ap.add_argument("--bf16-tol", type=float, default=0.25, help="bf16, same measure")
    ap.add_argument(
        "--experts", default="eager,grouped_mm", help="experts implementations to check in fp32"
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    cpu = torch.device("cpu")
    failed = False
    with tempfile.TemporaryDirectory(prefix="eager-check-") as tmp:
        for name, model_dir, ids, fixture in cases(args):
            ref = dsinfer_logits(args.dsinfer, model_dir, ids, tmp)
            print(f"{name}: {len(ids)} tokens, max |logit| {float(ref.abs().max()):.3f}")
            if fixture is not None:
                err = rel_err(ref, fixture)
                print(f"  dsinfer score vs the fixture's transformers logits: {err:.2e}")
            runs = [(torch.float32, e, args.tol) for e in args.experts.split(",") if e]
            runs.append((torch.bfloat16, "default", args.bf16_tol))
            for dtype, experts, tol in runs:
                model, _, _ = te.load_model(model_dir, cpu, dtype, experts, verbose=False)
                res = run_checks(model, ids, ref, args.decode)
                if fixture is not None and dtype == torch.float32:
                    full = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
                    res["prefill_vs_fixture"] = rel_err(full.detach(), fixture)
                if dtype == torch.bfloat16:  # batch paths differ by bf16 rounding only
                    res = {k: v for k, v in res.items() if "batch" not in k}
                ok = all(v <= tol for v in res.values())
                failed |= not ok
                impl = model.config._experts_implementation
                detail = ", ".join(f"{k} {v:.2e}" for k, v in res.items())
                label = f"{str(dtype).replace('torch.', '')}, experts {impl}"
                print(f"  {'ok  ' if ok else 'FAIL'} {label}: {detail} (tolerance {tol:g})")
    print("FAILED" if failed else "all checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
