#!/usr/bin/env python3
"""Where a profiled run's GPU time goes, per kernel and per part of the model.

Reads an Nsight Compute CSV (`ncu --metrics gpu__time_duration.sum[,dram__bytes_read.sum]
[,dram__bytes_write.sum] --csv`: one row per kernel launch and metric) or an Nsight Systems
`cuda_gpu_kern_sum` CSV, and prints the top kernels and the time by part -- attention, indexer
and top-k, compressors, mHC, MoE, dense linears (GEMMs, GEMVs, the LM head), norms / RoPE /
quantisation, sampling, the rest -- each with its launches, its share, and (ncu with the DRAM
metrics) the DRAM bytes moved (read, plus written where measured: what `bench`'s copy ceiling
counts) and the achieved TB/s. `--steps N` divides by the number of steps the capture holds (a decode
profile of N steps), so the figures are per step.

Usage: tools/bench/kernel_parts.py CSV [--steps N] [--label TEXT] [--top K]
       tools/bench/kernel_parts.py --self-test
"""
import argparse
import collections
import csv
import io
import re
import sys

# First match wins: the MoE's GEMVs before the dense GEMVs, the indexer before the norms.
PARTS = [
    ("attention", r"sink_attention"),
    ("indexer + top-k", r"indexer|top_k|refs_from_indices"),
    ("compressors", r"compressor"),
    ("mHC", r"\bhc_|::hc_|hc_(mix|pre|post|head|collapse)"),
    # (the grouped GEMMs: CUTLASS's over the FP8 copy by their problem shape, ours by name)
    ("MoE", r"moe_|gemv_gate_up|gemv_down|expert|grouped|GroupProblemShape|w4a8"),
    # (CUTLASS's dense GEMMs are device_kernel<GemmUniversal<...>>)
    ("dense linears", r"gemv|gemm|GemmUniversal|dense_kernel|linear"),
    ("norms, RoPE, quantisation", r"rms_norm|rope|quant"),
    ("sampling", r"sampl"),
    ("other", r"."),
]

TIME_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6,
           "s": 1e9, "second": 1e9}
BYTES = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def part_of(name):
    for part, pattern in PARTS:
        if re.search(pattern, name):
            return part
    return "other"


def short(name):
    name = re.sub(r"\(anonymous namespace\)::|<?unnamed>::|dsinfer::|cuda::|void ", "", name)
    return name.split("(")[0] if "(" in name else name


