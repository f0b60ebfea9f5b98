#!/usr/bin/env python3
"""Where a replayed step's time goes, from a kernel timeline (DSINFER_KERNEL_TRACE, src/perf).

`DSINFER_KERNEL_TRACE=k.csv dsinfer bench --model DIR --profile-range decode ...` records every
kernel's start and end on the GPU (CUPTI) over the timed decode steps, one traced range per
decode batch. Kernels launched together by one CUDA graph replay share a correlation id: each
such group is a step (eager launches are one group per kernel). Per range this prints the steps'
mean span (first start to last end), the GPU idle time inside a step and between steps, and per
kernel its mean share of the step: the step's timeline is cut at every kernel's end, and each
piece goes to the kernel that ends there (with programmatic dependent launch a kernel starts
before its predecessor ends, so durations overlap and their sum exceeds the step; the shares
add up to the span less the idle time). The shares are also summed by part of the model
(kernel_parts.py's parts). A range without graph replays (prefill, eager steps) is reported as
one pass over all its kernels, its idle time included (the host's launch gaps).

Usage: tools/bench/kernel_trace.py CSV [--range N] [--top K]
       tools/bench/kernel_trace.py --self-test
"""
import argparse
import collections
import csv
import io
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_parts import part_of, short  # noqa: E402


def read(text):
    """range -> list of (name, start, end, correlation, graph)."""
    out = collections.defaultdict(list)
    for row in csv.DictReader(io.StringIO(text)):
        out[int(row["range"])].append((row["name"], int(row["start_ns"]), int(row["end_ns"]),
                                       int(row["correlation"]), int(row["graph"])))
    return out


def demangle(ranges):
    """Mangled names (traces written before the recorder demangled) through c++filt, if any."""
    names = sorted({k[0] for ks in ranges.values() for k in ks if k[0].startswith("_Z")})
    tool = shutil.which("c++filt")
    if not names or not tool:
        return ranges
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
    plain = dict(zip(names, out.stdout.splitlines())) if out.returncode == 0 else {}
    return {r: [(plain.get(k[0], k[0]),) + k[1:] for k in ks] for r, ks in ranges.items()}


def steps_of(kernels):
    """Graph replays (kernels of one correlation id with a graph), in time order."""
    groups = collections.defaultdict(list)
    for k in kernels:
        if k[4] != 0:
            groups[k[3]].append(k)
    return sorted(groups.values(), key=lambda g: min(k[1] for k in g))


def shares(step):
    """name -> ns of the step's timeline attributed to it, and the idle ns inside the step."""
    out = collections.defaultdict(float)
    covered = None
    for name, start, end, _, _ in sorted(step, key=lambda k: k[2]):
        lo = start if covered is None else max(start, covered)
        if end > lo:
            out[name] += end - lo
        covered = end if covered is None else max(covered, end)
    span = max(k[2] for k in step) - min(k[1] for k in step)
    return out, span - sum(out.values())


def report(kernels, label, top):
    steps = steps_of(kernels)
    what = "replays"
    if not steps:
        if not kernels:
            return f"[trace] {label}: no kernels\n"
        steps, what = [kernels], "eager pass"
    spans, idles, gaps = [], [], []
    total = collections.defaultdict(float)
    launches = collections.Counter()
    prev_end = None
    for st in steps:
        sh, idle = shares(st)
        for n, v in sh.items():
            total[n] += v
        for k in st:
            launches[k[0]] += 1
        start, end = min(k[1] for k in st), max(k[2] for k in st)
        spans.append(end - start)
        idles.append(idle)
        if prev_end is not None:
            gaps.append(max(0, start - prev_end))
        prev_end = end
    n = len(steps)
    span = sum(spans) / n
    lines = [f"[trace] {label}: {n} {what}, {len(kernels) / n:.0f} kernels each, span "
             f"{span / 1e3:.1f} us, idle inside {sum(idles) / n / 1e3:.1f} us, between replays "
             f"{(sum(gaps) / len(gaps) if gaps else 0) / 1e3:.1f} us"]
    for name, v in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {v / n / 1e3:9.1f} us {100 * v / n / span:5.1f}%  x {launches[name] / n:4.0f}"
                     f"  {short(name)[:90]}")
    parts = collections.defaultdict(float)
    for name, v in total.items():
        parts[part_of(name)] += v
    lines.append(f"[trace] {label} by part:")
    for part, v in sorted(parts.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {v / n / 1e3:9.1f} us {100 * v / n / span:5.1f}%  {part}")
    return "\n".join(lines) + "\n"


def self_test():
    # Two replays of a chain a -> b -> c where b starts (PDL) before a ends, and an idle gap of
    # 5 ns before c; one eager kernel between the replays.
    text = "range,name,start_ns,end_ns,stream,correlation,graph,graph_node,grid,block\n"
    for base, corr in ((0, 10), (100, 11)):
        text += f'1,"void a<1>(int)",{base},{base + 20},7,{corr},3,1,1x1x1,32x1x1\n'
        text += f'1,"b_kernel(P)",{base + 15},{base + 40},7,{corr},3,2,1x1x1,32x1x1\n'
        text += f'1,"gemv_x(Q)",{base + 45},{base + 60},7,{corr},3,3,1x1x1,32x1x1\n'
    text += '1,"eager_k(R)",70,80,7,99,0,0,1x1x1,32x1x1\n'
    ranges = read(text)
    steps = steps_of(ranges[1])
    assert len(steps) == 2 and all(len(s) == 3 for s in steps), steps
    sh, idle = shares(steps[0])
    assert sh["void a<1>(int)"] == 20 and sh["b_kernel(P)"] == 20 and sh["gemv_x(Q)"] == 15, sh
    assert idle == 5, idle
    out = report(ranges[1], "test", 10)
    assert "2 replays" in out and "span 0.1 us" in out and "between replays 0.0 us" in out, out
    assert "dense linears" in out, out
    eager = report([k for k in ranges[1] if k[4] == 0], "eager", 10)
    assert "1 eager pass" in eager and "span 0.0 us" in eager, eager
    print("kernel_trace self-test: ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="?")
    ap.add_argument("--range", type=int, default=0, help="only this traced range (1-based)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        self_test()
        return 0
    if not a.csv:
        ap.error("a CSV is required")
    with open(a.csv) as f:
        ranges = demangle(read(f.read()))
    for r in sorted(ranges):
        if a.range and r != a.range:
            continue
        sys.stdout.write(report(ranges[r], f"range {r}", a.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
