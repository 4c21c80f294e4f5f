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
# Needs: Xcode command line tools (clang, lipo, otool, nm, codesign, pkgbuild,
# productbuild) and rustup with the aarch64-apple-darwin target.
#
# Steps:
# - Rust release builds, arm64 only: metaliftd, metalift, metalift-probe are
#   separate processes that are never injected anywhere, so nothing requires
#   them to match an arm64e host (an arm64 process runs fine on any Apple
#   Silicon Mac; rustc emits no pointer authentication for arm64e anyway).
# - The shim from shim/c/*.c with Apple clang, for arm64 AND arm64e
#   (-target arm64e-apple-macos13: clang signs and authenticates every function
#   pointer), `lipo`ed into one universal dylib: an injected library is inherited
#   by every child, system tools included, and an arm64e process (Apple's own
#   binaries) accepts only an arm64e slice (dyld GradedArchitectures.cpp). The
#   arm64e slice must carry the versioned pointer-authentication ABI
#   (cpusubtype ARM64E with the PTRAUTH_ABI capability bit, `otool -hv`: "E PAC00"),
#   not the unversioned arm64e.old that dyld-1323 and later refuse: checked below.
#   And for x86_64 (-target x86_64-apple-macos13.0, the same C): an x86_64
#   process under Rosetta inherits DYLD_INSERT_LIBRARIES too, and dyld
#   terminates a process whose inserted library has no slice for its
#   architecture (dyld DyldRuntimeState.cpp, RuntimeState::loadInsertedLibraries:
#   "terminating because inserted dylib ... could not be loaded"). Its stat
#   calls must be the 64-bit-inode ones (_fstat$INODE64, shim/c/metalift_shim.h):
#   checked below.
#   Exports: exactly shim/c/exports.macos.txt (nothing; -fno-jump-tables: see scripts/shim-arm64e-check.sh); install name: the installed path.
# - The inert stub (pkg/inert/libmetalift-inert.c, uninstall.sh --force) the
#   same way: arm64 + arm64e + x86_64, no code.
# - Stage the payload with pkg/stage.sh, codesign, pkgbuild the component with
#   pkg/scripts (payload: /usr/local/metalift only), productbuild with
#   pkg/Distribution.xml, optionally productsign.
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
MACOSX_DEPLOYMENT_TARGET=13.0 cargo build --release --locked --target aarch64-apple-darwin \
  -p metalift-daemon -p metalift-cli -p metalift-probe

rm -rf "$out"
mkdir -p "$out/slices"
readonly install_name=/usr/local/metalift/lib/libmetalift.dylib

# The slices of the shim and the inert stub.
readonly dylib_arches="arm64 arm64e x86_64"

# universal_dylib OUTPUT EXPORTS_FILE_OR_EMPTY SOURCES...: every slice, lipo'd.
universal_dylib() {
  local output=$1 exports=$2 arch name
  shift 2
  name=$(basename "$output" .dylib)
  local -a export_flags=()
  if [ -n "$exports" ]; then
    # Mach-O spells C names with a leading underscore.
    { grep -v '^[[:space:]]*\(#\|$\)' "$exports" || true; } | sed 's/^[[:space:]]*/_/; s/[[:space:]]*$//' \
      >"$out/slices/$name.exports"
    export_flags=(-exported_symbols_list "$out/slices/$name.exports")
  fi
  local -a slices=()
  for arch in $dylib_arches; do
    xcrun clang -target "$arch-apple-macos13.0" -dynamiclib -O2 -Wall -Wextra -Werror -fno-jump-tables -fblocks \
      "-DML_SHIM_VERSION=\"$version\"" \
      -install_name "$install_name" ${export_flags[@]+"${export_flags[@]}"} \
      -o "$out/slices/$name-$arch.dylib" "$@"
    slices+=("$out/slices/$name-$arch.dylib")
  done
  lipo -create -output "$output" "${slices[@]}"
  lipo -detailed_info "$output"
  check_slices "$output"
  check_arm64e_abi "$output"
  check_x86_64_inode64 "$output"
  for arch in $dylib_arches; do
    check_libsystem_only "$output" "$arch"
  done
}

