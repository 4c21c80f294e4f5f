//! The CI recipes as written, against a real metaliftd: two probes (two CI jobs)
//! unlock through libmetalift with their GITHUB_* variables set, then
//! `examples/ci/github-job-completed.sh` (the runner's job-completed hook) runs:
//! its step summary lists this job's unlocks only, and `metalift audit export`
//! leaves a bundle `sha256sum -c` accepts, whose records say which host, boot,
//! image and job, each valid by the committed record schema.
//!
//! Needs `metaliftd` and `metalift` next to the probe (`cargo build --workspace`,
//! as `scripts/test.sh` does). Linux only (the simulated Metal).
#![cfg(target_os = "linux")]

#[path = "../../daemon/tests/record_schema.rs"]
mod record_schema;
mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use metalift_daemon::scratch::{ScratchDaemon, ScratchDir};
use support::*;

struct Rig {
    /// The one scratch daemon.
    daemon: Option<ScratchDaemon>,
    dir: tempfile::TempDir,
    bin: PathBuf,
}

impl Rig {
    fn start() -> Rig {
        let bin = probe().parent().unwrap().to_path_buf();
        for tool in ["metaliftd", "metalift"] {
            assert!(
                bin.join(tool).is_file(),
                "{tool} must be built first: cargo build --workspace (scripts/test.sh does)"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let scratch = ScratchDir::new(dir.path()).unwrap();
        std::fs::create_dir_all(dir.path().join("etc/policy.d")).unwrap();
        std::fs::write(
            dir.path().join("etc/policy.toml"),
            format!(
                "version = 1\n\n[profile.apple7]\napple_family_max = 7\n\n[[rule]]\nid = \"probe\"\npath = {:?}\nunlock = \"apple7\"\n",
                probe().display().to_string()
            ),
        )
        .unwrap();
        // Where the guide says the image's labels go: a drop-in baked into the image.
        std::fs::write(
            dir.path().join("etc/policy.d/00-image.toml"),
            "[audit.labels]\nimage = \"macos-26-xcode-17\"\n",
        )
        .unwrap();
        let mut cmd = scratch.command(&bin.join("metaliftd")).unwrap();
        scrub(&mut cmd);
        cmd.arg("--allow-insecure-owner");
        let daemon = ScratchDaemon::spawn(cmd, &scratch).unwrap_or_else(|e| panic!("{e}"));
        Rig {
            daemon: Some(daemon),
            dir,
            bin,
        }
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("run/metalift.sock")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("log/audit.jsonl")
    }

    /// Runs the probe as a step of CI job `run_id`; returns its pid.
    fn job_step(&self, run_id: &str) -> u32 {
        let mut cmd = injected(probe(), &self.socket());
        cmd.env("GITHUB_RUN_ID", run_id)
            .env("GITHUB_JOB", "build")
            .env("GITHUB_REPOSITORY", "example/app")
            .env("RUNNER_NAME", "tart-runner-1")
            .arg("--json")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd.spawn().expect("spawn the probe");
        let pid = child.id();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "probe: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        pid
    }

    /// `metalift` with this rig's socket and log in its environment.
    fn metalift(&self) -> Command {
        let mut cmd = clean(self.bin.join("metalift"));
        cmd.env("METALIFT_SOCKET", self.socket())
            .env("METALIFT_AUDIT_LOG", self.log());
        cmd
    }

    fn stop_daemon(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            d.kill();
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop_daemon();
    }
}

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The one bundle in `dir`.
fn bundle_in(dir: &Path) -> PathBuf {
    let bundles: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        bundles.len(),
        1,
        "one bundle, nothing half-written: {bundles:?}"
    );
    bundles[0].clone()
}

fn sha256sum_check(bundle: &Path) -> std::process::Output {
    Command::new("sha256sum")
        .args(["-c", "SHA256SUMS"])
        .current_dir(bundle)
        .output()
        .expect("sha256sum (coreutils) runs")
}

#[test]
fn the_github_hook_summarises_this_jobs_unlocks_only_and_exports_a_bundle_sha256sum_accepts() {
    let mut rig = Rig::start();
    let ours = rig.job_step("4242");
    let theirs = rig.job_step("9999");
    // Let the outcomes land.
    std::thread::sleep(Duration::from_millis(300));

    let summary = rig.dir.path().join("step-summary.md");
    let export = rig.dir.path().join("export");
    // The hook flushes first: with `metalift audit flush` in this build, a hook
    // run in strict mode must succeed (no forwarder configured: nothing to flush).
    let has_flush = rig
        .metalift()
        .args(["audit", "flush", "--help"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(
        has_flush,
        "`metalift audit flush` is missing: the hook's flush step cannot run"
    );
    let out = Command::new("sh")
        .arg(repo().join("examples/ci/github-job-completed.sh"))
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("METALIFT", rig.bin.join("metalift"))
        .env("METALIFT_SOCKET", rig.socket())
        .env("METALIFT_AUDIT_LOG", rig.log())
        .env("METALIFT_EXPORT_DIR", &export)
        .env("GITHUB_STEP_SUMMARY", &summary)
        .env("GITHUB_RUN_ID", "4242")
        .env("METALIFT_HOOK_STRICT", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the hook failed: {said}");

    let table = std::fs::read_to_string(&summary).expect("the hook wrote the step summary");
    assert!(
        table.contains("| Process | Guest | Rule | Result |"),
        "{table}"
    );
    let row = table
        .lines()
        .find(|l| l.contains(&format!("(pid {ours}) |")))
        .unwrap_or_else(|| panic!("no row for pid {ours}: {table}"));
    assert!(row.ends_with("| probe | applied |"), "{table}");
    assert!(
        !table.contains(&format!("(pid {theirs})")),
        "another job's unlock: {table}"
    );
    assert_eq!(table.matches("(pid ").count(), 1, "{table}");

    let bundle = bundle_in(&export);
    assert!(said.contains(&bundle.display().to_string()), "{said}");
    let check = sha256sum_check(&bundle);
    assert!(
        check.status.success(),
        "sha256sum -c: {}",
        String::from_utf8_lossy(&check.stdout)
    );
    let listed = String::from_utf8_lossy(&check.stdout).into_owned();
    for file in [
        "audit.jsonl",
        "status.json",
        "manifest.json",
        "policy/sha256",
    ] {
        assert!(listed.contains(&format!("{file}: OK")), "{listed}");
    }

    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let records = record_schema::valid_records(&bundle.join("audit.jsonl"));
    let mut ids = std::collections::BTreeSet::new();
    for r in &records {
        assert_eq!(r["host"]["boot_id"], boot.trim(), "{r}");
        assert!(
            ids.insert(r["id"].as_str().unwrap().to_owned()),
            "a repeated id: {r}"
        );
    }
    let decisions: Vec<&serde_json::Value> =
        records.iter().filter(|r| r["kind"] == "decision").collect();
    assert_eq!(decisions.len(), 2, "{records:?}");
    for d in &decisions {
        assert_eq!(d["host"]["labels"]["image"], "macos-26-xcode-17", "{d}");
        assert_eq!(d["advisory"]["job"]["GITHUB_JOB"], "build", "{d}");
        assert_eq!(
            d["action"], "unlock",
            "a claim never changes the verdict: {d}"
        );
    }
    assert_eq!(decisions[0]["advisory"]["job"]["GITHUB_RUN_ID"], "4242");
    // The manifest names the labels the records carry (it showed `{}`: issue 43).
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(bundle.join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(
        manifest["host"]["labels"]["image"], "macos-26-xcode-17",
        "{manifest}"
    );
    let status: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(bundle.join("status.json")).unwrap())
            .unwrap();
    assert_eq!(status["error"], serde_json::Value::Null, "{status}");
    let sha = std::fs::read_to_string(bundle.join("policy/sha256")).unwrap();
    assert_eq!(
        sha.trim(),
        decisions[0]["policy_sha256"],
        "the live policy's hash"
    );
    let main = std::fs::read_to_string(bundle.join("policy/00-policy.toml"))
        .expect("the live policy's text");
    assert!(main.contains("id = \"probe\""), "{main}");
    assert!(bundle.join("policy/01-00-image.toml").is_file());

    // A bundle changed after the fact fails the check.
    std::fs::write(bundle.join("audit.jsonl"), "{}\n").unwrap();
    assert!(!sha256sum_check(&bundle).status.success());

    // With the daemon down, the export still writes the records and says so.
    rig.stop_daemon();
    let down = rig.dir.path().join("export-down");
    let out = rig
        .metalift()
        .args(["audit", "export", "--to"])
        .arg(&down)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bundle = bundle_in(&down);
    let status: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(bundle.join("status.json")).unwrap())
            .unwrap();
    assert_eq!(status["state"], "unreachable", "{status}");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(bundle.join("manifest.json")).unwrap())
            .unwrap();
    assert!(
        manifest["daemon"].as_str().unwrap().starts_with("down: "),
        "{manifest}"
    );
    assert!(manifest["records"].as_u64().unwrap() >= 6, "{manifest}");
    assert!(sha256sum_check(&bundle).status.success());
}

#[test]
fn an_export_the_user_cannot_read_the_log_for_names_the_file_and_the_fix_and_writes_nothing() {
    let rig = Rig::start();
    let out_dir = rig.dir.path().join("export");
    // Run as `nobody` (root reads everything): the log is root's, 0640.
    let runuser = Path::new("/usr/sbin/runuser");
    if !root_or_skip("acting as another user needs root") {
        return;
    }
    assert!(runuser.exists(), "runuser(1) (util-linux) is missing");
    std::fs::create_dir_all(&out_dir).unwrap();
    // Everything on the way to the binary and the export dir must be reachable by nobody.
    let mut p = out_dir.clone();
    loop {
        let _ = Command::new("chmod").arg("a+rwx").arg(&p).status();
        if !p.pop() || p == Path::new("/") {
            break;
        }
    }
    let out = Command::new(runuser)
        .args(["-u", "nobody", "--"])
        .arg(rig.bin.join("metalift"))
        .args(["audit", "export", "--to"])
        .arg(&out_dir)
        .arg("--log")
        .arg(rig.log())
        .arg("--socket")
        .arg(rig.socket())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("permission denied reading the audit log"),
        "{err}"
    );
    assert!(err.contains(&rig.log().display().to_string()), "{err}");
    assert!(err.contains("group"), "{err}");
    assert_eq!(
        std::fs::read_dir(&out_dir).unwrap().count(),
        0,
        "nothing half-written"
    );
}
