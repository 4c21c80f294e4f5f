#!/usr/bin/env bash
# Checks the Mach-O scripts/macos-build.sh linked, by construction (no Mac):
#
#   scripts/macos-check.sh OUTDIR
#
# bin/*: arm64 (cputype ARM64), MH_EXECUTE. lib/*: universal, exactly the slices
# arm64 and x86_64 (llvm-lipo -archs; x86_64 for Rosetta children, which dyld
# kills when an inserted library has no slice for them), each slice checked on
# its own: MH_DYLIB. Every file or slice: platform macOS with minos 13.0
# (LC_BUILD_VERSION) and an ad-hoc code signature (LC_CODE_SIGNATURE whose blob
# is an embedded signature with a CodeDirectory flagged adhoc; arm64 macOS kills
# unsigned code; x86_64 would run unsigned, but pkg/build.sh's codesign signs
# every slice and this one is held to the same). Each slice of the shim
# (lib/libmetalift.dylib): loads /usr/lib/libSystem.B.dylib and nothing else,
# install name /usr/local/metalift/lib/libmetalift.dylib, exports exactly
# shim/c/exports.macos.txt, has an initializer, and imports only symbols zig's
# libSystem.tbd exports for that slice's target, never a legacy one whose
# `$INODE64` variant exists (x86_64's `_fstat` is the 32-bit-inode stat; the
# shim's struct stat is the 64-bit-inode one, `_fstat$INODE64`). The inert
# stub: libSystem only, no export, no initializer, per slice.
# metaliftd: the os_log C layer is linked in (defines _metalift_oslog_error,
# imports _os_log_impl, Mach-O __os_log_impl), and that C layer, run on this
# host against fake libSystem functions (daemon/c/oslog_test.c, clang-22),
# hands the unified log a PUBLIC string argument at the right level.
#
# Exits 1 at the first failed check, naming it. Env: OBJDUMP (llvm-objdump-22),
# NM (llvm-nm-22), CLANG (clang-22), LIPO (llvm-lipo-22), SHIM_C_DIR (shim/c),
# LIBSYSTEM_TBD (zig's lib/libc/darwin/libSystem.tbd, from pip's ziglang).
set -euo pipefail

[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 64; }
out=$1
repo=$(cd "$(dirname "$0")/.." && pwd)
objdump=${OBJDUMP:-llvm-objdump-22}
nm=${NM:-llvm-nm-22}
clang=${CLANG:-clang-22}
lipo=${LIPO:-llvm-lipo-22}
shim_dir=${SHIM_C_DIR:-$repo/shim/c}
readonly install_name=/usr/local/metalift/lib/libmetalift.dylib
checks=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The slices every shipped library has (arm64e is added by pkg/build.sh on a Mac).
readonly lib_arches="arm64 x86_64"
libsystem_tbd=${LIBSYSTEM_TBD:-$(python3 -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "lib"))')/libc/darwin/libSystem.tbd}

fail() { echo "macos-check: FAIL: $*" >&2; exit 1; }
ok() { checks=$((checks + 1)); echo "macos-check: ok: $*"; }

# Whole outputs are read before awk looks at them: an awk that stops early
# would SIGPIPE the producer, which pipefail turns into a silent exit.
headers() { local h; h=$("$objdump" --macho --private-headers "$1"); printf '%s\n' "$h"; }

# The dylibs a file loads, one per line (every load-dylib flavour).
loaded_dylibs() {
  headers "$1" | awk '
    /cmd LC_(LOAD|LOAD_WEAK|REEXPORT|LAZY_LOAD|LOAD_UPWARD)_DYLIB$/ { want = 1; next }
    want && $1 == "name" { print $2; want = 0 }'
}

# Exported symbols (the export trie), sorted.
exports() {
  local t
  t=$("$objdump" --macho --exports-trie "$1")
  printf '%s\n' "$t" | awk '$1 ~ /^0x/ { print $NF }' | sort
}

