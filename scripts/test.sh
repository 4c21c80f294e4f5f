#!/usr/bin/env bash
# The test command README.md names: builds every artifact the end-to-end tests
# inject or spawn (libmetalift, the simulated Metal libraries, metaliftd, the probe),
# then runs every test in the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --all-targets
cargo test --workspace --all-targets "$@"
