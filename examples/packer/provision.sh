#!/bin/bash
# Packer shell provisioner: installs metalift in a macOS guest image and FAILS THE
# BUILD unless the guest can unlock. Runs as root (the templates' execute_command
# uses sudo). Bash 3.2 (macOS's /bin/bash): no mapfile, no associative arrays.
#
# Input (environment_vars in the templates; the file provisioners upload the
# pkg and the policy first):
#   METALIFT_BAKE_PKG              the .pkg in the guest (e.g. /tmp/metalift.pkg)
#   METALIFT_BAKE_PKG_SHA256       its SHA-256, from the release's SHA256SUMS
#   METALIFT_BAKE_TEAM_ID          the Developer ID team that must have signed it
#   METALIFT_BAKE_POLICY           the policy drop-in to install (policy.d/50-bake.toml)
#   METALIFT_BAKE_VERIFY_PROFILES  optional: space-separated require_verified profiles;
#                             each must pass `metalift verify` on this guest
#   METALIFT_BAKE_STRICT           optional: 1 = doctor's warnings fail the bake too
#   METALIFT_BAKE_WAIT             optional: seconds to wait for the daemon to start and
#                             load the policy (default 60)
#   METALIFT_BAKE_REQUIRE_LABELS   optional: space-separated [audit.labels] keys the
#                             policy must set (doctor --require-label KEY each)
#   METALIFT_BAKE_REQUIRE_FORWARD  optional: 1 = [audit.forward] must be live and
#                             connected (doctor --require-forward)
#   METALIFT_BAKE_FORWARD_UNREACHABLE_OK  optional: 1 = with REQUIRE_FORWARD, the
#                             collector cannot be reached from the build network:
#                             configured is enough (doctor --forward-unreachable-ok)
#
# Steps, each fatal: the checksum; `pkgutil --check-signature` (signed by a
# Developer ID Installer certificate of METALIFT_BAKE_TEAM_ID, notarized); `installer
# -pkg`; the drop-in, root-owned 0644; `metalift validate`; each profile of
# METALIFT_BAKE_VERIFY_PROFILES verified; `metalift doctor --bake` (one line per
# check, `ok|warn|FAIL <check>: <message>`; exit 0 only without a FAIL line)
# until it passes or METALIFT_BAKE_WAIT runs out.
#
# Seams for the Linux test (cli/tests/packer_provision.rs; never set in a real
# bake): METALIFT_BAKE_ROOT (the guest's root, default /: doctor and verify are
# pointed at the installation under it), PKGUTIL and INSTALLER (commands called
# exactly as Apple's pkgutil and installer are).
set -euo pipefail

fail() { echo "provision: FAILED: $*" >&2; exit 1; }
need() { eval "[ -n \"\${$1:-}\" ]" || fail "$1 is not set (see the comment at the top of $0)"; }
for var in METALIFT_BAKE_PKG METALIFT_BAKE_PKG_SHA256 METALIFT_BAKE_TEAM_ID METALIFT_BAKE_POLICY; do need "$var"; done
[ -f "$METALIFT_BAKE_PKG" ] || fail "no package at $METALIFT_BAKE_PKG"
[ -f "$METALIFT_BAKE_POLICY" ] || fail "no policy at $METALIFT_BAKE_POLICY"
case "$METALIFT_BAKE_TEAM_ID" in
  [A-Z0-9][A-Z0-9][A-Z0-9][A-Z0-9][A-Z0-9][A-Z0-9][A-Z0-9][A-Z0-9][A-Z0-9][A-Z0-9]) ;;
  *) fail "METALIFT_BAKE_TEAM_ID=$METALIFT_BAKE_TEAM_ID is not a 10-character team identifier" ;;
esac

# metalift's own variables would point doctor and verify elsewhere than the
# installation this script checks.
unset METALIFT_POLICY METALIFT_SOCKET METALIFT_AUDIT_LOG
root=${METALIFT_BAKE_ROOT:-/}
root=${root%/}
pkgutil_cmd=${PKGUTIL:-pkgutil}
installer_cmd=${INSTALLER:-installer}
wait_s=${METALIFT_BAKE_WAIT:-60}
metalift="$root/usr/local/metalift/bin/metalift"
step() { printf '\n==> provision: %s\n' "$*"; }

step "checksum of $METALIFT_BAKE_PKG"
if command -v shasum >/dev/null 2>&1; then
  sum=$(shasum -a 256 "$METALIFT_BAKE_PKG" | awk '{ print $1 }')
else
  sum=$(sha256sum "$METALIFT_BAKE_PKG" | awk '{ print $1 }')
