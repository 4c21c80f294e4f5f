#!/usr/bin/env bash
# Fills pkg/homebrew/metalift.rb.in for a release: prints the cask.
#
#   scripts/release-cask.sh VERSION SHA256 URL HOMEPAGE > metalift.rb
#
# Refuses a SHA-256 that is not 64 hex digits or a field with a quote or a
# newline (it lands in Ruby string literals), and any placeholder left unfilled.
# Tested on Linux (`ruby -c` on the result) by cli/tests/release_files.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 4 ] || { echo "usage: $0 VERSION SHA256 URL HOMEPAGE" >&2; exit 64; }
version=$1 sha256=$2 url=$3 homepage=$4
[[ "$sha256" =~ ^[0-9a-f]{64}$ ]] || { echo "release-cask: '$sha256' is not a SHA-256" >&2; exit 1; }
for field in "$version" "$url" "$homepage"; do
  case "$field" in
    *'"'* | *$'\n'* | *\\* | *'#{'* | '') echo "release-cask: refusing the field '$field'" >&2; exit 1 ;;
  esac
done
cask=$(sed -e "s|@VERSION@|$version|g" -e "s|@SHA256@|$sha256|g" \
  -e "s|@URL@|${url//|/\\|}|g" -e "s|@HOMEPAGE@|${homepage//|/\\|}|g" pkg/homebrew/metalift.rb.in)
if grep -q '@[A-Z0-9]*@' <<<"$cask"; then
  echo "release-cask: unfilled placeholders: $(grep -o '@[A-Z0-9]*@' <<<"$cask" | sort -u | tr '\n' ' ')" >&2
  exit 1
fi
printf '%s\n' "$cask"