def read_kernels(text):
    """name -> [ns, launches, dram bytes or None], from either CSV flavour."""
    lines = [l for l in text.splitlines() if l.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if not rows:
        raise ValueError("no CSV rows (expected an ncu --csv or nsys cuda_gpu_kern_sum export)")
    head = rows[0]
    agg = collections.defaultdict(lambda: [0.0, 0, None])
    if "Total Time (ns)" in head:  # nsys kernel summary: one row per kernel name
        t, n, k = head.index("Total Time (ns)"), head.index("Instances"), head.index("Name")
        for r in rows[1:]:
            a = agg[r[k]]
            a[0] += float(r[t].replace(",", ""))
            a[1] += int(r[n].replace(",", ""))
        return agg
    k, m, u, v = (head.index(c) for c in ("Kernel Name", "Metric Name", "Metric Unit",
                                           "Metric Value"))
    for r in rows[1:]:
        if len(r) <= v:
            continue
        a = agg[r[k]]
        value = float(r[v].replace(",", ""))
        if r[m] == "gpu__time_duration.sum" and r[u] in TIME_NS:
            a[0] += value * TIME_NS[r[u]]
            a[1] += 1
        elif r[m] in ("dram__bytes_read.sum", "dram__bytes_write.sum") and r[u] in BYTES:
            a[2] = (a[2] or 0.0) + value * BYTES[r[u]]
    return agg


def summarize(text, steps=1, label="run", top=15):
    """The report as a string, and the per-part totals {part: (ns per step, launches per step)}."""
    agg = read_kernels(text)
    steps = max(steps, 1)
    total = sum(a[0] for a in agg.values()) or 1.0
    launches = sum(a[1] for a in agg.values())
    out = [f"[profile] {label}: {total / steps / 1e3:.1f} us of kernels per step in "
           f"{launches / steps:.0f} launches"]

    def line(title, ns, n, dram):
        bw = f"  {dram / steps / 1e6:8.2f} MB {dram / ns / 1e3:5.2f} TB/s" if dram else ""
        return (f"  {ns / steps / 1e3:9.1f} us {100 * ns / total:5.1f}%  x{n / steps:6.0f}{bw}  "
                f"{title}")

    for name, (ns, n, dram) in sorted(agg.items(), key=lambda kv: -kv[1][0])[:top]:
        out.append(line(short(name)[:80], ns, n, dram))
    parts = collections.OrderedDict((p, [0.0, 0, None]) for p, _ in PARTS)
    for name, (ns, n, dram) in agg.items():
        p = parts[part_of(short(name))]
        p[0] += ns
        p[1] += n
        if dram is not None:
            p[2] = (p[2] or 0.0) + dram
    out.append(f"[profile] {label} by part:")
    for part, (ns, n, dram) in parts.items():
        if n:
            out.append(line(part, ns, n, dram))
    return "\n".join(out), {p: (v[0] / steps, v[1] / steps) for p, v in parts.items() if v[1]}


SELF_TEST_NCU = """==PROF== Connected to process 1
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","dsinfer","h","void dsinfer::cuda::(anonymous namespace)::hc_pre_kernel<0, 0>(HcPreParams, const float *)","1","13","(512, 1, 1)","(1, 2, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","Kbyte","150.50"
"0","1","dsinfer","h","void dsinfer::cuda::(anonymous namespace)::hc_pre_kernel<0, 0>(HcPreParams, const float *)","1","13","(512, 1, 1)","(1, 2, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","us","13.00"
"1","1","dsinfer","h","void dsinfer::cuda::(anonymous namespace)::gemv_gate_up_kernel<0, 0>(Fp8ExpertFfnParams, int)","1","13","(128, 1, 1)","(64, 6, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","Mbyte","53.50"
"1","1","dsinfer","h","void dsinfer::cuda::(anonymous namespace)::gemv_gate_up_kernel<0, 0>(Fp8ExpertFfnParams, int)","1","13","(128, 1, 1)","(64, 6, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","Kbyte","13,200"
"1","1","dsinfer","h","void dsinfer::cuda::(anonymous namespace)::gemv_gate_up_kernel<0, 0>(Fp8ExpertFfnParams, int)","1","13","(128, 1, 1)","(64, 6, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","33,000"
"2","1","dsinfer","h","void dsinfer::cuda::(anonymous namespace)::fp8_gemv_kernel<1, 1>(Fp8GemvArgs)","1","13","(256, 1, 1)","(512, 2, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","us","17.00"
"3","1","dsinfer","h","void dsinfer::cuda::(anonymous namespace)::hc_pre_kernel<0, 0>(HcPreParams, const float *)","1","13","(512, 1, 1)","(1, 2, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","us","11.00"
"4","1","dsinfer","h","dsinfer::cuda::(anonymous namespace)::sink_attention_merge_kernel(const float *, long)","1","13","(128, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","us","5.00"
"""

SELF_TEST_NSYS = """"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name"
"60.0","600000","20","30000.0","30000.0","29000","31000","100.0","void dsinfer::cuda::(anonymous namespace)::gemv_down_kernel<0, 0>(Fp8ExpertFfnParams, int)"
"40.0","400000","40","10000.0","10000.0","9000","11000","100.0","void dsinfer::cuda::(anonymous namespace)::rms_norm_warp_kernel<4>(RmsNormParams)"
"""


def self_test():
    failures = []

    def expect(what, got, want, tol=1e-6):
        if abs(got - want) > tol * max(1.0, abs(want)):
            failures.append(f"{what}: {got} != {want}")

    report, parts = summarize(SELF_TEST_NCU, steps=1, label="ncu")
    expect("mHC us", parts["mHC"][0] / 1e3, 24.0)
    expect("mHC launches", parts["mHC"][1], 2)
    expect("MoE us (ns with a thousands separator)", parts["MoE"][0] / 1e3, 33.0)
    expect("dense us", parts["dense linears"][0] / 1e3, 17.0)
    expect("attention us", parts["attention"][0] / 1e3, 5.0)
    if "2.02 TB/s" not in report:  # 53.5 MB read + 13.2 MB written in 33 us
        failures.append("MoE bandwidth not reported as 2.02 TB/s:\n" + report)
    _, parts = summarize(SELF_TEST_NCU, steps=2, label="ncu")
    expect("per-step mHC us", parts["mHC"][0] / 1e3, 12.0)
    _, parts = summarize(SELF_TEST_NSYS, steps=4, label="nsys")
    expect("nsys MoE us per step", parts["MoE"][0] / 1e3, 150.0)
    expect("nsys norm launches per step", parts["norms, RoPE, quantisation"][1], 10)
    for name in ("void dsinfer::cuda::(anonymous namespace)::moe_w4a8_gemm_kernel(Args)",
                 "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::"
                 "GroupProblemShape<cute::tuple<int, int, int>>, ...>>(T1::Params)"):
        if part_of(name) != "MoE":
            failures.append(f"{name[:60]}... classified as {part_of(name)}, not MoE")
    dense = ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, "
             "int, int>, ...>>(T1::Params)")
    if part_of(dense) != "dense linears":
        failures.append(f"CUTLASS's dense GEMM classified as {part_of(dense)}, not dense linears")
    try:
        summarize("no csv here")
        failures.append("text without CSV rows was accepted")
    except ValueError:
        pass
    for f in failures:
        print("kernel_parts self-test:", f)
    print(f"kernel_parts self-test: {len(failures)} failures")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", nargs="?")
    ap.add_argument("--steps", type=int, default=1, help="steps the capture holds (per-step figures)")
    ap.add_argument("--label", default="run")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if not args.csv:
        ap.error("a CSV file is needed (or --self-test)")
    try:
        with open(args.csv, encoding="utf-8", errors="replace") as f:
            report, _ = summarize(f.read(), args.steps, args.label, args.top)
    except (OSError, ValueError) as e:
        print(f"kernel_parts: {args.csv}: {e}", file=sys.stderr)
        return 2
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
