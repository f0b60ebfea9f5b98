#!/usr/bin/env python3
"""Evaluate an exported dsv4-mini model (official layout, dequantised exactly, fp32).

Reports (metrics JSON):
  * validation cross-entropy / perplexity of the main head and of the MTP head (next-next
    token) on fixed held-out windows ([BOS] + 512 tokens each, as in training);
  * a unigram baseline on the same target tokens (token frequencies of the training split,
    add-one smoothing);
  * MTP draft acceptance:
      - teacher-forced: fraction of positions i where argmax MTP(i) (a guess for token i+2 given
        the true token i+1) equals the main model's greedy argmax at i+1 given the true prefix,
        and where it equals the true token i+2;
      - greedy chain (= speculative decoding with one MTP draft under greedy sampling): generate
        greedily from held-out prompts, then the fraction of generated positions where the MTP
        draft equals the token the main model produced next;
  * greedy sample completions of a few prompts.
Also writes the first --sample-windows validation windows (int32 [n, 513]) for the C++ check.
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
from safetensors.torch import save_file
from tokenizers import Tokenizer

import common as C

PROMPTS = [
    "def fibonacci(n):\n",
    "import os\n\n\ndef list_python_files(root):\n    \"\"\"Return all .py files below root.\"\"\"\n",
    "class Stack:\n    \"\"\"A simple LIFO stack.\"\"\"\n\n    def __init__(self):\n",
    "def is_prime(n: int) -> bool:\n",
]
CHAT = "Write a Python function `def add(a, b):` that does the following: Return the sum of a and b."


def windows(path: str, n: int, seq: int) -> torch.Tensor:
    arr = torch.from_numpy(np.fromfile(path, dtype=np.uint16).astype(np.int64))
    n = min(n, (arr.numel() - 1) // seq)
    step = (arr.numel() - seq - 1) // max(n, 1)
    rows = [torch.cat([torch.zeros(1, dtype=torch.long), arr[i * step: i * step + seq]]) for i in range(n)]
    return torch.stack(rows)


@torch.no_grad()
def teacher_forced(model, mtp, samples: torch.Tensor, bs: int, device) -> dict:
    s = {"ce": 0.0, "ce_mtp": 0.0, "n": 0, "n_mtp": 0, "top1": 0, "mtp_top1": 0, "agree": 0}
    per_window = []
    for i in range(0, samples.shape[0], bs):
        x = samples[i:i + bs].to(device)
        logits, ml = C.forward_with_mtp(model, mtp, x[:, :-1])
        logits, ml = logits.float(), ml.float()
        V = logits.shape[-1]
        ce = F.cross_entropy(logits.reshape(-1, V), x[:, 1:].reshape(-1), reduction="none").view(x.shape[0], -1)
        cem = F.cross_entropy(ml.reshape(-1, V), x[:, 2:].reshape(-1), reduction="none")
        per_window += ce.mean(1).tolist()
        s["ce"] += float(ce.sum())
        s["ce_mtp"] += float(cem.sum())
        s["n"] += ce.numel()
        s["n_mtp"] += cem.numel()
        g = logits.argmax(-1)                      # g[:, j] = greedy guess for token j+1
        d = ml.argmax(-1)                          # d[:, i] = draft for token i+2
        s["top1"] += int((g == x[:, 1:]).sum())
        s["mtp_top1"] += int((d == x[:, 2:]).sum())
        s["agree"] += int((d == g[:, 1:]).sum())
    return {
        "loss": s["ce"] / s["n"], "ppl": math.exp(s["ce"] / s["n"]),
        "mtp_loss": s["ce_mtp"] / s["n_mtp"], "mtp_ppl": math.exp(s["ce_mtp"] / s["n_mtp"]),
        "top1_acc": s["top1"] / s["n"], "mtp_top1_acc_vs_true": s["mtp_top1"] / s["n_mtp"],
        "mtp_acceptance_vs_main_greedy": s["agree"] / s["n_mtp"],
        "tokens": s["n"], "windows": int(samples.shape[0]), "per_window_loss": per_window,
    }


@torch.no_grad()
def greedy(model, prompt: torch.Tensor, n_new: int) -> torch.Tensor:
    """prompt [B, P] -> [B, P+n_new]; full recompute each step (no cache: exact, simple)."""
    x = prompt
    for _ in range(n_new):
        nxt = model(input_ids=x, use_cache=False).logits[:, -1].float().argmax(-1, keepdim=True)
        x = torch.cat([x, nxt], 1)
    return x


@torch.no_grad()
def chain_acceptance(model, mtp, samples: torch.Tensor, n_prompts: int, prompt_len: int, n_new: int, device) -> dict:
    p = samples[:n_prompts, : prompt_len].to(device)
    seq = greedy(model, p, n_new)
    _, ml = C.forward_with_mtp(model, mtp, seq)
    d = ml.float().argmax(-1)                       # d[:, i] drafts token i+2
    lo = prompt_len - 1                             # first draft made after the first generated token
    hit = (d[:, lo: seq.shape[1] - 2] == seq[:, lo + 2:])
    return {"greedy_chain_acceptance": float(hit.float().mean()), "prompts": int(p.shape[0]),
            "prompt_tokens": prompt_len, "generated_tokens": n_new, "drafts": int(hit.numel())}


@torch.no_grad()
def samples_text(model, tok: Tokenizer, device, n_new: int) -> list[dict]:
    out = []
    plain = json.loads(tok.to_str())
    plain["added_tokens"] = []
    ptok = Tokenizer.from_str(json.dumps(plain))
    for p in PROMPTS:
        ids = [0] + ptok.encode(p, add_special_tokens=False).ids
        seq = greedy(model, torch.tensor([ids], device=device), n_new)[0].tolist()
        gen = seq[len(ids):]
        if 1 in gen:
            gen = gen[: gen.index(1)]
        out.append({"prompt": p, "completion": tok.decode(gen, skip_special_tokens=False)})
    ids = [0, tok.token_to_id(C.USER)] + ptok.encode(CHAT, add_special_tokens=False).ids + \
          [tok.token_to_id(C.ASSISTANT), tok.token_to_id(C.THINK_END)]
    seq = greedy(model, torch.tensor([ids], device=device), n_new)[0].tolist()
    gen = seq[len(ids):]
    if 1 in gen:
        gen = gen[: gen.index(1) + 1]
    out.append({"prompt": "<chat> " + CHAT, "completion": tok.decode(gen, skip_special_tokens=False)})
    return out


def unigram(train_bin: str | None, counts_path: str | None, vocab: int, samples: torch.Tensor):
    if counts_path and os.path.exists(counts_path):
        counts = np.load(counts_path)
    else:
        arr = np.fromfile(train_bin, dtype=np.uint16)
        counts = np.bincount(arr, minlength=vocab).astype(np.int64)
    p = (counts + 1.0) / (counts.sum() + vocab)
    tgt = samples[:, 1:].reshape(-1).numpy()
    ce = float(-np.log(p[tgt]).mean())
    return counts, {"loss": ce, "ppl": math.exp(ce), "smoothing": "add-one", "train_tokens": int(counts.sum())}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--val", required=True, help="val.bin (uint16 stream) or val_sample.safetensors")
    ap.add_argument("--train", help="train.bin (for unigram counts)")
    ap.add_argument("--counts", help="unigram_counts.npy (instead of --train)")
    ap.add_argument("--windows", type=int, default=256)
    ap.add_argument("--seq", type=int, default=C.SEQ_LEN)
    ap.add_argument("--bs", type=int, default=16)
    ap.add_argument("--chain-prompts", type=int, default=32)
    ap.add_argument("--chain-prompt-len", type=int, default=64)
    ap.add_argument("--chain-new", type=int, default=96)
    ap.add_argument("--sample-new", type=int, default=80)
    ap.add_argument("--sample-windows", type=int, default=8, help="windows saved for the C++ check")
    ap.add_argument("--out", required=True, help="metrics JSON")
    ap.add_argument("--save-dir", help="where to write val_sample.safetensors / unigram_counts.npy")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args(argv)
    import transformers
    transformers.utils.logging.set_verbosity_error()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    t0 = time.time()
    dev = torch.device(a.device)
    cfg, model, mtp = C.load_official(a.model, dev)
    if a.val.endswith(".safetensors"):
        from safetensors.torch import load_file
        samples = load_file(a.val)["windows"].long()[: a.windows]
    else:
        samples = windows(a.val, a.windows, a.seq)
    m = {"model": os.path.abspath(a.model), "device": str(dev), "numerics": "fp32, dequantised official weights"}
    counts, m["unigram"] = unigram(a.train, a.counts, cfg.vocab_size, samples)
    m["val"] = teacher_forced(model, mtp, samples, a.bs, dev)
    print(f"val loss {m['val']['loss']:.4f} ppl {m['val']['ppl']:.2f} | unigram {m['unigram']['loss']:.4f} "
          f"ppl {m['unigram']['ppl']:.1f} | mtp acc-vs-greedy {m['val']['mtp_acceptance_vs_main_greedy']:.3f}",
          flush=True)
    if a.chain_prompts > 0:
        m["mtp_chain"] = chain_acceptance(model, mtp, samples, a.chain_prompts, a.chain_prompt_len, a.chain_new, dev)
        print(f"greedy chain acceptance {m['mtp_chain']['greedy_chain_acceptance']:.3f}", flush=True)
    if a.sample_new > 0:
        tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
        m["samples"] = samples_text(model, tok, dev, a.sample_new)
    if a.save_dir:
        os.makedirs(a.save_dir, exist_ok=True)
        save_file({"windows": samples[: a.sample_windows].to(torch.int32).contiguous()},
                  os.path.join(a.save_dir, "val_sample.safetensors"))
        np.save(os.path.join(a.save_dir, "unigram_counts.npy"), counts)
    m["seconds"] = round(time.time() - t0, 1)
    with open(a.out, "w") as f:
        json.dump(m, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
