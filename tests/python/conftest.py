"""Fixtures of the Python package tests: the bundled model, one shared LLM, the CLI binary.

The package is imported as installed (`pip install .`), or from the CMake build tree when
$DSINFER_PYTHON_BUILD names its python/ folder (what ./test.sh does: no second build)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if os.environ.get("DSINFER_PYTHON_BUILD"):
    sys.path.insert(0, os.environ["DSINFER_PYTHON_BUILD"])

MODEL = os.environ.get("DSINFER_TEST_MODEL", str(REPO / "models" / "dsv4-mini"))


@pytest.fixture(scope="session")
def model_dir() -> str:
    return MODEL


@pytest.fixture(scope="session")
def llm():
    from dsinfer import LLM

    return LLM(model=MODEL)


def _find_cli():
    env = os.environ.get("DSINFER_CLI")
    if env:
        return env
    for d in ("build", "build-cpu"):
        p = REPO / d / "bin" / "dsinfer"
        if p.exists():
            return str(p)
    return shutil.which("dsinfer")


@pytest.fixture(scope="session")
def cli():
    """Runs `dsinfer generate` on a list of JSONL request objects; returns the result objects."""
    exe = _find_cli()
    if exe is None:
        pytest.skip("no dsinfer binary (set DSINFER_CLI or build build/bin/dsinfer)")

    def run(requests, tmp_path, *flags):
        import json

        inp = tmp_path / "in.jsonl"
        out = tmp_path / "out.jsonl"
        inp.write_text("".join(json.dumps(r) + "\n" for r in requests))
        subprocess.run(
            [exe, "generate", "--model", MODEL, "--input", str(inp), "--output", str(out),
             "--no-progress", *flags],
            check=True,
            capture_output=True,
        )
        return [json.loads(line) for line in out.read_text().splitlines()]

    return run
