#!/usr/bin/env bash
# Notarizes FILE and REQUIRES status Accepted: `notarytool submit --wait`
# exits 0 for an Invalid submission too, so its JSON is read, and for any other
# status the submission's log is fetched, printed and the step fails.
#
#   scripts/release-notarize.sh FILE     (env NOTARY_KEY_PATH, NOTARY_KEY_ID, NOTARY_ISSUER)
#
# Runs `xcrun notarytool` ($XCRUN overrides xcrun: the Linux test,
# cli/tests/release_files.rs, puts notarytool's recorded JSON behind it).
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 FILE" >&2; exit 64; }
file=$1
xcrun=${XCRUN:-xcrun}
auth=(--key "$NOTARY_KEY_PATH" --key-id "$NOTARY_KEY_ID" --issuer "$NOTARY_ISSUER")

result=$("$xcrun" notarytool submit "$file" "${auth[@]}" --wait --output-format json) || {
  echo "release-notarize: notarytool submit failed: $result" >&2
  exit 1
}
echo "$result"
read -r id status < <(python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
print(r.get("id", ""), r.get("status", ""))' <<<"$result") || {
  echo "release-notarize: notarytool printed no JSON" >&2
  exit 1
}
if [ "$status" = Accepted ]; then
  echo "release-notarize: $file: Accepted (submission $id)"
  exit 0
fi
echo "release-notarize: $file: status '${status:-none}', not Accepted (submission ${id:-none}); the log:" >&2
if [ -n "$id" ]; then "$xcrun" notarytool log "$id" "${auth[@]}" >&2 || true; fi
exit 1
