#!/usr/bin/env python3
"""Checks the programmatic-dependent-launch contract of src/kernels/cuda/pdl.cuh over the sources.

Every kernel that some .cu file launches through launch_pdl(...) must call pdl_begin() as the first
statement of its body, or call pdl_begin_after(prologue) before any pdl_begin() (a prologue that
reads only constant data such as weights; pdl.cuh): a kernel launched that way may start while its predecessor still runs, and
only pdl_begin's wait orders its reads and writes after that predecessor's. Kernels launched
through a function pointer (auto* k = cond ? a : b; launch_pdl(k, ...)) are resolved through the
pointer's initialiser. Exit code 1 with the offending kernels named; 0 when every one complies.

Usage: tools/check_pdl.py [SOURCE_DIR]
"""
import pathlib
import re
import sys


def kernel_bodies(text):
    """name -> (first statement, body text) of each __global__ function."""
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
        depth, j = 0, brace
        while True:  # the matching closing brace
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                break
            j += 1
        body = text[brace + 1:j].lstrip()
        out.setdefault(m.group(1), []).append((body.split(";", 1)[0].strip(), body))
    return out


def complies(first, body):
    if first == "pdl_begin()":
        return True
    after = body.find("pdl_begin_after(")
    plain = re.search(r"\bpdl_begin\(\)", body)
    return after >= 0 and (plain is None or plain.start() > after)


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
        elif not all(complies(first, body) for first, body in bodies[k]):
            bad.append(f"{k}: launched by launch_pdl but its body does not start with pdl_begin() "
                       "(nor calls pdl_begin_after before any pdl_begin)")
    if bad:
        print("check_pdl: " + "\n  ".join(["contract broken:"] + bad))
        return 1
    print(f"check_pdl: {len(launched)} kernels launched by launch_pdl, each starts with pdl_begin() or pdl_begin_after()")
    return 0


if __name__ == "__main__":
    sys.exit(main())
