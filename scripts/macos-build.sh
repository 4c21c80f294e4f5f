#!/usr/bin/env bash
# Links Mach-O for everything metalift ships, on Linux, without an SDK.
#
#   scripts/macos-build.sh OUTDIR [--release]
#
# Output (OUTDIR):
#   bin/metaliftd bin/metalift bin/metalift-probe   MH_EXECUTE arm64, cargo-zigbuild
#   lib/libmetalift.dylib                           MH_DYLIB arm64 + x86_64, the C shim (shim/c/*.c)
#   lib/libmetalift-inert.dylib                     MH_DYLIB arm64 + x86_64, uninstall's inert stub
# Minimum macOS 13.0 (LC_BUILD_VERSION), every file and slice ad-hoc signed by the
# linker (LC_CODE_SIGNATURE: arm64 macOS refuses unsigned code). scripts/macos-check.sh
# verifies all of that; scripts/ci-macos.sh runs both.
#
# How:
# - Rust: `cargo zigbuild --target aarch64-apple-darwin` (zig as the linker),
#   MACOSX_DEPLOYMENT_TARGET=13.0 (zig would default to 15.0 and the binaries
#   would refuse macOS 13/14 guests). Frameworks and libraries zig does not
#   ship come from .tbd stubs written by scripts/tbd/gen-tbd.py from the
#   symbol lists in scripts/tbd/ into target/macos/tbd (a fixed path: the
#   RUSTFLAGS naming it are part of cargo's cache key). Default profile dev (CI time); --release for
#   the optimised build. Target directory: target/macos (kept apart so the
#   host builds and `cargo check --target aarch64-apple-darwin` stay warm).
#   daemon/build.rs compiles daemon/c/oslog.c with zig's C compiler (CC_<target>).
#   arm64 only: these processes are never injected anywhere.
# - The shim and the inert stub, once per slice: compiled by `zig cc -target
#   aarch64-macos.13.0` / `x86_64-macos.13.0` (it ships macOS libc headers),
#   linked by ld64.lld-22 (`-arch arm64` / `-arch x86_64`, `-adhoc_codesign`),
#   joined by `llvm-lipo-22 -create` into one universal file. The x86_64 slice
#   is there for Rosetta: an x86_64 child of an injected process inherits
#   DYLD_INSERT_LIBRARIES, and dyld terminates a process whose inserted library
#   has no slice for it (dyld DyldRuntimeState.cpp, RuntimeState::loadInsertedLibraries:
#   "terminating because inserted dylib ... could not be loaded"). arm64e comes
#   only from pkg/build.sh (Apple's ld): ld64.lld-22 cannot link it (checked:
#   `-arch arm64e` writes cpusubtype ARM64_ALL, and it rejects the
#   ARM64_RELOC_AUTHENTICATED_POINTER relocations of an arm64e object as
#   "INVALID relocation"). zig's own linker ignores -exported_symbols_list
#   (checked: it exported every global) and lld honours it. lld-22 cannot parse
#   zig's libSystem.tbd (unknown arch "arm64e.x1"), so
#   target/macos/tbd/lld/libSystem.tbd is zig's with those targets renamed arm64.
#   Install name /usr/local/metalift/lib/libmetalift.dylib (where pkg installs
#   it); exports exactly shim/c/exports.macos.txt (nothing). Only libSystem is linked.
#
# Env: SHIM_C_DIR (default shim/c), LD64_LLD (default ld64.lld-22), LIPO
# (default llvm-lipo-22).
set -euo pipefail
# The shim's version define: the workspace version, as shim/build.rs passes it.
shim_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$(dirname "$0")/../Cargo.toml" | head -n 1)

usage() { echo "usage: $0 OUTDIR [--release]" >&2; exit 64; }
repo=$(cd "$(dirname "$0")/.." && pwd)
out="" profile=dev
while [ $# -gt 0 ]; do
  case "$1" in
    --release) profile=release; shift ;;
    -*) usage ;;
    *) [ -z "$out" ] || usage; out=$1; shift ;;
  esac
done
[ -n "$out" ] || usage
mkdir -p "$out/bin" "$out/lib"
out=$(cd "$out" && pwd)
tbd=$repo/target/macos/tbd
mkdir -p "$tbd"
shim_dir=${SHIM_C_DIR:-$repo/shim/c}
lld=${LD64_LLD:-ld64.lld-22}
lipo=${LIPO:-llvm-lipo-22}
readonly install_name=/usr/local/metalift/lib/libmetalift.dylib
export MACOSX_DEPLOYMENT_TARGET=13.0

