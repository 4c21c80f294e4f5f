#!/usr/bin/env bash
# Checks that the shim's C (shim/c/*.c), compiled for arm64e-apple-macos13 by
# clang, is pointer-authentication correct (issue 11 item 1):
#
#   1. every object is arm64e with the versioned pointer-authentication ABI
#      (cpusubtype 2 with the 0x80 "caps" flag; arm64e.old has caps 0 and is
#      refused by dyld from dyld-1323 on);
#   2. no unauthenticated indirect branch (plain `blr`/`br`) in any text section:
#      every call through a pointer (dlsym results, original IMPs) authenticates;
#   3. every function-pointer constant in data is signed: relocations from data
#      sections to code are ARM64_RELOC_AUTHENTICATED_POINTER (type 11). Exempt:
#      __mod_init_func, whose entries dyld signs itself before calling them
#      (dyld-1378 dyld/Loader.cpp Loader::findAndRunAllInitializers:
#      `__builtin_ptrauth_sign_unauthenticated(func, ptrauth_key_asia, 0)`), and
#      the unwind tables (__compact_unwind, __eh_frame), which are never called.
#
# It proves itself first: two negative controls (a function-pointer table and a
# call through a pointer compiled for plain arm64, and for arm64e with
# -fno-ptrauth-calls -fno-ptrauth-intrinsics) must each fail the same check, or
# the script fails.
#
# Usage: scripts/shim-arm64e-check.sh        (needs clang-22 and llvm-objdump-22;
#        scripts/ci-shim.sh installs them)
set -euo pipefail
cd "$(dirname "$0")/.."

CLANG=${CLANG:-clang-22}
OBJDUMP=${OBJDUMP:-llvm-objdump-22}
NM=${NM:-llvm-nm-22}
TARGET=arm64e-apple-macos13
# No SDK: the compiler's own headers only (shim/c/metalift_shim.h declares libSystem).
INCLUDES=(-nostdinc -isystem "$("$CLANG" -print-resource-dir)/include")
# The flags every arm64e build of the shim must use (shim/build.rs and
# pkg/build.sh too). -fno-jump-tables: a switch (or a loop LLVM turns into one)
# otherwise becomes a jump table, whose `br` is an indirect branch no key covers.
# The shim's version define, from the workspace version as shim/build.rs passes it.
shim_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$(dirname "$0")/../Cargo.toml" | head -n 1)
SHIM_CFLAGS=(-O2 -std=c11 -Wall -Wextra -Werror -fvisibility=hidden -fno-jump-tables -fblocks "-DML_SHIM_VERSION=\"$shim_version\"")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# check_object OBJ: prints each problem; returns non-zero if there is one.
check_object() {
  local obj=$1 problems=0
  # 1. Mach header: cputype ARM64 (16777228), cpusubtype 2 (ARM64E), caps 0x80.
  local header
  header=$("$OBJDUMP" --macho --private-header --non-verbose "$obj" | awk '$1 ~ /^0xfeedfacf$/ {print $2, $3, $4}')
  read -r cputype subtype caps <<<"$header"
  if [[ $cputype != 16777228 || $subtype != 2 || $((caps & 0x80)) -eq 0 ]]; then
    echo "$obj: not arm64e with the versioned ptrauth ABI (cputype $cputype cpusubtype $subtype caps $caps)"
    problems=1
  fi
  # 2. Plain indirect branches in every section holding instructions.
  local sections
  sections=$("$OBJDUMP" --macho --section-headers "$obj" | awk '$NF == "TEXT" {print $2}')
  for section in $sections; do
    local plain
    plain=$("$OBJDUMP" --macho -d --no-show-raw-insn --section="__TEXT,$section" "$obj" |
      grep -E '^[[:space:]]*[0-9a-f]+:[[:space:]]+(blr|br)[[:space:]]' || true)
    if [[ -n $plain ]]; then
      echo "$obj: unauthenticated indirect branch in __TEXT,$section:"
      echo "$plain"
      problems=1
    fi
  done
  # 3. Relocations from data sections to code.
  local code_symbols
  code_symbols=$("$NM" -m "$obj" | awk '/\(__TEXT,__text\)/ {print $NF}')
  local bad
  bad=$("$OBJDUMP" --macho -r "$obj" | awk -v code="$code_symbols" '
    BEGIN { n = split(code, names, "\n"); for (i = 1; i <= n; i++) is_code[names[i]] = 1 }
    /^Relocation information/ { section = $3; next }
    /^address/ { next }
    section ~ /__text|__compact_unwind|__eh_frame|__mod_init_func/ { next }
    {
      target = $NF
      to_code = (target in is_code) || ($0 ~ /\(__TEXT,__text\)/)
      authenticated = ($0 ~ /[[:space:]]11 \(\?\)/)
      if (to_code && !authenticated) print section ": unsigned pointer to " target ": " $0
    }')
  if [[ -n $bad ]]; then
    echo "$obj: function pointers in data that are not signed:"
    echo "$bad"
    problems=1
  fi
  return $problems
}

# The negative controls: the check must catch them.
cat >"$work/control.c" <<'EOF'
static void a(void) {}
static void b(void) {}
void (*const table[])(void) = {a, b};
void call(void (*f)(void)) { f(); }
EOF
"$CLANG" -target arm64-apple-macos13 -O2 -c "$work/control.c" -o "$work/control-arm64.o"
"$CLANG" -target "$TARGET" -O2 -fno-ptrauth-calls -fno-ptrauth-intrinsics \
  -c "$work/control.c" -o "$work/control-noauth.o"
"$CLANG" -target "$TARGET" -O2 -c "$work/control.c" -o "$work/control-arm64e.o"
for control in control-arm64 control-noauth; do
  if check_object "$work/$control.o" >"$work/$control.log"; then
    echo "FAIL: the negative control $control.o passed the check: the check proves nothing"
    exit 1
  fi
  echo "ok: negative control $control.o is refused ($(head -1 "$work/$control.log"))"
done
if ! check_object "$work/control-arm64e.o"; then
  echo "FAIL: the positive control (the same file for $TARGET) does not pass"
  exit 1
fi
echo "ok: positive control control-arm64e.o passes"

status=0
for source in shim/c/*.c; do
  obj="$work/$(basename "$source" .c).o"
  "$CLANG" -target "$TARGET" "${INCLUDES[@]}" "${SHIM_CFLAGS[@]}" -c "$source" -o "$obj"
  if check_object "$obj"; then
    echo "ok: $source ($TARGET)"
  else
    status=1
  fi
done
# The plain arm64 slice must at least compile (pkg/build.sh ships both).
for source in shim/c/*.c; do
  "$CLANG" -target arm64-apple-macos13 "${INCLUDES[@]}" "${SHIM_CFLAGS[@]}" \
    -c "$source" -o "$work/arm64-$(basename "$source" .c).o"
done
echo "ok: shim/c/*.c compile for arm64-apple-macos13"
if [[ $status -ne 0 ]]; then
  echo "FAIL: the shim's arm64e object code is not pointer-authentication correct"
fi
exit $status
