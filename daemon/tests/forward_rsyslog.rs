//! Audit forwarding against a real rsyslog (Debian's `rsyslogd`, started here on a
//! loopback port with `examples/collectors/rsyslog*.conf`): every record arrives as
//! RFC 5424 with its JSON intact, over a `kill -9` and rotations, after a collector
//! outage, and over TLS; an untrusted collector is refused and `status` says why.
//! Over RELP (`examples/collectors/rsyslog-relp.conf`, imrelp): rsyslog killed and
//! restarted mid-stream under check-in load loses nothing, and `audit flush` exits
//! 0 only once rsyslog answered every record.
//! (`forward_hangup` has the collectors of the test's own that go away.)
//! Without `rsyslogd` (scripts/setup.sh installs it) every test fails saying so.
#![cfg(target_os = "linux")]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "forward_support/mod.rs"]
mod support;
use support::{check_in, free_port, reloads, serial, Env, GUARD};

struct Rsyslog {
    child: Child,
    out: PathBuf,
}

impl Drop for Rsyslog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts rsyslogd in the foreground with the example config at `example`,
/// placeholders replaced by `vars`; waits until it listens on `port`.
fn rsyslog(dir: &Path, example: &str, port: u16, vars: &[(&str, String)]) -> Rsyslog {
    let bin = Path::new("/usr/sbin/rsyslogd");
    assert!(
        bin.exists(),
        "rsyslogd is not installed: run scripts/setup.sh (Debian package rsyslog)"
    );
    let work = dir.join("rsyslog");
    std::fs::create_dir_all(&work).unwrap();
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../examples/collectors")
            .join(example),
    )
    .unwrap();
    let mut text = text
        .replace("@DIR@", work.to_str().unwrap())
        .replace("@PORT@", &port.to_string());
    for (k, v) in vars {
        text = text.replace(k, v);
    }
    let conf = work.join("rsyslog.conf");
    std::fs::write(&conf, text).unwrap();
    let child = Command::new(bin)
        .arg("-n")
        .arg("-f")
        .arg(&conf)
        .arg("-i")
        .arg(work.join("rsyslogd.pid"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(work.join("stderr")).unwrap())
        .spawn()
        .expect("spawn rsyslogd");
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(start.elapsed() < GUARD, "rsyslogd did not listen on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    Rsyslog {
        child,
        out: work.join("metalift-audit.log"),
    }
}

/// One message rsyslog received, parsed as RFC 5424.
#[derive(Debug)]
struct Message {
    /// TIMESTAMP, as received.
    time: String,
    msgid: String,
    json: String,
}

fn received(out: &Path) -> Vec<Message> {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            // <PRI>VERSION SP TIMESTAMP SP HOSTNAME SP APP-NAME SP PROCID SP MSGID SP SD SP MSG
            let mut parts = l.splitn(8, ' ');
            let pri_ver = parts.next().unwrap();
            assert_eq!(
                pri_ver, "<110>1",
                "PRI facility 13 severity 6, version 1: {l}"
            );
            let time = parts.next().unwrap().to_owned();
            assert!(time.ends_with('Z') && time.contains('T'), "timestamp: {l}");
            let host = parts.next().unwrap();
            assert!(!host.is_empty() && host != "-", "hostname: {l}");
            assert_eq!(parts.next(), Some("metaliftd"), "APP-NAME: {l}");
            parts
                .next()
                .unwrap()
                .parse::<u32>()
                .expect("PROCID is the pid");
            let msgid = parts.next().unwrap().to_owned();
            assert_eq!(parts.next(), Some("-"), "no structured data: {l}");
            let json = parts.next().expect("MSG").to_owned();
            let v: Value = serde_json::from_str(&json).expect("MSG is the JSON record");
            assert_eq!(v["kind"], msgid.as_str(), "MSGID is the record's kind");
            assert_eq!(
                v["time"],
                time.as_str(),
                "TIMESTAMP is the record's own time, not the send time: {l}"
            );
            Message { time, msgid, json }
        })
        .collect()
}

