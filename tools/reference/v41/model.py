"""DeepSeek V4.1 text backbone, written from spec/deepseek-v41.md (our own code).

One forward over a chunk of positions with an explicit per-sequence state, so that a prompt can be
run whole or in chunks. Weights are a dict of fp32 tensors under the official (DeepInfer) names,
already dequantised. Two numerics:

* ``reference``: what the transformers port computes in fp32: fp32 activations, exact weights,
  the model's own quantisation points (window KV FP8 1x32 UE8M0, compressed KV FP4 e2m1 / 16 /
  E4M3, index queries and keys FP4 e2m1 / 32 / UE8M0), indexer scores scaled by
  index_head_dim^-1/2 and index_n_heads^-1/2, router logits divided by gate_temp.
* ``deepseek``: DeepInfer's differences from that: no indexer scaling, gate_temp unread,
  candidate block scores capped at the largest finite bf16, the compressed-KV E4M3 scale clamped
  at 448.

DSpark (spec §7): the forward writes each draft block's context KV from the target layers'
features (State.dspark); Model.draft runs the blocks over [anchor, noise x (B - 1)] and the
Markov / confidence heads. The vision path is not part of this file.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

BF16_MAX = float(torch.finfo(torch.bfloat16).max)


# ---------------------------------------------------------------------------------------------
# Config and derived schedule (spec §1, §2)


@dataclasses.dataclass
class Config:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    qk_rope_head_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    sliding_window: int
    rope_theta: float
    compress_rope_theta: float
    yarn: dict | None  # {factor, original_max_position_embeddings, beta_fast, beta_slow}
    compress_ratios: list  # backbone entries
    kv_source_layer_ids: list
    index_source_layer_ids: list
    index_k_source_layer_ids: list
    candidate_source_layer_id: int
    candidate_topk_blocks: int
    candidate_block_size: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    moe_intermediate_size: int
    n_routed_experts: int
    num_experts_per_tok: int
    routed_scaling_factor: float
    gate_temp: float
    swiglu_limit: float
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    rms_norm_eps: float
    engram_layer_ids: list
    engram_vocab_size: int
    engram_max_ngram_size: int
    engram_n_heads: int
    engram_head_dim: int
    engram_pad_token_id: int
    engram_compressed_vocab_size: int
    use_fp4_sparse_kv: bool = True
    num_nextn_predict_layers: int = 0
    dspark_target_layer_ids: list = dataclasses.field(default_factory=list)
    dspark_num_experts_per_tok: int = 0
    dspark_noise_token_id: int = 0

    @staticmethod
    def from_text_config(t: dict) -> "Config":
        n = t["num_hidden_layers"]
        rs = t.get("rope_scaling")
        yarn = None
        if rs and rs.get("rope_type", rs.get("type")) == "yarn":
            yarn = {k: rs[k] for k in ("factor", "original_max_position_embeddings")}
            yarn["beta_fast"] = rs.get("beta_fast", 32)
            yarn["beta_slow"] = rs.get("beta_slow", 1)
        kv = list(t["kv_source_layer_ids"])
        return Config(
            vocab_size=t["vocab_size"],
            hidden_size=t["hidden_size"],
            num_hidden_layers=n,
            num_attention_heads=t["num_attention_heads"],
            head_dim=t["head_dim"],
            qk_rope_head_dim=t["qk_rope_head_dim"],
            q_lora_rank=t["q_lora_rank"],
            o_groups=t["o_groups"],
            o_lora_rank=t["o_lora_rank"],
            sliding_window=t["sliding_window"],
            rope_theta=float(t.get("rope_theta", 10000.0)),
            compress_rope_theta=float(t.get("compress_rope_theta", 160000.0)),
            yarn=yarn,
            compress_ratios=list(t["compress_ratios"][:n]),
            kv_source_layer_ids=kv,
            index_source_layer_ids=list(t["index_source_layer_ids"]),
            index_k_source_layer_ids=list(t.get("index_k_source_layer_ids", kv)),
            candidate_source_layer_id=t.get("candidate_source_layer_id", kv[-1] if kv else -1),
            candidate_topk_blocks=t.get("candidate_topk_blocks", 2048),
            candidate_block_size=t.get("candidate_block_size", 8),
            index_n_heads=t["index_n_heads"],
            index_head_dim=t["index_head_dim"],
            index_topk=t["index_topk"],
            moe_intermediate_size=t["moe_intermediate_size"],
            n_routed_experts=t["n_routed_experts"],
            num_experts_per_tok=t["num_experts_per_tok"],
            routed_scaling_factor=t.get("routed_scaling_factor", 1.0),
            gate_temp=t.get("gate_temp", 1.0),
            swiglu_limit=t.get("swiglu_limit", 0.0),
            hc_mult=t.get("hc_mult", 4),
            hc_sinkhorn_iters=t.get("hc_sinkhorn_iters", 20),
            hc_eps=t.get("hc_eps", 1e-6),
            rms_norm_eps=t.get("rms_norm_eps", 1e-20),
            engram_layer_ids=list(t.get("engram_layer_ids", [])),
            engram_vocab_size=t.get("engram_vocab_size", 0),
            engram_max_ngram_size=t.get("engram_max_ngram_size", 4),
            engram_n_heads=t.get("engram_n_heads", 8),
            engram_head_dim=t.get("engram_head_dim", 256),
            engram_pad_token_id=t.get("engram_pad_token_id", t.get("engram_pad_id", 2)),
            engram_compressed_vocab_size=t.get("engram_compressed_vocab_size", 0),
            use_fp4_sparse_kv=t.get("use_fp4_sparse_kv", True),
            num_nextn_predict_layers=t.get("num_nextn_predict_layers", 0),
            dspark_target_layer_ids=list(t.get("dspark_target_layer_ids", [])),
            dspark_num_experts_per_tok=t.get("dspark_num_experts_per_tok", 0),
            dspark_noise_token_id=t.get("dspark_noise_token_id", 0),
        )

    @staticmethod
    def _nearest(ids, layer):
        best = -1
        for s in ids:
            if s <= layer:
                best = s
        return best

    def kv_owner(self, layer):
        return self._nearest(self.kv_source_layer_ids, layer)

    def topk_source(self, layer):
        return self._nearest(self.index_source_layer_ids, layer)

    def index_key_owner(self, layer):
        return self._nearest(self.index_k_source_layer_ids, layer)


# ---------------------------------------------------------------------------------------------
# Quantisation points (spec §3.4–§3.6, §6.1)

_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def pow2_ceil(t: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2 t) for positive fp32 t, exactly (frexp: t = m 2^e, m in [0.5, 1))."""
    m, e = torch.frexp(t)
    e = torch.where(m == 0.5, e - 1, e)
    return torch.ldexp(torch.ones_like(t), e)


