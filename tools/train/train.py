#!/usr/bin/env python3
"""Train dsv4-mini: transformers' DeepseekV4ForCausalLM + the MTP block (spec 3.11).

Loss = CE(next token) + mtp_weight * CE(next-next token from the MTP block).
Data: packed uint16 token streams from tokenizer.py (train.bin / val.bin); every sample is
[BOS] + a random window of SEQ_LEN tokens of the stream (documents are joined by EOS BOS).

Router bias (e_score_correction_bias, not trained by gradient): DeepSeek's auxiliary-loss-free
balancing, bias_e += gamma * sign(mean_load - load_e) after every step, for every score-routed
gate (main layers and MTP). Hash-routed layers use a fixed seeded tid2eid table.

Schedule: linear warm-up, cosine decay to 10 %. With --steps 0 the number of steps is set from
the measured speed of the first steps so that training fits --time-budget seconds; a hard
deadline stops earlier if needed. Resumable: --resume continues from --ckpt (model, MTP,
optimizer, router biases, RNG, step counter); --extend-steps N raises the step total.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

import common as C


def log(msg: str, fh=None):
    line = f"[{time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    if fh is not None:
        fh.write(line + "\n")
        fh.flush()


class Stream:
    def __init__(self, path: str, device, seq: int):
        arr = np.fromfile(path, dtype=np.uint16).astype(np.int32)
        self.data = torch.from_numpy(arr).to(device)
        self.n = self.data.numel()
        self.seq = seq
        self.device = device

    def batch(self, offsets: torch.Tensor) -> torch.Tensor:
        """[B, seq+1]: BOS + seq tokens starting at each offset."""
        idx = offsets[:, None] + torch.arange(self.seq, device=self.device)[None, :]
        toks = self.data[idx].long()
        bos = torch.zeros((offsets.numel(), 1), dtype=torch.long, device=self.device)
        return torch.cat([bos, toks], dim=1)

    def random_offsets(self, b: int, gen: torch.Generator) -> torch.Tensor:
        return torch.randint(0, self.n - self.seq - 1, (b,), generator=gen, device="cpu").to(self.device)

    def fixed_offsets(self, n: int) -> torch.Tensor:
        """n evenly spaced, non-overlapping windows (the validation set used everywhere)."""
        n = min(n, (self.n - 1) // self.seq)
        step = (self.n - self.seq - 1) // max(n, 1)
        return torch.arange(n, device=self.device) * step


def losses(model, mtp, sample: torch.Tensor):
    """sample [B, T+1] -> (main CE, MTP CE) means, fp32."""
    inp = sample[:, :-1]
    logits, mtp_logits = C.forward_with_mtp(model, mtp, inp)
    V = logits.shape[-1]
    main = F.cross_entropy(logits.float().reshape(-1, V), sample[:, 1:].reshape(-1))
    mtp_l = F.cross_entropy(mtp_logits.float().reshape(-1, V), sample[:, 2:].reshape(-1))
    return main, mtp_l


@torch.no_grad()
def evaluate(model, mtp, stream: Stream, offsets: torch.Tensor, bs: int, autocast: bool):
    dev_type = offsets.device.type
    model.eval()
    mtp.eval()
    tot = tot_m = 0.0
    n = 0
    for i in range(0, offsets.numel(), bs):
        s = stream.batch(offsets[i:i + bs])
        with torch.autocast(dev_type, dtype=torch.bfloat16, enabled=autocast):
            a, b = losses(model, mtp, s)
        k = s.shape[0]
        tot += float(a) * k
        tot_m += float(b) * k
        n += k
    model.train()
    mtp.train()
    return tot / n, tot_m / n


def param_groups(model, mtp, wd: float):
    decay, no_decay = [], []
    seen = set()
    for mod in (model, mtp):
        for name, p in mod.named_parameters():
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            is_matrix = p.ndim >= 2 and not name.endswith(("hc.fn", "hc_fn"))
            (decay if is_matrix and "embed" not in name else no_decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


class BiasBalancer:
    """Aux-loss-free load balancing: count top-k picks per expert, nudge the selection bias."""

    def __init__(self, gates, n_experts: int, gamma: float):
        self.gates = gates
        self.gamma = gamma
        self.n = n_experts
        self.counts = {k: None for k, _ in gates}
        self.handles = [g.register_forward_hook(self._hook(k)) for k, g in gates]
        self.enabled = True

    def _hook(self, key):
        def hook(_m, _inp, out):
            if not self.enabled:
                return
            c = torch.bincount(out[2].reshape(-1), minlength=self.n).float()
            self.counts[key] = c if self.counts[key] is None else self.counts[key] + c
        return hook

    @torch.no_grad()
    def update(self) -> float:
        worst = 0.0
        for k, g in self.gates:
            c = self.counts[k]
            if c is None:
                continue
            mean = c.mean()
            g.e_score_correction_bias.add_(self.gamma * torch.sign(mean - c))
            worst = max(worst, float(c.max() / mean))
            self.counts[k] = None
        return worst


def save_ckpt(path, model, mtp, opt, state):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "mtp": mtp.state_dict(), "opt": opt.state_dict(),
                "state": state}, tmp)
    os.replace(tmp, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="dir with train.bin / val.bin")
    ap.add_argument("--ckpt", required=True, help="checkpoint dir (ckpt.pt, train_log.txt)")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--steps", type=int, default=0, help="0 = from --time-budget and measured speed")
    ap.add_argument("--extend-steps", type=int, default=0)
    ap.add_argument("--time-budget", type=float, default=420.0, help="seconds of training wanted")
    ap.add_argument("--deadline", type=float, default=0.0, help="absolute time.time() to stop at")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--bias-gamma", type=float, default=1e-3)
    ap.add_argument("--probe-steps", type=int, default=12)
    ap.add_argument("--eval-windows", type=int, default=128)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--ckpt-every-s", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seq", type=int, default=C.SEQ_LEN)
    ap.add_argument("--amp", action="store_true", help="bf16 autocast on CPU too (always on for CUDA)")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test: 2-layer tiny config")
    a = ap.parse_args(argv)

    t_start = time.time()
    os.makedirs(a.ckpt, exist_ok=True)
    fh = open(os.path.join(a.ckpt, "train_log.txt"), "a")
    dev = torch.device(a.device)
    use_amp = dev.type == "cuda" or a.amp
    torch.backends.cuda.matmul.allow_tf32 = True
    import transformers
    transformers.utils.logging.set_verbosity_error()

    arch = dict(C.ARCH)
    if a.tiny:
        arch.update(num_hidden_layers=4, layer_types=arch["layer_types"][:4], mlp_layer_types=arch["mlp_layer_types"][:4])
    sp, cfg, model, mtp = C.build_models(arch, seed=a.seed)
    model.to(dev).train()
    mtp.to(dev).train()
    log(f"params: main {C.count_params(model):,} mtp {C.count_params(mtp):,} device {dev}", fh)

    train = Stream(os.path.join(a.data, "train.bin"), dev, a.seq)
    val = Stream(os.path.join(a.data, "val.bin"), dev, a.seq)
    val_off = val.fixed_offsets(a.eval_windows)
    log(f"train tokens {train.n:,} val tokens {val.n:,} eval windows {val_off.numel()}", fh)

    opt = torch.optim.AdamW(param_groups(model, mtp, a.wd), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            fused=dev.type == "cuda")
    gen = torch.Generator().manual_seed(a.seed)
    state = {"step": 0, "total_steps": a.steps, "tokens": 0, "train_seconds": 0.0, "history": [],
             "args": vars(a), "arch": arch}
    ck = os.path.join(a.ckpt, "ckpt.pt")
    if a.resume and os.path.exists(ck):
        d = torch.load(ck, map_location=dev, weights_only=False)
        model.load_state_dict(d["model"])
        mtp.load_state_dict(d["mtp"])
        opt.load_state_dict(d["opt"])
        state = d["state"]
        gen.set_state(state["gen_state"])
        state["total_steps"] += a.extend_steps
        log(f"resumed at step {state['step']} / {state['total_steps']}", fh)

    bal = BiasBalancer(C.score_gates(model, mtp), cfg.n_routed_experts, a.bias_gamma)
    deadline = a.deadline if a.deadline > 0 else t_start + a.time_budget + 120
    t_train0 = time.time()
    budget_end = t_train0 + a.time_budget
    last_ck = time.time()
    acc = {"loss": 0.0, "mtp": 0.0, "n": 0, "imb": 0.0}
    t_log = time.time()
    probe_t0 = None
    while True:
        step = state["step"]
        if state["total_steps"] and step >= state["total_steps"]:
            break
        if time.time() > min(deadline, budget_end + 60):
            log(f"deadline reached at step {step}", fh)
            break
        if step == state.get("probe_start", 2) and probe_t0 is None and not state["total_steps"]:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            probe_t0 = time.time()
            state["probe_start"] = step
        if probe_t0 is not None and not state["total_steps"] and step == state["probe_start"] + a.probe_steps:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            dt = (time.time() - probe_t0) / a.probe_steps
            remaining = budget_end - time.time()
            state["total_steps"] = step + max(1, int(0.97 * remaining / dt))
            state["probe_step_seconds"] = dt
            log(f"probe: {dt * 1000:.1f} ms/step -> total_steps {state['total_steps']}", fh)
        if (probe_t0 is not None and state.get("probe_step_seconds") and not state.get("retargeted")
                and step == max(a.warmup, state["probe_start"] + 2 * a.probe_steps)):
            # re-estimate once, at the end of warm-up (the cosine has not started, so changing the
            # total here does not bend the schedule): the first probe is noisy
            if dev.type == "cuda":
                torch.cuda.synchronize()
            dt = (time.time() - probe_t0) / (step - state["probe_start"])
            state["total_steps"] = step + max(1, int(0.97 * (budget_end - time.time()) / dt))
            state["retargeted"] = True
            log(f"re-probe: {dt * 1000:.1f} ms/step -> total_steps {state['total_steps']}", fh)
        total_for_lr = state["total_steps"] or 10 ** 9
        lr = lr_at(step, total_for_lr, a.lr, a.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        sample = train.batch(train.random_offsets(a.batch, gen))
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_amp):
            main_l, mtp_l = losses(model, mtp, sample)
            loss = main_l + a.mtp_weight * mtp_l
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(list(model.parameters()) + list(mtp.parameters()), 1.0)
        opt.step()
        acc["imb"] = max(acc["imb"], bal.update())
        state["step"] += 1
        state["tokens"] += sample.shape[0] * (sample.shape[1] - 1)
        acc["loss"] += float(main_l.detach())
        acc["mtp"] += float(mtp_l.detach())
        acc["n"] += 1
        if state["step"] % a.log_every == 0 or state["step"] == state["total_steps"]:
            el = time.time() - t_log
            rec = {"step": state["step"], "loss": acc["loss"] / acc["n"], "mtp_loss": acc["mtp"] / acc["n"],
                   "lr": lr, "grad_norm": float(gn), "max_expert_load_over_mean": acc["imb"],
                   "tok_per_s": acc["n"] * a.batch * a.seq / el, "elapsed": time.time() - t_start}
            state["history"].append(rec)
            log(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.items()), fh)
            acc = {"loss": 0.0, "mtp": 0.0, "n": 0, "imb": 0.0}
            t_log = time.time()
        if time.time() - last_ck > a.ckpt_every_s:
            state["gen_state"] = gen.get_state()
            state["train_seconds"] += time.time() - t_train0
            t_train0 = time.time()
            save_ckpt(ck, model, mtp, opt, state)
            last_ck = time.time()
    state["train_seconds"] += time.time() - t_train0
    bal.enabled = False
    vl, vm = evaluate(model, mtp, val, val_off, 16, use_amp)
    state["final_val"] = {"loss": vl, "mtp_loss": vm, "ppl": math.exp(vl), "windows": int(val_off.numel()),
                          "autocast_bf16": use_amp}
    log(f"final val loss {vl:.4f} (ppl {math.exp(vl):.2f}) mtp {vm:.4f}; steps {state['step']} "
        f"tokens {state['tokens']:,} train {state['train_seconds']:.0f}s", fh)
    state["gen_state"] = gen.get_state()
    save_ckpt(ck, model, mtp, opt, state)
    with open(os.path.join(a.ckpt, "train_state.json"), "w") as f:
        json.dump({k: v for k, v in state.items() if k != "gen_state"}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
