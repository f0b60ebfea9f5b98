"""Checks a V4.1 golden fixture against the transformers port `models/deepseek_v41` (the oracle
for `reference` numerics), and the spec-derived reference (model.py) against the same port.

The port is not in any transformers release and is never committed here: pass the directory
holding a package `deepseek_v41/` with its `configuration_deepseek_v41.py` and
`modeling_deepseek_v41.py` (huggingface/transformers 0a2080b4, relative imports resolved to
`transformers.`) and run with a transformers that it runs on (5.23 on the CPU).

The fixture's `hf/` directory is loaded with load_state_dict(strict=True), so this also checks
that the layout is exactly what the port's save_pretrained writes. The port's cache path is used
(its no-cache path concatenates compressed entries across KV sources); the Engram compressed
token map comes from the fixture (the port derives it from a tokenizer).

Usage: python tools/reference/v41/check_oracle.py --oracle-dir DIR --fixture tests/fixtures/v41-tiny
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from safetensors.torch import load_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--oracle-dir", required=True)
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--chunks", default="0,1,7,64", help="0 = the whole prompt in one call")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sys.path.insert(0, args.oracle_dir)
    from deepseek_v41 import configuration_deepseek_v41 as oc  # noqa: E402
    from deepseek_v41 import modeling_deepseek_v41 as om  # noqa: E402
    from transformers.cache_utils import DynamicCache  # noqa: E402

    with open(os.path.join(args.fixture, "hf", "config.json")) as f:
        hcfg = json.load(f)
    with open(os.path.join(args.fixture, "meta.json")) as f:
        meta = json.load(f)
    phi = meta["engram_token_map"]
    cfg = oc.DeepseekV41TextConfig(**{k: v for k, v in hcfg.items() if k != "model_type"})
    cfg._attn_implementation = "eager"
    model = om.DeepseekV41ForCausalLM(cfg).float().eval()
    sd = {k: v.float() for k, v in load_file(os.path.join(args.fixture, "hf", "model.safetensors")).items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise SystemExit(f"hf/ layout differs from the port: missing {missing[:5]}, unexpected {unexpected[:5]}")
    om.build_compressed_token_map = lambda tokenizer: (phi, len(set(phi)))
    ref = load_file(os.path.join(args.fixture, "reference.safetensors"))
    ids = ref["input_ids"].tolist()
    want = ref["logits_reference"]
    T = len(ids)

    # Our spec-derived reference on the same weights (dequantised from the official layout is
    # what the fixture used; the hf/ values are identical).
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import model as ours  # noqa: E402

    t_cfg = dict(hcfg)
    t_cfg["engram_pad_token_id"] = t_cfg.pop("engram_pad_id")
    ocfg = ours.Config.from_text_config(t_cfg)
    w = {("head.weight" if k == "lm_head.weight" else k[len("model.") :]): v for k, v in sd.items()}

    for chunk in [int(c) for c in args.chunks.split(",")]:
        step = T if chunk == 0 else chunk
        if hcfg.get("engram_layer_ids"):
            model.model.bind_tokenizer(None)
        cache = DynamicCache(config=cfg)
        rows = []
        with torch.no_grad():
            for s in range(0, T, step):
                part = torch.tensor([ids[s : s + step]])
                rows.append(model(part, past_key_values=cache, use_cache=True).logits[0])
        got = torch.cat(rows)
        d = (got - want).abs()
        print(
            f"oracle vs fixture logits_reference, chunk {chunk or T}: max |d| {d.max():.3e}, "
            f"mean {d.mean():.3e}, argmax equal {int((got.argmax(-1) == want.argmax(-1)).sum())}/{T}"
        )
    m = ours.Model(ocfg, w, phi, "reference")
    with torch.no_grad():
        mine = m.forward(ids, ours.State())
    d = (mine - want).abs()
    print(f"model.py on hf/ weights vs fixture: max |d| {d.max():.3e}, mean {d.mean():.3e}")


if __name__ == "__main__":
    main()
