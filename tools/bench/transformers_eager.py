#!/usr/bin/env python3
"""transformers-eager baseline for `dsinfer bench`.

Loads a dsinfer checkpoint in the official DeepSeek layout (FP8 128x128 dense weights, MXFP4
routed experts, BF16/F32 rest; e.g. `dsinfer make-checkpoint --preset v4-flash --layers 4`) into
transformers' `DeepseekV4ForCausalLM` with dequantised weights (bf16 by default, eager
attention), and measures what `dsinfer bench` measures, on the same device and the same token ids:

  * prefill: one sequence of N tokens from an empty cache, logits of the last token;
  * decode: one sequence prefilled to C tokens (the context), its cache repeated into a batch of
    B sequences, then single-token steps of the whole batch.

Timing uses CUDA events after warm-up (time.perf_counter on the CPU); prefill reports the median
over --repeats runs, decode the median step. The JSON uses `dsinfer bench`'s keys where they
overlap (prefill[].tokens/seconds/tokens_per_s, decode[].batch/context/steps/step_ms/
tokens_per_s, device, model.*), so tools/bench/compare.py can put the two side by side. An entry
that fails (out of memory, say) gets an "error" field and the run goes on.

Loading streams the checkpoint: the model is built on the meta device, allocated once on the
target device, and every tensor is read from its shard (safetensors safe_open, a few reader
threads ahead of the consumer), copied to the device and dequantised there with torch.

  python tools/bench/transformers_eager.py --model /tmp/flash4 --output eager.json
  python tools/bench/transformers_eager.py --preset tiny --device cpu       # a CPU smoke run

See tools/bench/README.md.
"""

from __future__ import annotations

import argparse
import collections
import copy
import itertools
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

SLIDING = "sliding_attention"
CSA = "compressed_sparse_attention"
HCA = "heavily_compressed_attention"

# Names used in `dsinfer bench`'s "schedule" (attention_type_name / moe_type_name).
SCHEDULE_NAMES = {SLIDING: "sliding", CSA: "csa", HCA: "hca", "hash_moe": "hash", "moe": "score"}

# Small sizes for a CPU smoke run on `--preset tiny` (its context is 1024 positions).
TINY_DEFAULTS = dict(prefill=[64, 256], decode_batch=[1, 4], context=128, decode_steps=4)
FULL_DEFAULTS = dict(prefill=[1024, 8192], decode_batch=[1, 64], context=8192, decode_steps=16)

DECODE_WARMUP_STEPS = 3  # as `dsinfer bench`
CONTEXT_CHUNK = 1024  # decode context prefilled in chunks of this size if one forward is too big


