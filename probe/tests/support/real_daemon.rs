//! A real metaliftd, built with the workspace, on a temporary directory: the one
//! scratch daemon (`metalift_daemon::scratch`: `etc/policy.toml`,
//! `run/metalift.sock`, `log/audit.jsonl`, `daemon.log`). Killed on drop.

use std::path::PathBuf;

use metalift_daemon::scratch::{ScratchDaemon, ScratchDir};

use super::{probe, scrub};

pub struct RealDaemon {
    // Dropped first: the daemon stops before its directory goes.
    _process: ScratchDaemon,
    scratch: ScratchDir,
    _dir: tempfile::TempDir,
}

impl RealDaemon {
    /// Starts metaliftd on `policy` (with the development flag: the file is the
    /// test's), on a host whose chip brand is `brand` (METALIFT_HOST_CHIP_BRAND,
    /// the daemon's own environment; none: unset), logging at debug level; returns
    /// once it answers a status request.
    pub fn start(policy: &str, brand: Option<&str>) -> RealDaemon {
        let metaliftd = probe().with_file_name("metaliftd");
        assert!(
            metaliftd.is_file(),
            "metaliftd must be built first: cargo build --workspace (scripts/test.sh does)"
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let scratch = ScratchDir::new(dir.path()).expect("layout");
        scratch.write_policy(policy).expect("policy");
        let mut cmd = scratch.command(&metaliftd).expect("command");
        scrub(&mut cmd);
        if let Some(brand) = brand {
            cmd.env("METALIFT_HOST_CHIP_BRAND", brand);
        }
        cmd.arg("--allow-insecure-owner").env("RUST_LOG", "debug");
        let process = ScratchDaemon::spawn(cmd, &scratch).unwrap_or_else(|e| panic!("{e}"));
        RealDaemon {
            _process: process,
            scratch,
            _dir: dir,
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.scratch.socket()
    }

    /// The audit records so far whose kind is one of `kinds`.
    pub fn records_of(&self, kinds: &[&str]) -> Vec<serde_json::Value> {
        self.scratch
            .records()
            .unwrap_or_else(|e| panic!("{e}"))
            .into_iter()
            .filter(|r| kinds.iter().any(|k| r["kind"] == *k))
            .collect()
    }

    /// The daemon's stderr so far.
    pub fn log(&self) -> String {
        self.scratch.daemon_log_text()
    }
}