step() { printf '\n==> %s\n' "$*"; }

step "link stubs (.tbd) from scripts/tbd"
python3 "$repo/scripts/tbd/gen-tbd.py" "$tbd"
zig_lib=$(python3 -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "lib"))')
# For lld only (its own directory: zig must keep finding its own libSystem).
mkdir -p "$tbd/lld"
sed 's/arm64e\.x1-/arm64-/g' "$zig_lib/libc/darwin/libSystem.tbd" >"$tbd/lld/libSystem.tbd"

step "Rust binaries (cargo zigbuild, profile $profile)"
start=$(date +%s)
profile_flag=()
[ "$profile" = release ] && profile_flag=(--release)
(
  cd "$repo"
  CARGO_TARGET_DIR="$repo/target/macos" \
  CARGO_TARGET_AARCH64_APPLE_DARWIN_RUSTFLAGS="-L framework=$tbd/Frameworks -L native=$tbd/lib" \
    cargo zigbuild --locked "${profile_flag[@]}" --target aarch64-apple-darwin \
    -p metalift-daemon -p metalift-cli -p metalift-probe --bin metaliftd --bin metalift --bin metalift-probe
)
built="$repo/target/macos/aarch64-apple-darwin/$([ "$profile" = release ] && echo release || echo debug)"
for bin in metaliftd metalift metalift-probe; do
  cp -f "$built/$bin" "$out/bin/$bin"
done
echo "macos-build: Rust binaries in $(( $(date +%s) - start )) s"

# The slices of the shim and the inert stub: lld's -arch and zig's target.
readonly slices="arm64:aarch64 x86_64:x86_64"

# c_dylib OUTPUT EXPORTS_FILE_OR_EMPTY SOURCES...: compile with zig cc and link
# with lld once per slice, then lipo the slices into OUTPUT.
c_dylib() {
  local output=$1 exports=$2 objdir src slice arch
  shift 2
  objdir=$(mktemp -d)
  local -a export_flags=() thin=()
  if [ -n "$exports" ]; then
    # Mach-O spells C names with a leading underscore.
    { grep -v '^[[:space:]]*\(#\|$\)' "$exports" || true; } | sed 's/^[[:space:]]*/_/; s/[[:space:]]*$//' >"$objdir/exports"
  else
    : >"$objdir/exports"
  fi
  export_flags=(-exported_symbols_list "$objdir/exports")
  for slice in $slices; do
    arch=${slice%%:*}
    local -a objects=()
    mkdir -p "$objdir/$arch"
    for src in "$@"; do
      python3 -m ziglang cc -target "${slice##*:}-macos.13.0" -c -fPIC -O2 -Wall -fno-jump-tables -fblocks \
        "-DML_SHIM_VERSION=\"$shim_version\"" \
        -o "$objdir/$arch/$(basename "$src" .c).o" "$src"
      objects+=("$objdir/$arch/$(basename "$src" .c).o")
    done
    "$lld" -dylib -arch "$arch" -platform_version macos 13.0 13.0 -adhoc_codesign \
      -install_name "$install_name" "${export_flags[@]}" \
      -L "$tbd/lld" -lSystem -o "$objdir/$arch.dylib" "${objects[@]}"
    thin+=("$objdir/$arch.dylib")
  done
  "$lipo" -create -output "$output" "${thin[@]}"
  "$lipo" -info "$output"
  rm -rf "$objdir"
}

step "inert stub (pkg/inert/libmetalift-inert.c)"
c_dylib "$out/lib/libmetalift-inert.dylib" "" "$repo/pkg/inert/libmetalift-inert.c"

step "shim (shim/c/*.c)"
shopt -s nullglob
sources=("$shim_dir"/*.c)
[ ${#sources[@]} -gt 0 ] || { echo "macos-build: no .c files in $shim_dir" >&2; exit 1; }
[ -f "$shim_dir/exports.macos.txt" ] || { echo "macos-build: $shim_dir/exports.macos.txt is missing" >&2; exit 1; }
c_dylib "$out/lib/libmetalift.dylib" "$shim_dir/exports.macos.txt" "${sources[@]}"

echo
echo "macos-build: Mach-O in $out (binaries arm64; the shim and the inert stub arm64 + x86_64)"
