#!/usr/bin/env bash
# Installs the Debian packages metalift's Linux build and tests need:
#   gobjc-12, libobjc-12-dev  the GCC Objective-C compiler and runtime behind the
#                             simulated Metal device (probe/simmetal/);
#   rsyslog, rsyslog-gnutls   the real syslog collector (and its TLS driver) the
#                             audit forwarding tests start on loopback ports;
#   openssl                   the test CA and certificates of the TLS tests;
#   and the shell linter that CI runs over every script (package shellcheck).
# Already installed packages are left alone; nothing else is changed.
set -euo pipefail

missing=()
for pkg in gobjc-12 libobjc-12-dev shellcheck rsyslog rsyslog-gnutls openssl; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}"
