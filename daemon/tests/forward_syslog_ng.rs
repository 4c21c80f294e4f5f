//! Audit forwarding against a real syslog-ng: Debian's syslog-ng-core 3.38, which
//! conflicts with rsyslog as a package, so scripts/setup.sh unpacks it with
//! `dpkg -x` into /opt/metalift-test/syslog-ng (or `$METALIFT_SYSLOG_NG_ROOT`) and
//! this test runs it from there (`LD_LIBRARY_PATH`, `--module-path`, its own pid,
//! persist and control files in a temp dir) on a loopback port, with
//! `examples/collectors/syslog-ng.conf`. Every record arrives once with its JSON
//! intact, in the file named after the HOSTNAME syslog-ng parsed. Without the
//! unpacked copy the test fails saying so.
#![cfg(target_os = "linux")]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use metalift_daemon::scratch::ScratchDir;

#[path = "forward_support/mod.rs"]
mod support;

use support::{fleet, free_port, GUARD};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn root() -> PathBuf {
    std::env::var_os("METALIFT_SYSLOG_NG_ROOT").map_or_else(
        || PathBuf::from("/opt/metalift-test/syslog-ng"),
        PathBuf::from,
    )
}

/// A test's syslog-ng: its temporary directory, where it writes (`out()`), its
/// port; stopped on drop.
struct SyslogNg {
    // Dropped first: syslog-ng stops before its directory goes.
    _child: Killed,
    dir: tempfile::TempDir,
    work: PathBuf,
    port: u16,
}

impl SyslogNg {
    /// syslog-ng in a new temporary directory named `prefix…`, on a free port.
    fn start(prefix: &str) -> SyslogNg {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
        let work = dir.path().join("syslog-ng");
        std::fs::create_dir_all(&work).unwrap();
        let port = free_port();
        SyslogNg {
            _child: syslog_ng(&work, port),
            dir,
            work,
            port,
        }
    }

    /// The directory the example writes its files in (one per HOSTNAME).
    fn out(&self) -> PathBuf {
        self.work.join("out")
    }
}

/// syslog-ng in the foreground with the example config (address, port and output
/// directory replaced); waits until it listens.
fn syslog_ng(work: &Path, port: u16) -> Killed {
    let root = root();
    let bin = root.join("usr/sbin/syslog-ng");
    assert!(
        bin.exists(),
        "{} is missing: run scripts/setup.sh (it unpacks Debian's syslog-ng-core with dpkg -x; \
         the package conflicts with rsyslog)",
        bin.display()
    );
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/collectors/syslog-ng.conf"),
    )
    .unwrap();
    let out = work.join("out");
    let text = example
        .replace(
            "ip(\"0.0.0.0\") port(6514)",
            &format!("ip(\"127.0.0.1\") port({port})"),
        )
        .replace("/var/log/metalift-collector", out.to_str().unwrap());
    assert!(
        text.contains(&format!("port({port})")) && text.contains(out.to_str().unwrap()),
        "the example's source and destination are where this test expects them:\n{text}"
    );
    let conf = work.join("syslog-ng.conf");
    std::fs::write(&conf, text).unwrap();
    let libs = [
        root.join("usr/lib/syslog-ng"),
        root.join("usr/lib/x86_64-linux-gnu"),
        root.join("lib/x86_64-linux-gnu"),
    ]
    .iter()
    .map(|p| p.display().to_string())
    .collect::<Vec<_>>()
    .join(":");
    let stderr = work.join("stderr");
    let mut child = Command::new(&bin)
        .arg("-F")
        .arg("--no-caps")
        .arg("--stderr")
        .arg(format!(
            "--module-path={}",
            root.join("usr/lib/syslog-ng/3.38").display()
        ))
        .arg("-f")
        .arg(&conf)
        .arg("-p")
        .arg(work.join("syslog-ng.pid"))
        .arg("-R")
        .arg(work.join("syslog-ng.persist"))
        .arg("-c")
        .arg(work.join("syslog-ng.ctl"))
        .env("LD_LIBRARY_PATH", libs)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .expect("spawn syslog-ng");
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(exit)) = child.try_wait() {
            panic!(
                "syslog-ng exited ({exit}): {}",
                std::fs::read_to_string(&stderr).unwrap_or_default()
            );
        }
        assert!(
            start.elapsed() < GUARD,
            "syslog-ng did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Killed(child)
}

