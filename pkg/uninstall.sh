#!/bin/bash
# Removes metalift. Installed as /usr/local/metalift/libexec/uninstall.sh.
#
#   sudo /usr/local/metalift/libexec/uninstall.sh [--purge] [--force]
#
# Stops metaliftd (the daemon and every user's agent), removes the binaries, the
# shim, both plists, the links postinstall made (the payload's share/links: in
# /usr/local/bin, the man, completion and schema directories; each only while it
# still holds metalift's value, and never the directories, which other software
# shares) and the socket directories, and forgets the package receipt. Keeps /etc/metalift (the policy, policy.d/ and
# the markers) and the audit logs (/var/log/metalift, and each user's
# ~/Library/Logs/metalift from the opt-in agent) unless --purge is given.
#
# Why it may refuse. dyld does NOT skip a missing inserted library: in
# dyld-1378, dyld/DyldRuntimeState.cpp, RuntimeState::loadInsertedLibraries
# stops at the first DYLD_INSERT_LIBRARIES entry it cannot load unless AMFI set
# allowInsertFailures (dyld/DyldProcessConfig.cpp, from
# AMFI_DYLD_OUTPUT_ALLOW_FAILED_LIBRARY_INSERTION), logs "terminating because
# inserted dylib '...' could not be loaded", and dyld/dyldMain.cpp prepare()
# halt()s the launch. So removing the shim while a launchd job, a launchd
# environment (launchctl setenv) or a shell profile still names it would stop
# every process started from there. Before anything is changed this script
# looks for such references:
#   - launchd plists: /Library/LaunchAgents, /Library/LaunchDaemons,
#     /Users/*/Library/LaunchAgents (/System is Apple's, never ours to change);
#   - launchctl getenv DYLD_INSERT_LIBRARIES, system domain and each user's
#     (launchctl asuser UID ...);
#   - /etc/launchd.conf, /etc/zshenv, /etc/zprofile, /etc/zshrc, /etc/profile,
#     /etc/bashrc and each user's (and root's) ~/.zshenv ~/.zprofile ~/.zshrc
#     ~/.bash_profile ~/.bashrc ~/.profile;
#   - running processes whose environment names it (their children inherit it).
# If any names libmetalift, it lists them and exits 1 having changed nothing.
# --force goes ahead and leaves an INERT STUB at the shim's path
# (libexec/libmetalift-inert.dylib from the payload: no constructor, no code,
# links libSystem only), so those launches keep working and stay stock. Remove
# the references, then `sudo rm -rf /usr/local/metalift`.
#
# Exit status: 0 removed; 1 refused (references listed); 64 usage; 2 not root.
#
# Tests run this against a temporary root: METALIFT_ROOT prefixes every absolute
# path (and lifts the must-be-root check), and launchctl, stat, pkgutil and ps
# are found through PATH so stubs can record the calls.
set -euo pipefail

readonly label=com.metalift.metaliftd
readonly root=${METALIFT_ROOT:-}
readonly prefix=$root/usr/local/metalift
readonly needle=libmetalift

say() { printf 'metalift uninstall: %s\n' "$*"; }

usage() {
  echo "usage: $0 [--purge] [--force]" >&2
  exit 64
}

console_uid() {
  local uid
  uid=$(stat -f%u /dev/console 2>/dev/null) || return 0
  case "$uid" in
    ''|*[!0-9]*) return 0 ;;
  esac
  if [ "$uid" -ge 500 ]; then printf '%s\n' "$uid"; fi
}

# The console user and the owners of the homes in /Users (uid >= 500).
user_uids() {
  local home uid
  {
    console_uid
    for home in "$root"/Users/*; do
      case "${home##*/}" in Shared|Guest) continue ;; esac
      [ -d "$home" ] || continue
      uid=$(stat -f%u "$home" 2>/dev/null) || continue
      case "$uid" in ''|*[!0-9]*) continue ;; esac
      if [ "$uid" -ge 500 ]; then printf '%s\n' "$uid"; fi
    done
  } | sort -un
}

process_table() {
  if [ "$(uname -s)" = Darwin ]; then ps -A -E -ww -o pid= -o command=; else ps axeww -o pid= -o command=; fi
}

# Prints one line per place that still names the shim: "WHERE: WHAT".
find_references() {
  local file value uid home name
  local -a plists=() profiles=()
  shopt -s nullglob
  plists=("$root"/Library/LaunchAgents/*.plist "$root"/Library/LaunchDaemons/*.plist
    "$root"/Users/*/Library/LaunchAgents/*.plist)
  for file in "${plists[@]}"; do
    # Binary plists keep ASCII strings as they are: grep finds them too.
    if grep -qaF "$needle" "$file" 2>/dev/null; then
      printf '%s: launchd plist\n' "${file#"$root"}"
    fi
  done

  value=$(launchctl getenv DYLD_INSERT_LIBRARIES 2>/dev/null || true)
  case "$value" in *"$needle"*) printf 'launchctl getenv (system domain): DYLD_INSERT_LIBRARIES=%s\n' "$value" ;; esac
  for uid in $(user_uids); do
    value=$(launchctl asuser "$uid" launchctl getenv DYLD_INSERT_LIBRARIES 2>/dev/null || true)
    case "$value" in *"$needle"*) printf 'launchctl getenv (user %s): DYLD_INSERT_LIBRARIES=%s\n' "$uid" "$value" ;; esac
  done

  profiles=("$root"/etc/launchd.conf "$root"/etc/zshenv "$root"/etc/zprofile "$root"/etc/zshrc
    "$root"/etc/profile "$root"/etc/bashrc)
  for home in "$root"/Users/* "$root"/var/root; do
    case "${home##*/}" in Shared) continue ;; esac
    for name in .zshenv .zprofile .zshrc .bash_profile .bashrc .profile; do
      profiles+=("$home/$name")
    done
  done
  for file in "${profiles[@]}"; do
    if [ -f "$file" ] && grep -qF "$needle" "$file" 2>/dev/null; then
      printf '%s: shell profile (line %s)\n' "${file#"$root"}" \
        "$(grep -nF "$needle" "$file" | head -n 1 | cut -d: -f1)"
    fi
  done

  # pgrep cannot match environments; ps shows them (-E on macOS, e on Linux).
  # shellcheck disable=SC2009
  process_table 2>/dev/null |
    grep -E "DYLD_INSERT_LIBRARIES=[^ ]*$needle" |
    awk '{ printf "running process %s: its environment names the shim (its children inherit it)\n", $1 }' || true
}

