//! `metalift audit` on what a fleet's collectors hold: syslog-framed lines from two
//! clones of one image (same host name, colliding decision ids), copies a
//! collector received twice, directories with compressed rotations (made with the
//! real gzip, bzip2 and zstd), export bundles, and input that holds no record.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use metalift_daemon::audit::forward::frame::{self, Header};
use metalift_daemon::audit::{Host, Record, Stamper};
use serde_json::{json, Value};

const T0: &str = "2026-12-06T07:00:00Z";

fn metalift(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(args)
        .env_remove("METALIFT_AUDIT_LOG")
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// One guest: its own daemon run (a fresh random run id), host name, boot id, labels.
fn guest(name: &str, boot_id: &str, image: &str) -> Stamper {
    Stamper::with_host(Host {
        name: name.into(),
        boot_id: Some(boot_id.into()),
        labels: BTreeMap::from([("image".to_owned(), image.to_owned())]),
        pid: Some(77),
        os_build: Some("24A335".into()),
        instance: None,
    })
}

fn record(value: Value) -> Record {
    serde_json::from_value(value).unwrap()
}

fn decision(id: u64, exe: &str, job: &str) -> Record {
    record(json!({
        "kind": "decision", "time": T0, "decision_id": id, "pid": 4000, "uid": 501,
        "exe": exe, "rule": "llama-cpp", "action": "unlock", "profile": "apple7",
        "mode": "enforce", "policy_sha256": "ab".repeat(32), "host_chip": "Apple M2 (Virtual)",
        "advisory": {"shim_version": "1", "arch": "arm64", "job": {"GITHUB_RUN_ID": job}},
    }))
}

fn outcome(id: u64, exe: &str, result: &str) -> Record {
    record(json!({
        "kind": "outcome", "time": "2026-12-06T07:00:01Z", "decision_id": id, "pid": 4000,
        "exe": exe, "result": result,
        "reason": if result == "failed" { "supportsFamily: not found" } else { "" },
        "device_class": "AppleParavirtDevice",
        "stock": {"families": [], "threadgroup_memory": 32768, "working_set": 0},
        "effective": {"families": [], "threadgroup_memory": 32768, "working_set": 0},
    }))
}

/// The JSON line as the local log holds it, without its newline.
fn json_line(g: &Stamper, r: &Record) -> String {
    let line = String::from_utf8(g.line(r).unwrap()).unwrap();
    line.trim_end_matches('\n').to_owned()
}

/// The line as rsyslog's `%rawmsg%` keeps what metaliftd sends: the RFC 5424
/// message of the forwarder's own frame, without RFC 6587's length prefix.
fn rfc5424(g: &Stamper, r: &Record) -> String {
    let line = json_line(g, r);
    let mut framed = Vec::new();
    let header = Header {
        hostname: g.host().name.clone(),
        pid: 77,
    };
    frame::push(&mut framed, &header, line.as_bytes());
    let framed = String::from_utf8(framed).unwrap();
    framed.split_once(' ').unwrap().1.to_owned()
}

/// Two clones of one image (same host name), booted together: their daemons drew
/// the same decision ids. The collector's file interleaves them and holds two
/// records twice (at least once delivery).
fn fleet_file(dir: &Path) -> PathBuf {
    let a = guest("ci-clone", "aaaaaaaa-1111-4000-8000-000000000001", "ci-15");
    let b = guest("ci-clone", "bbbbbbbb-2222-4000-8000-000000000002", "ci-15");
    let c = guest("other", "cccccccc-3333-4000-8000-000000000003", "ci-14");
    let a_dec = rfc5424(&a, &decision(1000, "/opt/llama/a-server", "2"));
    let b_dec = rfc5424(&b, &decision(1000, "/opt/llama/b-server", "2"));
    let b_out = rfc5424(&b, &outcome(1000, "/opt/llama/b-server", "failed"));
    let a_out = rfc5424(&a, &outcome(1000, "/opt/llama/a-server", "applied"));
    let c_dec = rfc5424(&c, &decision(1000, "/opt/llama/c-server", "3"));
    let c_out = rfc5424(&c, &outcome(1000, "/opt/llama/c-server", "applied"));
    let lines = [
        &a_dec, &b_dec, &b_out, &a_dec, &c_dec, &a_out, &b_out, &c_out,
    ];
    let path = dir.join("metalift-audit.log");
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&path, text).unwrap();
    path
}

