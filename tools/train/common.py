"""Shared definitions for the dsv4-mini training pipeline (tools/train).

The model is transformers' DeepseekV4ForCausalLM plus the MTP block of
tools/reference/make_fixtures.py (spec 3.11); quantisation and the official
DeepSeek export are reused from that module unchanged.
"""

from __future__ import annotations

import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tools", "reference"))

import make_fixtures as mf  # noqa: E402  (tools/reference/make_fixtures.py)
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM  # noqa: E402

SLIDING, CSA, HCA = mf.SLIDING, mf.CSA, mf.HCA

MODEL_NAME = "dsv4-mini"

# ---------------------------------------------------------------------------------------------
# Special tokens (exact strings, spec recipe-and-protocols.md 1.2; bars U+FF5C, underscores U+2581)
# ids 0/1/2 are fixed; the others follow the BPE vocabulary, in this order.
BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
SPECIAL_FIXED = [BOS, EOS, PAD]
# (content, special, normalized) as in DeepSeek V4's tokenizer.json added_tokens
ADDED_TOKENS = [
    ("<｜fim▁hole｜>", False, True),
    ("<｜fim▁begin｜>", False, True),
    ("<｜fim▁end｜>", False, True),
    ("<｜User｜>", False, True),
    ("<｜Assistant｜>", False, True),
    ("<|EOT|>", False, True),
    ("<｜tool▁calls▁begin｜>", False, True),
    ("<｜tool▁calls▁end｜>", False, True),
    ("<｜tool▁call▁begin｜>", False, True),
    ("<｜tool▁call▁end｜>", False, True),
    ("<｜tool▁outputs▁begin｜>", False, True),
    ("<｜tool▁outputs▁end｜>", False, True),
    ("<｜tool▁output▁begin｜>", False, True),
    ("<｜tool▁output▁end｜>", False, True),
    ("<｜tool▁sep｜>", False, True),
    ("<think>", False, True),
    ("</think>", False, True),
    ("｜DSML｜", False, True),
    ("<｜begin▁sys｜>", False, True),
    ("<｜end▁sys｜>", False, True),
    ("<｜latest_reminder｜>", False, True),
    ("<｜System｜>", False, True),
    ("<｜action｜>", False, True),
    ("<｜query｜>", False, True),
    ("<｜authority｜>", False, True),
    ("<｜domain｜>", False, True),
    ("<｜task｜>", False, True),
    ("<｜title｜>", False, True),
    ("<｜answer｜>", False, True),
    ("<｜search｜>", False, True),
    ("<dsml:", False, True),
    ("</dsml:", False, True),
    ("<｜extracted_url｜>", False, True),
    ("<｜read_url｜>", False, True),
    ("<｜end_of_query｜>", True, False),
]
USER, ASSISTANT, THINK, THINK_END = "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"

# ---------------------------------------------------------------------------------------------
# Architecture (see docs/model.md). Same field names as make_fixtures' specs.
VOCAB_SIZE = 8192
SEQ_LEN = 512          # training context (tokens per sample, BOS included)

ARCH = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=256,
    num_hidden_layers=8,
    layer_types=[SLIDING, SLIDING, CSA, HCA, CSA, HCA, CSA, HCA],
    mlp_layer_types=["hash_moe"] * 3 + ["moe"] * 5,
    compress_rates={CSA: 4, HCA: 16},
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=128,
    partial_rotary_factor=0.5,   # rope 64 of 128
    q_lora_rank=128,
    o_groups=2,
    o_lora_rank=128,
    sliding_window=64,
    index_n_heads=4,
    index_head_dim=64,
    index_topk=16,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    moe_intermediate_size=256,
    hc_mult=4,
    hc_sinkhorn_iters=20,
    hc_eps=1e-6,
    rms_norm_eps=1e-6,
    routed_scaling_factor=1.5,
    swiglu_limit=10.0,
    scoring_func="sqrtsoftplus",
    norm_topk_prob=True,
    hidden_act="silu",
    rope_theta=10000.0,
    compress_rope_theta=160000.0,
    max_position_embeddings=4096,
    bos_token_id=0,
    eos_token_id=1,
    tie_word_embeddings=False,
    num_nextn_predict_layers=1,
)
YARN = dict(factor=16.0, original_max_position_embeddings=65536, beta_fast=32.0, beta_slow=1.0)


def spec(arch: dict | None = None) -> dict:
    """make_fixtures-style spec dict (config + yarn), used by its build_config/official_config."""
    return {"config": dict(arch or ARCH), "yarn": dict(YARN)}


def build_models(arch: dict | None = None, seed: int = 0):
    """Fresh (HF-initialised) main model + MTP block, tid2eid filled with a seeded hash table."""
    sp = spec(arch)
    cfg = mf.build_config(sp)
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(cfg).float()
    mtp = mf.MTPBlock(mf.build_mtp_config(cfg)).float()
    init_mtp(mtp, cfg)
    fill_hash_tables(model, cfg, seed)
    return sp, cfg, model, mtp


