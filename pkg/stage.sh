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
# Payload (paths relative to the target volume's root):
#   usr/local/metalift/bin/{metaliftd,metalift,metalift-probe}         0755
#   usr/local/metalift/lib/libmetalift.dylib                           0755
#   usr/local/metalift/libexec/uninstall.sh                            0755
#   usr/local/metalift/libexec/metaliftd-agent                         0755
#   usr/local/metalift/libexec/libmetalift-inert.dylib                 0755
#   usr/local/metalift/share/launchd/LaunchAgents/com.metalift.metaliftd.plist   0644
#   usr/local/metalift/share/launchd/LaunchDaemons/com.metalift.metaliftd.plist  0644
#   usr/local/metalift/share/default-policy.toml                       0644
#   usr/local/bin/metalift -> ../metalift/bin/metalift
#   usr/local/bin/metalift-probe -> ../metalift/bin/metalift-probe
#   private/etc/metalift/policy.d/                                     0755
#
# Deliberately not in the payload (postinstall owns them, so an upgrade can never
# overwrite an admin's file or loosen a mode): /etc/metalift/policy.toml (copied
# from share/default-policy.toml only when absent), the plist under
# /Library/Launch{Agents,Daemons} (one of the two, see postinstall) and
# /var/log/metalift. On macOS /etc is a symlink to /private/etc; a payload must
# name the real directory or Installer would replace the symlink.
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
  "$dest/usr/local/bin" "$dest/private/etc/metalift/policy.d"

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
for link in metalift metalift-probe; do
  ln -sfn "../metalift/bin/$link" "$dest/usr/local/bin/$link"
done

# Man pages, completions and the policy's JSON Schema, where macOS's man, zsh,
# bash-completion, fish and taplo-based editors look (generated from the CLI's
# definitions and committed: man/, completions/, schema/).
share="$dest/usr/local/share"
mkdir -p "$share/man/man1" "$share/man/man5" "$share/man/man8" "$share/zsh/site-functions" \
  "$share/fish/vendor_completions.d" "$share/metalift" "$dest/usr/local/etc/bash_completion.d"
for page in "$repo"/man/*.[158]; do
  put 0644 "$page" "$share/man/man${page##*.}/$(basename "$page")"
done
put 0644 "$repo/completions/_metalift" "$share/zsh/site-functions/_metalift"
put 0644 "$repo/completions/metalift.fish" "$share/fish/vendor_completions.d/metalift.fish"
put 0644 "$repo/completions/metalift.bash" "$dest/usr/local/etc/bash_completion.d/metalift"
put 0644 "$repo/schema/metalift-policy.schema.json" "$share/metalift/metalift-policy.schema.json"

# Directories: 0755 whatever the caller's umask (pkgbuild records these modes).
# The system's own directories (usr, usr/local, private/etc, ...) get their stock
# macOS modes too: Installer applies a payload directory's mode to an existing one.
find "$dest/usr/local/metalift" "$dest/private/etc/metalift" -type d -exec chmod 0755 {} +
chmod 0755 "$dest/usr" "$dest/usr/local" "$dest/usr/local/bin" "$dest/private" "$dest/private/etc"
find "$share" "$dest/usr/local/etc" -type d -exec chmod 0755 {} +

echo "stage: payload in $dest (shim: $(basename "$shim"))"