def log(msg: str) -> None:
    print(f"[eager] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# Config: DeepSeek dialect (config.json of an official checkpoint) -> DeepseekV4Config kwargs
# ----------------------------------------------------------------------------------------------


def layer_schedule(cfg: dict) -> tuple[list[str], dict, list[str]]:
    """(layer_types, compress_rates, mlp_layer_types) from `compress_ratios` / `num_hash_layers`.

    Same rule as dsinfer's config parser: ratio 0 is sliding; with two distinct non-zero ratios
    the smaller is CSA and the larger HCA; a single one is CSA only when it is 4 (DeepSeek's
    reference). Trailing entries for the MTP layers are dropped.
    """
    if "layer_types" in cfg:
        raise ValueError(
            "config.json is in the transformers dialect; this tool reads the DeepSeek one"
        )
    n = int(cfg["num_hidden_layers"])
    ratios = [int(r) for r in cfg["compress_ratios"]][:n]
    if len(ratios) != n:
        raise ValueError(f"compress_ratios has {len(ratios)} entries for {n} layers")
    distinct = sorted({r for r in ratios if r > 0})
    if len(distinct) > 2:
        raise ValueError(f"compress_ratios: more than two distinct ratios {distinct}")
    csa = distinct[0] if len(distinct) == 2 or distinct == [4] else None
    rates = {CSA: 4, HCA: 128}  # transformers' defaults, for a type that is absent
    types = []
    for r in ratios:
        if r == 0:
            types.append(SLIDING)
        elif r == csa:
            types.append(CSA)
            rates[CSA] = r
        else:
            types.append(HCA)
            rates[HCA] = r
    n_hash = min(int(cfg.get("num_hash_layers", cfg.get("n_hash_layers", 0))), n)
    mlp = ["hash_moe"] * n_hash + ["moe"] * (n - n_hash)
    return types, rates, mlp


def rope_parameters(cfg: dict) -> dict | None:
    """The DeepSeek dialect's YaRN settings (they apply to the compress table only) in the flat
    form that DeepseekV4Config expands into its `main` / `compress` tables."""
    rs = cfg.get("rope_scaling")
    if rs:
        kind = rs.get("rope_type", rs.get("type", "default"))
        if kind != "yarn":
            return None if kind == "default" else {"rope_type": kind}
        return {
            "rope_type": "yarn",
            "factor": float(rs["factor"]),
            "original_max_position_embeddings": int(rs["original_max_position_embeddings"]),
            "beta_fast": float(rs.get("beta_fast", 32.0)),
            "beta_slow": float(rs.get("beta_slow", 1.0)),
        }
    if int(cfg.get("original_seq_len", 0)) > 0:  # inference/config.json spelling
        return {
            "rope_type": "yarn",
            "factor": float(cfg["rope_factor"]),
            "original_max_position_embeddings": int(cfg["original_seq_len"]),
            "beta_fast": float(cfg.get("beta_fast", 32.0)),
            "beta_slow": float(cfg.get("beta_slow", 1.0)),
        }
    return None


def hf_config_kwargs(cfg: dict) -> dict:
    """DeepseekV4Config keyword arguments for a DeepSeek-dialect config.json."""
    types, rates, mlp = layer_schedule(cfg)
    keys = [
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "q_lora_rank",
        "o_groups",
        "o_lora_rank",
        "sliding_window",
        "max_position_embeddings",
        "rope_theta",
        "compress_rope_theta",
        "index_n_heads",
        "index_head_dim",
        "index_topk",
        "hc_mult",
        "hc_sinkhorn_iters",
        "hc_eps",
        "rms_norm_eps",
        "n_routed_experts",
        "n_shared_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "scoring_func",
        "norm_topk_prob",
        "routed_scaling_factor",
        "swiglu_limit",
        "hidden_act",
        "num_nextn_predict_layers",
        "bos_token_id",
        "eos_token_id",
    ]
    kw = {k: cfg[k] for k in keys if k in cfg}
    kw.update(
        layer_types=types,
        mlp_layer_types=mlp,
        compress_rates=rates,
        partial_rotary_factor=int(cfg["qk_rope_head_dim"]) / int(cfg["head_dim"]),
        tie_word_embeddings=False,
    )
    rp = rope_parameters(cfg)
    if rp is not None:
        kw["rope_parameters"] = rp
    return kw


def read_config(model_dir: str) -> dict:
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


# ----------------------------------------------------------------------------------------------
# Checkpoint access and dequantisation
# ----------------------------------------------------------------------------------------------


class OfficialCheckpoint:
    """Tensor name -> shard file of a checkpoint directory; tensors are read with safe_open."""

    def __init__(self, model_dir: str):
        from safetensors import safe_open

        self._safe_open = safe_open
        self.dir = model_dir
        index = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                self.file_of = dict(json.load(f)["weight_map"])
        else:
            files = sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors"))
            if not files:
                raise FileNotFoundError(f"{model_dir}: no .safetensors files")
            self.file_of = {}
            for fn in files:
                with safe_open(os.path.join(model_dir, fn), framework="pt") as f:
                    for k in f.keys():
                        self.file_of[k] = fn
        self._handles = {}

    def __contains__(self, name: str) -> bool:
        return name in self.file_of

    def names(self) -> list[str]:
        return list(self.file_of)

    def _handle(self, name: str):
        if name not in self.file_of:
            raise KeyError(f"{self.dir}: tensor '{name}' not found")
        fn = self.file_of[name]
        h = self._handles.get(fn)
        if h is None:
            path = os.path.join(self.dir, fn)
            h = self._handles.setdefault(fn, self._safe_open(path, framework="pt"))
        return h

    def dtype(self, name: str) -> str:
        """The stored safetensors dtype ("F32", "BF16", "F8_E4M3", "I8", ...)."""
        return self._handle(name).get_slice(name).get_dtype()

    def get(self, name: str) -> torch.Tensor:
        """The stored tensor, on the CPU, in its stored dtype."""
        return self._handle(name).get_tensor(name)

    def nbytes(self) -> int:
        return sum(os.path.getsize(os.path.join(self.dir, f)) for f in set(self.file_of.values()))


# E2M1 code -> value (bit 3 is the sign).
E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
E2M1_LUT = torch.tensor(E2M1_VALUES + [-v for v in E2M1_VALUES], dtype=torch.float32)
_E2M1_ON_DEVICE: dict = {}


def e8m0_to_float(s: torch.Tensor) -> torch.Tensor:
    """UE8M0 scales (stored as float8_e8m0fnu or uint8) -> float32 powers of two, exactly."""
    u = s.view(torch.uint8).to(torch.int32)
    if u.device.type != "meta" and bool((u == 255).any()):
        raise ValueError("E8M0 scale 0xFF (NaN)")
    f = (u << 23).view(torch.float32)  # 2^(u-127) for u >= 1
    return torch.where(u == 0, torch.full_like(f, 2.0**-127), f)


def dequant_fp8_block(w: torch.Tensor, scale: torch.Tensor, block: int = 128) -> torch.Tensor:
    """E4M3 [out, in] with UE8M0 scales [ceil(out/128), ceil(in/128)] -> float32 [out, in]."""
    rows, cols = w.shape
    s = e8m0_to_float(scale)
    s = s.repeat_interleave(block, 0)[:rows].repeat_interleave(block, 1)[:, :cols]
    return w.to(torch.float32) * s


def dequant_mxfp4(packed: torch.Tensor, scale: torch.Tensor, block: int = 32) -> torch.Tensor:
    """MXFP4 [out, in/2] (low nibble = even element) with UE8M0 scales [out, in/32] -> float32."""
    rows, half = packed.shape
    u = packed.view(torch.uint8)
    codes = torch.stack((u & 0xF, u >> 4), dim=-1).reshape(rows, 2 * half).to(torch.int64)
    lut = _E2M1_ON_DEVICE.get(packed.device)
    if lut is None:
        lut = _E2M1_ON_DEVICE.setdefault(packed.device, E2M1_LUT.to(packed.device))
    vals = lut[codes]
    s = e8m0_to_float(scale)
    return (vals.view(rows, -1, block) * s.unsqueeze(-1)).view(rows, 2 * half)


def dequantise(w: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """The logical value of a stored weight (float32 for quantised formats, else unchanged)."""
    if scale is None:
        return w
    if w.dtype == torch.float8_e4m3fn:
        return dequant_fp8_block(w, scale)
    if w.dtype in (torch.int8, torch.uint8):
        return dequant_mxfp4(w, scale)
    raise TypeError(f"unexpected quantised dtype {w.dtype}")


def scale_name(weight: str) -> str:
    return weight[: -len(".weight")] + ".scale" if weight.endswith(".weight") else weight + ".scale"


# ----------------------------------------------------------------------------------------------
# transformers name -> official name (see tools/reference/README.md, "Files per fixture")
# ----------------------------------------------------------------------------------------------

LAYER_NAMES = {
    "self_attn.q_a_proj.weight": "attn.wq_a.weight",
    "self_attn.q_a_norm.weight": "attn.q_norm.weight",
    "self_attn.q_b_proj.weight": "attn.wq_b.weight",
    "self_attn.kv_proj.weight": "attn.wkv.weight",
    "self_attn.kv_norm.weight": "attn.kv_norm.weight",
    "self_attn.o_a_proj.weight": "attn.wo_a.weight",
    "self_attn.o_b_proj.weight": "attn.wo_b.weight",
    "self_attn.sinks": "attn.attn_sink",
    "self_attn.compressor.kv_proj.weight": "attn.compressor.wkv.weight",
    "self_attn.compressor.gate_proj.weight": "attn.compressor.wgate.weight",
    "self_attn.compressor.position_bias": "attn.compressor.ape",
    "self_attn.compressor.kv_norm.weight": "attn.compressor.norm.weight",
    "self_attn.compressor.indexer.q_b_proj.weight": "attn.indexer.wq_b.weight",
    "self_attn.compressor.indexer.scorer.weights_proj.weight": "attn.indexer.weights_proj.weight",
    "self_attn.compressor.indexer.kv_proj.weight": "attn.indexer.compressor.wkv.weight",
    "self_attn.compressor.indexer.gate_proj.weight": "attn.indexer.compressor.wgate.weight",
    "self_attn.compressor.indexer.position_bias": "attn.indexer.compressor.ape",
    "self_attn.compressor.indexer.kv_norm.weight": "attn.indexer.compressor.norm.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "attn_hc.fn": "hc_attn_fn",
    "attn_hc.base": "hc_attn_base",
    "attn_hc.scale": "hc_attn_scale",
    "ffn_hc.fn": "hc_ffn_fn",
    "ffn_hc.base": "hc_ffn_base",
    "ffn_hc.scale": "hc_ffn_scale",
    "mlp.gate.weight": "ffn.gate.weight",
    "mlp.gate.e_score_correction_bias": "ffn.gate.bias",
    "mlp.gate.tid2eid": "ffn.gate.tid2eid",
    "mlp.shared_experts.gate_proj.weight": "ffn.shared_experts.w1.weight",
    "mlp.shared_experts.up_proj.weight": "ffn.shared_experts.w3.weight",
    "mlp.shared_experts.down_proj.weight": "ffn.shared_experts.w2.weight",
}
TOP_NAMES = {
    "model.embed_tokens.weight": "embed.weight",
    "lm_head.weight": "head.weight",
    "model.norm.weight": "norm.weight",
    "model.hc_head.hc_fn": "hc_head_fn",
    "model.hc_head.hc_base": "hc_head_base",
    "model.hc_head.hc_scale": "hc_head_scale",
}


def load_jobs(hf_name: str, shape: tuple, ckpt: OfficialCheckpoint) -> list[tuple]:
    """How to fill one transformers tensor: a list of (index, [official weight names]); the
    dequantised weights of a job are concatenated along rows into `tensor[index]`."""

    def w(name):
        return [name]

    if hf_name in TOP_NAMES:
        return [((), w(TOP_NAMES[hf_name]))]
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", hf_name)
    if not m:
        raise KeyError(f"no official name for {hf_name}")
    prefix, rest = f"layers.{m.group(1)}.", m.group(2)
    if rest == "mlp.experts.gate_up_proj":  # [E, 2I, H] = cat(w1, w3) per expert
        return [
            ((e,), [f"{prefix}ffn.experts.{e}.w1.weight", f"{prefix}ffn.experts.{e}.w3.weight"])
            for e in range(shape[0])
        ]
    if rest == "mlp.experts.down_proj":  # [E, H, I]
        return [((e,), w(f"{prefix}ffn.experts.{e}.w2.weight")) for e in range(shape[0])]
    if rest not in LAYER_NAMES:
        raise KeyError(f"no official name for {hf_name}")
    return [((), w(prefix + LAYER_NAMES[rest]))]


def fetch(ckpt: OfficialCheckpoint, names: list[str]) -> list[tuple]:
    """[(weight, scale or None)] on the CPU (runs on reader threads)."""
    out = []
    for n in names:
        sn = scale_name(n)
        out.append((ckpt.get(n), ckpt.get(sn) if sn in ckpt else None))
    return out


def prefetched(jobs, fn, workers: int, lookahead: int):
    """Yields (job, fn(job)) in order, with up to `lookahead` calls running ahead on threads."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        it = iter(jobs)
        pending = collections.deque(
            (j, pool.submit(fn, j)) for j in itertools.islice(it, lookahead)
        )
        while pending:
            job, fut = pending.popleft()
            nxt = next(it, None)
            if nxt is not None:
                pending.append((nxt, pool.submit(fn, nxt)))
            yield job, fut.result()


# ----------------------------------------------------------------------------------------------
# Model construction and streaming load
# ----------------------------------------------------------------------------------------------


def build_hf_config(cfg: dict, experts_implementation: str | None):
    from transformers import DeepseekV4Config

    kw = hf_config_kwargs(cfg)
    extra = {"attn_implementation": "eager"}
    if experts_implementation not in (None, "default"):
        extra["experts_implementation"] = experts_implementation
    return DeepseekV4Config(**kw, **extra)


@torch.no_grad()
def load_model(
    model_dir: str,
    device: torch.device,
    dtype: torch.dtype,
    experts_implementation: str | None = None,
    threads: int = 8,
    verbose: bool = True,
):
    """DeepseekV4ForCausalLM with the checkpoint's dequantised weights, on `device`.
    Returns (model, official config dict, load statistics).

    Dtypes: a tensor stored as F32 in the checkpoint (mHC fn/base/scale, attention sinks, the
    compressors' ape, the router bias) stays fp32; every other float tensor gets `dtype`. With
    bf16 that is lossless: FP8 and MXFP4 values times their power-of-two scales, and BF16 values,
    are all exact in bf16. (transformers' own from_pretrained(dtype=bfloat16) keeps the norm
    weights in fp32 too, and 5.17 then fails: its RMSNorm returns fp32 into bf16 linears.)
    """
    from transformers import DeepseekV4ForCausalLM
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RotaryEmbedding

    t0 = time.perf_counter()
    cfg = read_config(model_dir)
    config = build_hf_config(cfg, experts_implementation)
    ckpt = OfficialCheckpoint(model_dir)

    # Built on the meta device (no memory, no init), given its dtypes there, then allocated once.
    with torch.device("meta"):
        model = DeepseekV4ForCausalLM(config)
    plan = {}  # transformers name -> [(index, official names)]
    for mod_name, mod in model.named_modules():
        for kind in ("_parameters", "_buffers"):
            for name, t in list(getattr(mod, kind).items()):
                full = f"{mod_name}.{name}" if mod_name else name
                if t is None or name in mod._non_persistent_buffers_set:
                    continue  # the RoPE tables, refilled below
                plan[full] = load_jobs(full, tuple(t.shape), ckpt)
                if not t.is_floating_point():
                    continue
                stored = {ckpt.dtype(n) for _, names in plan[full] for n in names}
                want = torch.float32 if stored == {"F32"} else dtype
                if t.dtype != want:
                    new = t.to(want)
                    if kind == "_parameters":
                        new = torch.nn.Parameter(new, requires_grad=False)
                    getattr(mod, kind)[name] = new
    model.to_empty(device=device)
    model.requires_grad_(False)
    model.eval()

    # Non-persistent buffers (the RoPE tables) are not in the checkpoint: copy them from a module
    # built the normal way.
    fresh = DeepseekV4RotaryEmbedding(config)
    for mod in model.modules():
        if isinstance(mod, DeepseekV4RotaryEmbedding):
            for bname, b in fresh.named_buffers(recurse=False):
                getattr(mod, bname).copy_(b)
            for lt in fresh.layer_types:
                setattr(mod, f"{lt}_attention_scaling", getattr(fresh, f"{lt}_attention_scaling"))

    persistent = model.state_dict(keep_vars=True)
    if set(persistent) != set(plan):
        raise RuntimeError(f"state dict and load plan differ: {set(persistent) ^ set(plan)}")
    nonpersistent = {n for n, _ in model.named_buffers()} - set(persistent)
    stray = [n for n in nonpersistent if "rotary_emb" not in n]
    if stray:
        raise RuntimeError(f"unhandled non-persistent buffers: {stray}")

    # Every job: (target tensor, index, official names). Ordered as stored (layer by layer).
    jobs = []
    for hf_name, t in persistent.items():
        for index, names in plan[hf_name]:
            jobs.append((hf_name, t, index, names))
    used = set()
    loaded_bytes = 0
    current_layer, layer_t0 = None, time.perf_counter()
    it = prefetched(jobs, lambda j: fetch(ckpt, j[3]), workers=threads, lookahead=4 * threads)
    for (hf_name, target, index, names), parts in it:
        m = re.match(r"model\.layers\.(\d+)\.", hf_name)
        layer = m.group(1) if m else None
        if verbose and layer != current_layer and current_layer is not None:
            log(f"layer {current_layer} loaded in {time.perf_counter() - layer_t0:.1f} s")
            layer_t0 = time.perf_counter()
        current_layer = layer
        values = []
        for n, (w, s) in zip(names, parts):
            used.add(n)
            loaded_bytes += w.numel() * w.element_size()
            if s is not None:
                used.add(scale_name(n))
                loaded_bytes += s.numel() * s.element_size()
                s = s.to(device)
            values.append(dequantise(w.to(device), s))
        value = values[0] if len(values) == 1 else torch.cat(values, dim=0)
        dst = target[index] if index else target
        if tuple(value.shape) != tuple(dst.shape):
            raise ValueError(
                f"{names}: shape {tuple(value.shape)} does not fit {hf_name}{list(index)} "
                f"{tuple(dst.shape)}"
            )
        dst.copy_(value)
    if verbose and current_layer is not None:
        log(f"layer {current_layer} loaded in {time.perf_counter() - layer_t0:.1f} s")
    unused = sorted(n for n in ckpt.names() if n not in used and not n.startswith("mtp."))
    if unused:
        raise ValueError(f"checkpoint tensors not used by the model: {unused[:8]}...")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    stats = {
        "load_s": time.perf_counter() - t0,
        "checkpoint_bytes_read": loaded_bytes,
        "weight_bytes_on_device": sum(t.numel() * t.element_size() for t in persistent.values()),
        "ignored_tensors": sum(1 for n in ckpt.names() if n.startswith("mtp.")),
    }
    return model, cfg, stats


# ----------------------------------------------------------------------------------------------
# Benchmark
# ----------------------------------------------------------------------------------------------


def random_tokens(n: int, vocab: int, seed: int) -> list[int]:
    """The ids `dsinfer bench` uses: std::mt19937(seed)() % vocab (numpy's legacy RandomState
    seeds MT19937 the same way)."""
    raw = np.random.RandomState(seed).randint(0, 2**32, size=n, dtype=np.uint32)
    return [int(x) % vocab for x in raw]


def decode_step_tokens(step: int, batch: int, vocab: int) -> list[int]:
    """`dsinfer bench`'s decode tokens for step `step` (warm-up steps included)."""
    return [(step * 7919 + i * 104729) % vocab for i in range(batch)]


class Timer:
    """Seconds of GPU time between start() and stop() (CUDA events), or wall time on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def start(self):
        if self.cuda:
            self.a = torch.cuda.Event(enable_timing=True)
            self.b = torch.cuda.Event(enable_timing=True)
            self.a.record()
        else:
            self.t = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            self.b.record()
            self.b.synchronize()
            return self.a.elapsed_time(self.b) / 1e3
        return time.perf_counter() - self.t


def new_cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def expand_value(v, batch: int):
    if isinstance(v, torch.Tensor) and v.dim() > 0:
        if v.shape[0] != 1:
            raise ValueError(f"cache tensor with batch dimension {v.shape[0]}, expected 1")
        return v.repeat(batch, *([1] * (v.dim() - 1)))
    if isinstance(v, dict):
        return {k: expand_value(x, batch) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(expand_value(x, batch) for x in v)
    return v


def expand_cache(cache, batch: int):
    """A copy of a batch-1 cache with every per-sequence tensor repeated `batch` times (distinct
    memory per sequence, as after a prefill of `batch` identical prompts). Walks the layers'
    attributes generically: the sliding-window K=V cache and the V4 compressor / indexer state
    (buffers, compressed entries, overlap windows)."""
    out = copy.copy(cache)
    out.layers = []
    for layer in cache.layers:
        nl = copy.copy(layer)
        for k, v in vars(layer).items():
            setattr(nl, k, expand_value(v, batch))
        if getattr(layer, "values", None) is getattr(layer, "keys", None) and hasattr(nl, "keys"):
            nl.values = nl.keys  # V4 shares K and V
        out.layers.append(nl)
    return out


def forward(model, ids: torch.Tensor, cache):
    return model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def reset_memory(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def error_text(e: BaseException) -> str:
    kind = "out of memory" if is_oom(e) else type(e).__name__
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{kind}: {first[:300]}"


@torch.inference_mode()
def bench_prefill(model, device, vocab: int, n: int, warmup: int, repeats: int) -> dict:
    ids = torch.tensor([random_tokens(n, vocab, n)], dtype=torch.long, device=device)
    timer = Timer(device)
    reset_memory(device)
    for _ in range(warmup):
        forward(model, ids, new_cache(model))
    times = []
    for _ in range(repeats):
        cache = new_cache(model)
        timer.start()
        forward(model, ids, cache)
        times.append(timer.stop())
        del cache
    med = statistics.median(times)
    return {
        "tokens": n,
        "seconds": med,
        "tokens_per_s": n / med,
        "seconds_min": min(times),
        "seconds_all": times,
        "peak_memory_bytes": peak_memory(device),
    }


@torch.inference_mode()
def prefill_context(model, device, vocab: int, context: int, batch: int = 1, chunk: int = 0):
    """A cache holding the decode context (`dsinfer bench`'s ids, seed 17), prefilled in one
    forward, or `chunk` tokens at a time when chunk > 0. Returns (cache, seconds)."""
    ids = torch.tensor([random_tokens(context, vocab, 17)] * batch, dtype=torch.long, device=device)
    cache = new_cache(model)
    timer = Timer(device)
    timer.start()
    step = chunk if chunk > 0 else context
    for i in range(0, context, step):
        forward(model, ids[:, i : i + step], cache)
    return cache, timer.stop()


@torch.inference_mode()
def bench_decode(model, device, vocab: int, base_cache, batch: int, steps: int) -> dict:
    context = base_cache.get_seq_length()
    try:
        cache = expand_cache(base_cache, batch)
        how = "batch-1 context cache repeated into the batch"
    except (TypeError, ValueError, AttributeError) as e:  # a cache layout expand_cache misses
        log(f"decode batch {batch}: cannot repeat the cache ({e}); prefilling {batch} prompts")
        cache, _ = prefill_context(model, device, vocab, context, batch)
        how = f"prefill of {batch} identical prompts (repeating the cache failed: {e})"
    timer = Timer(device)
    times = []
    for k in range(DECODE_WARMUP_STEPS + steps):
        tok = decode_step_tokens(k, batch, vocab)
        ids = torch.tensor(tok, dtype=torch.long, device=device).view(batch, 1)
        timer.start()
        forward(model, ids, cache)
        dt = timer.stop()
        if k >= DECODE_WARMUP_STEPS:
            times.append(dt)
    med = statistics.median(times)
    return {
        "cache": how,
        "step_ms": med * 1e3,
        "tokens_per_s": batch / med,
        "step_ms_mean": statistics.fmean(times) * 1e3,
        "step_ms_min": min(times) * 1e3,
        "step_ms_max": max(times) * 1e3,
    }


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def versions() -> dict:
    import safetensors
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
        "cuda": torch.version.cuda,
    }


def config_summary(model, cfg: dict) -> dict:
    c = model.config
    return {
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "head_dim": c.head_dim,
        "qk_rope_head_dim": c.qk_rope_head_dim,
        "q_lora_rank": c.q_lora_rank,
        "o_groups": c.o_groups,
        "o_lora_rank": c.o_lora_rank,
        "sliding_window": c.sliding_window,
        "layer_types": list(c.layer_types),
        "mlp_layer_types": list(c.mlp_layer_types),
        "compress_rates": dict(c.compress_rates),
        "index_n_heads": c.index_n_heads,
        "index_head_dim": c.index_head_dim,
        "index_topk": c.index_topk,
        "n_routed_experts": c.n_routed_experts,
        "num_experts_per_tok": c.num_experts_per_tok,
        "moe_intermediate_size": c.moe_intermediate_size,
        "hc_mult": c.hc_mult,
        "rope_parameters": c.rope_parameters,
        "quantization_in_checkpoint": cfg.get("quantization_config"),
        "mtp_layers_ignored": cfg.get("num_nextn_predict_layers", 0),
    }


def make_checkpoint(dsinfer: str, preset: str, layers: int | None, out: str):
    cmd = [dsinfer, "make-checkpoint", "--preset", preset, "--out", out]
    if layers is not None:
        cmd += ["--layers", str(layers)]
    log("running " + " ".join(cmd))
    subprocess.run(cmd, check=True, stdout=sys.stderr)


def parse_list(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="checkpoint directory (official DeepSeek layout)")
    src.add_argument(
        "--preset",
        choices=["tiny", "v4-flash"],
        help="make a random checkpoint with `dsinfer make-checkpoint` into a temporary directory",
    )
    ap.add_argument(
        "--layers", type=int, help="--preset: layers to keep (make-checkpoint --layers)"
    )
    ap.add_argument("--dsinfer", default="build/bin/dsinfer", help="binary for --preset")
    ap.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (default cuda)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument(
        "--experts-implementation",
        default="default",
        help="transformers' MoE experts backend: default (what from_pretrained picks: grouped_mm "
        "where it can dispatch), eager, grouped_mm, batched_mm",
    )
    ap.add_argument(
        "--prefill", type=parse_list, help="prompt lengths (default 1024,8192; tiny: 64,256)"
    )
    ap.add_argument(
        "--decode-batch", type=parse_list, help="decode batch sizes (default 1,64; tiny: 1,4)"
    )
    ap.add_argument("--context", type=int, help="decode context (default 8192; tiny: 128)")
    ap.add_argument("--decode-steps", type=int, help="timed decode steps (default 16; tiny: 4)")
    ap.add_argument("--repeats", type=int, default=3, help="timed prefill runs (median; default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed prefill runs first (default 1)")
    ap.add_argument("--threads", type=int, default=8, help="checkpoint reader threads (default 8)")
    ap.add_argument("--cpu-threads", type=int, help="torch CPU threads (--device cpu)")
    ap.add_argument("--output", help="also write the JSON here")
    args = ap.parse_args(argv)
    defaults = TINY_DEFAULTS if args.preset == "tiny" else FULL_DEFAULTS
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if min(args.prefill + args.decode_batch) < 1 or args.context < 1 or args.decode_steps < 1:
        ap.error("--prefill, --decode-batch, --context and --decode-steps must be >= 1")
    if args.layers is not None and not args.preset:
        ap.error("--layers applies to --preset (the checkpoint of --model is used as it is)")
    if args.repeats < 1 or args.warmup < 0:
        ap.error("--repeats must be >= 1 and --warmup >= 0")
    return args


def run(args) -> dict:
    device = torch.device(args.device)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    if args.cpu_threads:
        torch.set_num_threads(args.cpu_threads)
    dtype = getattr(torch, args.dtype)
    tmp = None
    model_dir = args.model
    if args.preset:
        tmp = tempfile.mkdtemp(prefix="eager-ckpt-")
        model_dir = os.path.join(tmp, args.preset)
        make_checkpoint(args.dsinfer, args.preset, args.layers, model_dir)
    try:
        log(f"loading {model_dir} onto {device} as {args.dtype}...")
        model, cfg, stats = load_model(
            model_dir, device, dtype, args.experts_implementation, threads=args.threads
        )
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    log(
        f"loaded {stats['checkpoint_bytes_read'] / 1e9:.2f} GB of checkpoint in "
        f"{stats['load_s']:.1f} s ({stats['weight_bytes_on_device'] / 1e9:.2f} GB on the device)"
    )
    c = model.config
    out = {
        "tool": "tools/bench/transformers_eager.py",
        "device": device_name(device),
        "versions": versions(),
        "model": {
            "dir": args.model if args.model else f"(--preset {args.preset})",
            "layers": c.num_hidden_layers,
            "schedule": [
                f"{SCHEDULE_NAMES[a]}/{SCHEDULE_NAMES[m]}"
                for a, m in zip(c.layer_types, c.mlp_layer_types)
            ],
            "hidden": c.hidden_size,
            "routed_experts": c.n_routed_experts,
            "dtype": args.dtype,
            "attn_implementation": c._attn_implementation,
            "experts_implementation": c._experts_implementation,
            **stats,
        },
        "config": config_summary(model, cfg),
        "settings": {
            "repeats": args.repeats,
            "warmup": args.warmup,
            "decode_warmup_steps": DECODE_WARMUP_STEPS,
            "timing": "CUDA events" if device.type == "cuda" else "time.perf_counter",
        },
    }
    max_tokens = max(max(args.prefill), args.context + DECODE_WARMUP_STEPS + args.decode_steps)
    if c.max_position_embeddings < max_tokens:
        raise SystemExit(f"the model's context ({c.max_position_embeddings}) is below {max_tokens}")

    prefill = []
    for n in args.prefill:
        log(f"prefill {n} tokens...")
        try:
            row = bench_prefill(model, device, c.vocab_size, n, args.warmup, args.repeats)
            log(f"prefill {n} tokens: {row['seconds']:.3f} s, {row['tokens_per_s']:.0f} tok/s")
        except Exception as e:  # noqa: BLE001 -- record and go on (OOM above all)
            row = {"tokens": n, "error": error_text(e)}
            log(f"prefill {n} tokens: {row['error']}")
        prefill.append(row)
        reset_memory(device)
    out["prefill"] = prefill

    decode = []
    base = None
    for chunk in (0, CONTEXT_CHUNK):  # whole, then in chunks if that runs out of memory
        how = "one forward" if chunk == 0 else f"chunks of {chunk} tokens"
        try:
            log(f"decode: prefilling a {args.context}-token context ({how})...")
            base, ctx_s = prefill_context(model, device, c.vocab_size, args.context, chunk=chunk)
            out["decode_context_prefill"] = {"how": how, "seconds": ctx_s}
            out.pop("decode_context_error", None)
            break
        except Exception as e:  # noqa: BLE001
            out["decode_context_error"] = error_text(e)
            log(f"decode context ({how}): {out['decode_context_error']}")
            reset_memory(device)
            if not is_oom(e) or args.context <= CONTEXT_CHUNK:
                break
    for batch in args.decode_batch:
        row = {"batch": batch, "context": args.context, "steps": args.decode_steps}
        reset_memory(device)
        try:
            if base is None:
                raise RuntimeError("no context cache: " + out.get("decode_context_error", "?"))
            row.update(bench_decode(model, device, c.vocab_size, base, batch, args.decode_steps))
            row["peak_memory_bytes"] = peak_memory(device)
            log(
                f"decode batch {batch} at {args.context} context: {row['step_ms']:.2f} ms/step, "
                f"{row['tokens_per_s']:.1f} tok/s"
            )
        except Exception as e:  # noqa: BLE001
            row["error"] = error_text(e)
            log(f"decode batch {batch}: {row['error']}")
        decode.append(row)
    out["decode"] = decode
    out["notes"] = (
        "transformers DeepseekV4ForCausalLM, eager attention, dequantised weights. prefill: one "
        "sequence from an empty DynamicCache, logits of the last token, median of the timed runs "
        "(seconds; seconds_min is the fastest). decode: the batch-1 cache of a prefilled context "
        "(ids as dsinfer bench) repeated into the batch, 3 warm-up steps, then the median of the "
        "timed single-token steps (step_ms). Same token ids as dsinfer bench. The MTP block is "
        "not loaded."
    )
    return out


def main(argv=None):
    args = parse_args(argv)
    out = run(args)
    text = json.dumps(out, indent=2)
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")
        log(f"wrote {args.output}")


if __name__ == "__main__":
    main()