# The installed shim and the payload's inert stub (.so on a Linux staging tree).
shim_path() {
  local f
  for f in "$prefix/lib/libmetalift.dylib" "$prefix/lib/libmetalift.so"; do
    if [ -e "$f" ]; then printf '%s\n' "$f"; return; fi
  done
  printf '%s\n' "$prefix/lib/libmetalift.dylib"
}

inert_for() { # inert_for SHIM
  case "$1" in
    *.so) printf '%s\n' "$prefix/libexec/libmetalift-inert.so" ;;
    *) printf '%s\n' "$prefix/libexec/libmetalift-inert.dylib" ;;
  esac
}

# The links listed in the payload's share/links ("LINK TARGET" per line), each
# only while it still points where postinstall pointed it: a file or a link
# someone else put at that name stays. Then metalift's own schema directory, if
# that left it empty. The shared directories themselves always stay.
link_table() {
  if [ -f "$prefix/share/links" ]; then
    cat "$prefix/share/links"
  else
    # A partial install without the table: the two links every release made.
    printf '%s\n' "usr/local/bin/metalift ../metalift/bin/metalift" \
      "usr/local/bin/metalift-probe ../metalift/bin/metalift-probe"
  fi
}

unlink_shared_places() {
  local link target path
  while read -r link target; do
    [ -n "$link" ] || continue
    path=$root/$link
    if [ -L "$path" ] && [ "$(readlink "$path")" = "$target" ]; then
      rm -f "$path"
    fi
  done < <(link_table)
  rmdir "$root/usr/local/share/metalift" 2>/dev/null || true
}

# Everything runs from main, which bash has read whole before it starts: this
# script deletes its own directory.
main() {
  local purge=no force=no uid refs shim inert keep=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --purge) purge=yes; shift ;;
      --force) force=yes; shift ;;
      -h|--help) usage ;;
      *) echo "uninstall: unknown argument $1" >&2; usage ;;
    esac
  done
  if [ -z "$root" ] && [ "$(id -u)" -ne 0 ]; then
    echo "uninstall: run as root: sudo $0 [--purge] [--force]" >&2
    exit 2
  fi

  refs=$(find_references)
  if [ -n "$refs" ] && [ "$force" = no ]; then
    say "refusing: these still name libmetalift, and dyld stops every launch whose"
    say "DYLD_INSERT_LIBRARIES names a library it cannot load:"
    printf '%s\n' "$refs" | sed 's/^/  /'
    say "remove DYLD_INSERT_LIBRARIES from them (and log out/in or reboot for launchctl setenv),"
    say "or run again with --force to leave an inert stub at the shim's path. Nothing was changed."
    exit 1
  fi

  shim=$(shim_path)
  inert=$(inert_for "$shim")
  if [ -n "$refs" ]; then
    if [ ! -f "$inert" ]; then
      say "error: --force needs the inert stub $inert, which is missing; nothing was changed"
      exit 1
    fi
    keep=$(mktemp "${TMPDIR:-/tmp}/metalift-inert.XXXXXX")
    cp "$inert" "$keep"
  fi

  launchctl bootout "system/$label" >/dev/null 2>&1 || true
  for uid in $(user_uids); do
    launchctl bootout "user/$uid/$label" >/dev/null 2>&1 || true
  done
  say "stopped $label"

  rm -f "$root/Library/LaunchAgents/$label.plist" "$root/Library/LaunchDaemons/$label.plist"
  unlink_shared_places
  rm -rf "$prefix" "$root/Users/Shared/metalift" "$root/var/run/metalift"
  say "removed /usr/local/metalift, the launchd plists and metalift's links"

  if [ -n "$keep" ]; then
    mkdir -p "$(dirname "$shim")"
    chmod 0755 "$prefix" "$(dirname "$shim")"
    mv -f "$keep" "$shim"
    chmod 0755 "$shim"
    say "--force: left an INERT STUB at ${shim#"$root"} (no code runs in it) because these still name it:"
    printf '%s\n' "$refs" | sed 's/^/  /'
    say "once they are gone: sudo rm -rf /usr/local/metalift"
  fi

  if [ "$purge" = yes ]; then
    rm -rf "$root/etc/metalift" "$root/var/log/metalift" "$root"/Users/*/Library/Logs/metalift
    say "purged /etc/metalift, /var/log/metalift and the agents' ~/Library/Logs/metalift"
  else
    say "kept /etc/metalift (policy) and the audit logs (/var/log/metalift, ~/Library/Logs/metalift); --purge removes them"
  fi

  if command -v pkgutil >/dev/null 2>&1; then
    pkgutil --forget com.metalift.pkg >/dev/null 2>&1 || true
  fi
}

main "$@"