/// Waits until every local record line was received at least once; returns how
/// often each was received.
fn wait_all_received(env: &Env, out: &Path) -> HashMap<String, usize> {
    let start = Instant::now();
    loop {
        let local = env.local_lines();
        let mut seen: HashMap<String, usize> = HashMap::new();
        for m in received(out) {
            *seen.entry(m.json).or_default() += 1;
        }
        let missing = local.iter().filter(|l| !seen.contains_key(*l)).count();
        if missing == 0 {
            for json in seen.keys() {
                assert!(
                    local.contains(json),
                    "received a record not in the log: {json}"
                );
            }
            return seen;
        }
        assert!(
            start.elapsed() < GUARD,
            "{missing} of {} records never arrived; status: {:?}\ndaemon log:\n{}",
            local.len(),
            env.status().forwarder,
            std::fs::read_to_string(env.daemon_log()).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn every_record_arrives_once_over_rotation_and_a_kill_9_with_duplicates_only_past_the_cursor() {
    let _serial = serial();
    let env = Env::new();
    let port = free_port();
    let collector = rsyslog(env.dir.path(), "rsyslog.conf", port, &[]);
    env.policy(&format!("address = \"127.0.0.1:{port}\""));
    // ~300-byte records, 2 KiB files: a rotation every few records.
    let mut daemon = env.start(2048);
    reloads(&env, &daemon, 40);
    let start = Instant::now();
    while env.status().forwarder.unwrap().delivered_records < 30 {
        assert!(
            start.elapsed() < GUARD,
            "the forwarder sends before the kill"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // What was sent counts as delivered once the collector's TCP stack acknowledged
    // it and the connection stayed up for TCP_SETTLE; the cursor is saved at most
    // every SAVE_EVERY (100 ms), and a position still unsaved once that has passed
    // is saved even if nothing more is delivered: what was sent well before the
    // kill is behind the saved cursor.
    let settled = metalift_daemon::audit::forward::window::TCP_SETTLE
        + metalift_daemon::audit::forward::cursor::SAVE_EVERY * 3;
    std::thread::sleep(settled);
    let delivered_long_before = env.status().forwarder.unwrap().delivered_records as usize;
    reloads(&env, &daemon, 5);
    // kill -9 mid-stream: the cursor saved on disk bounds what may come twice.
    daemon.kill();
    let local_at_kill = env.local_lines();
    assert!(local_at_kill.len() >= 40);
    let cursor = std::fs::read_to_string(env.path("log/forward.cursor")).unwrap_or_default();
    assert_eq!(
        cursor.split_whitespace().count(),
        3,
        "a saved cursor: {cursor:?}"
    );
    let past_cursor = env.lines_past_cursor(&cursor);
    // Every line is a record and was forwarded from the first one, oldest first.
    assert!(
        past_cursor <= local_at_kill.len() - delivered_long_before,
        "the saved cursor {cursor:?} is {past_cursor} records before the end of the log: \
         more than the {} written after the {delivered_long_before} delivered {:?} before \
         the kill",
        local_at_kill.len() - delivered_long_before,
        settled,
    );
    drop(daemon);
    let daemon = env.start(2048);
    reloads(&env, &daemon, 40);
    let seen = wait_all_received(&env, &collector.out);
    let rotated = std::fs::read_dir(env.path("log")).unwrap().count();
    assert!(rotated > 10, "the log rotated: {rotated} files");
    let dupes: usize = seen.values().map(|n| n - 1).sum();
    assert!(
        seen.values().all(|&n| n <= 2),
        "no record arrives more than twice: {seen:?}"
    );
    // Only records past the saved cursor may come twice.
    println!(
        "{} records ({} at the kill), {dupes} duplicates after kill -9, {past_cursor} past the saved cursor {cursor:?}",
        seen.len(),
        local_at_kill.len(),
    );
    assert!(
        dupes <= past_cursor,
        "{dupes} duplicates, more than the {past_cursor} records past the saved cursor"
    );
    let gaps = env
        .local_lines()
        .iter()
        .filter(|l| l.contains("\"forward_gap\""))
        .count();
    assert_eq!(gaps, 0, "keep = 200: nothing rotated away");
    drop(daemon);
}

#[test]
fn a_graceful_stop_saves_the_cursor_at_the_last_record_sent_so_a_restart_sends_nothing_twice() {
    let _serial = serial();
    let env = Env::new();
    let port = free_port();
    let collector = rsyslog(env.dir.path(), "rsyslog.conf", port, &[]);
    env.policy(&format!("address = \"127.0.0.1:{port}\""));
    let mut daemon = env.start(1 << 20);
    // Records in quick succession, then the stop at once: the schedule (a save at
    // most every 100 ms) still holds the last positions; the stop must save them.
    reloads(&env, &daemon, 20);
    assert!(daemon.terminate(GUARD).unwrap().expect("stopped").success());
    let cursor = std::fs::read_to_string(env.path("log/forward.cursor")).unwrap_or_default();
    assert_eq!(
        env.lines_past_cursor(&cursor),
        0,
        "every record, daemon_stop too, sent and the cursor saved at the stop: {cursor:?}"
    );
    drop(daemon);
    let daemon = env.start(1 << 20);
    reloads(&env, &daemon, 1);
    let seen = wait_all_received(&env, &collector.out);
    assert!(
        seen.values().all(|&n| n == 1),
        "nothing sent twice after a graceful restart: {seen:?}"
    );
    drop(daemon);
}

#[test]
fn a_collector_down_for_a_while_then_up_gets_every_record() {
    let _serial = serial();
    let env = Env::new();
    let port = free_port();
    env.policy(&format!("address = \"127.0.0.1:{port}\""));
    let daemon = env.start(1024 * 1024);
    reloads(&env, &daemon, 20);
    let start = Instant::now();
    let status = loop {
        let f = env.status().forwarder.expect("forwarder status");
        if f.last_error.is_some() {
            break f;
        }
        assert!(
            start.elapsed() < GUARD,
            "no error while the collector is down"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.connected);
    assert!(status.records_behind > 0, "{status:?}");
    assert!(
        status.last_error.as_deref().unwrap().contains("refused"),
        "{status:?}"
    );
    // Sent only after the collector is up, well after they were written.
    std::thread::sleep(Duration::from_millis(1500));
    let up_at = std::time::SystemTime::now();
    let collector = rsyslog(env.dir.path(), "rsyslog.conf", port, &[]);
    let seen = wait_all_received(&env, &collector.out);
    assert!(
        seen.values().all(|&n| n == 1),
        "exactly once without a restart"
    );
    let late = received(&collector.out)
        .into_iter()
        .filter(|m| humantime::parse_rfc3339(&m.time).unwrap() < up_at)
        .count();
    assert!(
        late >= 20,
        "the records written during the outage keep their own time: {late} stamped before the collector was up"
    );
    let start = Instant::now();
    while env.status().forwarder.unwrap().records_behind != 0 {
        assert!(start.elapsed() < GUARD, "status says caught up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let f = env.status().forwarder.unwrap();
    assert!(f.connected && f.last_delivery_at.is_some(), "{f:?}");
    let msgids: Vec<String> = received(&collector.out)
        .into_iter()
        .map(|m| m.msgid)
        .collect();
    assert!(msgids.iter().any(|m| m == "daemon_start"));
    assert!(msgids.iter().any(|m| m == "policy_loaded"));
    drop(daemon);
}

/// Makes a CA named `name` and a server certificate for localhost/127.0.0.1 signed
/// by it, with the `openssl` CLI; returns (ca.pem, server.pem, server.key).
fn test_ca(dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let p = |f: &str| dir.join(format!("{name}-{f}"));
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .output()
            .expect("openssl is not installed: run scripts/setup.sh");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let s = |x: &PathBuf| x.to_str().unwrap().to_owned();
    let (ca_key, ca, key, csr, cert, ext) = (
        p("ca.key"),
        p("ca.pem"),
        p("server.key"),
        p("server.csr"),
        p("server.pem"),
        p("ext.cnf"),
    );
    std::fs::write(
        &ext,
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &s(&ca_key),
        "-out",
        &s(&ca),
        "-days",
        "2",
        "-subj",
        &format!("/CN={name} test CA"),
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &s(&key),
        "-out",
        &s(&csr),
        "-subj",
        "/CN=localhost",
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        &s(&csr),
        "-CA",
        &s(&ca),
        "-CAkey",
        &s(&ca_key),
        "-CAcreateserial",
        "-out",
        &s(&cert),
        "-days",
        "2",
        "-extfile",
        &s(&ext),
    ]);
    (ca, cert, key)
}

/// A client certificate (`clientAuth`) signed by the CA `name` that [`test_ca`]
/// made in `dir`; returns (client.pem, client.key).
fn client_cert(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let p = |f: &str| dir.join(format!("{name}-{f}"));
    let s = |x: &PathBuf| x.to_str().unwrap().to_owned();
    let (key, csr, cert, ext) = (
        p("client.key"),
        p("client.csr"),
        p("client.pem"),
        p("client-ext.cnf"),
    );
    std::fs::write(
        &ext,
        "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
    )
    .unwrap();
    for args in [
        vec![
            "req".to_owned(),
            "-newkey".into(),
            "rsa:2048".into(),
            "-nodes".into(),
            "-keyout".into(),
            s(&key),
            "-out".into(),
            s(&csr),
            "-subj".into(),
            "/CN=metaliftd test client".into(),
        ],
        vec![
            "x509".to_owned(),
            "-req".into(),
            "-in".into(),
            s(&csr),
            "-CA".into(),
            s(&p("ca.pem")),
            "-CAkey".into(),
            s(&p("ca.key")),
            "-CAcreateserial".into(),
            "-out".into(),
            s(&cert),
            "-days".into(),
            "2".into(),
            "-extfile".into(),
            s(&ext),
        ],
    ] {
        let out = Command::new("openssl").args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    (cert, key)
}

fn tls_collector(env: &Env, port: u16, name: &str) -> (Rsyslog, PathBuf) {
    tls_collector_with(env, port, name, "anon")
}

/// An rsyslog over TLS with a certificate from the CA `name`, `StreamDriver.AuthMode`
/// `auth_mode` (`anon`, or `x509/certvalid`: a client certificate from the same CA
/// is required). Returns the collector and the CA's certificate.
fn tls_collector_with(env: &Env, port: u16, name: &str, auth_mode: &str) -> (Rsyslog, PathBuf) {
    let (ca, cert, key) = test_ca(env.dir.path(), name);
    let vars = [
        ("@CA@", ca.display().to_string()),
        ("@CERT@", cert.display().to_string()),
        ("@KEY@", key.display().to_string()),
        ("@AUTHMODE@", auth_mode.to_owned()),
    ];
    (rsyslog(env.dir.path(), "rsyslog-tls.conf", port, &vars), ca)
}

/// The forwarder's last error once it has one that differs from `before`.
fn next_error(env: &Env, before: Option<&str>) -> metalift_daemon::audit::forward::ForwarderStatus {
    let start = Instant::now();
    loop {
        let f = env.status().forwarder.unwrap();
        if f.last_error.is_some() && f.last_error.as_deref() != before {
            return f;
        }
        assert!(start.elapsed() < GUARD, "no new forwarding error: {f:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_collector_requiring_a_client_certificate_refuses_none_and_an_untrusted_one_and_takes_ours() {
    let _serial = serial();
    let env = Env::new();
    let port = free_port();
    let (collector, ca) = tls_collector_with(&env, port, "good", "x509/certvalid");
    let tls = format!(
        "address = \"127.0.0.1:{port}\"\ntransport = \"tls\"\nca = \"{}\"\nserver_name = \"localhost\"",
        ca.display()
    );
    // No client certificate.
    env.policy(&tls);
    let daemon = env.start(1024 * 1024);
    reloads(&env, &daemon, 3);
    let f = next_error(&env, None);
    let no_cert = f.last_error.clone().unwrap();
    assert!(!f.connected && f.delivered_records == 0, "{f:?}");
    assert!(
        no_cert.contains("client certificate"),
        "status says a client certificate may be what is missing: {no_cert}"
    );
    // A client certificate from another CA ("rogue").
    test_ca(env.dir.path(), "rogue");
    let (rogue_cert, rogue_key) = client_cert(env.dir.path(), "rogue");
    env.policy(&format!(
        "{tls}\nclient_cert = \"{}\"\nclient_key = \"{}\"",
        rogue_cert.display(),
        rogue_key.display()
    ));
    reloads(&env, &daemon, 1);
    let f = next_error(&env, Some(&no_cert));
    let rogue = f.last_error.clone().unwrap();
    assert!(!f.connected && f.delivered_records == 0, "{f:?}");
    assert!(
        rogue.contains("refused our client certificate") && rogue.contains("rogue-client.pem"),
        "status says the collector refused the certificate: {rogue}"
    );
    assert!(
        received(&collector.out).is_empty(),
        "nothing delivered without a trusted client certificate"
    );
    let text = env.status().to_text();
    assert!(text.contains("last error:"), "{text}");
    println!("without a client certificate: {no_cert}\nwith an untrusted one: {rogue}");
    // Ours, from the CA the collector trusts.
    let (cert, key) = client_cert(env.dir.path(), "good");
    env.policy(&format!(
        "{tls}\nclient_cert = \"{}\"\nclient_key = \"{}\"",
        cert.display(),
        key.display()
    ));
    reloads(&env, &daemon, 2);
    let seen = wait_all_received(&env, &collector.out);
    assert!(seen.values().all(|&n| n == 1), "{seen:?}");
    let f = env.status().forwarder.unwrap();
    assert!(f.connected, "{f:?}");
    drop(daemon);
}

#[test]
fn over_tls_with_a_test_ca_every_record_arrives() {
    let _serial = serial();
    let env = Env::new();
    let port = free_port();
    let (collector, ca) = tls_collector(&env, port, "good");
    env.policy(&format!(
        "address = \"127.0.0.1:{port}\"\ntransport = \"tls\"\nca = \"{}\"\nserver_name = \"localhost\"",
        ca.display()
    ));
    let daemon = env.start(1024 * 1024);
    reloads(&env, &daemon, 10);
    let seen = wait_all_received(&env, &collector.out);
    assert!(seen.values().all(|&n| n == 1));
    let f = env.status().forwarder.unwrap();
    assert_eq!(f.transport.as_deref(), Some("tls"));
    assert!(f.connected, "{f:?}");
    drop(daemon);
}

#[test]
fn a_collector_whose_certificate_is_not_from_the_configured_ca_is_refused_and_status_says_why() {
    let _serial = serial();
    let env = Env::new();
    let port = free_port();
    // The collector's certificate comes from "rogue"; the policy trusts "good".
    let (collector, _) = tls_collector(&env, port, "rogue");
    let (trusted, _, _) = test_ca(env.dir.path(), "good");
    env.policy(&format!(
        "address = \"127.0.0.1:{port}\"\ntransport = \"tls\"\nca = \"{}\"\nserver_name = \"localhost\"",
        trusted.display()
    ));
    let daemon = env.start(1024 * 1024);
    reloads(&env, &daemon, 3);
    let start = Instant::now();
    let f = loop {
        let f = env.status().forwarder.unwrap();
        if f.last_error.is_some() {
            break f;
        }
        assert!(start.elapsed() < GUARD, "no TLS error reported");
        std::thread::sleep(Duration::from_millis(20));
    };
    let error = f.last_error.clone().unwrap();
    assert!(!f.connected, "{f:?}");
    assert!(
        error.contains("TLS handshake") && error.contains("certificate"),
        "status says the certificate is untrusted: {error}"
    );
    assert!(f.delivered_records == 0 && f.records_behind > 0, "{f:?}");
    assert!(
        received(&collector.out).is_empty(),
        "nothing sent to an untrusted collector"
    );
    let text = env.status().to_text();
    assert!(
        text.contains("last error:") && text.contains("certificate"),
        "{text}"
    );
    drop(daemon);
}

#[test]
fn records_rotated_away_while_the_collector_is_down_are_counted_in_a_forward_gap_record() {
    let _serial = serial();
    let mut env = Env::new();
    env.keep = 1;
    let port = free_port();
    env.policy(&format!("address = \"127.0.0.1:{port}\""));
    let daemon = env.start(1024);
    // ~300-byte records, 1 KiB files, one rotated file kept: most are deleted unsent.
    // The gap record lands in that same small log and is itself rotated away a few
    // records later, so it is looked for after every record, not only at the end
    // (under load it was written mid-way and gone by then: 'no forward_gap record').
    let mut gaps: Vec<Value> = Vec::new();
    let look = |env: &Env, gaps: &mut Vec<Value>| {
        for r in env
            .local_lines()
            .iter()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|r| r["kind"] == "forward_gap")
        {
            if !gaps.iter().any(|g| g["id"] == r["id"]) {
                gaps.push(r);
            }
        }
    };
    for _ in 0..30 {
        reloads(&env, &daemon, 1);
        look(&env, &mut gaps);
    }
    let start = Instant::now();
    while gaps.is_empty() {
        assert!(start.elapsed() < GUARD, "no forward_gap record");
        std::thread::sleep(Duration::from_millis(20));
        look(&env, &mut gaps);
    }
    let lost: u64 = gaps
        .iter()
        .map(|g| g["records"].as_u64().expect("counted"))
        .sum();
    assert!(lost > 0, "{gaps:?}");
    assert!(
        gaps[0]["file"].as_str().unwrap().contains("audit.jsonl"),
        "{gaps:?}"
    );
    drop(daemon);
}

use support::fleet::{self, metalift_cli};

#[test]
fn metalift_audit_on_what_rsyslog_wrote_from_two_daemons_answers_the_job_question_per_guest() {
    let _serial = serial();
    let port = free_port();
    let collector_dir = tempfile::tempdir().unwrap();
    let collector = rsyslog(collector_dir.path(), "rsyslog.conf", port, &[]);
    let guests = fleet::two_guests(&format!("127.0.0.1:{port}"), "");
    fleet::run_jobs(&guests);
    // Every record of both guests at the collector (`wait_all_received` expects
    // one guest's records only).
    let start = Instant::now();
    loop {
        let seen: std::collections::HashSet<String> = received(&collector.out)
            .into_iter()
            .map(|m| m.json)
            .collect();
        let local = fleet::local_lines(&guests);
        if local.iter().all(|l| seen.contains(l)) {
            assert_eq!(seen.len(), local.len(), "nothing but the guests' records");
            break;
        }
        assert!(start.elapsed() < GUARD, "not every record arrived");
        std::thread::sleep(Duration::from_millis(50));
    }
    fleet::assert_the_job_question(&collector.out);
}

/// `metalift audit flush --timeout TIMEOUT` for `env`'s daemon: exit code and output.
fn flush(env: &Env, timeout: &str) -> (Option<i32>, String) {
    let out = Command::new(metalift_cli())
        .args(["audit", "flush", "--timeout", timeout, "--socket"])
        .arg(env.socket())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// The record ids rsyslog wrote to `out`, with how often each came.
fn received_ids(out: &Path) -> HashMap<String, usize> {
    let mut ids: HashMap<String, usize> = HashMap::new();
    for m in received(out) {
        let v: Value = serde_json::from_str(&m.json).unwrap();
        *ids.entry(v["id"].as_str().unwrap().to_owned()).or_default() += 1;
    }
    ids
}

#[test]
fn over_relp_rsyslog_killed_and_restarted_mid_stream_gets_every_record_and_flush_waits_for_its_answers(
) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    let _serial = serial();
    let env = Env::new();
    let port = free_port();
    let mut collector = rsyslog(env.dir.path(), "rsyslog-relp.conf", port, &[]);
    env.policy(&format!(
        "address = \"127.0.0.1:{port}\"\ntransport = \"relp\""
    ));
    let daemon = env.start(1 << 20);
    let stop = AtomicBool::new(false);
    let check_ins = AtomicUsize::new(0);
    let socket = env.socket();
    let collector = std::thread::scope(|s| {
        // 64 clients checking in (each check-in writes a decision record).
        for _ in 0..64 {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    check_in(&socket, None);
                    check_ins.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        // rsyslog killed (SIGKILL) and started again, three times, mid-stream:
        // stopped (SIGSTOP) for 300 ms first, as a collector that hangs before it
        // crashes, so records are on their way (in its socket, unanswered) when
        // it dies.
        for _ in 0..3 {
            let before = check_ins.load(Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(800));
            assert!(
                check_ins.load(Ordering::Relaxed) > before,
                "check-ins go on while rsyslog comes and goes"
            );
            let pid = rustix::process::Pid::from_raw(collector.child.id() as i32).unwrap();
            rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            drop(collector);
            std::thread::sleep(Duration::from_millis(500));
            collector = rsyslog(env.dir.path(), "rsyslog-relp.conf", port, &[]);
        }
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
        collector
    });
    // The flush, then at once (no waiting) every record must be in rsyslog's file:
    // with a direct ruleset queue rsyslog answers only after the write.
    let (code, said) = flush(&env, "60");
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("acknowledged by the collector (RELP)"),
        "a RELP flush says the collector acknowledged: {said}"
    );
    let got = received_ids(&collector.out);
    let local: Vec<String> = env
        .local_lines()
        .iter()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["id"].as_str().unwrap().to_owned()
        })
        .collect();
    let missing: Vec<&String> = local.iter().filter(|id| !got.contains_key(*id)).collect();
    assert!(
        missing.is_empty(),
        "{} of {} records missing at rsyslog after a successful flush: {:?}; status: {:?}",
        missing.len(),
        local.len(),
        &missing[..missing.len().min(10)],
        env.status().forwarder
    );
    // A stopped rsyslog still takes bytes into its socket (its kernel acknowledges
    // them, all a TCP flush could wait for), but answers nothing: the flush waits.
    let pid = rustix::process::Pid::from_raw(collector.child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
    reloads(&env, &daemon, 3);
    let (code, stalled) = flush(&env, "2");
    rustix::process::kill_process(pid, rustix::process::Signal::CONT).unwrap();
    assert_eq!(
        code,
        Some(1),
        "no flush while rsyslog has not answered: {stalled}"
    );
    let (code, said_after) = flush(&env, "60");
    assert_eq!(code, Some(0), "{said_after}");
    let twice = got.values().filter(|&&n| n > 1).count();
    let f = env.status().forwarder.unwrap();
    assert_eq!(f.transport.as_deref(), Some("relp"));
    println!(
        "{} records after {} check-ins and 3 kills of rsyslog: every one at rsyslog when \
         flush returned, {twice} of them twice; last error: {:?}",
        local.len(),
        check_ins.load(Ordering::Relaxed),
        f.last_error
    );
    drop(daemon);
}

/// Issue 42 item 2: what a torn frame does to rsyslog (the example's `imtcp`
/// with octet counting). A frame whose connection ends before its MSG-LEN bytes
/// arrived (the daemon itself never tears one while the connection stays up) is
/// dropped whole by Debian 12's rsyslog: nothing of it reaches the file, the
/// frames before it and the next connection's arrive intact. So a forwarder that
/// sends the torn record again (at least once) leaves no half line behind.
#[test]
fn rsyslog_drops_a_frame_torn_by_a_closed_connection_and_keeps_the_others() {
    use metalift_daemon::audit::forward::frame;
    let dir = tempfile::Builder::new()
        .prefix("fwd-rsys-torn-")
        .tempdir()
        .unwrap();
    let port = free_port();
    let collector = rsyslog(dir.path(), "rsyslog.conf", port, &[]);
    let lines = support::send_torn(port, &collector.out);
    // %rawmsg%: the message as sent, without the frame's length.
    let message = |n: u32| {
        let mut out = Vec::new();
        frame::message(
            &mut out,
            &support::torn_header(),
            support::torn_record(n).as_bytes(),
        );
        String::from_utf8(out).unwrap()
    };
    assert_eq!(lines, [message(1), message(3)]);
}

/// Issue 42 item 1: RELP inside TLS (`transport = "relp-tls"`) with the shipped
/// `rsyslog-relp-tls.conf` (imrelp `tls="on"`, a certificate from a test CA):
/// every record arrives once, `audit flush` says the collector acknowledged
/// them, and a collector whose certificate is not from the configured CA is
/// refused with the reason in status.
#[test]
fn over_relp_inside_tls_every_record_arrives_acknowledged_and_a_foreign_certificate_is_refused() {
    let _serial = serial();
    let env = Env::new();
    let port = free_port();
    let (ca, cert, key) = test_ca(env.dir.path(), "relp");
    let vars = [
        ("@CA@", ca.display().to_string()),
        ("@CERT@", cert.display().to_string()),
        ("@KEY@", key.display().to_string()),
        ("@CLIENT@", "metaliftd test client".to_owned()),
    ];
    let collector = rsyslog(env.dir.path(), "rsyslog-relp-tls.conf", port, &vars);
    // librelp closes a TLS session that shows no client certificate from its CA.
    let (client, client_key) = client_cert(env.dir.path(), "relp");
    env.policy(&format!(
        "address = \"127.0.0.1:{port}\"\ntransport = \"relp-tls\"\nca = \"{}\"\nserver_name = \"localhost\"\n\
         client_cert = \"{}\"\nclient_key = \"{}\"",
        ca.display(),
        client.display(),
        client_key.display()
    ));
    let daemon = env.start(1 << 20);
    reloads(&env, &daemon, 10);
    let (code, said) = flush(&env, "30");
    assert_eq!(
        code,
        Some(0),
        "{said}\nrsyslog's stderr: {}",
        std::fs::read_to_string(env.dir.path().join("rsyslog/stderr")).unwrap_or_default()
    );
    assert!(
        said.contains("acknowledged by the collector (RELP)"),
        "{said}"
    );
    let seen = wait_all_received(&env, &collector.out);
    assert!(
        seen.values().all(|&n| n == 1),
        "every record once: {seen:?}"
    );
    let f = env.status().forwarder.unwrap();
    assert_eq!(f.transport.as_deref(), Some("relp-tls"), "{f:?}");
    assert!(f.connected, "{f:?}");
    drop(daemon);
    drop(collector);

    // The same collector, but metaliftd trusts another CA: refused, and said.
    let other = Env::new();
    let (other_ca, _, _) = test_ca(other.dir.path(), "other");
    let _collector = rsyslog(env.dir.path(), "rsyslog-relp-tls.conf", port, &vars);
    other.policy(&format!(
        "address = \"127.0.0.1:{port}\"\ntransport = \"relp-tls\"\nca = \"{}\"\nserver_name = \"localhost\"",
        other_ca.display()
    ));
    let _daemon = other.start(1 << 20);
    let f = next_error(&other, None);
    let error = f.last_error.clone().unwrap_or_default();
    assert!(
        error.contains("TLS handshake") && error.contains("UnknownIssuer"),
        "{f:?}"
    );
    assert!(!f.connected && f.delivered_records == 0, "{f:?}");
}
