#!/bin/sh
# GitHub Actions runner hook: get this job's audit records off the guest before
# it is destroyed. Bake it into the image and point the runner at it:
#
#   echo "ACTIONS_RUNNER_HOOK_JOB_COMPLETED=/usr/local/metalift/share/github-job-completed.sh" \
#     >> /path/to/actions-runner/.env
#
# It runs as the runner's user after every job, with the job's GITHUB_* variables:
#   1. metalift audit flush: every record reached the collector ([audit.forward]);
#      exit 0 also when no forwarder is configured;
#   2. metalift audit export: this boot's records, the daemon's status and the live
#      policy into $METALIFT_EXPORT_DIR (default $RUNNER_TEMP/metalift-audit), e.g.
#      a Tart --dir share or a directory an upload-artifact step picks up;
#   3. appends a Markdown table of this job's unlocks (process, rule, result) to
#      $GITHUB_STEP_SUMMARY (metalift audit --job "$GITHUB_RUN_ID" --markdown).
#
# The runner user must be able to read the audit log (the log's group; see the
# guide's "Getting records off the guest"). A failed step is reported as a
# workflow warning and the job's result is left alone, unless
# METALIFT_HOOK_STRICT=1, which makes any failure fail the hook.
set -u

metalift=${METALIFT:-metalift}
out=${METALIFT_EXPORT_DIR:-${RUNNER_TEMP:-/tmp}/metalift-audit}
failed=0

warn() {
	echo "::warning title=metalift::$1"
	failed=1
}

if ! "$metalift" audit flush --timeout "${METALIFT_FLUSH_TIMEOUT:-30}"; then
	warn "audit flush failed: the collector may lack this job's last records (the export has them)"
fi

if bundle=$("$metalift" audit export --to "$out"); then
	echo "metalift: audit bundle at $bundle"
else
	warn "audit export into $out failed (see the message above)"
fi

if [ -n "${GITHUB_STEP_SUMMARY:-}" ] && [ -n "${GITHUB_RUN_ID:-}" ]; then
	if ! "$metalift" audit --job "$GITHUB_RUN_ID" --markdown >>"$GITHUB_STEP_SUMMARY"; then
		warn "could not write the unlock table to the step summary"
	fi
fi

if [ "$failed" -ne 0 ] && [ "${METALIFT_HOOK_STRICT:-0}" = 1 ]; then
	exit 1
fi
exit 0
