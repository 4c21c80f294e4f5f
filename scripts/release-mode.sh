#!/usr/bin/env bash
# The release workflow's signing decision, from which secrets the release
# environment gave the job (names only are looked at here):
#   DEVELOPER_ID_APPLICATION_P12, DEVELOPER_ID_INSTALLER_P12, P12_PASSWORD,
#   NOTARY_KEY (App Store Connect API key, .p8 text), NOTARY_KEY_ID,
#   NOTARY_ISSUER, TEAM_ID
# All set: mode=signed. None set: mode=unsigned, and the job summary says in
# capitals that the build is UNSIGNED and not a release. Some but not all: a
# half-configured environment, exit 1 naming the missing ones.
# Writes mode=... to $GITHUB_OUTPUT and the notice to $GITHUB_STEP_SUMMARY
# (both default to /dev/stdout). Tested on Linux by cli/tests/release_files.rs.
set -euo pipefail

names="DEVELOPER_ID_APPLICATION_P12 DEVELOPER_ID_INSTALLER_P12 P12_PASSWORD NOTARY_KEY NOTARY_KEY_ID NOTARY_ISSUER TEAM_ID"
output=${GITHUB_OUTPUT:-/dev/stdout}
summary=${GITHUB_STEP_SUMMARY:-/dev/stdout}
set_names=""
missing=""
for name in $names; do
  if [ -n "${!name:-}" ]; then set_names="$set_names $name"; else missing="$missing $name"; fi
done

if [ -z "$missing" ]; then
  case "$TEAM_ID" in
    [A-Z0-9][A-Z0-9][A-Z0-9][A-Z0-9][A-Z0-9][A-Z0-9][A-Z0-9][A-Z0-9][A-Z0-9][A-Z0-9]) ;;
    *) echo "release-mode: TEAM_ID is not a 10-character team identifier" >&2; exit 1 ;;
  esac
  echo "mode=signed" >>"$output"
  echo "release-mode: signed (Developer ID, notarized), team $TEAM_ID"
  exit 0
fi
if [ -n "$set_names" ]; then
  echo "release-mode: the release environment sets${set_names} but not${missing}: refusing a half-signed build" >&2
  exit 1
fi
echo "mode=unsigned" >>"$output"
{
  echo "## UNSIGNED build: not a release"
  echo
  echo "The release environment has no signing secrets (${names// /, }), so"
  echo "this run built the pkg with ad hoc signatures: it is not notarized, has no"
  echo "attestation and publishes no release. Do not install it on a fleet."
} >>"$summary"
echo "release-mode: UNSIGNED (no signing secrets): artifacts only, no release"
