//! The guide's examples run as written (issue 34), on Linux against the real
//! metaliftd, the real shim and the simulated Metal:
//!
//! - the configuration chapter's "A daemon of your own" block
//!   (docs/src/configuration.md), read from the page and run by bash with `set -e`:
//!   every command in it must succeed;
//! - the CI cookbook's GitHub Actions job (docs/src/ci.md), read from the page: its
//!   drop-in, on the policy the installer lays down (examples/default-policy.toml),
//!   then every `run:` step, with only what cannot exist on Linux stood in for (each
//!   stand-in below says what and why). The macOS workflow runs the real thing.
//!
//! Needs `metaliftd` and `metalift` next to the probe (`cargo build --workspace`,
//! as `scripts/test.sh` does).
#![cfg(target_os = "linux")]

mod support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::Instant;

use support::{clean, probe, root_or_skip, shim, PATIENCE};

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn bin(name: &str) -> PathBuf {
    let path = probe().with_file_name(name);
    assert!(
        path.is_file(),
        "{name} must be built first: cargo build --workspace (scripts/test.sh does)"
    );
    path
}

/// The llama-bench test double (`tests/llama_bench/`, this package's example,
/// which `cargo test` builds).
fn llama_bench() -> PathBuf {
    let path = probe()
        .with_file_name("examples")
        .join("metalift-llama-bench");
    assert!(
        path.is_file(),
        "{} must be built first: cargo build --workspace --all-targets (scripts/test.sh does)",
        path.display()
    );
    path
}