# The ad-hoc signature: superblob 0xfade0cc0 holding a CodeDirectory 0xfade0c02
# whose flags have CS_ADHOC (0x2).
assert_adhoc_signed() {
  local file=$1 dataoff datasize
  read -r dataoff datasize < <(headers "$file" | awk '
    /cmd LC_CODE_SIGNATURE/ { want = 1; next }
    want && $1 == "dataoff" { off = $2 }
    want && $1 == "datasize" && !done { print off, $2; done = 1 }') || true
  [ -n "${dataoff:-}" ] || fail "$file has no LC_CODE_SIGNATURE"
  python3 - "$file" "$dataoff" "$datasize" <<'PY' || fail "$file: the code signature is not an ad-hoc embedded signature"
import struct, sys
path, off, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
blob = open(path, "rb").read()[off:off + size]
magic, _length, count = struct.unpack(">III", blob[:12])
assert magic == 0xFADE0CC0, hex(magic)
for i in range(count):
    _type, boff = struct.unpack(">II", blob[12 + 8 * i:20 + 8 * i])
    if struct.unpack(">I", blob[boff:boff + 4])[0] == 0xFADE0C02:
        flags = struct.unpack(">I", blob[boff + 12:boff + 16])[0]
        assert flags & 0x2, "CodeDirectory not flagged adhoc"
        sys.exit(0)
sys.exit("no CodeDirectory")
PY
}

assert_macho() { # assert_macho FILE FILETYPE [ARCH, default arm64]
  local file=$1 want=$2 arch=${3:-arm64} cpu got minos platform
  case "$arch" in
    arm64) cpu=ARM64 ;;
    x86_64) cpu=X86_64 ;;
    *) fail "assert_macho: unknown arch $arch" ;;
  esac
  [ -f "$file" ] || fail "$file is missing"
  got=$(headers "$file" | awk '$1 == "MH_MAGIC_64" && !done { print $2, $5; done = 1 }')
  [ "$got" = "$cpu $want" ] || fail "$file is '$got', want '$cpu $want'"
  read -r platform minos < <(headers "$file" | awk '
    /cmd LC_BUILD_VERSION/ { want = 1; next }
    want && $1 == "platform" { p = $2 }
    want && $1 == "minos" && !done { print p, $2; done = 1 }') || true
  [ "${platform:-}" = macos ] || fail "$file: LC_BUILD_VERSION platform '${platform:-none}', want macos"
  [ "${minos:-}" = 13.0 ] || fail "$file: minos '${minos:-none}', want 13.0"
  assert_adhoc_signed "$file"
  ok "$(basename "$file"): $want $arch, macOS 13.0, ad-hoc signed"
}

# extract_slices FILE: checks FILE is universal with exactly $lib_arches and
# writes each slice to "$(slice_path FILE ARCH)".
slice_path() { echo "$work/$(basename "$1" .dylib)-$2.dylib"; }
extract_slices() {
  local file=$1 arch got
  [ -f "$file" ] || fail "$file is missing"
  got=$("$lipo" -archs "$file" | tr ' ' '\n' | grep . | sort | tr '\n' ' ') ||
    fail "$file is not a Mach-O file llvm-lipo can read"
  [ "$got" = "$lib_arches " ] || fail "$file has slices '$got', want '$lib_arches'"
  for arch in $lib_arches; do
    "$lipo" "$file" -thin "$arch" -output "$(slice_path "$file" "$arch")" ||
      fail "$file: no $arch slice to extract"
  done
  ok "$(basename "$file"): universal, slices ${got% }"
}

# The libSystem.tbd targets a slice was linked against: x86_64 as it is; arm64
# as macos-build.sh hands lld zig's file (arm64e.x1 renamed arm64).
tbd_targets() {
  case "$1" in
    x86_64) echo x86_64-macos ;;
    arm64) echo arm64-macos,arm64e.x1-macos ;;
    *) fail "tbd_targets: unknown arch $1" ;;
  esac
}

# libsystem_import_problems TARGETS SYMBOLS...: prints each (undefined) symbol
# libSystem.tbd does not export for TARGETS, and each legacy one whose
# `$INODE64` variant it does export; exits non-zero if there is one.
libsystem_import_problems() {
  python3 - "$libsystem_tbd" "$@" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
want = set(sys.argv[2].split(","))
exported, targets = set(), set()
# tbd v4 is YAML whose lists are all flow sequences: "key: [ a, 'b$c', ... ]",
# each exports/reexports item's "targets" list before its "symbols" lists.
for key, body in re.findall(r"([\w-]+):\s*\[([^\]]*)\]", text):
    items = {i.strip().strip("'\"") for i in body.split(",") if i.strip()}
    if key == "targets":
        targets = items
    elif key in ("symbols", "weak-symbols") and targets & want:
        exported |= items
if len(exported) < 1000:
    sys.exit(f"{sys.argv[1]}: only {len(exported)} symbols for {sys.argv[2]}: not a libSystem.tbd")
bad = 0
for sym in sys.argv[3:]:
    if sym not in exported:
        print(f"{sym}: not exported by libSystem for {sys.argv[2]}")
        bad = 1
    elif sym + "$INODE64" in exported:
        print(f"{sym}: the legacy 32-bit-inode function; the 64-bit-inode one is {sym}$INODE64")
        bad = 1
sys.exit(bad)
PY
}

