//! Two guests at one collector, as a fleet's admin meets them: two metaliftd
//! (two images, `img-a` and `img-b`) forwarding to the same collector at once,
//! each deciding for two CI jobs and getting one outcome per decision (`img-a`'s
//! applied, `img-b`'s failed), and the one fleet question asked of whatever the
//! collector wrote: "in job 42, which executables were unlocked, on which guest,
//! did it apply?". Each real collector's test (rsyslog, syslog-ng) runs it on
//! its own output. On one machine the two daemons share a host name and a boot
//! id: only the daemon run in each record's id tells their decisions apart.
//! [`two_clones`] is the other fleet: two clones of one image (same policy, same
//! host name), told apart by the name their orchestrator gave each (the
//! `instance` file beside the policy).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use metalift_daemon::scratch::{ScratchDaemon, ScratchDir};
use metalift_policy::wire::{Outcome, OutcomeResult, WireAction};
use serde_json::Value;

const GUARD: Duration = Duration::from_secs(60);

/// One guest: its directory and its daemon (killed on drop).
pub struct Guest {
    pub daemon: ScratchDaemon,
    pub scratch: ScratchDir,
    _dir: tempfile::TempDir,
}

impl Guest {
    /// Every line of its local audit log (1 MiB files: no rotation here).
    pub fn local_lines(&self) -> Vec<String> {
        std::fs::read_to_string(self.scratch.audit_log())
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// `img-a` and `img-b`, each with a rule unlocking this test binary, the image
/// label, and `[audit.forward]` to `address` (plus `forward_extra` lines).
pub fn two_guests(address: &str, forward_extra: &str) -> Vec<Guest> {
    guests(address, forward_extra, &[("img-a", None), ("img-b", None)])
}

/// Two clones of the image `img`, the same policy, named `clone-a` and `clone-b`
/// by their orchestrator (each one's `instance` file, written before it starts).
pub fn two_clones(address: &str) -> Vec<Guest> {
    guests(
        address,
        "",
        &[("img", Some("clone-a")), ("img", Some("clone-b"))],
    )
}

/// One guest per `(image label, instance name)`.
fn guests(address: &str, forward_extra: &str, which: &[(&str, Option<&str>)]) -> Vec<Guest> {
    let me = std::env::current_exe().unwrap();
    which
        .iter()
        .map(|(image, instance)| {
            let dir = tempfile::Builder::new().prefix("fleet-").tempdir().unwrap();
            let scratch = ScratchDir::new(dir.path()).expect("layout");
            std::fs::write(
                scratch.policy(),
                format!(
                    "version = 1\n[profile.apple7]\napple_family_max = 7\n\n\
                     [[rule]]\nid = \"me\"\npath = \"{}\"\nunlock = \"apple7\"\n\n\
                     [audit.labels]\nimage = \"{image}\"\n\n\
                     [audit.forward]\naddress = \"{address}\"\n{forward_extra}",
                    me.display()
                ),
            )
            .unwrap();
            if let Some(name) = instance {
                std::fs::write(
                    scratch.policy().with_file_name("instance"),
                    format!("{name}\n"),
                )
                .unwrap();
            }
            let daemon = scratch
                .start(
                    Path::new(env!("CARGO_BIN_EXE_metaliftd")),
                    &["--audit-max-bytes", "1048576"],
                    &[],
                )
                .unwrap_or_else(|e| panic!("{e}"));
            Guest {
                daemon,
                scratch,
                _dir: dir,
            }
        })
        .collect()
}

/// Jobs 42 and 41 on each guest: one check-in each, and its outcome (`img-a`'s
/// applied, `img-b`'s failed).
pub fn run_jobs(guests: &[Guest]) {
    let results = [OutcomeResult::Applied, OutcomeResult::Failed];
    for (guest, result) in guests.iter().zip(results) {
        for job in ["GITHUB_RUN_ID=42", "GITHUB_RUN_ID=41"] {
            let (mut client, verdict) = super::check_in(&guest.scratch.socket(), Some(job));
            assert_eq!(verdict.action, WireAction::Unlock);
            client
                .outcome(&Outcome {
                    decision_id: verdict.decision_id,
                    result,
                    reason: if result == OutcomeResult::Failed {
                        "supportsFamily: not found".into()
                    } else {
                        String::new()
                    },
                    device_class: "SimulatedParavirtDevice".into(),
                    ..Default::default()
                })
                .unwrap();
        }
    }
}

/// Every local record line of every guest.
pub fn local_lines(guests: &[Guest]) -> Vec<String> {
    guests.iter().flat_map(Guest::local_lines).collect()
}

/// `target/<profile>/metalift`, built beside metaliftd (`cargo build --workspace`).
pub fn metalift_cli() -> PathBuf {
    let cli = Path::new(env!("CARGO_BIN_EXE_metaliftd")).with_file_name("metalift");
    assert!(
        cli.exists(),
        "{} is missing: run `cargo build --workspace` first (scripts/test.sh does)",
        cli.display()
    );
    cli
}

/// `metalift audit --log INPUT --job 42 --json` answers with each guest's own
/// process, rule and outcome, and `--summary --by label:image,result` counts both
/// jobs per image.
pub fn assert_the_job_question(input: &Path) {
    let out = Command::new(metalift_cli())
        .args(["audit", "--log"])
        .arg(input)
        .args(["--job", "42", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut answers: Vec<(String, String, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let p: Value = serde_json::from_str(l).unwrap();
            (
                p["host"]["labels"]["image"].as_str().unwrap().to_owned(),
                p["rule"].as_str().unwrap().to_owned(),
                p["result"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    answers.sort();
    assert_eq!(
        answers,
        [
            ("img-a".into(), "me".into(), "applied".into()),
            ("img-b".into(), "me".into(), "failed".into()),
        ],
        "the job's processes, each with its own guest's outcome"
    );
    let summary = Command::new(metalift_cli())
        .args(["audit", "--log"])
        .arg(input)
        .args(["--summary", "--by", "label:image,result", "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&summary.stdout).unwrap();
    assert_eq!(v["groups"].as_array().unwrap().len(), 2, "{v}");
    for g in v["groups"].as_array().unwrap() {
        assert_eq!(g["counts"]["processes"], 2, "both jobs per image: {g}");
    }
}