fn page(rel: &str) -> String {
    fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The body of the first fenced block of `lang` after `marker` in `text`.
fn block_after(text: &str, marker: &str, lang: &str) -> String {
    let at = text
        .find(marker)
        .unwrap_or_else(|| panic!("the page no longer says {marker:?}"));
    let fence = format!("```{lang}\n");
    let start = text[at..]
        .find(&fence)
        .expect("a fenced block after the marker")
        + at;
    let body = &text[start + fence.len()..];
    body[..body.find("```").expect("the block's end")].to_owned()
}

/// Copies `from` to `to` (creating its directory) as an executable.
fn install(from: &Path, to: &Path) {
    fs::create_dir_all(to.parent().expect("a directory")).expect("mkdir");
    fs::copy(from, to).unwrap_or_else(|e| panic!("{} -> {}: {e}", from.display(), to.display()));
    fs::set_permissions(to, fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// `bash -c SCRIPT` with `set -euo pipefail`, in `cwd`, with the workspace's
/// binaries first on PATH and no metalift variable inherited from the test's
/// environment; the shim's deadline is raised for a loaded test machine.
fn bash(script: &str, cwd: &Path, envs: &[(&str, &Path)]) -> Output {
    let path = format!(
        "{}:{}",
        bin("metalift").parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = clean("bash");
    cmd.arg("-c")
        .arg(format!("set -euo pipefail\n{script}"))
        .current_dir(cwd)
        .env("PATH", path)
        .env("METALIFT_TIMEOUT_MS", "5000")
        // The shim's unresponsive marker goes to the caller's private directory.
        .env("XDG_RUNTIME_DIR", cwd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in envs {
        cmd.env(key, value);
    }
    cmd.output().expect("bash")
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The audit records of `kind` in `log`.
fn records(log: &Path, kind: &str) -> Vec<serde_json::Value> {
    fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| r["kind"] == kind)
        .collect()
}

#[test]
fn the_configuration_chapters_daemon_of_your_own_runs_as_written() {
    let block = block_after(
        &page("docs/src/configuration.md"),
        "A daemon of your own",
        "sh",
    );
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let cwd = dir.path();
    // What the block expects of its reader: ./build/bin/llama-bench (llama.cpp's
    // test double, copied so that its path is the one the rule names) and a
    // ./policy.toml with a rule for it.
    install(&llama_bench(), &cwd.join("build/bin/llama-bench"));
    let bench = cwd.join("build/bin/llama-bench").canonicalize().unwrap();
    fs::write(
        cwd.join("policy.toml"),
        format!(
            "version = 1\n\n[profile.apple7]\napple_family_max = 7\n\n\
             [[rule]]\nid = \"my-llama-bench\"\npath = {:?}\nunlock = \"apple7\"\n",
            bench.display().to_string()
        ),
    )
    .unwrap();
    fs::set_permissions(cwd.join("policy.toml"), fs::Permissions::from_mode(0o644)).unwrap();
    // The block's /tmp/ml paths moved into this test's directory (tests run in
    // parallel); everything else as written. The daemon it starts is stopped at
    // the end (`$!` is still its pid: nothing else runs in the background).
    let ml = cwd.join("ml");
    let script = format!(
        "trap 'kill $! 2>/dev/null || true' EXIT\n{}",
        block.replace("/tmp/ml", &ml.display().to_string())
    );
    let out = bash(&script, cwd, &[]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "the block failed:\n{all}");

    // `metalift exec` unlocked the bench by the policy's rule, and the shim applied it.
    let log = ml.join("audit.jsonl");
    let decisions = records(&log, "decision");
    assert!(
        decisions
            .iter()
            .any(|d| d["action"] == "unlock" && d["rule"] == "my-llama-bench"),
        "no unlock by my-llama-bench: {decisions:?}\n{all}"
    );
    assert!(
        records(&log, "outcome")
            .iter()
            .any(|o| o["result"] == "applied"),
        "no applied outcome\n{all}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    // `metalift audit` showed it, `doctor` found nothing wrong, and `explain --live`
    // said the live policy unlocks the bench by that rule.
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("my-llama-bench") && l.contains("unlock") && l.contains("applied")),
        "metalift audit shows the unlock:\n{all}"
    );
    assert!(stdout.contains("0 failed, 0 warnings"), "doctor:\n{all}");
    assert!(
        stdout.contains("unlock with profile `apple7` (rule `my-llama-bench`"),
        "explain --live:\n{all}"
    );
}

/// The cookbook's GitHub job as the page has it: its steps' names and scripts.
struct Step {
    name: String,
    run: Option<String>,
}

/// The `steps:` of the one job in `yaml`, read as GitHub reads this shape: each
/// `- name:`/`- uses:` item at the steps' indent, its `run: |` block (dedented) or
/// one-line `run:`. Only the shape the cookbook uses; anything else fails loudly.
fn steps(yaml: &str) -> Vec<Step> {
    let lines: Vec<&str> = yaml.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let at = lines
        .iter()
        .position(|l| l.trim() == "steps:")
        .expect("steps:");
    let item = indent(lines[at]) + 2;
    let key = item + 2;
    let mut steps: Vec<Step> = Vec::new();
    let mut i = at + 1;
    while i < lines.len() {
        let line = lines[i];
        if line.trim().is_empty() {
            i += 1;
            continue;
        }
        assert!(indent(line) >= key - 2, "outside the steps: {line:?}");
        let field = if indent(line) == item && line.trim_start().starts_with("- ") {
            steps.push(Step {
                name: String::new(),
                run: None,
            });
            &line.trim_start()[2..]
        } else {
            assert_eq!(indent(line), key, "a step's key: {line:?}");
            line.trim_start()
        };
        let step = steps.last_mut().expect("a step");
        i += 1;
        if let Some(name) = field.strip_prefix("name: ") {
            step.name = name.to_owned();
        } else if field == "run: |" {
            let mut body = String::new();
            while i < lines.len() && (lines[i].trim().is_empty() || indent(lines[i]) > key) {
                body.push_str(lines[i].get(key + 2..).unwrap_or(""));
                body.push('\n');
                i += 1;
            }
            step.run = Some(body);
        } else if let Some(run) = field.strip_prefix("run: ") {
            step.run = Some(format!("{run}\n"));
        } else {
            assert!(
                field.starts_with("uses: ") || field.starts_with("if: "),
                "a key this reader does not know: {field:?}"
            );
        }
    }
    steps
}

/// A child process killed when dropped (a failing assertion must not leave a
/// daemon behind).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The installed system daemon's stand-in: metaliftd on `root`'s installed paths,
/// as the LaunchDaemon runs it (no development flag: the policy must be root's),
/// on an M1 host (the default policy's `native` profile asks `"host"`).
fn system_daemon(root: &Path) -> Killed {
    let mut daemon = clean(bin("metaliftd"))
        .arg("--policy")
        .arg(root.join("etc/metalift/policy.toml"))
        .arg("--socket")
        .arg(root.join("run/metalift.sock"))
        .arg("--audit-log")
        .arg(root.join("var/log/metalift/audit.jsonl"))
        .env("METALIFT_HOST_CHIP_BRAND", "Apple M1 (Virtual)")
        .stdout(Stdio::null())
        .stderr(fs::File::create(root.join("daemon.log")).unwrap())
        .spawn()
        .expect("metaliftd");
    let deadline = Instant::now() + PATIENCE;
    while !root.join("run/metalift.sock").exists() {
        if let Ok(Some(status)) = daemon.try_wait() {
            panic!(
                "metaliftd exited {status}: {}",
                fs::read_to_string(root.join("daemon.log")).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "metaliftd did not come up");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Killed(daemon)
}

#[test]
fn the_ci_cookbooks_github_job_runs_as_written_where_linux_can() {
    // The install step chowns to root and chgrps to staff, as the guest's admin
    // does; as another user neither can run.
    if !root_or_skip("the cookbook's job needs root (sudo)") {
        return;
    }
    let yaml = block_after(
        &page("docs/src/ci.md"),
        "## GitHub Actions on hosted macOS runners",
        "yaml",
    );
    let steps = steps(&yaml);
    let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        steps.len(),
        5,
        "checkout, install, probe, bench, audit: {names:?}"
    );
    assert!(steps[0].run.is_none(), "the checkout");

    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let root = dir.path();
    // What `installer -pkg` lays down (pkg/stage.sh, pkg/scripts/postinstall), in
    // this root: the default policy, the probe and the shim in their places, the
    // log directory; and the LaunchDaemon's stand-in on those paths.
    for sub in ["etc/metalift/policy.d", "run", "var/log/metalift"] {
        fs::create_dir_all(root.join(sub)).unwrap();
    }
    fs::copy(
        repo().join("examples/default-policy.toml"),
        root.join("etc/metalift/policy.toml"),
    )
    .unwrap();
    for d in ["etc/metalift", "etc/metalift/policy.d", "var/log/metalift"] {
        fs::set_permissions(root.join(d), fs::Permissions::from_mode(0o755)).unwrap();
    }
    fs::set_permissions(
        root.join("etc/metalift/policy.toml"),
        fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    install(
        &probe(),
        &root.join("usr/local/metalift/bin/metalift-probe"),
    );
    install(&shim(), &root.join("usr/local/metalift/lib/libmetalift.so"));
    // The job's checkout, with llama.cpp's build in it (the test double for llama-bench).
    let checkout = root.join("Users/runner/work/app/app");
    install(&llama_bench(), &checkout.join("build/bin/llama-bench"));
    let daemon = system_daemon(root);

    // Where the job's absolute paths are on this machine: under the root.
    let here = |script: &str| -> String {
        let r = root.display().to_string();
        script
            .replace("/etc/metalift", &format!("{r}/etc/metalift"))
            .replace("/usr/local/metalift", &format!("{r}/usr/local/metalift"))
            .replace("/var/log/metalift", &format!("{r}/var/log/metalift"))
            .replace("/Users/runner/work", &format!("{r}/Users/runner/work"))
    };
    // The installed defaults the commands find on macOS without flags, given as
    // the variables every command honours (docs/src/configuration.md).
    let socket = root.join("run/metalift.sock");
    let policy = root.join("etc/metalift/policy.toml");
    let log = root.join("var/log/metalift/audit.jsonl");
    let shim_at = root.join("usr/local/metalift/lib/libmetalift.so");
    let envs: [(&str, &Path); 4] = [
        ("METALIFT_SOCKET", &socket),
        ("METALIFT_POLICY", &policy),
        ("METALIFT_AUDIT_LOG", &log),
        ("METALIFT_SHIM", &shim_at),
    ];

    let mut outputs = String::new();
    for step in &steps[1..] {
        let run = step.run.as_deref().expect("a run step");
        let mut script = String::new();
        for line in here(run).lines() {
            let line = match line.trim_start() {
                // The package itself is macOS's; what it lays down is staged above.
                l if l.starts_with("sudo installer -pkg ") => ":".to_owned(),
                // Debian has no wheel group; root's own group is its stand-in.
                l if l.starts_with("sudo chown root:wheel ") => {
                    line.replace("root:wheel", "root:root")
                }
                _ => line.to_owned(),
            };
            // pgrep would also find the daemons of tests running beside this one.
            let line = line.replace("\"$(pgrep -x metaliftd)\"", &daemon.0.id().to_string());
            // Root already: sudo is not installed on every test machine.
            let line = line.replace("sudo ", "");
            script.push_str(&line);
            script.push('\n');
        }
        let out = bash(&script, &checkout, &envs);
        outputs.push_str(&format!("=== {}\n{}", step.name, text(&out)));
        assert_eq!(
            out.status.code(),
            Some(0),
            "step {:?} failed:\n{outputs}\ndaemon log:\n{}",
            step.name,
            fs::read_to_string(root.join("daemon.log")).unwrap_or_default()
        );
        if step.name.starts_with("Install") {
            // The drop-in went live on the HUP before the next step checks in.
            let deadline = Instant::now() + PATIENCE;
            while !records(&log, "policy_loaded")
                .iter()
                .any(|r| r["rules"].as_u64().unwrap_or(0) >= 2)
            {
                assert!(
                    Instant::now() < deadline,
                    "the drop-in never went live:\n{outputs}"
                );
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
    drop(daemon);

    // The probe and the bench were unlocked by the drop-in's rules and applied, and
    // the last step's audit showed both.
    let decisions = records(&log, "decision");
    for rule in ["ci-probe", "ci-llama"] {
        assert!(
            decisions
                .iter()
                .any(|d| d["action"] == "unlock" && d["rule"] == rule),
            "no unlock by {rule}: {decisions:?}\n{outputs}"
        );
    }
    let audit = outputs.rsplit("=== ").next().unwrap_or_default();
    assert!(
        audit.contains("ci-probe") && audit.contains("ci-llama"),
        "the audit step shows both rules:\n{audit}"
    );
}
