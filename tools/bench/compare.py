#!/usr/bin/env python3
"""Markdown table of dsinfer `bench` against the transformers-eager baseline.

Reads the JSON of `dsinfer bench --output` and of tools/bench/transformers_eager.py --output
(ideally from the same device run) and prints, per prefill length and per decode batch, both
rates and their ratio dsinfer / eager (above 1: dsinfer is faster; for decode it is also eager
ms/step over dsinfer ms/step). An entry missing or failed on one side shows as such. Standard
library only.

  python tools/bench/compare.py bench.json eager.json [--output table.md]
"""

from __future__ import annotations

import argparse
import json
import sys


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def fmt_rate(tok_s: float) -> str:
    return f"{tok_s:,.0f} tok/s" if tok_s >= 100 else f"{tok_s:.1f} tok/s"


def fmt_ms(ms: float) -> str:
    return f"{ms:.1f} ms/step" if ms >= 10 else f"{ms:.2f} ms/step"


def fmt_ratio(r: float) -> str:
    if r >= 10:
        return f"{r:.1f}×"
    if r >= 1:
        return f"{r:.2f}×"
    return f"{r:.2g}×"


def cell(row: dict | None, kind: str) -> str:
    if row is None:
        return "—"
    if "error" in row:
        return "error: " + row["error"].split(":")[0]
    if kind == "prefill":
        return fmt_rate(row["tokens_per_s"])
    return f"{fmt_ms(row['step_ms'])} ({fmt_rate(row['tokens_per_s'])})"


def ratio(a: dict | None, b: dict | None) -> str:
    ok = a is not None and b is not None and "error" not in a and "error" not in b
    return fmt_ratio(a["tokens_per_s"] / b["tokens_per_s"]) if ok else "—"


def table(ours: dict, eager: dict) -> str:
    lines = []
    em = eager.get("model", {})
    ev = eager.get("versions", {})
    om = ours.get("model", {})
    lines.append(
        f"dsinfer `bench` ({ours.get('device', '?')}, {om.get('numerics', '?')} numerics) vs "
        f"transformers {ev.get('transformers', '?')} eager ({eager.get('device', '?')}, torch "
        f"{ev.get('torch', '?')}, {em.get('dtype', '?')}, attention "
        f"{em.get('attn_implementation', '?')}, experts {em.get('experts_implementation', '?')})."
    )
    warnings = []
    if ours.get("device") and eager.get("device") and ours["device"] != eager["device"]:
        warnings.append(f"different devices: {ours['device']} vs {eager['device']}")
    if om.get("schedule") and em.get("schedule") and om["schedule"] != em["schedule"]:
        warnings.append(f"different layer schedules: {om['schedule']} vs {em['schedule']}")
    if om.get("hidden") and em.get("hidden") and om["hidden"] != em["hidden"]:
        warnings.append(f"different widths: hidden {om['hidden']} vs {em['hidden']}")
    if om.get("schedule"):
        lines.append(f"Model: {len(om['schedule'])} layers ({', '.join(om['schedule'])}).")
    for w in warnings:
        lines.append(f"**Warning: {w}.**")
    lines += [
        "",
        "| | dsinfer `bench` | transformers eager | dsinfer ÷ eager |",
        "|---|---|---|---|",
    ]

    op = {r["tokens"]: r for r in ours.get("prefill", [])}
    ep = {r["tokens"]: r for r in eager.get("prefill", [])}
    for n in sorted(set(op) | set(ep)):
        a, b = op.get(n), ep.get(n)
        lines.append(
            f"| prefill {n:,} tokens | {cell(a, 'prefill')} | {cell(b, 'prefill')} | "
            f"{ratio(a, b)} |"
        )

    od = {(r["batch"], r["context"]): r for r in ours.get("decode", [])}
    ed = {(r["batch"], r["context"]): r for r in eager.get("decode", [])}
    for key in sorted(set(od) | set(ed)):
        a, b = od.get(key), ed.get(key)
        lines.append(
            f"| decode batch {key[0]}, {key[1]:,} context | {cell(a, 'decode')} | "
            f"{cell(b, 'decode')} | {ratio(a, b)} |"
        )
        # The engine's default step: launched before the previous one's tokens are back.
        if a is not None and "error" not in a and a.get("async_step_ms"):
            ahead = {"step_ms": a["async_step_ms"], "tokens_per_s": key[0] * 1e3 / a["async_step_ms"]}
            lines.append(
                f"| decode batch {key[0]}, {key[1]:,} context, launched ahead | "
                f"{cell(ahead, 'decode')} | {cell(b, 'decode')} | {ratio(ahead, b)} |"
            )
    errors = [
        f"- eager {what}: {r['error']}"
        for what, rows in (
            ("prefill", eager.get("prefill", [])),
            ("decode", eager.get("decode", [])),
        )
        for r in rows
        if "error" in r
    ]
    if errors:
        lines += ["", "Errors:"] + errors
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("dsinfer_json", help="output of `dsinfer bench --output`")
    ap.add_argument("eager_json", help="output of tools/bench/transformers_eager.py --output")
    ap.add_argument("--output", help="also write the Markdown here")
    args = ap.parse_args(argv)
    text = table(load(args.dsinfer_json), load(args.eager_json))
    sys.stdout.write(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