@torch.no_grad()
def init_mtp(mtp: torch.nn.Module, cfg) -> None:
    """The MTP block is not a PreTrainedModel: give it the same init HF's _init_weights uses."""
    std = cfg.initializer_range
    for name, p in mtp.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            p.fill_(1.0)
        elif leaf in ("sinks", "position_bias") or name.endswith("hc_base") or name.endswith("_hc.base"):
            p.zero_()
        elif name.endswith("hc_scale") or name.endswith("_hc.scale"):
            p.fill_(1.0)
        else:
            p.normal_(0.0, std)
    for name, b in mtp.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.zero_()


@torch.no_grad()
def fill_hash_tables(model, cfg, seed: int) -> None:
    """tid2eid: every token id -> num_experts_per_tok distinct experts (seeded, balanced-ish)."""
    g = torch.Generator().manual_seed(seed * 7919 + 17)
    for layer in model.model.layers:
        gate = layer.mlp.gate
        if hasattr(gate, "tid2eid"):
            V, k = gate.tid2eid.shape
            rows = torch.stack([torch.randperm(cfg.n_routed_experts, generator=g)[:k] for _ in range(V)])
            gate.tid2eid.copy_(rows.to(gate.tid2eid.dtype))


def forward_with_mtp(model, mtp, input_ids: torch.Tensor):
    """Main logits [B,T,V] and MTP logits [B,T-1,V] (row i predicts token i+2)."""
    cap = {}
    last = model.model.layers[-1]
    h = last.register_forward_hook(lambda _m, _i, out: cap.__setitem__("streams", out))
    try:
        logits = model(input_ids=input_ids, use_cache=False).logits
    finally:
        h.remove()
    mtp_logits, _ = mtp(model, input_ids, cap["streams"])
    return logits, mtp_logits


def score_gates(model, mtp):
    """(key, TopKRouter) for every score-routed MoE gate (main layers and MTP)."""
    out = []
    for i, layer in enumerate(model.model.layers):
        g = layer.mlp.gate
        if hasattr(g, "e_score_correction_bias"):
            out.append((f"L{i}", g))
    out.append(("mtp", mtp.layer.mlp.gate))
    return out


def count_params(module) -> int:
    return sum(p.numel() for p in module.parameters())


# ---------------------------------------------------------------------------------------------
# Official checkpoint <-> HF modules


def official_files(model_dir: str) -> list[str]:
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        import json
        with open(idx) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(model_dir, n) for n in names]
    return [os.path.join(model_dir, "model.safetensors")]


@torch.no_grad()
def load_official_into(model, mtp, model_dir: str) -> None:
    """Fill the HF model + MTP block with the exactly dequantised official tensors
    (make_fixtures' independent numpy dequantiser; the inverse of quantise_into)."""
    off = mf.np_dequant_official(official_files(model_dir))
    used = set()
    for mod, is_mtp in ((model, False), (mtp, True)):
        for name, t in mf.persistent_tensors(mod):
            target, fmt = mf.official_target(name, is_mtp)
            if fmt in ("fp4_gate_up", "fp4_down"):
                base = target.split(".experts.")[0] + ".experts."
                parts = []
                for e in range(t.shape[0]):
                    ks = [f"{base}{e}.w1.weight", f"{base}{e}.w3.weight"] if fmt == "fp4_gate_up" else [f"{base}{e}.w2.weight"]
                    parts.append(torch.from_numpy(np_cat([off[k] for k in ks])))
                    used.update(ks)
                val = torch.stack(parts)
            else:
                val = torch.from_numpy(off[target])
                used.add(target)
            assert tuple(val.shape) == tuple(t.shape), (name, val.shape, t.shape)
            t.copy_(val.to(t.dtype))
    extra = set(off) - used
    assert not extra, f"unused official tensors: {sorted(extra)[:5]}"


def np_cat(arrs):
    import numpy as np
    return np.concatenate(arrs, 0) if len(arrs) > 1 else arrs[0]


def load_official(model_dir: str, device="cpu"):
    """(cfg, model, mtp) in fp32 with the dequantised weights of an exported model dir."""
    import json
    with open(os.path.join(model_dir, "config.json")) as f:
        oc = json.load(f)
    arch = dict(ARCH)
    L = oc["num_hidden_layers"]
    ratios = oc["compress_ratios"][:L]
    hca = max(ratios) if max(ratios) > 4 else ARCH["compress_rates"][HCA]
    arch.update(vocab_size=oc["vocab_size"], num_hidden_layers=L,
                layer_types=[SLIDING if r == 0 else (CSA if r == 4 else HCA) for r in ratios],
                mlp_layer_types=["hash_moe"] * oc["num_hash_layers"] + ["moe"] * (L - oc["num_hash_layers"]),
                compress_rates={CSA: 4, HCA: hca})
    sp, cfg, model, mtp = build_models(arch)
    expect = mf.official_config(sp, cfg)
    diff = {k: (v, oc.get(k)) for k, v in expect.items() if oc.get(k) != v}
    assert not diff, f"{model_dir}/config.json differs from common.ARCH: {diff}"
    load_official_into(model, mtp, model_dir)
    return cfg, model.to(device).eval(), mtp.to(device).eval()
