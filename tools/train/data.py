#!/usr/bin/env python3
"""Offline training corpus: the Python sources and docs installed on the machine.

Steps (deterministic for a given machine image):
  1. collect *.py, *.pyi, *.md, *.rst under the interpreter's stdlib, site-packages and
     /usr/lib/python3*, /usr/local/lib/python3* (symlinks resolved, each file once);
  2. filter: UTF-8, 64 B .. 200 KB, no line over 1000 chars, mean line length <= 100
     (drops minified / generated / data files);
  3. normalise (CRLF -> LF, trailing whitespace stripped, one final newline) and
     deduplicate exactly on the SHA-1 of the normalised text (first path in sorted order wins);
  4. split by *group* (top-level package / stdlib module) so that no package is in both
     splits: groups in SHA-1(name) order, each <= 0.5 % of the bytes, go to validation until
     it holds >= 1 % of the bytes;
  5. cap the training split at --max-train-mb by a seeded shuffle of files;
  6. synthesise chat examples (DeepSeek V4 prompt format, chat mode and thinking mode) from
     documented functions of each split: "write a function with this header/doc" -> code.

Output: corpus dir with train.jsonl / val.jsonl ({"text":...} or {"chat":[instr, think, answer]})
and corpus_meta.json (file counts, bytes, dedup, split).
"""

from __future__ import annotations

import argparse
import ast
import glob
import hashlib
import json
import os
import random
import site
import sys
import sysconfig
import time
from multiprocessing import Pool

EXTS = (".py", ".pyi", ".md", ".rst")
MIN_BYTES, MAX_BYTES = 64, 200_000
MAX_LINE, MAX_MEAN_LINE = 1000, 100


def default_roots() -> list[str]:
    roots = []
    paths = sysconfig.get_paths()
    for k in ("stdlib", "purelib", "platlib"):
        if paths.get(k):
            roots.append(paths[k])
    try:
        roots += site.getsitepackages()
    except AttributeError:
        pass
    roots += sorted(glob.glob("/usr/lib/python3*")) + sorted(glob.glob("/usr/local/lib/python3*"))
    out, seen = [], set()
    for r in roots:
        if os.path.isdir(r):
            rr = os.path.realpath(r)
            if rr not in seen:
                seen.add(rr)
                out.append(rr)
    return out


def group_of(root: str, path: str) -> str:
    rel = os.path.relpath(path, root)
    parts = rel.split(os.sep)
    # nested site-packages under a stdlib-like root (/usr/lib/python3/dist-packages/x/...)
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            i = parts.index(marker)
            parts = parts[i + 1:]
            break
    head = parts[0] if parts else rel
    for ext in EXTS:
        if head.endswith(ext):
            head = head[: -len(ext)]
    return head.split(".")[0].split("-")[0].lower() or "_"


def list_files(roots: list[str]) -> list[tuple[str, str]]:
    """(realpath, group) for each candidate file, each real file once, sorted by path."""
    seen, out = set(), []
    for root in roots:
        for dp, dns, fns in os.walk(root, followlinks=False):
            dns.sort()
            if "__pycache__" in dns:
                dns.remove("__pycache__")
            for fn in sorted(fns):
                if not fn.endswith(EXTS):
                    continue
                p = os.path.join(dp, fn)
                try:
                    rp = os.path.realpath(p)
                    if rp in seen or not os.path.isfile(rp):
                        continue
                    sz = os.path.getsize(rp)
                except OSError:
                    continue
                if not (MIN_BYTES <= sz <= MAX_BYTES):
                    continue
                seen.add(rp)
                out.append((rp, group_of(root, p)))
    out.sort()
    return out


def normalise(raw: bytes) -> str | None:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if "\x00" in text:
        return None
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    if not lines:
        return None
    if max(len(ln) for ln in lines) > MAX_LINE:
        return None
    if sum(len(ln) for ln in lines) / len(lines) > MAX_MEAN_LINE:
        return None
    text = "\n".join(lines) + "\n"
    if len(text.encode("utf-8")) < MIN_BYTES:
        return None
    return text


def _load(item):
    path, group = item
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    text = normalise(raw)
    if text is None:
        return None
    return path, group, hashlib.sha1(text.encode("utf-8")).hexdigest(), text


# ------------------------------------------------------------------------------------------------
# Chat synthesis


def _first_sentence(doc: str) -> str | None:
    para = doc.strip().split("\n\n")[0]
    s = " ".join(para.split())
    if not (12 <= len(s) <= 200) or s.startswith((">>>", ":", "..")):
        return None
    if any(c in s for c in "`|*"):
        return None
    return s


