#!/bin/sh
# Tart (on the host): share a host directory into the guest so the audit bundle
# survives `tart delete`. Tart mounts `--dir NAME:PATH` shares in a macOS guest
# under "/Volumes/My Shared Files/NAME".
#
#   ./tart-dir-share.sh IMAGE JOB-SCRIPT
#
# The guest's job then ends with:
#   metalift audit flush --timeout 30
#   metalift audit export --to "/Volumes/My Shared Files/metalift-audit"
set -eu

image=$1
job=$2
vm="ci-$(date +%s)-$$"
share="$PWD/metalift-audit"
mkdir -p "$share"

tart clone "$image" "$vm"
trap 'tart stop "$vm" >/dev/null 2>&1 || true; tart delete "$vm"' EXIT
tart run --no-graphics --dir "metalift-audit:$share" "$vm" &
ip=$(tart ip --wait 120 "$vm")
# The job runs in the guest; its last lines export into the share.
ssh -o StrictHostKeyChecking=no "admin@$ip" 'bash -s' <"$job"
# On the host now, whatever happens to the VM: check the bundles' sums.
for bundle in "$share"/metalift-*/; do
	(cd "$bundle" && shasum -a 256 -c SHA256SUMS) # the same format as sha256sum
done
