#!/usr/bin/env python3
"""Greedy completions from the dsinfer CPU engine (`dsinfer score`, one call per token, full
recompute) next to PyTorch's greedy completions on the same exported model. For the docs; once
`dsinfer generate` exists, prefer that."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

import common as C
import evaluate as E


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dsinfer", required=True)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    import transformers
    transformers.utils.logging.set_verbosity_error()
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    j = json.loads(tok.to_str())
    j["added_tokens"] = []
    plain = Tokenizer.from_str(json.dumps(j))
    _, model, _ = C.load_official(a.model, "cpu")
    res = []
    with tempfile.TemporaryDirectory() as td:
        for p in E.PROMPTS[: a.prompts]:
            ids = [0] + plain.encode(p, add_special_tokens=False).ids
            cpp = list(ids)
            for _ in range(a.new):
                out = os.path.join(td, "s.safetensors")
                subprocess.run([a.dsinfer, "score", "--model", a.model, "--input-ids", ",".join(map(str, cpp)),
                                "--output", out], check=True, capture_output=True)
                cpp.append(int(load_file(out)["logits"][-1].argmax()))
            pt = E.greedy(model, torch.tensor([ids]), a.new)[0].tolist()
            res.append({"prompt": p, "dsinfer": tok.decode(cpp[len(ids):], skip_special_tokens=False),
                        "pytorch": tok.decode(pt[len(ids):], skip_special_tokens=False),
                        "identical_tokens": cpp == pt})
            print(json.dumps(res[-1], ensure_ascii=False, indent=1), flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
