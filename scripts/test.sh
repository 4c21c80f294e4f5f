#!/usr/bin/env bash
# The test command README.md names: builds every artifact the end-to-end tests
# inject or spawn (libmetalift, the simulated Metal libraries, metaliftd, the probe,
# the llama-bench test double, which is the probe package's example), then runs every
# test in the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --all-targets
# The committed man pages, completions, the guide's generated reference pages and
# the policy schema must be what the CLI generates now (regenerate:
# metalift __generate-docs . && metalift schema > schema/...).
docs=$(mktemp -d)
trap 'rm -rf "$docs"' EXIT
cargo run -q -p metalift-cli --bin metalift -- __generate-docs "$docs"
diff -ru --exclude=metalift-policy.5 man "$docs/man"
diff -ru completions "$docs/completions"
for page in exit-codes.md cli.md; do
  diff -u "docs/src/reference/$page" "$docs/docs/src/reference/$page"
done
cargo run -q -p metalift-cli --bin metalift -- schema | diff -u schema/metalift-policy.schema.json -
# Every page well-formed: nothing at mandoc's warning level or above (STYLE notes,
# long lines of clap's help text, are below it). cli/tests/cli_docs.rs too.
mandoc -T lint -W warning man/*
# The audit record schema, generated from the daemon's record types (metalift
# schema --audit-record > schema/metalift-audit-record.schema.json).
cargo run -q -p metalift-cli --bin metalift -- schema --audit-record | diff -u schema/metalift-audit-record.schema.json -
cargo test --workspace --all-targets "$@"