fn processes(out: &Output) -> Vec<Value> {
    assert!(out.status.success(), "{}", stderr(out));
    stdout(out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// (boot id prefix, exe, result) of each process.
fn summary(ps: &[Value]) -> Vec<(String, String, String)> {
    ps.iter()
        .map(|p| {
            (
                p["host"]["boot_id"].as_str().unwrap()[..8].to_owned(),
                p["exe"].as_str().unwrap().to_owned(),
                p["result"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn the_job_question_on_a_syslog_framed_file_from_two_clones_joins_each_guests_own_outcome() {
    let tmp = tempfile::tempdir().unwrap();
    let file = fleet_file(tmp.path());
    let log = file.to_str().unwrap();
    let ps = processes(&metalift(&["audit", "--log", log, "--job", "2", "--json"]));
    assert_eq!(
        summary(&ps),
        [
            (
                "bbbbbbbb".into(),
                "/opt/llama/b-server".into(),
                "failed".into()
            ),
            (
                "aaaaaaaa".into(),
                "/opt/llama/a-server".into(),
                "applied".into()
            ),
        ],
        "each clone's decision with its own outcome, the copies counted once"
    );
    assert_eq!(ps[0]["host"]["name"], "ci-clone");
    assert_eq!(ps[0]["host"]["labels"]["image"], "ci-15");
    assert_eq!(ps[0]["rule"], "llama-cpp");

    // The text view names the guest and the label asked for.
    let out = metalift(&["audit", "--log", log, "--job", "2", "--show-label", "image"]);
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].contains("GUEST") && lines[0].contains("IMAGE"),
        "{text}"
    );
    assert!(
        lines[1].contains("ci-clone/bbbbbbbb") && lines[1].contains("ci-15"),
        "{text}"
    );
    assert_eq!(lines.len(), 3, "{text}");
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));

    // Markdown, for a step summary: the guest and the label too.
    let md = stdout(&metalift(&[
        "audit",
        "--log",
        log,
        "--job",
        "2",
        "--markdown",
        "--show-label",
        "image",
    ]));
    assert!(
        md.contains("| Process | Guest | image | Rule | Result |"),
        "{md}"
    );
    assert!(
        md.contains("ci-clone/aaaaaaaa | ci-15 | llama-cpp | applied"),
        "{md}"
    );

    // Filters by guest: boot id prefix, host name, labels (all must match).
    let only_b = processes(&metalift(&[
        "audit",
        "--log",
        log,
        "--boot-id",
        "bbbb",
        "--json",
    ]));
    assert_eq!(summary(&only_b).len(), 1);
    let other = processes(&metalift(&[
        "audit", "--log", log, "--host", "other", "--json",
    ]));
    assert_eq!(summary(&other)[0].1, "/opt/llama/c-server");
    let by_label = processes(&metalift(&[
        "audit",
        "--log",
        log,
        "--label",
        "image=ci-15",
        "--json",
    ]));
    assert_eq!(by_label.len(), 2);
    let none = processes(&metalift(&[
        "audit",
        "--log",
        log,
        "--label",
        "image=ci-15",
        "--label",
        "image=ci-14",
        "--json",
    ]));
    assert!(none.is_empty());

    // The raw records: each once.
    let raw = stdout(&metalift(&["audit", "--log", log, "--records", "--json"]));
    assert_eq!(raw.lines().count(), 6, "{raw}");
}

#[test]
fn every_kind_the_records_have_is_a_kind_filter() {
    let tmp = tempfile::tempdir().unwrap();
    let file = fleet_file(tmp.path());
    for kind in metalift_daemon::audit::Record::KINDS {
        let out = metalift(&["audit", "--log", file.to_str().unwrap(), "--kind", kind]);
        assert!(out.status.success(), "--kind {kind}: {}", stderr(&out));
    }
}

#[test]
fn rfc3164_lines_and_a_directory_of_compressed_rotations_are_read_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("collector");
    std::fs::create_dir_all(dir.join("nested")).unwrap();
    let g = guest(
        "relay-guest",
        "dddddddd-4444-4000-8000-000000000004",
        "ci-15",
    );
    let line = |id: u64| json_line(&g, &decision(id, &format!("/bin/p{id}"), "9"));
    let write = |name: &str, text: String| std::fs::write(dir.join(name), text).unwrap();
    // Oldest first: a.log.2 (gzip), a.log.1 (bzip2), a.log (plain, RFC 3164 with a
    // BSD timestamp), nested/b.log (zstd, RFC 3339 timestamp).
    write("a.log.2", format!("{}\n", line(1)));
    write("a.log.1", format!("{}\n", line(2)));
    write(
        "a.log",
        format!("Dec  6 07:00:03 relay-guest metaliftd[77]: {}\n", line(3)),
    );
    std::fs::write(
        dir.join("nested/b.log"),
        format!(
            "2026-12-06T07:00:04.000000+00:00 relay-guest metaliftd: {}\n",
            line(4)
        ),
    )
    .unwrap();
    for (tool, file) in [
        ("gzip", "a.log.2"),
        ("bzip2", "a.log.1"),
        ("zstd", "nested/b.log"),
    ] {
        let status = Command::new(tool)
            .args(if tool == "zstd" {
                vec!["-q", "--rm"]
            } else {
                vec![]
            })
            .arg(dir.join(file))
            .status()
            .unwrap_or_else(|e| panic!("{tool} (scripts/setup.sh installs it): {e}"));
        assert!(status.success());
    }
    write(".hidden", "not read\n".into());
    write("audit.jsonl.lock", String::new());
    let out = metalift(&[
        "audit",
        "--log",
        dir.to_str().unwrap(),
        "--records",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let ids: Vec<u64> = stdout(&out)
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["decision_id"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(ids, [1, 2, 3, 4]);
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));
}

#[test]
fn a_file_of_syslog_headers_without_a_record_exits_3_naming_the_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("syslog");
    std::fs::write(
        &file,
        "<30>1 2026-12-06T07:00:00Z host systemd 1 - - Started Session 4.\n\
         Dec  6 07:00:01 host sshd[12]: Accepted publickey for admin\n",
    )
    .unwrap();
    let out = metalift(&["audit", "--log", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains(&format!("{}:1:", file.display())), "{err}");
    assert!(err.contains("no metalift record"), "{err}");
    assert!(err.contains("RFC 5424"), "{err}");
}

#[test]
fn a_truncated_gzip_is_named_and_the_other_inputs_are_still_read() {
    let tmp = tempfile::tempdir().unwrap();
    let g = guest("g", "eeeeeeee-5555-4000-8000-000000000005", "ci-15");
    let good = tmp.path().join("good.log");
    std::fs::write(
        &good,
        format!("{}\n", json_line(&g, &decision(5, "/bin/ok", "1"))),
    )
    .unwrap();
    let bad = tmp.path().join("old.log");
    let many: String = (0..2000)
        .map(|i| format!("{}\n", json_line(&g, &decision(i, "/bin/x", "1"))))
        .collect();
    std::fs::write(&bad, many).unwrap();
    assert!(Command::new("gzip").arg(&bad).status().unwrap().success());
    let gz = tmp.path().join("old.log.gz");
    let bytes = std::fs::read(&gz).unwrap();
    std::fs::write(&gz, &bytes[..bytes.len() / 2]).unwrap();
    let out = metalift(&[
        "audit",
        "--log",
        gz.to_str().unwrap(),
        good.to_str().unwrap(),
        "--records",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("old.log.gz"), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("/bin/ok"),
        "the good file is still read"
    );
}

#[test]
fn an_export_bundle_directory_is_its_records() {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("metalift-guest-20261206T070000Z");
    std::fs::create_dir_all(bundle.join("policy")).unwrap();
    let g = guest("guest", "ffffffff-6666-4000-8000-000000000006", "ci-15");
    std::fs::write(
        bundle.join("audit.jsonl"),
        format!(
            "{}\n{}\n",
            json_line(&g, &decision(7, "/bin/llama", "4")),
            json_line(&g, &outcome(7, "/bin/llama", "applied"))
        ),
    )
    .unwrap();
    std::fs::write(bundle.join("manifest.json"), "{}\n").unwrap();
    std::fs::write(bundle.join("status.json"), "{}\n").unwrap();
    std::fs::write(bundle.join("SHA256SUMS"), "00  audit.jsonl\n").unwrap();
    std::fs::write(bundle.join("policy/sha256"), "ab\n").unwrap();
    let ps = processes(&metalift(&[
        "audit",
        "--log",
        tmp.path().to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(
        summary(&ps),
        [(
            "ffffffff".to_owned(),
            "/bin/llama".to_owned(),
            "applied".to_owned()
        )]
    );
}

#[test]
fn the_fleet_summary_by_image_and_macos_build_names_the_failing_image_with_its_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let file = fleet_file(tmp.path());
    let log = file.to_str().unwrap();
    let out = metalift(&[
        "audit",
        "--log",
        log,
        "--summary",
        "--by",
        "label:image,os",
        "--result",
        "failed",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["by"], json!(["label:image", "os"]));
    assert_eq!(v["groups"].as_array().unwrap().len(), 1, "{v}");
    let g = &v["groups"][0];
    assert_eq!(g["key"], json!({"label:image": "ci-15", "os": "24A335"}));
    assert_eq!(g["counts"]["failed"], 1);
    assert_eq!(g["top_failures"][0]["reason"], "supportsFamily: not found");

    // Every process, by image: text and Markdown.
    let text = stdout(&metalift(&[
        "audit",
        "--log",
        log,
        "--summary",
        "--by",
        "label:image",
    ]));
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    // LABEL:IMAGE PROCESSES UNLOCKED APPLIED FAILED STOCK NO-OUTCOME ...
    assert_eq!(
        rows[0][..7],
        ["ci-15", "2", "2", "1", "1", "0", "0"],
        "{text}"
    );
    assert_eq!(
        rows[1][..7],
        ["ci-14", "1", "1", "1", "0", "0", "0"],
        "{text}"
    );
    let md = stdout(&metalift(&[
        "audit",
        "--log",
        log,
        "--summary",
        "--by",
        "host,result",
        "--markdown",
    ]));
    assert!(md.contains("| host | result | Processes |"), "{md}");
    assert!(md.contains("| ci-clone | failed | 1 | 1 | 0 | 1 |"), "{md}");
    let bad = metalift(&["audit", "--log", log, "--summary", "--by", "colour"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("label:NAME"), "{}", stderr(&bad));
}

/// A `verification` record as `metalift verify --workload` writes it on a guest.
fn verification(passed: bool, pp: f64, tg: f64) -> Record {
    let answers = json!({"apple_family": 7, "max_threadgroup_memory": 32768,
        "recommended_working_set": null, "has_simdgroup_reduction": true,
        "has_simdgroup_mm": true, "has_bfloat": true});
    record(json!({
        "kind": "verification", "time": "2026-12-06T06:00:00Z", "profile": "apple7",
        "apple_family_max": 7, "max_threadgroup_memory": 32768, "recommended_working_set": null,
        "host_chip": "Apple M2 (Virtual)", "os_build": "24A335", "metalift_version": "0.1.0",
        "passed": passed, "kernels": [], "recorded_by_uid": 0,
        "receipt": {"shim": "/usr/local/lib/libmetalift.dylib", "shim_sha256": null,
            "probe": "/usr/local/libexec/metalift-probe", "probe_sha256": null,
            "os_product_version": "15.0", "stock": answers, "effective": answers,
            "unlock_needed": true, "control": "differs", "kernel_timeout_ms": 1000,
            "timeout_ms": 60000, "elapsed_ms": 900,
            "workload": {"command": ["llama-bench"], "runs": 3, "measure": "llama_bench",
                "result": "pass", "pp_speedup": pp, "tg_speedup": tg, "speedup": pp.min(tg),
                "tests": []}},
    }))
}

#[test]
fn the_validated_matrix_joins_processes_with_verifications_and_gates_ci() {
    let tmp = tempfile::tempdir().unwrap();
    let fleet = fleet_file(tmp.path());
    // Verifications on two more guests of each image: ci-15 passed (twice, with
    // its speed-ups), ci-14 failed.
    let v15 = guest("bake-15", "99999999-7777-4000-8000-000000000007", "ci-15");
    let v14 = guest("bake-14", "88888888-8888-4000-8000-000000000008", "ci-14");
    let verifications = tmp.path().join("verifications.log");
    std::fs::write(
        &verifications,
        format!(
            "{}\n{}\n{}\n",
            rfc5424(&v15, &verification(true, 11.0, 16.0)),
            rfc5424(&v15, &verification(true, 9.0, 14.0)),
            rfc5424(&v14, &verification(false, 1.0, 1.0)),
        ),
    )
    .unwrap();
    let logs = [fleet.to_str().unwrap(), verifications.to_str().unwrap()];
    let out = metalift(&["audit", "--log", logs[0], logs[1], "--matrix", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let row = |exe: &str| {
        rows.iter()
            .find(|r| r["exe"] == exe)
            .unwrap_or_else(|| panic!("no row for {exe}: {v}"))
    };
    let a = row("/opt/llama/a-server");
    assert_eq!(
        (&a["chip"], &a["os_build"], &a["image"]),
        (
            &json!("Apple M2 (Virtual)"),
            &json!("24A335"),
            &json!("ci-15")
        )
    );
    assert_eq!(
        (&a["applied"], &a["verification"]),
        (&json!(1), &json!("pass"))
    );
    assert_eq!(a["pp_speedup"], json!([9.0, 11.0]), "min and median");
    assert_eq!(a["marked"], false);
    assert_eq!(
        row("/opt/llama/b-server")["marked"],
        true,
        "a failed process"
    );
    let c = row("/opt/llama/c-server");
    assert_eq!(
        (&c["verification"], &c["marked"]),
        (&json!("fail"), &json!(true))
    );

    let gate = metalift(&[
        "audit",
        "--log",
        logs[0],
        logs[1],
        "--matrix",
        "--fail-on-failed",
    ]);
    assert_eq!(gate.status.code(), Some(1), "{}", stderr(&gate));
    assert!(
        stderr(&gate).contains("b-server: 1 failed"),
        "{}",
        stderr(&gate)
    );
    let gate = metalift(&["audit", "--log", logs[0], "--matrix", "--require-verified"]);
    assert_eq!(gate.status.code(), Some(1), "no verification read at all");
    let md = stdout(&metalift(&[
        "audit",
        "--log",
        logs[0],
        logs[1],
        "--matrix",
        "--markdown",
    ]));
    assert!(
        md.contains("| ⚠️ Apple M2 (Virtual) | 24A335 | ci-15 | /opt/llama/b-server |"),
        "{md}"
    );

    let html = stdout(&metalift(&[
        "audit", "--log", logs[0], logs[1], "--matrix", "--html",
    ]));
    assert!(html.starts_with("<!DOCTYPE html>"), "{html}");
    assert!(
        !html.contains("<script") && !html.contains("http"),
        "self-contained: {html}"
    );
    assert!(
        html.contains("<tr class=\"marked\"><td>Apple M2 (Virtual)</td>"),
        "{html}"
    );
    assert!(html.contains("9.0× / 11.0×"), "{html}");
}

#[test]
fn the_matrix_page_renders_its_table_in_headless_chromium_without_a_console_message() {
    let tmp = tempfile::tempdir().unwrap();
    let fleet = fleet_file(tmp.path());
    let out = metalift(&[
        "audit",
        "--log",
        fleet.to_str().unwrap(),
        "--matrix",
        "--html",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let page = tmp.path().join("matrix.html");
    std::fs::write(&page, &out.stdout).unwrap();
    let shot = tmp.path().join("matrix.png");
    let url = format!("file://{}", page.display());
    // Debian's chromium, headless; as root it needs --no-sandbox. Console messages
    // (a script error, a blocked resource) are logged to stderr as `:CONSOLE`.
    let run = |extra: &[String]| {
        Command::new("chromium")
            .args(["--headless", "--no-sandbox", "--disable-gpu"])
            .args(["--enable-logging=stderr", "--v=0"])
            .arg(format!(
                "--user-data-dir={}",
                tmp.path().join("profile").display()
            ))
            .args(extra)
            .arg(&url)
            .output()
            .unwrap_or_else(|e| panic!("chromium (scripts/setup.sh installs it): {e}"))
    };
    let dom = run(&["--dump-dom".to_owned()]);
    assert!(dom.status.success(), "{}", stderr(&dom));
    let dom_text = stdout(&dom);
    let rendered_rows = dom_text.matches("<tr").count();
    // The header row and one per process's chip, build, image and executable.
    assert_eq!(rendered_rows, 1 + 3, "{dom_text}");
    assert!(
        dom_text.contains("<td>/opt/llama/b-server</td>"),
        "{dom_text}"
    );
    let shot_run = run(&[
        format!("--screenshot={}", shot.display()),
        "--window-size=1400,600".to_owned(),
    ]);
    assert!(shot_run.status.success(), "{}", stderr(&shot_run));
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 1000,
        "a screenshot was drawn"
    );
    for output in [&dom, &shot_run] {
        let log = stderr(output);
        assert!(!log.contains(":CONSOLE"), "a console message: {log}");
    }
}
