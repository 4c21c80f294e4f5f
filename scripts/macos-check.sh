#!/usr/bin/env bash
# Checks the Mach-O scripts/macos-build.sh linked, by construction (no Mac):
#
#   scripts/macos-check.sh OUTDIR
#
# Every file: arm64 (cputype ARM64), the right file type (MH_EXECUTE for
# bin/*, MH_DYLIB for lib/*), platform macOS with minos 13.0 (LC_BUILD_VERSION),
# and an ad-hoc code signature (LC_CODE_SIGNATURE whose blob is an embedded
# signature with a CodeDirectory flagged adhoc; arm64 macOS kills unsigned code).
# The shim (lib/libmetalift.dylib): loads /usr/lib/libSystem.B.dylib and nothing
# else, install name /usr/local/metalift/lib/libmetalift.dylib, exports exactly
# shim/c/exports.macos.txt. The inert stub: libSystem only, no export, no initializer.
# metaliftd: the os_log C layer is linked in (defines _metalift_oslog_error,
# imports _os_log_impl, Mach-O __os_log_impl), and that C layer, run on this
# host against fake libSystem functions (daemon/c/oslog_test.c, clang-22),
# hands the unified log a PUBLIC string argument at the right level.
#
# Exits 1 at the first failed check, naming it. Env: OBJDUMP (llvm-objdump-22),
# NM (llvm-nm-22), CLANG (clang-22), SHIM_C_DIR (shim/c).
set -euo pipefail

[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 64; }
out=$1
repo=$(cd "$(dirname "$0")/.." && pwd)
objdump=${OBJDUMP:-llvm-objdump-22}
nm=${NM:-llvm-nm-22}
clang=${CLANG:-clang-22}
shim_dir=${SHIM_C_DIR:-$repo/shim/c}
readonly install_name=/usr/local/metalift/lib/libmetalift.dylib
checks=0

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

assert_macho() { # assert_macho FILE FILETYPE
  local file=$1 want=$2 got minos platform
  [ -f "$file" ] || fail "$file is missing"
  got=$(headers "$file" | awk '$1 == "MH_MAGIC_64" && !done { print $2, $5; done = 1 }')
  [ "$got" = "ARM64 $want" ] || fail "$file is '$got', want 'ARM64 $want'"
  read -r platform minos < <(headers "$file" | awk '
    /cmd LC_BUILD_VERSION/ { want = 1; next }
    want && $1 == "platform" { p = $2 }
    want && $1 == "minos" && !done { print p, $2; done = 1 }') || true
  [ "${platform:-}" = macos ] || fail "$file: LC_BUILD_VERSION platform '${platform:-none}', want macos"
  [ "${minos:-}" = 13.0 ] || fail "$file: minos '${minos:-none}', want 13.0"
  assert_adhoc_signed "$file"
  ok "$(basename "$file"): $want arm64, macOS 13.0, ad-hoc signed"
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

inert=$out/lib/libmetalift-inert.dylib
assert_macho "$inert" DYLIB
assert_only_libsystem "$inert"
[ -z "$(exports "$inert")" ] || fail "$inert exports: $(exports "$inert" | tr '\n' ' ')"
if grep -Eq '__mod_init_func|__init_offsets' <<<"$("$objdump" --macho --section-headers "$inert")"; then
  fail "$inert has an initializer section"
fi
ok "libmetalift-inert.dylib exports nothing and has no initializer"

shim=$out/lib/libmetalift.dylib
assert_macho "$shim" DYLIB
assert_only_libsystem "$shim"
id=$(headers "$shim" | awk '/cmd LC_ID_DYLIB/ { want = 1; next } want && $1 == "name" && !done { print $2; done = 1 }')
[ "$id" = "$install_name" ] || fail "shim install name '$id', want $install_name"
ok "libmetalift.dylib install name $install_name"
# Its constructor is all there is to it: without an initializer dyld would run nothing.
grep -Eq '__mod_init_func|__init_offsets' <<<"$("$objdump" --macho --section-headers "$shim")" ||
  fail "$shim has no initializer section: its constructor would never run"
ok "libmetalift.dylib has an initializer (its constructor)"
want=$({ grep -v '^[[:space:]]*\(#\|$\)' "$shim_dir/exports.macos.txt" || true; } | sed 's/^[[:space:]]*/_/; s/[[:space:]]*$//' | sort)
got=$(exports "$shim")
[ "$got" = "$want" ] || fail "shim exports differ from exports.macos.txt:
$(diff <(echo "$want") <(echo "$got") || true)"
ok "libmetalift.dylib exports exactly shim/c/exports.macos.txt ($(printf "%s" "$want" | grep -c . || true) symbols)"

echo "macos-check: $checks checks passed"
