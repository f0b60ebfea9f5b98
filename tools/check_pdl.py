#!/usr/bin/env python3
"""Checks the programmatic-dependent-launch contract of src/kernels/cuda/pdl.cuh over the sources.

Every kernel that some .cu file launches through launch_pdl(...) must call pdl_begin() as the first
statement of its body, or call pdl_begin_after(prologue) before any pdl_begin() (a prologue that
reads only constant data such as weights; pdl.cuh): a kernel launched that way may start while its predecessor still runs, and
only pdl_begin's wait orders its reads and writes after that predecessor's. Kernels launched
through a function pointer (auto* k = cond ? a : b; launch_pdl(k, ...)) are resolved through the
pointer's initialiser. Exit code 1 with the offending kernels named; 0 when every one complies.

Usage: tools/check_pdl.py [SOURCE_DIR]
       tools/check_pdl.py --self-test   (the checker against small sources with known verdicts)
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


def first_argument(text, start):
    """The text of the call's first argument: from `start` to the first comma outside (), <>, []."""
    depth, i = 0, start
    while i < len(text):
        ch = text[i]
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            if depth == 0:
                break
            depth -= 1
        elif ch == "," and depth == 0:
            break
        i += 1
    return text[start:i]


def launched_kernels(text):
    """Every kernel a launch_pdl / launch_pdl_cluster call may launch: the first argument's kernel
    names (a name, a template instance, or a conditional choosing between kernels), a pointer
    variable resolved through its `auto* name = ...;` initialiser."""
    names = set()
    for m in re.finditer(r"launch_pdl(?:_cluster)?\(", text):
        arg = first_argument(text, m.end()).strip()
        if not arg or arg.startswith("F&&") or arg.startswith("void"):  # the launcher's own signature
            continue
        kernels = re.findall(r"(\w+_kernel)\b", arg)
        if kernels:
            names.update(kernels)
            continue
        name = re.match(r"[\w:]+", arg)
        if not name:
            continue
        name = name.group(0).split("::")[-1]
        ptr = re.search(r"auto\*\s+" + name + r"\s*=\s*([^;]+);", text)
        if ptr:  # a pointer chosen at run time: every kernel its initialiser names
            names.update(re.findall(r"(\w+_kernel)\b", ptr.group(1)))
        else:
            names.add(name)
    return names


def check(sources):
    """sources: [(file name, text)]. Returns the list of contract violations."""
    bodies, launched = {}, set()
    for name, text in sources:
        if name == "pdl.cuh":  # the launchers themselves (launch_pdl forwards its `kernel`)
            continue
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
    return bad, launched


SELF_TEST = [
    # (source, kernels that must be reported, kernels that must be accepted)
    ("__global__ void a_kernel(P p) { pdl_begin(); x(); }\n"
     "void f() { launch_pdl(a_kernel, g, b, 0, s, p); }", [], ["a_kernel"]),
    ("__global__ void b_kernel(P p) { x(); pdl_begin(); }\n"
     "void f() { launch_pdl(b_kernel, g, b, 0, s, p); }", ["b_kernel"], []),
    ("template <int N, bool C>\n__global__ void __launch_bounds__(256) c_kernel(P p) {\n"
     "  float w[4];\n  pdl_begin_after([&] { w[0] = p.w[0]; });\n  y();\n}\n"
     "void f() { launch_pdl(c_kernel<1, true>, g, b, 0, s, p); }", [], ["c_kernel"]),
    ("__global__ void d_kernel(P p) { pdl_begin(); }\n"
     "__global__ void e_kernel(P p) { z(); }\n"
     "void f(bool q) { launch_pdl(q ? d_kernel<F, W, true> : e_kernel<F, W, false>, g, b, 0, s); }",
     ["e_kernel"], ["d_kernel"]),
    ("__global__ void f_kernel(P p) { w(); }\n__global__ void g_kernel(P p) { pdl_begin(); }\n"
     "void f(bool q) { auto* k = q ? f_kernel : g_kernel; launch_pdl(k, g, b, 0, s); }",
     ["f_kernel"], ["g_kernel"]),
    ("__global__ void h_kernel(P p) { x(); }\n__global__ void i_kernel(P p) {\n"
     "  pdl_begin_after([&] {});\n}\nvoid f() { launch_pdl_cluster(h_kernel, g, b, 0, s, c, p); }",
     ["h_kernel"], []),
]


def self_test():
    failures = 0
    for i, (src, want_bad, want_ok) in enumerate(SELF_TEST):
        bad, launched = check([("case.cu", src)])
        reported = {b.split(":")[0] for b in bad}
        for k in want_bad:
            if k not in reported:
                print(f"check_pdl self-test case {i}: {k} not reported")
                failures += 1
        for k in want_ok:
            if k in reported or k not in launched:
                print(f"check_pdl self-test case {i}: {k} not seen as launched and compliant")
                failures += 1
    print(f"check_pdl self-test: {len(SELF_TEST)} cases, {failures} failures")
    return 1 if failures else 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        return self_test()
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    files = sorted((root / "src").rglob("*.cu")) + sorted((root / "src").rglob("*.cuh"))
    bad, launched = check([(f.name, f.read_text()) for f in files])
    if bad:
        print("check_pdl: " + "\n  ".join(["contract broken:"] + bad))
        return 1
    print(f"check_pdl: {len(launched)} kernels launched by launch_pdl, each starts with "
          "pdl_begin() or pdl_begin_after()")
    return 0


if __name__ == "__main__":
    sys.exit(main())
