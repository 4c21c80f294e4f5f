#!/bin/bash
# Removes metalift. Installed as /usr/local/metalift/libexec/uninstall.sh.
#
#   sudo /usr/local/metalift/libexec/uninstall.sh [--purge]
#
# Stops metaliftd (agent and daemon), removes the binaries, the shim, both
# plists, the /usr/local/bin links and the socket directories, and forgets the
# package receipt. Keeps /etc/metalift (the policy, policy.d/ and the
# use-launchdaemon marker) and /var/log/metalift (the audit trail) unless
# --purge is given.
#
# Processes still running with libmetalift.dylib mapped keep it until they exit;
# new ones started with DYLD_INSERT_LIBRARIES pointing at it run without it
# (dyld skips a missing inserted library) and stay stock. Remove the variable
# from your launchd jobs as well.
#
# Tests run this against a temporary root: METALIFT_ROOT prefixes every absolute
# path (and lifts the must-be-root check), and launchctl, stat and pkgutil are
# found through PATH so stubs can record the calls.
set -euo pipefail

readonly label=com.metalift.metaliftd
readonly root=${METALIFT_ROOT:-}

say() { printf 'metalift uninstall: %s\n' "$*"; }

usage() {
  echo "usage: $0 [--purge]" >&2
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

# Everything runs from main, which bash has read whole before it starts: this
# script deletes its own directory.
main() {
  local purge=no uid link
  while [ $# -gt 0 ]; do
    case "$1" in
      --purge) purge=yes; shift ;;
      -h|--help) usage ;;
      *) echo "uninstall: unknown argument $1" >&2; usage ;;
    esac
  done
  if [ -z "$root" ] && [ "$(id -u)" -ne 0 ]; then
    echo "uninstall: run as root: sudo $0 [--purge]" >&2
    exit 1
  fi

  uid=$(console_uid)
  launchctl bootout "system/$label" >/dev/null 2>&1 || true
  if [ -n "$uid" ]; then
    launchctl bootout "user/$uid/$label" >/dev/null 2>&1 || true
  fi
  say "stopped $label"

  rm -f "$root/Library/LaunchAgents/$label.plist" "$root/Library/LaunchDaemons/$label.plist"
  for link in metalift metalift-probe; do
    # Only our own link: never a metalift some other installer put there.
    case "$(readlink "$root/usr/local/bin/$link" 2>/dev/null || true)" in
      */metalift/bin/"$link") rm -f "$root/usr/local/bin/$link" ;;
    esac
  done
  rm -rf "$root/usr/local/metalift" "$root/Users/Shared/metalift" "$root/var/run/metalift"
  say "removed /usr/local/metalift, the launchd plists and links"

  if [ "$purge" = yes ]; then
    rm -rf "$root/etc/metalift" "$root/var/log/metalift"
    say "purged /etc/metalift and /var/log/metalift"
  else
    say "kept /etc/metalift (policy) and /var/log/metalift (audit log); --purge removes them"
  fi

  if command -v pkgutil >/dev/null 2>&1; then
    pkgutil --forget com.metalift.pkg >/dev/null 2>&1 || true
  fi
}

main "$@"
