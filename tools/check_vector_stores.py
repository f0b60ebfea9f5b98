#!/usr/bin/env python3
"""Finds global stores that nvcc split into scalar stores, in the PTX of the CUDA kernel files.

A kernel that writes `*reinterpret_cast<float4*>(p) = v` (or float2, uint2, ...) means one
vector store per thread; in some kernels nvcc emitted four (or two) 4-byte stores instead, with
no warning: the sink attention's key-split partials (65% of the decode kernel's stall samples on
the store queue) and hc_mix_dmma's streams (537 MB per 8k prefill launch) did (thirty-seventh
session, docs/performance.md). `__stcg` / `__stwt` (st.global.{cg,wt}.v2/.v4) keep the vector.

The check: within one kernel (.entry), a scalar st.global of 2 or 4 bytes at [%rdN+o] that
follows a store of the same width at [%rdN+o-w] within the last six stores through that base
register is a pair of adjacent scalar stores; a kernel with at least --min pairs is reported,
with its count of vector stores. Kernels that store adjacent scalars by design (a loop over a
few ids, an fp32 path not taken on the GPU) are listed with --allow SUBSTRING.

Usage:
  tools/check_vector_stores.py BUILD_DIR [--files a.cu,b.cu] [--min 4] [--allow S ...] [--strict]
      PTX of each file of src/kernels/cuda (default: the files without CUTLASS instantiations),
      compiled with the build's own nvcc command line (ninja -t commands), into BUILD_DIR/ptx.
  tools/check_vector_stores.py --ptx FILE.ptx ...   (the check over existing PTX files)
  tools/check_vector_stores.py --self-test
Exit 1 with --strict when a kernel not allowed is reported; otherwise 0.
"""
import argparse
import collections
import pathlib
import re
import shlex
import subprocess
import sys

STORE = re.compile(
    r"^\s*(?:@!?%p\d+\s+)?st\.global(?:\.[a-z0-9]+)*\.(f32|b32|u32|s32|b16|u16|s16)\s+"
    r"\[(%rd\d+)(?:\+(-?\d+))?\]")
VECTOR = re.compile(r"^\s*(?:@!?%p\d+\s+)?st\.global(?:\.[a-z0-9]+)*\.v[24]\.")
WIDTH = {"f32": 4, "b32": 4, "u32": 4, "s32": 4, "b16": 2, "u16": 2, "s16": 2}
# Kernels whose adjacent scalar stores are meant (see the module doc).
DEFAULT_ALLOW = [
    "moe_route_kernel",  # six expert ids and weights per token
    "v41_",  # V4.1's kernels: reference tiles, not the hot path (docs/gpu.md)
    # The fp32 `out` of a one-split query (reference numerics' tensor-core path; the deepseek
    # path writes BF16 pairs, and the key splits' partials are __stcg vector stores).
    "sink_attention_",
    # An element loop over a lane's V values, in place over rows of any alignment (the indexer
    # q's Hadamard rounding, 0.26 ms per 8k CSA layer).
    "quant_sim_warp_kernel",
]


def split_pairs(ptx_text):
    """kernel -> (adjacent scalar store pairs, vector stores)."""
    pairs = collections.Counter()
    vectors = collections.Counter()
    kernel = None
    recent = collections.defaultdict(list)  # base register -> [(offset, width)]
    for line in ptx_text.splitlines():
        if ".entry" in line:
            kernel = line.split(".entry", 1)[1].strip().split("(", 1)[0]
            recent.clear()
            pairs[kernel] += 0
            vectors[kernel] += 0
            continue
        if kernel is None:
            continue
        if VECTOR.match(line):
            vectors[kernel] += 1
            continue
        m = STORE.match(line)
        if not m:
            continue
        width = WIDTH[m.group(1)]
        base = m.group(2)
        off = int(m.group(3) or 0)
        if any(o + w == off and w == width for o, w in recent[base][-6:]):
            pairs[kernel] += 1
        recent[base].append((off, width))
    return {k: (pairs[k], vectors[k]) for k in pairs}


