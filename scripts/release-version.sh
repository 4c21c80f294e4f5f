#!/usr/bin/env bash
# The release workflow's version check: a tag vX.Y.Z must name the version of
# the crates (Cargo.toml's [workspace.package] version, which every member
# inherits) and, given --package-info, of the built pkg (the PackageInfo that
# pkgbuild wrote, from `pkgutil --expand`): pkg/build.sh stamps the pkg with
# the Cargo.toml version, and this checks what it actually stamped.
#
#   scripts/release-version.sh TAG [--package-info FILE]
#
# Prints the version; exits 1 naming every mismatch. Tested on Linux by
# cli/tests/release_files.rs.
set -euo pipefail
cd "$(dirname "$0")/.."

[ $# -ge 1 ] || { echo "usage: $0 TAG [--package-info FILE]" >&2; exit 64; }
tag=$1
shift
package_info=""
while [ $# -gt 0 ]; do
  case "$1" in
    --package-info) [ $# -ge 2 ] || exit 64; package_info=$2; shift 2 ;;
    *) echo "release-version: unknown argument $1" >&2; exit 64 ;;
  esac
done

tag=${tag#refs/tags/}
if ! [[ "$tag" =~ ^v([0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?)$ ]]; then
  echo "release-version: tag '$tag' is not vMAJOR.MINOR.PATCH" >&2
  exit 1
fi
version=${BASH_REMATCH[1]}
status=0

crates=$(awk '/^\[workspace\.package\]/ { inside = 1; next } /^\[/ { inside = 0 }
  inside && /^version[[:space:]]*=/ { gsub(/.*=[[:space:]]*"|".*/, ""); print; exit }' Cargo.toml)
if [ "$crates" != "$version" ]; then
  echo "release-version: tag $tag but Cargo.toml's workspace version is '${crates:-none}'" >&2
  status=1
fi
for manifest in policy xpc daemon cli shim probe bench; do
  if ! grep -q '^version\.workspace = true' "$manifest/Cargo.toml"; then
    echo "release-version: $manifest/Cargo.toml does not take the workspace version" >&2
    status=1
  fi
done
if [ -n "$package_info" ]; then
  pkg=$(sed -n 's/.*<pkg-info[^>]* version="\([^"]*\)".*/\1/p' "$package_info" | head -n 1)
  if [ "$pkg" != "$version" ]; then
    echo "release-version: tag $tag but the pkg's PackageInfo says version '${pkg:-none}'" >&2
    status=1
  fi
fi
[ "$status" -eq 0 ] && echo "$version"
exit "$status"