assert_imports_from_libsystem() { # FILE ARCH
  local problems
  local -a imports
  mapfile -t imports < <("$nm" -u "$1")
  [ ${#imports[@]} -gt 0 ] || fail "$1 ($2) imports nothing: llvm-nm -u read no symbols"
  problems=$(libsystem_import_problems "$(tbd_targets "$2")" "${imports[@]}") ||
    fail "$1 ($2) imports what libSystem does not export for it:
$problems"
  ok "$(basename "$1"): its ${#imports[@]} imports are all libSystem exports for $2"
}

assert_only_libsystem() {
  local dylibs
  dylibs=$(loaded_dylibs "$1" | tr '\n' ' ')
  [ "$dylibs" = "/usr/lib/libSystem.B.dylib " ] || fail "$1 loads: $dylibs(want libSystem only)"
  ok "$(basename "$1") loads /usr/lib/libSystem.B.dylib only"
}

for bin in metaliftd metalift metalift-probe; do
  assert_macho "$out/bin/$bin" EXECUTE
done

symbols=$("$nm" "$out/bin/metaliftd")
grep -q ' T _metalift_oslog_error$' <<<"$symbols" ||
  fail "metaliftd does not contain daemon/c/oslog.c (_metalift_oslog_error)"
grep -Eq '^ +U __os_log_impl$' <<<"$symbols" ||
  fail "metaliftd does not call _os_log_impl"
ok "metaliftd carries the os_log C layer"
oslog_test=$(mktemp -d)
"$clang" -Wall -Wextra -Werror -o "$oslog_test/oslog_test" \
  "$repo/daemon/c/oslog_test.c" "$repo/daemon/c/oslog.c" ||
  fail "daemon/c/oslog_test.c does not build"
"$oslog_test/oslog_test" || fail "daemon/c/oslog.c: see oslog_test's failures above"
rm -rf "$oslog_test"
ok "daemon/c/oslog.c logs one public string per call, at each level's os_log type"

# The import check proves itself first: an x86_64 object calling the legacy
# fstat and a function libSystem lacks must fail it, naming both.
cat >"$work/control.c" <<'C'
extern int fstat(int fd, void *st);
extern int metalift_no_such_function(void);
int control(void *st) { return fstat(0, st) + metalift_no_such_function(); }
C
python3 -m ziglang cc -target x86_64-macos.13.0 -c -O2 -o "$work/control.o" "$work/control.c" ||
  fail "the import check's negative control does not compile"
mapfile -t control_imports < <("$nm" -u "$work/control.o")
if control=$(libsystem_import_problems "$(tbd_targets x86_64)" "${control_imports[@]}"); then
  fail "the import check passes an object calling _fstat and _metalift_no_such_function"
fi
for reason in '^_fstat: the legacy' '^_metalift_no_such_function: not exported'; do
  grep -q "$reason" <<<"$control" || fail "the import check's negative control failed for the wrong reason: $control"
done
ok "the import check refuses the legacy _fstat and a symbol libSystem lacks (negative control)"

inert=$out/lib/libmetalift-inert.dylib
extract_slices "$inert"
for arch in $lib_arches; do
  slice=$(slice_path "$inert" "$arch")
  assert_macho "$slice" DYLIB "$arch"
  assert_only_libsystem "$slice"
  [ -z "$(exports "$slice")" ] || fail "$inert ($arch) exports: $(exports "$slice" | tr '\n' ' ')"
  if grep -Eq '__mod_init_func|__init_offsets' <<<"$("$objdump" --macho --section-headers "$slice")"; then
    fail "$inert ($arch) has an initializer section"
  fi
  ok "libmetalift-inert.dylib ($arch) exports nothing and has no initializer"
done

shim=$out/lib/libmetalift.dylib
want=$({ grep -v '^[[:space:]]*\(#\|$\)' "$shim_dir/exports.macos.txt" || true; } | sed 's/^[[:space:]]*/_/; s/[[:space:]]*$//' | sort)
extract_slices "$shim"
for arch in $lib_arches; do
  slice=$(slice_path "$shim" "$arch")
  assert_macho "$slice" DYLIB "$arch"
  assert_only_libsystem "$slice"
  assert_imports_from_libsystem "$slice" "$arch"
  id=$(headers "$slice" | awk '/cmd LC_ID_DYLIB/ { want = 1; next } want && $1 == "name" && !done { print $2; done = 1 }')
  [ "$id" = "$install_name" ] || fail "shim ($arch) install name '$id', want $install_name"
  ok "libmetalift.dylib ($arch) install name $install_name"
  # Its constructor is all there is to it: without an initializer dyld would run nothing.
  grep -Eq '__mod_init_func|__init_offsets' <<<"$("$objdump" --macho --section-headers "$slice")" ||
    fail "$shim ($arch) has no initializer section: its constructor would never run"
  ok "libmetalift.dylib ($arch) has an initializer (its constructor)"
  got=$(exports "$slice")
  [ "$got" = "$want" ] || fail "shim ($arch) exports differ from exports.macos.txt:
$(diff <(echo "$want") <(echo "$got") || true)"
  ok "libmetalift.dylib ($arch) exports exactly shim/c/exports.macos.txt ($(printf "%s" "$want" | grep -c . || true) symbols)"
done

echo "macos-check: $checks checks passed"
