#!/usr/bin/env bash
# CI step for the shim (called once from .ci/run): installs clang-22 and
# llvm-22 (Debian bookworm-security ships them; idempotent) and runs the arm64e
# pointer-authentication check of shim/c/*.c (scripts/shim-arm64e-check.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v clang-22 >/dev/null || ! command -v llvm-objdump-22 >/dev/null; then
  sudo_if_needed() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }
  sudo_if_needed apt-get update -qq
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang-22 llvm-22
fi

echo "==> shim: arm64e object code (pointer authentication)"
bash scripts/shim-arm64e-check.sh
