#!/bin/sh
# metalift's CI recipe: two checks that fail a job before it benchmarks or tests
# on the Apple5 path, and hold on every host chip (M1 to M5).
#
#   examples/ci-recipe.sh [WORKLOAD [ARGUMENTS...]]
#
# Run it in a job on a macOS guest runner with metalift installed and a policy
# that has a rule for the probe (an exact path rule for
# /usr/local/metalift/bin/metalift-probe) and one for the workload. The runner's
# user must be able to read the audit log. Both steps inject the shim with
# `metalift exec`: a job's shell is SIP-protected (/bin/bash, /bin/sh), and dyld
# purges DYLD_INSERT_LIBRARIES for what it starts, even when the runner agent's
# plist sets it.
#
# Environment (each has the installed default):
#   METALIFT            the metalift CLI     (metalift, from PATH)
#   METALIFT_PROBE      the probe            (/usr/local/metalift/bin/metalift-probe)
#   METALIFT_AUDIT_LOG  the daemon's log     (/var/log/metalift/audit.jsonl)
#
# Exit status: 3 when the probe is not unlocked to Apple7 or above; the workload's
# own status when it fails; 4 when it succeeded without being unlocked; else 0.
set -eu

metalift=${METALIFT:-metalift}
probe=${METALIFT_PROBE:-/usr/local/metalift/bin/metalift-probe}
log=${METALIFT_AUDIT_LOG:-/var/log/metalift/audit.jsonl}

# 1. The GPU is unlocked in this guest: Apple7 or above, what llama.cpp's fast
#    paths need. `apple_family_max = "host"` gives 7 on an M1 host, 8 on M2, 9 on
#    M3 and M4, 10 on M5; write `--expect-family =9` to require exactly Apple9.
"$metalift" exec -- "$probe" --expect-family 7

# 2. The workload, failing unless it (or a process it starts: a wrapper script,
#    make, a Python launcher) was unlocked, as the daemon's audit log records it.
if [ "$#" -eq 0 ]; then
    set -- ./build/bin/llama-bench -m models/tinyllama-1.1b-q4_0.gguf
fi
status=0
"$metalift" exec --require-unlock --expect-family 7 --log "$log" -- "$@" || status=$?

# 3. The audit for the job's log: anything of the last hour that did not apply
#    (informational: the job's status is the workload's, or 4).
"$metalift" audit --since 1h --result failed --log "$log" || true

# 4. Before the guest is destroyed: every record reached the collector (exit 0
#    also when no forwarder is configured), and a bundle of this boot's records
#    (with the daemon's status, the live policy and SHA256SUMS) for the artifact
#    or a host-shared directory. Informational too: the job's status stays.
"$metalift" audit flush --timeout 30 || echo "metalift: audit flush failed" >&2
"$metalift" audit export --to "${METALIFT_EXPORT_DIR:-${RUNNER_TEMP:-/tmp}/metalift-audit}" --log "$log" \
    || echo "metalift: audit export failed" >&2
exit "$status"
