#!/usr/bin/env python3
"""Byte-level BPE vocabulary for dsv4-mini (Hugging Face tokenizers).

Same layout as DeepSeek V4's tokenizer.json: empty normalizer Sequence, the DeepSeek
pre-tokenizer (digits 1-3, CJK runs, the V3/V4 split regex, then ByteLevel without regex),
ByteLevel decoder and post-processor. ids 0/1/2 are BOS/EOS/pad; the DeepSeek added tokens
(<｜User｜>, <｜Assistant｜>, <think>, </think>, ｜DSML｜, <｜latest_reminder｜>, <｜System｜>, task
and FIM tokens) follow the BPE vocabulary with DeepSeek's special/normalized flags, so the
total is exactly common.VOCAB_SIZE.

Trained on a seeded sample of the training split (text documents and chat answers).
Deterministic for a given corpus (tokenizers' BPE trainer is deterministic).

Also: tokenize the corpus into packed uint16 token streams (see pack()).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from multiprocessing import Pool

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

import common as C

DS_SPLIT = (
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
)


def pre_tokenizer_json() -> dict:
    def split(rx):
        return {"type": "Split", "pattern": {"Regex": rx}, "behavior": "Isolated", "invert": False}
    return {"type": "Sequence", "pretokenizers": [
        split("\\p{N}{1,3}"),
        split("[一-龥぀-ゟ゠-ヿ]+"),
        split(DS_SPLIT),
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
    ]}


def iter_texts(path: str, max_chars: int, seed: int):
    """Seeded sample of documents (text, or chat instruction+answer) up to max_chars."""
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    random.Random(seed).shuffle(lines)
    n = 0
    for ln in lines:
        d = json.loads(ln)
        t = d["text"] if "text" in d else "\n".join(x for x in d["chat"] if x)
        yield t
        n += len(t)
        if n >= max_chars:
            break


def train_tokenizer(train_jsonl: str, out_path: str, sample_mb: float, seed: int) -> dict:
    t0 = time.time()
    tok = Tokenizer(models.BPE())
    j = json.loads(tok.to_str())
    j["pre_tokenizer"] = pre_tokenizer_json()
    tok = Tokenizer.from_str(json.dumps(j))
    tok.decoder = decoders.ByteLevel()
    n_added = len(C.ADDED_TOKENS)
    trainer = trainers.BpeTrainer(
        vocab_size=C.VOCAB_SIZE - n_added,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=list(C.SPECIAL_FIXED),
    )
    tok.train_from_iterator(iter_texts(train_jsonl, int(sample_mb * 1e6), seed), trainer)
    tok.add_tokens([AddedToken(c, special=s, normalized=n) for c, s, n in C.ADDED_TOKENS])
    j = json.loads(tok.to_str())
    j["normalizer"] = {"type": "Sequence", "normalizers": []}
    j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True}
    j["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    # BOS/EOS/pad: special, not normalized (as DeepSeek's file)
    for a in j["added_tokens"]:
        if a["content"] in C.SPECIAL_FIXED:
            a["normalized"] = False
            a["special"] = True
    text = json.dumps(j, ensure_ascii=False, indent=1) + "\n"
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(text)
    tok = Tokenizer.from_file(out_path)
    ids = {c: tok.token_to_id(c) for c in C.SPECIAL_FIXED + [c for c, _, _ in C.ADDED_TOKENS]}
    assert ids[C.BOS] == 0 and ids[C.EOS] == 1 and ids[C.PAD] == 2, ids
    assert tok.get_vocab_size() <= C.VOCAB_SIZE, tok.get_vocab_size()
    return {"vocab_size": tok.get_vocab_size(), "bpe_merges": len(j["model"]["merges"]),
            "sample_mb": sample_mb, "seed": seed, "seconds": round(time.time() - t0, 1),
            "special_ids": {k: v for k, v in ids.items()}}


def plain_tokenizer(tok_path: str) -> Tokenizer:
    """The same tokenizer without added tokens: source text containing e.g. '<think>' stays text."""
    j = json.load(open(tok_path, encoding="utf-8"))
    j["added_tokens"] = []
    return Tokenizer.from_str(json.dumps(j))


_WORKER_TOK = None


def _init_worker(tok_path: str):
    global _WORKER_TOK
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER_TOK = plain_tokenizer(tok_path)


def _encode_chunk(texts):
    return [np.asarray(e.ids, dtype=np.uint16) for e in _WORKER_TOK.encode_batch(texts, add_special_tokens=False)]


def encode_docs(tok_path: str, jsonl: str, chat_repeat: int = 1):
    """Token id lists per document; chats rendered in DeepSeek V4 format (chat or thinking mode):
    <｜User｜>{instr}<｜Assistant｜></think>{answer}  /  ...<｜Assistant｜><think>{r}</think>{answer}.
    The packer adds EOS (+ BOS of the next document)."""
    full = Tokenizer.from_file(tok_path)
    plain = plain_tokenizer(tok_path)
    sid = lambda s: full.token_to_id(s)  # noqa: E731
    U, A, TH, THE = sid(C.USER), sid(C.ASSISTANT), sid(C.THINK), sid(C.THINK_END)
    texts, chats = [], []
    with open(jsonl, encoding="utf-8") as f:
        for ln in f:
            d = json.loads(ln)
            if "text" in d:
                texts.append(d["text"])
            else:
                chats.append(d["chat"])
    chunks = [texts[i:i + 256] for i in range(0, len(texts), 256)]
    with Pool(os.cpu_count() or 1, initializer=_init_worker, initargs=(tok_path,)) as pool:
        docs = [a for part in pool.imap(_encode_chunk, chunks) for a in part]
    n_text = len(docs)
    flat = []
    for instr, think, ans in chats:
        flat += [instr, think or "", ans]
    enc = []
    for i in range(0, len(flat), 4096):
        enc += [e.ids for e in plain.encode_batch(flat[i:i + 4096], add_special_tokens=False)]
    for i in range(len(chats)):
        ei, et, ea = enc[3 * i], enc[3 * i + 1], enc[3 * i + 2]
        ids = [U] + ei + [A] + ([TH] + et + [THE] if chats[i][1] else [THE]) + ea
        arr = np.asarray(ids, dtype=np.uint16)
        for _ in range(chat_repeat):
            docs.append(arr)
    return docs, n_text, len(chats)


def pack(docs, seed: int) -> np.ndarray:
    """Seeded shuffle, then doc0 EOS BOS doc1 EOS BOS ... as uint16."""
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    parts = []
    sep = np.array([1, 0], dtype=np.uint16)
    for i in order:
        parts.append(docs[i])
        parts.append(sep)
    return np.concatenate(parts) if parts else np.zeros(0, np.uint16)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="dir from data.py")
    ap.add_argument("--out", required=True, help="dir: tokenizer.json, train.bin, val.bin, tokens_meta.json")
    ap.add_argument("--sample-mb", type=float, default=40.0)
    ap.add_argument("--chat-repeat", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    tp = os.path.join(a.out, "tokenizer.json")
    meta = {"tokenizer": train_tokenizer(os.path.join(a.corpus, "train.jsonl"), tp, a.sample_mb, a.seed)}
    print(json.dumps(meta["tokenizer"]["vocab_size"]), "tokenizer", meta["tokenizer"]["seconds"], "s", flush=True)
    t0 = time.time()
    for split, rep in (("train", a.chat_repeat), ("val", 1)):
        docs, n_text, n_chat = encode_docs(tp, os.path.join(a.corpus, f"{split}.jsonl"), rep)
        arr = pack(docs, a.seed + (0 if split == "train" else 1))
        arr.tofile(os.path.join(a.out, f"{split}.bin"))
        meta[split] = {"tokens": int(arr.size), "text_docs": n_text, "chat_examples": n_chat,
                       "chat_repeat": rep}
    meta["encode_seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(a.out, "tokens_meta.json"), "w") as f:
        json.dump(meta, f, indent=2, ensure_ascii=False)
    print(json.dumps({k: v for k, v in meta.items() if k != "tokenizer"}), flush=True)


if __name__ == "__main__":
    main()
