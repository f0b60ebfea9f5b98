#!/usr/bin/env python3
"""Checks the programmatic-dependent-launch contract of src/kernels/cuda/pdl.cuh over the sources.

Every kernel that some .cu file launches through launch_pdl(...) must call pdl_begin() as the first
statement of its body: a kernel launched that way may start while its predecessor still runs, and
only pdl_begin's wait orders its reads and writes after that predecessor's. Kernels launched
through a function pointer (auto* k = cond ? a : b; launch_pdl(k, ...)) are resolved through the
pointer's initialiser. Exit code 1 with the offending kernels named; 0 when every one complies.

Usage: tools/check_pdl.py [SOURCE_DIR]
"""
import pathlib
import re
import sys


def kernel_bodies(text):
    """name -> the first statement of each __global__ function body."""
    out = {}
    pat = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(")
    for m in pat.finditer(text):
        depth, i = 0, m.end() - 1
        while True:
            if text[i] == "(":
                depth += 1
            elif text[i] == ")":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        brace = text.index("{", i)
        body = text[brace + 1:].lstrip()
        out.setdefault(m.group(1), []).append(body.split(";", 1)[0].strip())
    return out


def launched_kernels(text):
    names = set()
    for m in re.finditer(r"launch_pdl(?:_cluster)?\(\s*([\w:]+)\s*(?:<[^()]*?>)?\s*,", text):
        name = m.group(1).split("::")[-1]
        ptr = re.search(r"auto\*\s+" + name + r"\s*=\s*([^;]+);", text)
        if ptr:  # a pointer chosen at run time: every kernel its initialiser names
            names.update(re.findall(r"(\w+_kernel)\b", ptr.group(1)))
        else:
            names.add(name)
    return names


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    files = sorted((root / "src").rglob("*.cu")) + sorted((root / "src").rglob("*.cuh"))
    bodies, launched = {}, set()
    for f in files:
        if f.name == "pdl.cuh":  # the launchers themselves (launch_pdl forwards its `kernel`)
            continue
        text = f.read_text()
        for k, v in kernel_bodies(text).items():
            bodies.setdefault(k, []).extend(v)
        launched |= launched_kernels(text)
    bad = []
    for k in sorted(launched):
        if k not in bodies:
            bad.append(f"{k}: launched by launch_pdl, definition not found")
        elif any(first != "pdl_begin()" for first in bodies[k]):
            bad.append(f"{k}: launched by launch_pdl but its body does not start with pdl_begin()")
    if bad:
        print("check_pdl: " + "\n  ".join(["contract broken:"] + bad))
        return 1
    print(f"check_pdl: {len(launched)} kernels launched by launch_pdl, each starts with pdl_begin()")
    return 0


if __name__ == "__main__":
    sys.exit(main())
