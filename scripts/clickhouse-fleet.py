#!/usr/bin/env python3
"""Loads audit record lines into chdb (ClickHouse's embedded engine) with
examples/collectors/clickhouse.sql and prints each of its queries' rows as JSON.

    python3 scripts/clickhouse-fleet.py RECORDS.jsonl --param job=42 [--batch N]

Lines are inserted N at a time (default 1000), as Vector's sink batches them:
copies of one record in different batches are different parts until ClickHouse
merges them, so the queries must read with FINAL. --batch 1 --stop-merges makes
every record its own part and keeps it so (SYSTEM STOP MERGES: a collector whose
background merges have not caught up), the case the tests check.

Prints one JSON object: {"query name": [row, ...], ...}. Exit 2 with a message
when chdb is missing (scripts/setup.sh installs it) or a statement fails.
"""
import argparse
import json
import pathlib
import sys

SQL = pathlib.Path(__file__).resolve().parent.parent / "examples/collectors/clickhouse.sql"


def statements(text):
    """The file's statements in order, each with its `-- query: NAME` or None."""
    out, name, current = [], None, []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("-- query:"):
            name = stripped.split(":", 1)[1].strip()
            continue
        if stripped.startswith("--") or not stripped:
            continue
        current.append(line)
        if stripped.endswith(";"):
            out.append((name, "\n".join(current).rstrip(";")))
            name, current = None, []
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("records")
    parser.add_argument("--param", action="append", default=[], help="NAME=VALUE")
    parser.add_argument("--batch", type=int, default=1000, help="lines per INSERT")
    parser.add_argument("--stop-merges", action="store_true", help="no background merge")
    args = parser.parse_args()
    try:
        from chdb import session
    except ImportError as e:
        print(f"clickhouse-fleet: chdb is missing ({e}): run scripts/setup.sh", file=sys.stderr)
        return 2
    params = dict(p.split("=", 1) for p in args.param)
    s = session.Session()
    results = {}
    for name, sql in statements(SQL.read_text()):
        if name is None:
            s.query(sql)
            if "CREATE TABLE" in sql:
                if args.stop_merges:
                    s.query("SYSTEM STOP MERGES metalift.records")
                lines = [l for l in pathlib.Path(args.records).read_text().splitlines() if l.strip()]
                # Lines as values of the one inserted column, as Vector's sink sends them.
                for i in range(0, len(lines), max(args.batch, 1)):
                    rows = "\n".join(json.dumps({"line": l}) for l in lines[i : i + args.batch])
                    s.query(f"INSERT INTO metalift.records (line) FORMAT JSONEachRow\n{rows}")
            continue
        out = s.query(sql, "JSONEachRow", params=params)
        results[name] = [json.loads(r) for r in str(out).splitlines() if r.strip()]
    print(json.dumps(results, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
