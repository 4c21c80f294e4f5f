#!/usr/bin/env bash
# Assembles the exact payload tree of metalift.pkg under DESTDIR, on any OS, so it
# can be inspected and tested where there is no pkgbuild.
#
#   pkg/stage.sh DESTDIR [--bin-dir DIR] [--shim PATH] [--inert PATH]
#
#   --bin-dir DIR  where metaliftd, metalift and metalift-probe were built
#                  (default: target/release)
#   --shim PATH    the shim to ship (default: DIR/libmetalift.dylib, else
#                  DIR/libmetalift.so)
#   --inert PATH   the inert stub uninstall.sh --force leaves at the shim's path
#                  (default: built here from pkg/inert/libmetalift-inert.c with
#                  ${CC:-cc} -shared, named like the shim: .so or .dylib)
#
# The shim keeps its own file name: on macOS it is lib/libmetalift.dylib; on
# Linux the ELF lib/libmetalift.so stands in for it, named as what it is, so a
# staged Linux tree is never mistaken for a Mac payload (and `metalift exec` run
# from it finds its shim next to itself, as on a Mac).
#
# Payload: exactly the tree under DESTDIR/usr/local/metalift, which build.sh
# hands to pkgbuild as --root with --install-location /usr/local/metalift. It
# holds only metalift's own directories, so Installer never re-owns or re-modes a
# directory that other software shares (/usr/local/bin, /usr/local/share/man,
# the shells' completion directories): those get symlinks from postinstall,
# which creates a missing one root:wheel 0755 and never changes an existing one.
# DESTDIR/usr and DESTDIR/usr/local are staging scaffolding, not payload.
#   bin/{metaliftd,metalift,metalift-probe}                            0755
#   lib/libmetalift.dylib                                              0755
#   libexec/{uninstall.sh,metaliftd-agent,libmetalift-inert.dylib}     0755
#   share/launchd/Launch{Agents,Daemons}/com.metalift.metaliftd.plist  0644
#   share/default-policy.toml                                          0644
#   share/man/man{1,5,8}/*, share/completions/*, share/schema/*.json   0644
#   share/links                                                        0644
# share/links is the one list of the links postinstall makes and uninstall
# removes: one "LINK TARGET" line each, LINK relative to the volume's root
# (usr/local/bin/metalift), TARGET the symlink's relative value
# (../metalift/bin/metalift), so a link is recognised as ours by its value.
#
# Deliberately not in the payload (postinstall owns them, so an upgrade can never
# overwrite an admin's file or loosen a mode): /etc/metalift and policy.d/
# (root:wheel 0755), /etc/metalift/policy.toml (copied from
# share/default-policy.toml only when absent), the plist under
# /Library/Launch{Agents,Daemons} (one of the two, see postinstall),
# /var/log/metalift, and the links above.
set -euo pipefail

usage() {
  echo "usage: $0 DESTDIR [--bin-dir DIR] [--shim PATH] [--inert PATH]" >&2
  exit 64
}

repo=$(cd "$(dirname "$0")/.." && pwd)
dest=""
bin_dir="$repo/target/release"
shim=""
inert=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir) [ $# -ge 2 ] || usage; bin_dir=$2; shift 2 ;;
    --shim) [ $# -ge 2 ] || usage; shim=$2; shift 2 ;;
    --inert) [ $# -ge 2 ] || usage; inert=$2; shift 2 ;;
    -h|--help) usage ;;
    -*) echo "stage: unknown option $1" >&2; usage ;;
    *) [ -z "$dest" ] || usage; dest=$1; shift ;;
  esac
done
[ -n "$dest" ] || usage

if [ -z "$shim" ]; then
  for candidate in "$bin_dir/libmetalift.dylib" "$bin_dir/libmetalift.so"; do
    if [ -f "$candidate" ]; then shim=$candidate; break; fi
  done
fi
if [ -z "$shim" ] || [ ! -f "$shim" ]; then
  echo "stage: no libmetalift.dylib or libmetalift.so in $bin_dir (build the workspace first, or pass --shim)" >&2
  exit 1