# Exactly $dylib_arches, in any order.
check_slices() {
  local got want
  got=$(lipo -archs "$1" | tr ' ' '\n' | grep . | sort | tr '\n' ' ')
  want=$(echo "$dylib_arches" | tr ' ' '\n' | sort | tr '\n' ' ')
  if [ "$got" != "$want" ]; then
    echo "build.sh: $1 has slices $got(want $want)" >&2
    exit 1
  fi
}

# On x86_64, plain _fstat/_lstat are the legacy 32-bit-inode functions, whose
# struct stat is not the one shim/c/metalift_shim.h declares.
check_x86_64_inode64() {
  if nm -arch x86_64 -u "$1" | grep -Eqx '_(f|l)stat'; then
    echo "build.sh: $1: the x86_64 slice imports the 32-bit-inode _fstat/_lstat, want _fstat\$INODE64/_lstat\$INODE64" >&2
    exit 1
  fi
}

# The arm64e slice's cpusubtype: ARM64E (2) with the PTRAUTH_ABI capability bit
# (0x80 in otool's caps column: "E PAC00" verbose). 0x00 would be arm64e.old.
check_arm64e_abi() {
  local subtype caps
  read -r subtype caps < <(otool -arch arm64e -h "$1" | awk '$1 ~ /^0x/ { print $3, $4 }')
  if [ "${subtype:-}" != 2 ] || [ $(( ${caps:-0} & 0x80 )) -eq 0 ]; then
    echo "build.sh: $1: arm64e slice has cpusubtype ${subtype:-?} caps ${caps:-?}, want 2 with 0x80 (versioned pointer-authentication ABI)" >&2
    exit 1
  fi
  otool -arch arm64e -hv "$1"
}

check_libsystem_only() { # FILE ARCH
  local deps
  deps=$(otool -arch "$2" -L "$1" | tail -n +2 | awk '{ print $1 }' | grep -v "^$install_name\$" | tr '\n' ' ')
  if [ "$deps" != "/usr/lib/libSystem.B.dylib " ]; then
    echo "build.sh: $1 ($2) links: $deps(want libSystem only)" >&2
    exit 1
  fi
}

step "shim (shim/c/*.c, Apple clang, arm64 + arm64e + x86_64)"
shopt -s nullglob
shim_sources=(shim/c/*.c)
[ ${#shim_sources[@]} -gt 0 ] || { echo "build.sh: no shim/c/*.c" >&2; exit 1; }
universal_dylib "$out/libmetalift.dylib" shim/c/exports.macos.txt "${shim_sources[@]}"

step "inert stub (uninstall.sh --force)"
universal_dylib "$out/libmetalift-inert.dylib" "" pkg/inert/libmetalift-inert.c

step "payload"
root="$out/root"
bash pkg/stage.sh "$root" --bin-dir target/aarch64-apple-darwin/release \
  --shim "$out/libmetalift.dylib" --inert "$out/libmetalift-inert.dylib"

step "codesign (${sign_identity:-ad hoc})"
bin="$root/usr/local/metalift/bin"
# Every signature's identifier is com.metalift.NAME (codesign --prefix prefixes
# an implicit identifier without a dot: metaliftd -> com.metalift.metaliftd,
# libmetalift.dylib -> com.metalift.libmetalift), stable across releases, so a
# PPPC code requirement or a policy's signing_id can name it. The release
# workflow checks each one (codesign -dv).
sign() { # sign [codesign options...] PATH
  if [ -n "$sign_identity" ]; then
    codesign --force --timestamp --prefix com.metalift. --sign "$sign_identity" "$@"
  else
    codesign --force --prefix com.metalift. --sign - "$@"
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
sign "$root/usr/local/metalift/libexec/libmetalift-inert.dylib"
codesign --verify --strict --verbose=1 "$bin/metaliftd" "$bin/metalift" "$bin/metalift-probe" \
  "$root/usr/local/metalift/lib/libmetalift.dylib" \
  "$root/usr/local/metalift/libexec/libmetalift-inert.dylib"

step "pkgbuild + productbuild"
# The payload is metalift's own directory and nothing above it (pkg/stage.sh):
# with --install-location / and --root "$root", the BOM would also list usr,
# usr/local and whatever else the tree holds, and Installer would apply the
# recorded owner and mode to those existing, shared directories.
pkgbuild --root "$root/usr/local/metalift" --scripts pkg/scripts \
  --identifier com.metalift.pkg --version "$version" \
  --install-location /usr/local/metalift --ownership recommended \
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
