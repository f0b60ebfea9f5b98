#!/usr/bin/env python3
"""Summarises one kernel's SASS-level ncu export: where its warps stall and what it executes.

Input: `ncu -i REPORT --page source --csv --print-source sass > k.csv` of a report taken with
`--set full` (the source counters: per-instruction executed counts, warp stall sampling and its
reasons). Prints
  - the stall reasons' shares of all samples (no_instructions high: the code does not fit the
    instruction cache, as the attention epilogue's inlined sinf/cosf did; lg: the store queue),
  - the opcodes by share of executed instructions and of stall samples,
  - the hottest instructions (their stall samples and the reasons behind them),
  - the code in windows of --window instructions with their shares (where a long kernel spends).

Usage: tools/bench/ncu_stalls.py k.csv [--top 15] [--window 200]
       tools/bench/ncu_stalls.py --self-test
"""
import argparse
import collections
import csv
import io
import sys


def load(text):
    """(header, rows) of the SASS table: the first row that starts with 'Address'."""
    rows = list(csv.reader(io.StringIO(text)))
    start = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if start is None:
        raise ValueError("no SASS table (export with --page source --csv --print-source sass)")
    header = rows[start]
    return header, [r for r in rows[start + 1:] if len(r) == len(header)]


def num(s):
    try:
        return float(s.replace(",", "")) if s else 0.0
    except ValueError:
        return 0.0


def opcode(sass):
    parts = sass.split()
    if not parts:
        return "?"
    return parts[1] if parts[0].startswith("@") and len(parts) > 1 else parts[0]


def summarise(text, top=15, window=200, out=sys.stdout):
    header, rows = load(text)
    col = {c: i for i, c in enumerate(header)}
    execd = col["Instructions Executed"]
    samples = col["Warp Stall Sampling (All Samples)"]
    reasons = [(c[len("stall_"):], i) for c, i in col.items()
               if c.startswith("stall_") and "Not Issued" not in c]
    n_total = sum(num(r[execd]) for r in rows) or 1.0
    s_total = sum(num(r[samples]) for r in rows) or 1.0
    print(f"{len(rows)} SASS instructions, {n_total:,.0f} executed (warp level), "
          f"{s_total:,.0f} stall samples", file=out)
    by_reason = collections.Counter()
    for name, i in reasons:
        by_reason[name] = sum(num(r[i]) for r in rows)
    r_total = sum(by_reason.values()) or 1.0
    print("stall reasons: " + ", ".join(f"{k} {v / r_total * 100:.1f}%"
                                         for k, v in by_reason.most_common(8)), file=out)
    ops_n = collections.Counter()
    ops_s = collections.Counter()
    for r in rows:
        op = opcode(r[1])
        ops_n[op] += num(r[execd])
        ops_s[op] += num(r[samples])
    print("opcodes (executed, stall samples):", file=out)
    for op, n in ops_n.most_common(top):
        print(f"  {op:28s} {n / n_total * 100:5.1f}%  {ops_s[op] / s_total * 100:5.1f}%", file=out)
    print("hottest instructions:", file=out)
    hot = sorted(range(len(rows)), key=lambda i: -num(rows[i][samples]))[:top]
    for i in sorted(hot):
        r = rows[i]
        why = ", ".join(f"{name} {num(r[j]) / max(num(r[samples]), 1) * 100:.0f}%"
                        for name, j in reasons if num(r[j]) >= 0.2 * num(r[samples]) > 0)
        print(f"  {num(r[samples]) / s_total * 100:5.1f}%  #{i:<6d} {r[1][:56]:56s} {why}", file=out)
    print(f"windows of {window} instructions (executed, stall samples, top opcodes):", file=out)
    for b in range(0, len(rows), window):
        seg = rows[b:b + window]
        n = sum(num(r[execd]) for r in seg)
        s = sum(num(r[samples]) for r in seg)
        if n / n_total < 0.005 and s / s_total < 0.005:
            continue
        ops = collections.Counter()
        for r in seg:
            ops[opcode(r[1])] += num(r[execd])
        tops = " ".join(f"{k}:{v / max(n, 1) * 100:.0f}%" for k, v in ops.most_common(4))
        print(f"  #{b:<6d} {n / n_total * 100:5.1f}%  {s / s_total * 100:5.1f}%  {tops}", file=out)
    return by_reason, r_total


SAMPLE = """==PROF== noise
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_no_inst","stall_lg","stall_no_inst (Not Issued)"
"0x10","LDC R1, c[0x0][0x28]","10","100","10","0","0"
"0x20","@!P0 STG.E desc[UR4][R2.64], R3","30","200","0","30","0"
"0x30","STG.E desc[UR4][R2.64+0x4], R5","60","200","0","60","0"
"""


def self_test():
    buf = io.StringIO()
    by_reason, total = summarise(SAMPLE, top=3, window=2, out=buf)
    text = buf.getvalue()
    ok = (by_reason["lg"] == 90 and by_reason["no_inst"] == 10 and total == 100 and
          "STG.E" in text and "90.0%" in text and "3 SASS instructions" in text)
    print("self-test " + ("passed" if ok else "failed:\n" + text))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", nargs="?")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--window", type=int, default=200)
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if not a.csv:
        ap.print_usage()
        return 2
    with open(a.csv, errors="replace") as f:
        text = f.read()
    try:
        summarise(text, a.top, a.window)
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        sys.stderr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
