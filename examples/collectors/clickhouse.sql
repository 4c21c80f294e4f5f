-- metalift's audit records in ClickHouse, for a fleet past one collector host.
--
-- One row per record: `line` is the record's JSON exactly as metaliftd wrote it
-- (what Vector's `clickhouse` sink inserts with examples/collectors/vector-clickhouse.toml),
-- and the columns the fleet questions need are computed from it when the row is
-- inserted. ReplacingMergeTree ordered by the record's `id` keeps one row per
-- record: a collector's at-least-once copies count once (read with FINAL).
--
-- A decision joins only an outcome of the same daemon run: `run` is the id's
-- 128-bit prefix (32 hex digits before the '-'), as `metalift audit` joins them
-- (two clones of one image can share a decision_id; they never share a run).
--
-- The questions below are the ones `metalift audit` answers, with the same
-- answers on the same records: cli/tests/audit_clickhouse.rs runs this file in
-- chdb (ClickHouse's embedded engine, from PyPI) through scripts/clickhouse-fleet.py
-- and compares. Each query starts with a `-- query: NAME` line.

CREATE DATABASE IF NOT EXISTS metalift;

CREATE TABLE IF NOT EXISTS metalift.records
(
    line String,
    id String MATERIALIZED JSONExtractString(line, 'id'),
    run String MATERIALIZED splitByChar('-', JSONExtractString(line, 'id'))[1],
    kind LowCardinality(String) MATERIALIZED JSONExtractString(line, 'kind'),
    time DateTime64(6, 'UTC') MATERIALIZED parseDateTime64BestEffort(JSONExtractString(line, 'time'), 6, 'UTC'),
    host_name String MATERIALIZED JSONExtractString(line, 'host', 'name'),
    boot_id String MATERIALIZED JSONExtractString(line, 'host', 'boot_id'),
    image String MATERIALIZED JSONExtractString(line, 'host', 'labels', 'image'),
    decision_id UInt64 MATERIALIZED JSONExtractUInt(line, 'decision_id'),
    exe String MATERIALIZED JSONExtractString(line, 'exe'),
    rule String MATERIALIZED JSONExtractString(line, 'rule'),
    jobs Array(String) MATERIALIZED mapValues(JSONExtract(line, 'advisory', 'job', 'Map(String, String)')),
    result LowCardinality(String) MATERIALIZED JSONExtractString(line, 'result')
)
ENGINE = ReplacingMergeTree
ORDER BY id;

-- query: job
-- In job {job}, which executables were unlocked, on which guest, did it apply?
-- (metalift audit --job JOB --json: one row per decision with its outcome)
SELECT d.host_name AS host, d.image AS image, d.exe AS exe, d.rule AS rule,
       if(o.id = '', 'no outcome', o.result) AS result
FROM (SELECT host_name, image, exe, rule, run, decision_id
      FROM metalift.records FINAL
      WHERE kind = 'decision' AND has(jobs, {job:String})) AS d
LEFT JOIN (SELECT id, run, decision_id, result
           FROM metalift.records FINAL
           WHERE kind = 'outcome') AS o
    ON d.run = o.run AND d.decision_id = o.decision_id
ORDER BY host, image, exe, result;

-- query: summary_by_image
-- Processes and their results per image (metalift audit --summary --by label:image,result --json)
SELECT d.image AS image, if(o.id = '', 'no outcome', o.result) AS result, count() AS processes
FROM (SELECT image, run, decision_id
      FROM metalift.records FINAL
      WHERE kind = 'decision') AS d
LEFT JOIN (SELECT id, run, decision_id, result
           FROM metalift.records FINAL
           WHERE kind = 'outcome') AS o
    ON d.run = o.run AND d.decision_id = o.decision_id
GROUP BY image, result
ORDER BY image, result;