def e2m1_round(v: torch.Tensor) -> torch.Tensor:
    """Round |v| <= 6 to the nearest E2M1 value, ties to the even code."""
    a = v.abs()
    # Candidate codes: index of the largest grid value <= a, and the next one.
    grid = _E2M1.to(v.device)
    lo = torch.searchsorted(grid, a.contiguous(), right=True) - 1
    lo = lo.clamp(0, 7)
    hi = (lo + 1).clamp(max=7)
    glo, ghi = grid[lo], grid[hi]
    dlo, dhi = a - glo, ghi - a
    take_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0) & (hi != lo))
    r = torch.where(take_hi, ghi, glo)
    return torch.where(torch.signbit(v), -r, r)


def fp8_window_quant(x: torch.Tensor) -> torch.Tensor:
    """FP8 E4M3 per 32 values, UE8M0 scale 2^ceil(log2(max(amax, 1e-4)/448))."""
    b = x.float().unflatten(-1, (-1, 32))
    amax = b.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    s = pow2_ceil(amax * (1.0 / 448.0))
    q = (b / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float()
    return (q * s).flatten(-2)


def fp4_index_quant(x: torch.Tensor) -> torch.Tensor:
    """FP4 E2M1 per 32 values, UE8M0 scale 2^ceil(log2(max(amax, 6 2^-126)/6))."""
    b = x.float().unflatten(-1, (-1, 32))
    amax = b.abs().amax(-1, keepdim=True).clamp_min(6.0 * 2.0**-126)
    s = pow2_ceil(amax * (1.0 / 6.0))
    return (e2m1_round((b / s).clamp(-6.0, 6.0)) * s).flatten(-2)


def fp4_compressed_quant(x: torch.Tensor, clamp_scale: bool) -> torch.Tensor:
    """FP4 E2M1 per 16 values, E4M3 scale e4m3(max(amax, 6 2^-9)/6) (DeepInfer: min(., 448))."""
    b = x.float().unflatten(-1, (-1, 16))
    amax = b.abs().amax(-1, keepdim=True).clamp_min(6.0 * 2.0**-9)
    s = amax / 6.0
    if clamp_scale:
        s = s.clamp_max(448.0)
    s = s.to(torch.float8_e4m3fn).float()
    return (e2m1_round((b / s).clamp(-6.0, 6.0)) * s).flatten(-2)


# ---------------------------------------------------------------------------------------------
# RoPE (interleaved pairs on the last rope dims; V4-spec §3.4)


def inv_freq(cfg: Config, table: str) -> torch.Tensor:
    d = cfg.qk_rope_head_dim
    base = cfg.rope_theta if table == "main" else cfg.compress_rope_theta
    pos = base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    inv = 1.0 / pos
    if table == "main" or cfg.yarn is None:
        return inv
    y = cfg.yarn
    factor, orig = float(y["factor"]), float(y["original_max_position_embeddings"])

    def corr(rot):
        return (d * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(corr(y["beta_fast"])), 0)
    high = min(math.ceil(corr(y["beta_slow"])), d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrap = 1.0 - ramp
    return (1.0 / (factor * pos)) * (1 - extrap) + inv * extrap


def rope(x: torch.Tensor, pos: torch.Tensor, inv: torch.Tensor, inverse=False) -> torch.Tensor:
    """x [..., T, (H,) D]; rotates pairs (2i, 2i+1) of the last len(inv)*2 dims by pos*inv."""
    rd = inv.numel() * 2
    ang = pos.float()[:, None] * inv[None, :]  # [T, rd/2]
    cos, sin = ang.cos(), ang.sin()
    if inverse:
        sin = -sin
    while cos.dim() < x.dim():
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    nope, r = x[..., :-rd], x[..., -rd:]
    ev, od = r[..., 0::2], r[..., 1::2]
    rot = torch.stack([ev * cos - od * sin, ev * sin + od * cos], dim=-1).flatten(-2)
    return torch.cat([nope, rot], dim=-1)


# ---------------------------------------------------------------------------------------------
# Engram hashing (spec §4)


def engram_primes(cfg: Config):
    seen = set()
    out = []
    for _ in cfg.engram_layer_ids:
        layer = []
        for _n in range(2, cfg.engram_max_ngram_size + 1):
            cur = cfg.engram_vocab_size - 1
            for _h in range(cfg.engram_n_heads):
                c = cur + 1
                while not _is_prime(c) or c in seen:
                    c += 1
                seen.add(c)
                layer.append(c)
                cur = c
        out.append(layer)
    return out


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True


def engram_multipliers(cfg: Config):
    """Per Engram layer L: 2 r_i + 1, r = default_rng(10007 L).integers(0, B, max_ngram)."""
    bound = max(1, (np.iinfo(np.int64).max // cfg.engram_compressed_vocab_size) // 2)
    rows = []
    for layer in cfg.engram_layer_ids:
        r = np.random.default_rng(10007 * layer).integers(0, bound, size=(cfg.engram_max_ngram_size,), dtype=np.int64)
        rows.append([int(v) * 2 + 1 for v in r])
    return rows


def engram_rows(cfg: Config, phi: list, tokens: list, positions: list):
    """Row ids [len(positions), n_engram_layers, (N-1)*heads] (python ints, exact)."""
    primes = engram_primes(cfg)
    mults = engram_multipliers(cfg)
    pad = phi[cfg.engram_pad_token_id]
    out = []
    for p in positions:
        t = []
        blocked = False
        for r in range(cfg.engram_max_ngram_size):
            q = p - r
            if q < 0 or blocked or tokens[q] >= cfg.vocab_size:
                blocked = True
                t.append(pad)
            else:
                t.append(phi[tokens[q]])
        per_layer = []
        for li in range(len(cfg.engram_layer_ids)):
            m = mults[li]
            h = t[0] * m[0]
            cols, off, k = [], 0, 0
            for n in range(2, cfg.engram_max_ngram_size + 1):
                h ^= t[n - 1] * m[n - 1]
                for _j in range(cfg.engram_n_heads):
                    pr = primes[li][k]
                    cols.append(off + h % pr)
                    off += pr
                    k += 1
            per_layer.append(cols)
        out.append(per_layer)
    return out


# ---------------------------------------------------------------------------------------------
# The model


class State:
    """Per-sequence caches: every layer's window KV rows (dequantised), the compressed entries and
    index keys of each owner, the ratio-2 compressors' unfinished groups, the token history."""

    def __init__(self):
        self.tokens: list = []
        self.window: dict = {}  # layer -> [T, hd]
        self.compressed: dict = {}  # owner -> [G, hd]
        self.index_keys: dict = {}  # owner -> [G, idh]
        self.pending: dict = {}  # owner -> (z [n, hd], c [n, hd])
        self.dspark: dict = {}  # draft block -> [T, hd] context KV by position (zeros: unwritten)


class Model:
    def __init__(self, cfg: Config, w: dict, phi: list | None = None, numerics="reference"):
        assert numerics in ("reference", "deepseek")
        self.cfg, self.w, self.numerics = cfg, w, numerics
        self.phi = phi if phi is not None else list(range(cfg.vocab_size))
        self.inv = {"main": inv_freq(cfg, "main"), "compress": inv_freq(cfg, "compress")}
        # Instrumentation for margin checks: (kind, layer, position, sorted scores, k).
        self.selections: list = []

    # -- small pieces -----------------------------------------------------------------------
    def rms(self, x, weight=None):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps)
        return y if weight is None else y * weight

    def lin(self, name, x):
        return x @ self.w[name].T

    def mixes(self, X, p):
        cfg = self.cfg
        hc = cfg.hc_mult
        v = X.flatten(1)  # [T, hc*D]
        mu = (v @ self.w[p + "_fn"].T) * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)
        a, b = self.w[p + "_scale"], self.w[p + "_base"]
        pre = torch.sigmoid(mu[:, :hc] * a[0] + b[:hc]) + cfg.hc_eps
        post = 2 * torch.sigmoid(mu[:, hc : 2 * hc] * a[1] + b[hc : 2 * hc])
        comb = (mu[:, 2 * hc :] * a[2] + b[2 * hc :]).view(-1, hc, hc)
        comb = torch.softmax(comb, dim=-1) + cfg.hc_eps
        comb = comb / (comb.sum(-2, keepdim=True) + cfg.hc_eps)
        for _ in range(cfg.hc_sinkhorn_iters - 1):
            comb = comb / (comb.sum(-1, keepdim=True) + cfg.hc_eps)
            comb = comb / (comb.sum(-2, keepdim=True) + cfg.hc_eps)
        return pre, post, comb

    @staticmethod
    def expand(F, X, post, comb):
        return post[:, :, None] * F[:, None, :] + torch.einsum("tjk,tjd->tkd", comb, X)

    # -- attention ---------------------------------------------------------------------------
    def attention(self, L, x, pos, st: State, shared: dict, early=None, compressed_already=False):
        cfg, w = self.cfg, self.w
        p = f"layers.{L}.attn."
        ratio = cfg.compress_ratios[L]
        table = "main" if ratio == 0 else "compress"
        inv = self.inv[table]
        T = x.shape[0]
        H, hd = cfg.num_attention_heads, cfg.head_dim
        q_res = self.rms(self.lin(p + "wq_a.weight", x), w[p + "q_norm.weight"])
        q = rope(self.lin(p + "wq_b.weight", q_res).view(T, H, hd), pos, inv)
        kv = rope(self.rms(self.lin(p + "wkv.weight", x), w[p + "kv_norm.weight"]), pos, inv)
        kv = fp8_window_quant(kv)
        consumer = L >= self.boundary()
        narrowed = early is not None and consumer
        prev = st.window.get(L)
        if prev is None:
            prev = kv[:0]
        if prev.shape[0] < int(pos[0]):  # rows an early exit never computed: never visible
            prev = torch.cat([prev, torch.zeros(int(pos[0]) - prev.shape[0], kv.shape[1])])
        stored = kv if not (narrowed and early["placeholder"]) else torch.zeros_like(kv)
        allkv = torch.cat([prev, kv])
        st.window[L] = torch.cat([prev, stored])
        keys = [allkv]
        kpos = torch.arange(allkv.shape[0])
        # window mask [T, n_all]: key k visible iff p - W < k <= p (and k >= the kept tail's
        # start in an early-exit prefill's consumer layers)
        mask = (kpos[None, :] <= pos[:, None]) & (kpos[None, :] > pos[:, None] - cfg.sliding_window)
        if narrowed:
            mask = mask & (kpos[None, :] >= early["floor"])
        masks = [mask]
        if ratio > 0:
            owner = cfg.kv_owner(L)
            if owner == L and not compressed_already:
                self.compress(L, x, st)
            if cfg.topk_source(L) == L:
                shared["topk"] = self.indexer(L, x, q_res, pos, st, shared)
            comp = st.compressed.get(owner)
            if comp is not None and comp.shape[0] > 0:
                sel = shared["topk"]  # [T, G_at_topk_source] bool
                G = comp.shape[0]
                keys.append(comp)
                masks.append(sel[:, :G])
        K = torch.cat(keys)
        M = torch.cat(masks, dim=1)
        scores = torch.einsum("thd,kd->thk", q, K) * hd**-0.5
        scores = scores.masked_fill(~M[:, None, :], float("-inf"))
        sink = w[p + "attn_sink"][None, :, None].expand(T, H, 1)
        logits = torch.cat([scores, sink], dim=-1)
        probs = torch.softmax(logits, dim=-1)[..., :-1]
        o = torch.einsum("thk,kd->thd", probs, K)
        o = rope(o, pos, inv, inverse=True)
        G = cfg.o_groups
        o = o.reshape(T, G, H // G * hd)
        wa = w[p + "wo_a.weight"].view(G, cfg.o_lora_rank, -1)
        y = torch.einsum("tgi,goi->tgo", o, wa).reshape(T, -1)
        return self.lin(p + "wo_b.weight", y)

    def compress(self, L, x, st: State):
        """Owner L: close every group completed by this chunk, append its entry and index key."""
        cfg, w = self.cfg, self.w
        p = f"layers.{L}.attn."
        ratio = cfg.compress_ratios[L]
        first_new = len(st.tokens) - x.shape[0]  # absolute position of x[0]
        c = self.lin(p + "compressor.wkv.weight", x)
        if ratio > 1:
            z = self.lin(p + "compressor.wgate.weight", x)
            pz, pc = st.pending.get(L, (z[:0], c[:0]))
            z, c = torch.cat([pz, z]), torch.cat([pc, c])
            start = first_new - pz.shape[0]
            usable = (z.shape[0] // ratio) * ratio
            st.pending[L] = (z[usable:], c[usable:])
            z, c = z[:usable], c[:usable]
            g = usable // ratio
            if g == 0:
                return
            zz, cc = z.view(g, ratio, -1), c.view(g, ratio, -1)
            lat = (torch.softmax(zz, dim=1) * cc).sum(1)
        else:
            start = first_new
            lat = c
        lat = self.rms(lat, w[p + "compressor.norm.weight"])
        gpos = start + ratio * torch.arange(lat.shape[0])
        inv = self.inv["compress"]
        if L in cfg.index_k_source_layer_ids:
            k = self.rms(self.lin(p + "indexer.wk.weight", lat), w[p + "indexer.k_norm.weight"])
            k = fp4_index_quant(rope(k, gpos, inv))
            prev = st.index_keys.get(L)
            st.index_keys[L] = k if prev is None else torch.cat([prev, k])
        e = rope(lat, gpos, inv)
        if cfg.use_fp4_sparse_kv:
            e = fp4_compressed_quant(e, clamp_scale=self.numerics == "deepseek")
        else:  # the FP8 main record of the window rings (spec §6.1)
            e = fp8_window_quant(e)
        prev = st.compressed.get(L)
        st.compressed[L] = e if prev is None else torch.cat([prev, e])

    def indexer(self, L, x, q_res, pos, st: State, shared: dict):
        """Top-k selection mask [T, G] over the KV owner's compressed entries."""
        cfg, w = self.cfg, self.w
        p = f"layers.{L}.attn."
        ratio = cfg.compress_ratios[L]
        keys = st.index_keys.get(cfg.index_key_owner(L))
        T = x.shape[0]
        G = 0 if keys is None else keys.shape[0]
        if G == 0:
            return torch.zeros(T, 0, dtype=torch.bool)
        IH, ID = cfg.index_n_heads, cfg.index_head_dim
        q = rope(self.lin(p + "indexer.wq_b.weight", q_res).view(T, IH, ID), pos, self.inv["compress"])
        q = fp4_index_quant(q)
        s = torch.relu(torch.einsum("thd,gd->thg", q, keys))
        hw = self.lin(p + "indexer.weights_proj.weight", x)
        if self.numerics == "reference":
            s = s * ID**-0.5
            hw = hw * IH**-0.5
        score = (s * hw[:, :, None]).sum(1)  # [T, G]
        visible = (pos[:, None] + 1) // ratio  # entries < visible are visible
        gidx = torch.arange(G)
        score = score.masked_fill(gidx[None, :] >= visible, float("-inf"))
        if L == cfg.candidate_source_layer_id:
            shared["candidates"] = self.candidate_pool(L, score, visible, pos)
        elif 0 <= cfg.candidate_source_layer_id < L and "candidates" in shared:
            score = score.masked_fill(~shared["candidates"][:, :G], float("-inf"))
        k = min(cfg.index_topk, G)
        sel = torch.zeros(T, G, dtype=torch.bool)
        for t in range(T):
            row = score[t]
            order = torch.sort(row, descending=True, stable=True)
            vals, idx = order.values, order.indices
            n_valid = int((vals > float("-inf")).sum())
            kk = min(k, n_valid)
            sel[t, idx[:kk]] = True
            self.selections.append(("index", L, int(pos[t]), vals[:n_valid].clone(), kk))
        return sel

    def candidate_pool(self, L, score, visible, pos):
        cfg = self.cfg
        bs = cfg.candidate_block_size
        T, G = score.shape
        nb = (G + bs - 1) // bs
        padded = torch.full((T, nb * bs), float("-inf"))
        padded[:, :G] = score
        blk = padded.view(T, nb, bs).amax(-1)
        if self.numerics == "deepseek":
            blk = blk.clamp_max(BF16_MAX)
        newest = (visible[:, 0] - 1) // bs
        keep = torch.zeros(T, nb, dtype=torch.bool)
        for t in range(T):
            if int(visible[t, 0]) <= 0:
                continue
            row = blk[t].clone()
            row[int(newest[t])] = float("inf")
            order = torch.sort(row, descending=True, stable=True)
            vals, idx = order.values, order.indices
            n_valid = int((vals > float("-inf")).sum())
            kk = min(cfg.candidate_topk_blocks, n_valid)
            keep[t, idx[:kk]] = True
            self.selections.append(("candidate", L, int(pos[t]), vals[1:n_valid].clone(), kk - 1))
        return keep.repeat_interleave(bs, dim=1)[:, :G]

    # -- MoE -------------------------------------------------------------------------------
    def moe(self, L, x, prefix=None, k=None):
        cfg, w = self.cfg, self.w
        p = prefix if prefix is not None else f"layers.{L}.ffn."
        logits = self.lin(p + "gate.weight", x)
        if self.numerics == "reference":
            logits = logits / cfg.gate_temp
        s = torch.sqrt(torch.nn.functional.softplus(logits))
        biased = s + w[p + "gate.bias"]
        k = k if k is not None else cfg.num_experts_per_tok
        order = torch.sort(biased, dim=-1, descending=True, stable=True)
        idx = order.indices[:, :k]
        for t in range(x.shape[0]):
            self.selections.append(("router", L, t, order.values[t].clone(), k))
        wts = s.gather(1, idx)
        wts = wts / (wts.sum(-1, keepdim=True) + 1e-20) * cfg.routed_scaling_factor
        y = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(k):
                e = int(idx[t, j])
                y[t] += self.expert(p + f"experts.{e}.", x[t : t + 1], wts[t, j])[0]
        return y + self.expert(p + "shared_experts.", x, None)

    def expert(self, p, x, weight):
        lim = self.cfg.swiglu_limit
        g = self.lin(p + "w1.weight", x)
        u = self.lin(p + "w3.weight", x)
        if lim > 0:
            u = u.clamp(-lim, lim)
            g = g.clamp(max=lim)
        h = torch.nn.functional.silu(g) * u
        if weight is not None:
            h = h * weight
        return self.lin(p + "w2.weight", h)

    # -- Engram --------------------------------------------------------------------------------
    def engram(self, L, X, rows):
        """rows: [T, cols] row ids of this layer's table."""
        cfg, w = self.cfg, self.w
        p = f"layers.{L}.engram."
        T, hc, D = X.shape
        e = w[p + "embed.weight"][rows.flatten()].view(T, -1)
        kv = self.lin(p + "wkv.weight", e).view(T, hc + 1, D)
        key, value = kv[:, :hc], kv[:, hc]
        wk = w[p + "q_weight"] * w[p + "k_weight"]
        eps = cfg.rms_norm_eps
        rstd = torch.rsqrt(X.pow(2).mean(-1) + eps) * torch.rsqrt(key.pow(2).mean(-1) + eps)
        d = (X * wk[None] * key).sum(-1) * rstd * D**-0.5
        g = torch.sigmoid(torch.sign(d) * d.abs().clamp_min(1e-6).sqrt())
        return X + g[:, :, None] * value[:, None, :]

    # -- forward -----------------------------------------------------------------------------
    def boundary(self):
        r = self.cfg.compress_ratios
        return r.index(1) if 1 in r else len(r)

    def forward(self, ids: list, st: State, exit=None):
        """exit = (prompt_length N, keep_rows K): prefill early exit (spec §5.2); returns the
        logits of the consumer rows only, with the chunk index of the first one."""
        logits, first = self._forward(ids, st, exit)
        return logits if exit is None else (logits, first)

    def _forward(self, ids: list, st: State, exit):
        """Runs positions len(st.tokens) .. + len(ids) - 1; returns fp32 logits [T, vocab]."""
        cfg, w = self.cfg, self.w
        start = len(st.tokens)
        st.tokens.extend(ids)
        T = len(ids)
        pos = torch.arange(start, start + T)
        e = w["embed.weight"][torch.tensor(ids)]
        X = e[:, None, :].repeat(1, cfg.hc_mult, 1)
        pi = torch.zeros(T, cfg.hc_mult)
        pi[:, 0] = 1.0
        rows = None
        if cfg.engram_layer_ids:
            rows = torch.tensor(engram_rows(cfg, self.phi, st.tokens, list(range(start, start + T))))
        shared: dict = {}
        early = None
        first_row = 0
        if exit is not None:
            floor = max(0, exit[0] - exit[1])
            early = {"floor": floor, "placeholder": start + T <= floor}
        dspark = self.has_dspark()
        feats = {}
        for L in range(cfg.num_hidden_layers):
            p = f"layers.{L}."
            if L in cfg.engram_layer_ids:
                X = self.engram(L, X, rows[:, cfg.engram_layer_ids.index(L)])
            if dspark and L in cfg.dspark_target_layer_ids:
                feats[L] = (X.mean(1), pos)  # the streams entering the attention site
            pre, post, comb = self.mixes(X, p + "hc_attn")
            u = self.rms((pi[:, :, None] * X).sum(1), w[p + "attn_norm.weight"])
            done = False
            if early is not None and L == self.boundary():
                # The global KV from every row, then the consumer half on the kept rows only.
                self.compress(L, u, st)
                done = True
                keep = T - 1 if early["placeholder"] else max(0, early["floor"] - start)
                X, pi, pre, post, comb, u, pos = (
                    X[keep:],
                    pi[keep:],
                    pre[keep:],
                    post[keep:],
                    comb[keep:],
                    u[keep:],
                    pos[keep:],
                )
                first_row = keep
            a = self.attention(L, u, pos, st, shared, early, done)
            pi = pre
            X = self.expand(a, X, post, comb)
            pre, post, comb = self.mixes(X, p + "hc_ffn")
            u = (pi[:, :, None] * X).sum(1)
            f = self.moe(L, self.rms(u, w[p + "ffn_norm.weight"]))
            pi = pre
            X = self.expand(f, X, post, comb)
        if dspark and not (early is not None and early["placeholder"]):
            self.dspark_context(feats, pos, st)
        h = (pi[:, :, None] * X).sum(1)
        return self.rms(h, w["norm.weight"]) @ w["head.weight"].T, first_row

    # -- DSpark (spec §7) ----------------------------------------------------------------------
    def has_dspark(self):
        return self.cfg.num_nextn_predict_layers > 0 and "mtp.0.main_proj.weight" in self.w

    def dspark_context(self, feats, pos, st: State):
        """Context KV of the rows at `pos` (the rows that ran the consumer half) for every block."""
        cfg, w = self.cfg, self.w
        parts = []
        for L in cfg.dspark_target_layer_ids:
            f, fpos = feats[L]
            parts.append(f[int(pos[0] - fpos[0]) :])  # rows cut after the capture drop out
        main_x = self.rms(self.lin("mtp.0.main_proj.weight", torch.cat(parts, -1)), w["mtp.0.main_norm.weight"])
        end = int(pos[-1]) + 1
        for b in range(cfg.num_nextn_predict_layers):
            p = f"mtp.{b}.attn."
            kv = self.rms(self.lin(p + "wkv.weight", main_x), w[p + "kv_norm.weight"])
            kv = fp8_window_quant(rope(kv, pos, self.inv["main"]))
            ring = st.dspark.get(b, torch.zeros(0, cfg.head_dim))
            if ring.shape[0] < end:
                ring = torch.cat([ring, torch.zeros(end - ring.shape[0], cfg.head_dim)])
            ring = ring.clone()
            ring[pos] = kv
            st.dspark[b] = ring

    def draft(self, st: State, anchor: int, B: int, temperature: float = 1.0, sample=None):
        """One draft block after the sequence in `st` (positions a+1 .. a+B, a = last computed
        position): returns (tokens, logits [B, vocab], confidences [B], hidden [B, D])."""
        cfg, w = self.cfg, self.w
        a = len(st.tokens) - 1
        H, hd, D, W = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size, cfg.sliding_window
        ids = [anchor] + [cfg.dspark_noise_token_id] * (B - 1)
        pos = torch.arange(a + 1, a + 1 + B)
        e = w["embed.weight"][torch.tensor(ids)]
        X = e[:, None, :].repeat(1, cfg.hc_mult, 1)
        pi = torch.zeros(B, cfg.hc_mult)
        pi[:, 0] = 1.0
        inv = self.inv["main"]
        for b in range(cfg.num_nextn_predict_layers):
            p = f"mtp.{b}."
            pre, post, comb = self.mixes(X, p + "hc_attn")
            u = self.rms((pi[:, :, None] * X).sum(1), w[p + "attn_norm.weight"])
            ap = p + "attn."
            q_res = self.rms(self.lin(ap + "wq_a.weight", u), w[ap + "q_norm.weight"])
            q = rope(self.lin(ap + "wq_b.weight", q_res).view(B, H, hd), pos, inv)
            kv = fp8_window_quant(rope(self.rms(self.lin(ap + "wkv.weight", u), w[ap + "kv_norm.weight"]), pos, inv))
            ctx = st.dspark[b][max(0, a - W + 1) : a + 1]
            K = torch.cat([ctx, kv])  # every block row sees the context window and all block rows
            scores = torch.einsum("thd,kd->thk", q, K) * hd**-0.5
            sink = w[ap + "attn_sink"][None, :, None].expand(B, H, 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
            o = rope(torch.einsum("thk,kd->thd", probs, K), pos, inv, inverse=True)
            G = cfg.o_groups
            wa = w[ap + "wo_a.weight"].view(G, cfg.o_lora_rank, -1)
            y = torch.einsum("tgi,goi->tgo", o.reshape(B, G, H // G * hd), wa).reshape(B, -1)
            pi = pre
            X = self.expand(self.lin(ap + "wo_b.weight", y), X, post, comb)
            pre, post, comb = self.mixes(X, p + "hc_ffn")
            u = (pi[:, :, None] * X).sum(1)
            f = self.moe(-1, self.rms(u, w[p + "ffn_norm.weight"]), p + "ffn.", cfg.dspark_num_experts_per_tok)
            pi = pre
            X = self.expand(f, X, post, comb)
        h = (pi[:, :, None] * X).sum(1)
        last = f"mtp.{cfg.num_nextn_predict_layers - 1}."
        base = self.rms(h, w[last + "norm.weight"]) @ w["head.weight"].T
        E = w[last + "markov_head.embed.weight"]
        Mh = w[last + "markov_head.head.weight"]
        cw = w[last + "confidence_head.proj.weight"][0]
        tokens, logits, conf = [], [], []
        prev = anchor
        for k in range(B):
            em = E[prev]
            lk = base[k] + Mh @ em
            z = torch.dot(cw, torch.cat([h[k], em]))
            conf.append(torch.sigmoid((z / temperature).clamp(-60, 60)))
            d = int(torch.argmax(lk)) if sample is None else int(sample(k, lk))
            tokens.append(d)
            logits.append(lk)
            prev = d
        return tokens, torch.stack(logits), torch.stack(conf), h