fi
for bin in metaliftd metalift metalift-probe; do
  [ -f "$bin_dir/$bin" ] || {
    echo "stage: $bin_dir/$bin is missing (build the workspace first, or pass --bin-dir)" >&2
    exit 1
  }
done
default_policy="$repo/examples/default-policy.toml"
[ -f "$default_policy" ] || { echo "stage: $default_policy is missing" >&2; exit 1; }

prefix="$dest/usr/local/metalift"
mkdir -p "$prefix/bin" "$prefix/lib" "$prefix/libexec" \
  "$prefix/share/launchd/LaunchAgents" "$prefix/share/launchd/LaunchDaemons" \
  "$prefix/share/man/man1" "$prefix/share/man/man5" "$prefix/share/man/man8" \
  "$prefix/share/completions" "$prefix/share/schema"

put() { # put MODE SOURCE TARGET: copy (replacing) and set the mode explicitly
  rm -f "$3"
  cp "$2" "$3"
  chmod "$1" "$3"
}
for bin in metaliftd metalift metalift-probe; do
  put 0755 "$bin_dir/$bin" "$prefix/bin/$bin"
done
put 0755 "$shim" "$prefix/lib/$(basename "$shim")"
put 0755 "$repo/pkg/uninstall.sh" "$prefix/libexec/uninstall.sh"
put 0755 "$repo/pkg/libexec/metaliftd-agent" "$prefix/libexec/metaliftd-agent"
inert_name="libmetalift-inert.${shim##*.}"
if [ -n "$inert" ]; then
  put 0755 "$inert" "$prefix/libexec/$inert_name"
else
  rm -f "$prefix/libexec/$inert_name"
  ${CC:-cc} -shared -fPIC -nostartfiles -o "$prefix/libexec/$inert_name" \
    "$repo/pkg/inert/libmetalift-inert.c"
  chmod 0755 "$prefix/libexec/$inert_name"
fi
for kind in LaunchAgents LaunchDaemons; do
  put 0644 "$repo/launchd/$kind/com.metalift.metaliftd.plist" \
    "$prefix/share/launchd/$kind/com.metalift.metaliftd.plist"
done
put 0644 "$default_policy" "$prefix/share/default-policy.toml"

# Man pages, completions and the policy's JSON Schema (generated from the CLI's
# definitions and committed: man/, completions/, schema/), linked by postinstall
# from where macOS's man, zsh, bash-completion, fish and taplo-based editors look.
links="$prefix/share/links"
: >"$links.new"
link() { # link LINK TARGET_IN_PREFIX: one line of share/links, TARGET made relative
  local dir=${1%/*} up=""
  dir=${dir#usr/local}
  while [ -n "$dir" ]; do up="../$up"; dir=${dir%/*}; done
  printf '%s %smetalift/%s\n' "$1" "$up" "$2" >>"$links.new"
}
for bin in metalift metalift-probe; do
  link "usr/local/bin/$bin" "bin/$bin"
done
for page in "$repo"/man/*.[158]; do
  name=$(basename "$page")
  put 0644 "$page" "$prefix/share/man/man${page##*.}/$name"
  link "usr/local/share/man/man${page##*.}/$name" "share/man/man${page##*.}/$name"
done
put 0644 "$repo/completions/_metalift" "$prefix/share/completions/_metalift"
link usr/local/share/zsh/site-functions/_metalift share/completions/_metalift
put 0644 "$repo/completions/metalift.fish" "$prefix/share/completions/metalift.fish"
link usr/local/share/fish/vendor_completions.d/metalift.fish share/completions/metalift.fish
put 0644 "$repo/completions/metalift.bash" "$prefix/share/completions/metalift.bash"
link usr/local/etc/bash_completion.d/metalift share/completions/metalift.bash
put 0644 "$repo/schema/metalift-policy.schema.json" "$prefix/share/schema/metalift-policy.schema.json"
link usr/local/share/metalift/metalift-policy.schema.json share/schema/metalift-policy.schema.json
put 0644 "$links.new" "$links"
rm -f "$links.new"

# Directories: 0755 whatever the caller's umask (pkgbuild records these modes).
find "$prefix" -type d -exec chmod 0755 {} +

echo "stage: payload in $dest (shim: $(basename "$shim"))"
