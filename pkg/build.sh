#!/bin/bash
# Builds metalift.pkg on a Mac (Apple Silicon or Intel with the arm64 targets).
#
#   pkg/build.sh [--sign IDENTITY] [--installer-sign IDENTITY] [--out DIR]
#
#   --sign IDENTITY            codesign identity for the binaries and the shim
#                              (a "Developer ID Application: ..."); default: ad hoc
#   --installer-sign IDENTITY  productsign identity for the .pkg
#                              (a "Developer ID Installer: ..."); default: unsigned
#   --out DIR                  output directory (default: target/pkg)
#
# Needs: Xcode command line tools (lipo, codesign, pkgbuild, productbuild),
# rustup with the aarch64-apple-darwin target and a nightly toolchain with
# rust-src (arm64e is a tier-3 target, built with -Zbuild-std).
#
# Steps: release builds (binaries for arm64; the shim for arm64 and arm64e),
# `lipo` the universal shim (an arm64-only dylib makes dyld refuse it in arm64e
# processes, and injected libraries are inherited by every child, system tools
# included), stage the payload with pkg/stage.sh, codesign, pkgbuild the
# component with pkg/scripts, productbuild with pkg/Distribution.xml, and
# optionally productsign.
set -euo pipefail

usage() {
  echo "usage: $0 [--sign IDENTITY] [--installer-sign IDENTITY] [--out DIR]" >&2
  exit 64
}

repo=$(cd "$(dirname "$0")/.." && pwd)
sign_identity=""
installer_identity=""
out="$repo/target/pkg"
while [ $# -gt 0 ]; do
  case "$1" in
    --sign) [ $# -ge 2 ] || usage; sign_identity=$2; shift 2 ;;
    --installer-sign) [ $# -ge 2 ] || usage; installer_identity=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
    *) usage ;;
  esac
done

if [ "$(uname -s)" != Darwin ]; then
  echo "build.sh needs macOS (pkgbuild, productbuild, codesign, lipo)." >&2
  echo "On other systems, pkg/stage.sh assembles the same payload tree for inspection." >&2
  exit 1
fi

cd "$repo"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
[ -n "$version" ] || { echo "build.sh: no version in Cargo.toml" >&2; exit 1; }

step() { printf '\n==> %s\n' "$*"; }

step "release builds (aarch64-apple-darwin)"
cargo build --release --locked --target aarch64-apple-darwin \
  -p metalift-daemon -p metalift-probe -p metalift-shim

step "shim for arm64e (nightly, -Zbuild-std)"
cargo +nightly build --release --locked --target arm64e-apple-darwin \
  -Zbuild-std -p metalift-shim

step "universal shim"
rm -rf "$out"
mkdir -p "$out"
lipo -create -output "$out/libmetalift.dylib" \
  target/aarch64-apple-darwin/release/libmetalift.dylib \
  target/arm64e-apple-darwin/release/libmetalift.dylib
lipo -info "$out/libmetalift.dylib"

step "payload"
root="$out/root"
bash pkg/stage.sh "$root" --bin-dir target/aarch64-apple-darwin/release \
  --shim "$out/libmetalift.dylib"

step "codesign (${sign_identity:-ad hoc})"
bin="$root/usr/local/metalift/bin"
sign() { # sign [codesign options...] PATH
  if [ -n "$sign_identity" ]; then
    codesign --force --timestamp --sign "$sign_identity" "$@"
  else
    codesign --force --sign - "$@"
  fi
}
# The daemon and the CLI get the Hardened Runtime. metalift-probe must not:
# its whole job is to accept DYLD_INSERT_LIBRARIES. The shim is a library; the
# runtime flag means nothing on it, but a Developer ID signature lets it load
# into hardened processes of the same team.
sign --options runtime "$bin/metaliftd"
sign --options runtime "$bin/metalift"
sign "$bin/metalift-probe"
sign "$root/usr/local/metalift/lib/libmetalift.dylib"
codesign --verify --strict --verbose=1 "$bin/metaliftd" "$bin/metalift" "$bin/metalift-probe" \
  "$root/usr/local/metalift/lib/libmetalift.dylib"

step "pkgbuild + productbuild"
pkgbuild --root "$root" --scripts pkg/scripts \
  --identifier com.metalift.pkg --version "$version" \
  --install-location / --ownership recommended \
  "$out/metalift-component.pkg"
productbuild --distribution pkg/Distribution.xml --package-path "$out" \
  "$out/metalift-$version-unsigned.pkg"

final="$out/metalift-$version.pkg"
if [ -n "$installer_identity" ]; then
  step "productsign"
  productsign --timestamp --sign "$installer_identity" \
    "$out/metalift-$version-unsigned.pkg" "$final"
  rm -f "$out/metalift-$version-unsigned.pkg"
  pkgutil --check-signature "$final"
else
  mv "$out/metalift-$version-unsigned.pkg" "$final"
fi
echo
echo "built $final"
