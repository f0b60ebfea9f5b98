#!/usr/bin/env python3
"""Export a training checkpoint to the official DeepSeek V4 layout (models/dsv4-mini).

Quantisation and file layout are make_fixtures' (tools/reference): FP8 E4M3 128x128 blocks with
UE8M0 scales for attention / shared-expert / indexer-query / MTP projections, MXFP4 (E2M1 +
UE8M0 per 32) for routed experts, BF16 embeddings / head / norms / compressors / routers, F32
mHC / sinks / compressor ape / router bias, I32 tid2eid. Written as --shards safetensors shards
+ model.safetensors.index.json, DeepSeek-dialect config.json, tokenizer.json and
tokenizer_config.json. Self-check: the independent numpy dequantisation of the written files is
bit-identical to the dequantised values put back into the PyTorch modules.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil

import torch

import common as C


def export(ckpt_path: str, tokenizer_json: str, out_dir: str, shards: int):
    d = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    arch = d["state"].get("arch", C.ARCH)
    sp, cfg, model, mtp = C.build_models(arch)
    model.load_state_dict(d["model"])
    mtp.load_state_dict(d["mtp"])
    model.eval()
    mtp.eval()
    official = {}
    C.mf.quantise_into(model, False, official)   # modules now hold the dequantised values
    C.mf.quantise_into(mtp, True, official)
    if os.path.exists(out_dir):
        for f in os.listdir(out_dir):
            if f.endswith((".safetensors", ".json")):
                os.remove(os.path.join(out_dir, f))
    os.makedirs(out_dir, exist_ok=True)
    files = C.mf.write_official(official, out_dir, C.mf.official_config(sp, cfg), shards)
    shutil.copyfile(tokenizer_json, os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token": C.BOS, "eos_token": C.EOS, "pad_token": C.PAD,
                   "add_bos_token": True, "add_eos_token": False,
                   "model_max_length": arch["max_position_embeddings"],
                   "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False},
                  f, indent=2, ensure_ascii=False)
        f.write("\n")
    offnp = C.mf.np_dequant_official([os.path.join(out_dir, f) for f in files])
    C.mf.check_official_matches(offnp, model, mtp, cfg)
    sizes = {f: os.path.getsize(os.path.join(out_dir, f)) for f in sorted(os.listdir(out_dir))}
    return model, mtp, cfg, sizes


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True, help="ckpt.pt from train.py")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shards", type=int, default=2)
    a = ap.parse_args(argv)
    import transformers
    transformers.utils.logging.set_verbosity_error()
    _, _, _, sizes = export(a.ckpt, a.tokenizer, a.out, a.shards)
    print(json.dumps({"files": sizes, "total_bytes": sum(sizes.values())}, indent=1))


if __name__ == "__main__":
    main()