def functions_with_docs(text: str, max_n: int = 4) -> list[tuple[str, str, str, str]]:
    """(name, header line, first doc sentence, source) for documented top-level functions."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    lines = text.split("\n")
    out = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node)
        if not doc or node.decorator_list:
            continue
        sent = _first_sentence(doc)
        if sent is None or node.name.startswith("_"):
            continue
        src = "\n".join(lines[node.lineno - 1: node.end_lineno])
        if not (80 <= len(src) <= 1500):
            continue
        header = lines[node.lineno - 1].strip()
        if not header.endswith(":"):
            continue
        out.append((node.name, header, sent, src))
        if len(out) >= max_n:
            break
    return out


INSTR = [
    "Write a Python function `{header}` that does the following: {sent}",
    "Implement `{name}` in Python. {sent}",
    "{sent} Write this as a Python function named `{name}`.",
    "Can you write the Python function `{header}`? It should do this: {sent}",
]
THINK = [
    "The user wants a Python function called {name}. {sent} I will write it with the header {header}",
    "I need to implement {name}. The docstring should say: {sent}",
]


def _chats(item):
    text, seed = item
    rng = random.Random(seed)
    out = []
    for name, header, sent, src in functions_with_docs(text):
        instr = rng.choice(INSTR).format(header=header, name=name, sent=sent)
        think = rng.choice(THINK).format(header=header, name=name, sent=sent) if rng.random() < 0.35 else None
        answer = f"```python\n{src}\n```"
        out.append([instr, think, answer])
    return out


# ------------------------------------------------------------------------------------------------


def build(out_dir: str, roots: list[str], max_train_mb: float, seed: int, workers: int,
          chat_files: int) -> dict:
    t0 = time.time()
    os.makedirs(out_dir, exist_ok=True)
    files = list_files(roots)
    n_cand = len(files)
    with Pool(workers) as pool:
        loaded = [r for r in pool.imap(_load, files, chunksize=64) if r is not None]
    n_ok = len(loaded)
    seen, docs, dups = set(), [], 0
    for path, group, sha, text in loaded:     # already sorted by path
        if sha in seen:
            dups += 1
            continue
        seen.add(sha)
        docs.append((path, group, sha, text))
    del loaded
    total = sum(len(d[3]) for d in docs)
    gsize: dict[str, int] = {}
    for _, g, _, t in docs:
        gsize[g] = gsize.get(g, 0) + len(t)
    val_groups, vbytes = [], 0
    for g in sorted(gsize, key=lambda g: hashlib.sha1(g.encode()).hexdigest()):
        if vbytes >= 0.01 * total:
            break
        if gsize[g] <= 0.005 * total:
            val_groups.append(g)
            vbytes += gsize[g]
    vset = set(val_groups)
    val = [d for d in docs if d[1] in vset]
    train = [d for d in docs if d[1] not in vset]
    rng = random.Random(seed)
    rng.shuffle(train)
    rng.shuffle(val)
    cap = int(max_train_mb * 1e6)
    kept, acc = [], 0
    for d in train:
        if acc >= cap:
            break
        kept.append(d)
        acc += len(d[3])
    dropped_for_cap = len(train) - len(kept)
    train = kept

    def chats_for(split, n_files, base_seed):
        py = [d for d in split if d[0].endswith(".py")][:n_files]
        with Pool(workers) as pool:
            res = pool.map(_chats, [(d[3], base_seed + i) for i, d in enumerate(py)], chunksize=16)
        return [c for r in res for c in r]

    train_chats = chats_for(train, chat_files, seed * 1_000_000)
    val_chats = chats_for(val, max(1, chat_files // 50), seed * 1_000_000 + 999_999)

    def write(name, split, chats):
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            for d in split:
                f.write(json.dumps({"text": d[3]}, ensure_ascii=False) + "\n")
            for c in chats:
                f.write(json.dumps({"chat": c}, ensure_ascii=False) + "\n")

    write("train.jsonl", train, train_chats)
    write("val.jsonl", val, val_chats)

    def ext_counts(split):
        c = {}
        for d in split:
            e = os.path.splitext(d[0])[1]
            c[e] = c.get(e, 0) + 1
        return c

    meta = {
        "roots": roots,
        "extensions": list(EXTS),
        "filters": {"min_bytes": MIN_BYTES, "max_bytes": MAX_BYTES, "max_line_chars": MAX_LINE,
                    "max_mean_line_chars": MAX_MEAN_LINE, "utf8_only": True},
        "normalisation": "CRLF/CR -> LF, trailing whitespace per line stripped, trailing blank lines dropped",
        "dedup": "exact, SHA-1 of the normalised text; first path in sorted order kept",
        "split": "by top-level package/module group; groups in SHA-1(name) order, each <= 0.5% of bytes, "
                 "to validation until >= 1% of bytes",
        "candidate_files": n_cand,
        "readable_files_after_filters": n_ok,
        "exact_duplicates_removed": dups,
        "unique_files": len(docs),
        "unique_chars": total,
        "train_files": len(train),
        "train_chars": sum(len(d[3]) for d in train),
        "train_files_dropped_by_cap": dropped_for_cap,
        "train_cap_mb": max_train_mb,
        "train_ext_counts": ext_counts(train),
        "val_files": len(val),
        "val_chars": sum(len(d[3]) for d in val),
        "val_groups": val_groups,
        "val_ext_counts": ext_counts(val),
        "train_chat_examples": len(train_chats),
        "val_chat_examples": len(val_chats),
        "chat_source": "documented top-level functions (ast) of the split's own files",
        "seed": seed,
        "python": sys.version.split()[0],
        "seconds": round(time.time() - t0, 1),
    }
    with open(os.path.join(out_dir, "corpus_meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    return meta


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--root", action="append", help="source root (repeatable; default: interpreter paths)")
    ap.add_argument("--max-train-mb", type=float, default=300.0)
    ap.add_argument("--chat-files", type=int, default=20000, help="train .py files mined for chat examples")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args(argv)
    meta = build(a.out, a.root or default_roots(), a.max_train_mb, a.seed, a.workers, a.chat_files)
    print(json.dumps({k: v for k, v in meta.items() if k != "val_groups"}, indent=1))


if __name__ == "__main__":
    main()
