//! A real metaliftd, built with the workspace, on a temporary directory:
//! `etc/policy.toml`, `run/metalift.sock`, `log/audit.jsonl`, `log/daemon.log`.
//! Killed on drop.

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use super::{clean, probe, PATIENCE};

pub struct RealDaemon {
    child: Child,
    dir: tempfile::TempDir,
}

impl RealDaemon {
    /// Starts metaliftd on `policy` (with the development flag: the file is the
    /// test's), on a host whose chip brand is `brand` (METALIFT_HOST_CHIP_BRAND,
    /// the daemon's own environment; none: unset), logging at debug level; returns
    /// once its socket exists.
    pub fn start(policy: &str, brand: Option<&str>) -> RealDaemon {
        let metaliftd = probe().with_file_name("metaliftd");
        assert!(
            metaliftd.is_file(),
            "metaliftd must be built first: cargo build --workspace (scripts/test.sh does)"
        );
        let dir = tempfile::tempdir().expect("temp dir");
        for sub in ["etc", "run", "log"] {
            std::fs::create_dir_all(dir.path().join(sub)).expect("mkdir");
        }
        std::fs::write(dir.path().join("etc/policy.toml"), policy).expect("policy");
        let mut cmd = clean(&metaliftd);
        cmd.env_remove("METALIFT_HOST_CHIP_BRAND");
        if let Some(brand) = brand {
            cmd.env("METALIFT_HOST_CHIP_BRAND", brand);
        }
        let child = cmd
            .arg("--policy")
            .arg(dir.path().join("etc/policy.toml"))
            .arg("--socket")
            .arg(dir.path().join("run/metalift.sock"))
            .arg("--audit-log")
            .arg(dir.path().join("log/audit.jsonl"))
            .arg("--allow-insecure-owner")
            .env("RUST_LOG", "debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("log/daemon.log")).expect("log"))
            .spawn()
            .expect("metaliftd");
        let daemon = RealDaemon { child, dir };
        let deadline = Instant::now() + PATIENCE;
        while !daemon.socket().exists() {
            assert!(
                Instant::now() < deadline,
                "metaliftd did not come up: {}",
                daemon.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        daemon
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("run/metalift.sock")
    }

    /// The audit records so far whose kind is one of `kinds`.
    pub fn records_of(&self, kinds: &[&str]) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join("log/audit.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|r| kinds.iter().any(|k| r["kind"] == *k))
            .collect()
    }

    /// The daemon's stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log/daemon.log")).unwrap_or_default()
    }
}

impl Drop for RealDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