#[test]
fn syslog_ng_receives_every_record_once_with_its_json_intact() {
    let sng = SyslogNg::start("fwd-sng-");
    let scratch = ScratchDir::new(sng.dir.path()).expect("layout");
    std::fs::write(
        scratch.policy(),
        format!(
            "version = 1\n\n[audit.forward]\naddress = \"127.0.0.1:{}\"\n",
            sng.port
        ),
    )
    .unwrap();
    let log = scratch.audit_log();
    let daemon = scratch
        .start(
            Path::new(env!("CARGO_BIN_EXE_metaliftd")),
            &[] as &[&str],
            &[],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let pid = rustix::process::Pid::from_raw(daemon.pid() as i32).unwrap();
    let lines = || -> Vec<String> {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    for _ in 0..20 {
        let before = lines().len();
        rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
        let start = Instant::now();
        while lines().len() == before {
            assert!(start.elapsed() < GUARD, "no record after SIGHUP");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // The example writes one file per HOSTNAME: the host part's name.
    let local = lines();
    let first: serde_json::Value = serde_json::from_str(&local[0]).unwrap();
    let host = first["host"]["name"].as_str().unwrap().to_owned();
    let received_file = sng.out().join(format!("{host}.jsonl"));
    let start = Instant::now();
    let seen = loop {
        let text = std::fs::read_to_string(&received_file).unwrap_or_default();
        let mut seen: HashMap<String, usize> = HashMap::new();
        for l in text.lines() {
            let v: serde_json::Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("syslog-ng's $MSG is not the JSON record ({e}): {l}"));
            assert!(v["id"].is_string(), "{l}");
            *seen.entry(l.to_owned()).or_default() += 1;
        }
        if local.iter().all(|l| seen.contains_key(l)) {
            break seen;
        }
        assert!(
            start.elapsed() < GUARD,
            "{} of {} records never reached syslog-ng ({}); daemon log:\n{}",
            local.iter().filter(|l| !seen.contains_key(*l)).count(),
            local.len(),
            received_file.display(),
            std::fs::read_to_string(sng.dir.path().join("daemon.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(seen.len(), local.len(), "nothing but the local records");
    assert!(
        seen.values().all(|&n| n == 1),
        "every record exactly once: {seen:?}"
    );
    assert!(
        local.len() >= 21,
        "daemon_start, policy_loaded and 20 reloads"
    );
}

#[test]
fn metalift_audit_on_what_syslog_ng_wrote_from_two_daemons_answers_the_job_question_per_guest() {
    let sng = SyslogNg::start("fwd-sng-fleet-");
    let guests = fleet::two_guests(&format!("127.0.0.1:{}", sng.port), "");
    fleet::run_jobs(&guests);
    // The example files by HOSTNAME: the directory, whatever files it made.
    let out = sng.out();
    let start = Instant::now();
    loop {
        let mut seen = std::collections::HashSet::new();
        for entry in std::fs::read_dir(&out).into_iter().flatten() {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap_or_default();
            seen.extend(text.lines().map(str::to_owned));
        }
        let local = fleet::local_lines(&guests);
        if local.iter().all(|l| seen.contains(l)) {
            assert_eq!(seen.len(), local.len(), "nothing but the guests' records");
            break;
        }
        assert!(
            start.elapsed() < GUARD,
            "{} of {} records never reached syslog-ng",
            local.iter().filter(|l| !seen.contains(*l)).count(),
            local.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    fleet::assert_the_job_question(&out);
}

/// Issue 43: two clones of one image (same policy, same host name, same boot id
/// on this machine) that their orchestrator named `clone-a` and `clone-b`: every
/// record carries its clone's name, and the shipped example (which files by
/// HOSTNAME) writes one file per clone, each with only that clone's records.
#[test]
fn two_clones_of_one_image_named_by_their_orchestrator_land_in_two_files() {
    let sng = SyslogNg::start("fwd-sng-clones-");
    let guests = fleet::two_clones(&format!("127.0.0.1:{}", sng.port));
    fleet::run_jobs(&guests);
    let out = sng.out();
    let names = ["clone-a", "clone-b"];
    let start = Instant::now();
    loop {
        let arrived = guests.iter().zip(names).all(|(guest, name)| {
            let file =
                std::fs::read_to_string(out.join(format!("{name}.jsonl"))).unwrap_or_default();
            guest
                .local_lines()
                .iter()
                .all(|l| file.lines().any(|f| f == l))
        });
        if arrived {
            break;
        }
        assert!(
            start.elapsed() < GUARD,
            "the clones' records never reached their files: {:?}",
            std::fs::read_dir(&out)
                .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
                .unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut files: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        ["clone-a.jsonl", "clone-b.jsonl"],
        "one file per clone"
    );
    for (guest, name) in guests.iter().zip(names) {
        let local = guest.local_lines();
        let file = std::fs::read_to_string(out.join(format!("{name}.jsonl"))).unwrap();
        assert_eq!(
            file.lines().count(),
            local.len(),
            "{name}.jsonl holds {name}'s records and nothing else"
        );
        for line in &local {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            // From the first record on (daemon_start, before the policy's labels).
            assert_eq!(v["host"]["instance"], name, "{line}");
            if v["kind"] == "decision" {
                assert_eq!(v["host"]["labels"]["image"], "img", "{line}");
            }
        }
    }
    // The same host name on both: only the clone's name tells them apart.
    let host = |g: &fleet::Guest| -> serde_json::Value {
        serde_json::from_str::<serde_json::Value>(&g.local_lines()[0]).unwrap()["host"]["name"]
            .clone()
    };
    assert_eq!(host(&guests[0]), host(&guests[1]));
    // metalift audit --host picks one clone out of the collector's directory.
    let picked = Command::new(fleet::metalift_cli())
        .args(["audit", "--log"])
        .arg(&out)
        .args(["--host", "clone-b", "--json"])
        .output()
        .unwrap();
    let processes: Vec<serde_json::Value> = String::from_utf8_lossy(&picked.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(processes.len(), 2, "clone-b's two jobs: {processes:?}");
    assert!(processes.iter().all(|p| p["host"]["instance"] == "clone-b"));
}

/// Issue 42 item 2: what a torn frame does to syslog-ng (the example's `syslog()`
/// source). A frame whose connection ends before its MSG-LEN bytes arrived (a
/// sender that crashed, a cut by a load balancer; the daemon itself never tears
/// one while the connection stays up) is dropped whole: nothing of it reaches
/// the file, the frames before it and the next connection's arrive intact. So a
/// forwarder that sends the torn record again (at least once) leaves no half line
/// for `metalift audit` to skip.
#[test]
fn syslog_ng_drops_a_frame_torn_by_a_closed_connection_and_keeps_the_others() {
    let sng = SyslogNg::start("fwd-sng-torn-");
    let lines = support::send_torn(sng.port, &sng.out().join("torn.jsonl"));
    assert_eq!(lines, [support::torn_record(1), support::torn_record(3)]);
}