def report(results, min_pairs, allow):
    """Prints the kernels at or over min_pairs; returns how many are not allowed."""
    bad = 0
    for (name, kernel), (n, v) in sorted(results.items(), key=lambda kv: -kv[1][0]):
        if n < min_pairs:
            continue
        allowed = any(a in kernel for a in allow)
        bad += 0 if allowed else 1
        tag = "allowed" if allowed else "SPLIT"
        print(f"{tag:8s} {n:4d} adjacent scalar store pairs, {v:4d} vector stores  {name}: {kernel}")
    return bad


def uses_cutlass(cu_path):
    """Whether a kernel file (or a kernels/cuda header it includes) includes CUTLASS's headers."""
    text = cu_path.read_text()
    for inc in re.findall(r'#include "kernels/cuda/([^"]+)"', text):
        header = cu_path.parent / inc
        if header.exists():
            text += header.read_text()
    return '#include "cutlass/' in text


def ptx_of(build_dir, cu):
    """Compiles src/kernels/cuda/<cu> to PTX with the build's command line; returns the path."""
    obj = f"src/kernels/cuda/CMakeFiles/dsinfer_kernels_cuda.dir/{cu}.o"
    cmds = subprocess.run(["ninja", "-C", str(build_dir), "-t", "commands", obj],
                          capture_output=True, text=True, check=True).stdout.strip().splitlines()
    if not cmds:
        raise RuntimeError(f"no compile command for {obj}")
    args = shlex.split(cmds[-1])
    out = build_dir / "ptx" / (pathlib.Path(cu).stem + ".ptx")
    out.parent.mkdir(exist_ok=True)
    fixed = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a in ("-c", "-MD") or a.startswith("-MF") or a.startswith("-MT"):
            if a in ("-MF", "-MT"):
                skip = True
            continue
        fixed.append(a)
    fixed += ["-ptx", "-o", str(out)]
    subprocess.run(fixed, cwd=build_dir, check=True, capture_output=True)
    return out


def self_test():
    ptx = """
.visible .entry ok_kernel(
	st.global.v4.f32 	[%rd1], {%f1, %f2, %f3, %f4};
	st.global.f32 	[%rd2], %f1;
	st.global.f32 	[%rd3+4], %f1;
.visible .entry split_kernel(
	st.global.f32 	[%rd5], %f1;
	st.global.f32 	[%rd5+4], %f2;
	st.global.f32 	[%rd5+8], %f3;
	@%p1 st.global.f32 	[%rd5+12], %f4;
	st.global.u16 	[%rd6+2], %rs1;
	st.global.u16 	[%rd6+4], %rs2;
	st.global.f32 	[%rd7+8], %f5;
"""
    got = split_pairs(ptx)
    want = {"ok_kernel": (0, 1), "split_kernel": (4, 0)}
    if got != want:
        print(f"self-test failed: {got} != {want}")
        return 1
    print("self-test passed")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build_dir", nargs="?")
    ap.add_argument("--files", default="")
    ap.add_argument("--ptx", nargs="*", default=[])
    ap.add_argument("--min", type=int, default=4)
    ap.add_argument("--allow", nargs="*", default=[])
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    paths = [pathlib.Path(p) for p in a.ptx]
    if a.build_dir:
        build = pathlib.Path(a.build_dir).resolve()
        src = pathlib.Path(__file__).resolve().parent.parent / "src/kernels/cuda"
        if a.files:
            files = a.files.split(",")
        else:  # the CUTLASS translation units take minutes each to compile again
            files = sorted(p.name for p in src.glob("*.cu") if not uses_cutlass(p))
        for cu in files:
            try:
                paths.append(ptx_of(build, cu))
            except (subprocess.CalledProcessError, RuntimeError) as e:
                print(f"{cu}: could not compile to PTX ({e})", file=sys.stderr)
                return 2
    if not paths:
        ap.print_usage()
        return 2
    results = {}
    for p in paths:
        for k, v in split_pairs(p.read_text()).items():
            results[(p.name, k)] = v
    bad = report(results, a.min, DEFAULT_ALLOW + a.allow)
    print(f"{len(results)} kernels in {len(paths)} PTX files; {bad} with split stores not allowed")
    return 1 if (a.strict and bad) else 0


if __name__ == "__main__":
    sys.exit(main())
