#!/usr/bin/env bash
# Installs the build and test dependencies that are missing (Debian/Ubuntu packages).
# Sourced by run.sh and test.sh; safe to run repeatedly (does nothing when all are present).
dsi_install_deps() {
  local pkgs=(cmake ninja-build g++ pkg-config nlohmann-json3-dev libcli11-dev libgtest-dev ccache)
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