fi
want=$(printf '%s' "$METALIFT_BAKE_PKG_SHA256" | tr 'A-F' 'a-f')
[ "$sum" = "$want" ] || fail "SHA-256 of $METALIFT_BAKE_PKG is $sum, SHA256SUMS says $want"
echo "sha256 $sum: as SHA256SUMS says"

step "signature (pkgutil --check-signature), team $METALIFT_BAKE_TEAM_ID"
signature=$("$pkgutil_cmd" --check-signature "$METALIFT_BAKE_PKG") || {
  printf '%s\n' "$signature"
  fail "pkgutil --check-signature refused $METALIFT_BAKE_PKG"
}
printf '%s\n' "$signature"
# The leaf certificate is the chain's first entry ("1. Developer ID Installer:
# NAME (TEAMID)"); a signature from another team, an Apple Development or a
# self-signed certificate must not pass.
leaf=$(printf '%s\n' "$signature" | sed -n 's/^[[:space:]]*1\. //p' | head -n 1)
case "$leaf" in
  "Developer ID Installer: "*" ($METALIFT_BAKE_TEAM_ID)") ;;
  *) fail "the package's leaf certificate is \"${leaf:-none}\", want Developer ID Installer: ... ($METALIFT_BAKE_TEAM_ID)" ;;
esac
printf '%s\n' "$signature" | grep -q 'Status: signed by a developer certificate issued by Apple for distribution' ||
  fail "the package is not signed by a Developer ID certificate issued by Apple"
printf '%s\n' "$signature" | grep -q 'Notarization: trusted by the Apple notary service' ||
  fail "the package is not notarized (no 'Notarization: trusted by the Apple notary service')"

step "install ($installer_cmd -pkg $METALIFT_BAKE_PKG -target /)"
"$installer_cmd" -pkg "$METALIFT_BAKE_PKG" -target / || fail "the installer failed"
[ -x "$metalift" ] || fail "the installer left no $metalift"

step "policy drop-in: $root/etc/metalift/policy.d/50-bake.toml"
dropin="$root/etc/metalift/policy.d/50-bake.toml"
mkdir -p "$root/etc/metalift/policy.d"
cp "$METALIFT_BAKE_POLICY" "$dropin.tmp"
chmod 0644 "$dropin.tmp"
if [ "$(id -u)" -eq 0 ]; then chown 0:0 "$dropin.tmp"; fi
mv "$dropin.tmp" "$dropin" # one rename: the daemon never reads half a file
owner_flag=()
if [ "$(id -u)" -ne 0 ]; then owner_flag=(--allow-insecure-owner); fi
"$metalift" validate ${owner_flag[@]+"${owner_flag[@]}"} "$root/etc/metalift/policy.toml" ||
  fail "metalift validate refused the policy"

for profile in ${METALIFT_BAKE_VERIFY_PROFILES:-}; do
  step "metalift verify --profile $profile (require_verified)"
  "$metalift" verify --profile "$profile" \
    --policy "$root/etc/metalift/policy.toml" --audit-log "$root/var/log/metalift/audit.jsonl" ||
    fail "metalift verify --profile $profile did not pass on this guest: the daemon would answer stock"
done

step "metalift doctor --bake (every 'cannot unlock' fails the build)"
doctor=("$metalift" doctor --bake)
[ "$root" = "" ] || doctor+=(--root "$root")
doctor+=(${owner_flag[@]+"${owner_flag[@]}"})
if [ "${METALIFT_BAKE_STRICT:-0}" = 1 ]; then doctor+=(--strict); fi
for label in ${METALIFT_BAKE_REQUIRE_LABELS:-}; do doctor+=(--require-label "$label"); done
if [ "${METALIFT_BAKE_REQUIRE_FORWARD:-0}" = 1 ]; then
  doctor+=(--require-forward)
  if [ "${METALIFT_BAKE_FORWARD_UNREACHABLE_OK:-0}" = 1 ]; then doctor+=(--forward-unreachable-ok); fi
fi
# The daemon starts (launchd) and reloads the drop-in (its watcher) on its own
# time: a FAIL is retried until METALIFT_BAKE_WAIT runs out; the last attempt's
# lines are the build log's.
deadline=$(( $(date +%s) + wait_s ))
while :; do
  status=0
  lines=$("${doctor[@]}") || status=$?
  if [ "$status" -eq 0 ] || [ "$(date +%s)" -ge "$deadline" ]; then break; fi
  sleep 2
done
printf '%s\n' "$lines"
[ "$status" -eq 0 ] || fail "metalift doctor --bake exited $status: this image cannot unlock (the FAIL lines above say why)"
echo
echo "provision: passed: metalift is installed and this guest can unlock"
