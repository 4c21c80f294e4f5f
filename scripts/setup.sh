#!/usr/bin/env bash
# Installs the Debian packages metalift's Linux build and tests need:
#   gobjc-12, libobjc-12-dev  the GCC Objective-C compiler and runtime behind the
#                             simulated Metal device (probe/simmetal/);
#   (package) shellcheck      the shell linter that CI runs over every script;
#   mandoc                    `mandoc -T lint`, which every man page in man/ passes
#                             (cli/tests/cli_docs.rs, scripts/test.sh);
#   ruby                      `ruby -c` on the Homebrew cask template
#                             (pkg/homebrew/, cli/tests/release_files.rs);
#   libplist-utils            plistutil, a second reader of the MDM profiles
#                             (profiles/, cli/tests/release_files.rs);
#   nodejs, npm               scripts/check-packer.sh runs packer fmt's formatter
#                             (hclwrite.Format, npm @cdktf/hcl-tools) on node.
#   rsyslog, rsyslog-gnutls   the real syslog collector (and its TLS driver) the
#                             audit forwarding tests start on loopback ports;
#   rsyslog-relp              rsyslog's RELP input (imrelp, librelp): the collector
#                             of the `transport = "relp"` tests;
#   openssl                   the test CA and certificates of the TLS tests.
#   libclang1-22, libclang-common-22-dev  libclang and its own headers, which bindgen
#                             loads in shim/build.rs to generate the Rust side of the
#                             C helpers' FFI from shim/c/metalift_shim.h (the same
#                             LLVM 22 that scripts/ci-shim.sh compiles arm64e with);
#   gzip, bzip2, zstd, jq, time, chromium  metalift audit's compressed inputs, the
#                             fleet-read benchmark's baseline and RSS, the matrix page's
#                             headless browser test.
#   syslog-ng (not installed)  Debian's syslog-ng-core conflicts with rsyslog, so its
#                             package and the libraries it needs are unpacked with
#                             `dpkg -x` into /opt/metalift-test/syslog-ng (nothing
#                             registered with dpkg); daemon/tests/forward_syslog_ng.rs
#                             runs it from there on a loopback port.
# Already installed packages are left alone; nothing else is changed.
set -euo pipefail

missing=()
for pkg in gobjc-12 libobjc-12-dev shellcheck mandoc ruby libplist-utils rsyslog rsyslog-gnutls rsyslog-relp openssl libclang1-22 libclang-common-22-dev gzip bzip2 zstd jq time chromium; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
# node and npm by command, not by package: a machine's nodejs may come from
# elsewhere with npm inside it (Debian's npm package would conflict with it).
{ command -v node && command -v npm; } >/dev/null 2>&1 || missing+=(nodejs npm)
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
if [ ${#missing[@]} -gt 0 ]; then
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}"
fi

# chdb (PyPI): ClickHouse's embedded engine, which cli/tests/audit_clickhouse.rs runs
# examples/collectors/clickhouse.sql in (scripts/clickhouse-fleet.py). Pinned.
chdb_version=4.4.0
if ! python3 -c "import chdb, sys; sys.exit(chdb.__version__ != '$chdb_version')" 2>/dev/null; then
  python3 -m pip install -q "chdb==$chdb_version" 2>/dev/null ||
    python3 -m pip install -q --user --break-system-packages "chdb==$chdb_version"
fi

sng=/opt/metalift-test/syslog-ng
if [ ! -x "$sng/usr/sbin/syslog-ng" ]; then
  debs=$(mktemp -d)
  chmod a+rwx "$debs" # apt-get download fetches as _apt
  sng_debs=(syslog-ng-core libivykis0 libnet1 libwrap0 libjson-c5 libpcre3)
  # With every package above already installed, apt's lists were not refreshed
  # here and may be stale: refresh them once if the download fails.
  (cd "$debs" && apt-get download -qq "${sng_debs[@]}") ||
    { "${sudo[@]}" apt-get update -qq && (cd "$debs" && apt-get download -qq "${sng_debs[@]}"); }
  "${sudo[@]}" mkdir -p "$sng"
  for deb in "$debs"/*.deb; do "${sudo[@]}" dpkg -x "$deb" "$sng"; done
  rm -rf "$debs"
fi
