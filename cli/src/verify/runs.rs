//! The probe runs of one verification, each a bounded child
//! ([`super::bounded`]): the stock device (shim disabled), the device as the
//! unlock leaves it, one child per kernel, and the control.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use metalift_daemon::audit::receipt::DeviceAnswers;
use metalift_daemon::audit::verification::KernelLine;

use super::bounded::{self, Ended};
use crate::exec::INSERT_VAR;
use crate::tools::Tools;

/// The probe's kernels (`metalift-probe --verify --kernel NAME`), in its table's
/// order; the probe refuses a name it does not have, so a mismatch shows.
pub(crate) const KERNELS: [&str; 5] = [
    "metalift_simd_sum",
    "metalift_simd_max",
    "metalift_simdgroup_mm",
    "metalift_bfloat",
    "metalift_threadgroup",
];

/// The control's name as the probe takes it.
pub(crate) const CONTROL: &str = "control";

/// The bounds of one verification.
pub(crate) struct Bounds {
    /// Each probe child's deadline.
    pub(crate) per_kernel: Duration,
    /// The whole verification's end.
    pub(crate) end: Instant,
}

impl Bounds {
    fn deadline(&self) -> Instant {
        (Instant::now() + self.per_kernel).min(self.end)
    }
}

/// The probe under the shim: stock (`socket` `None`: `METALIFT_DISABLE=1`) or
/// asking the scratch daemon at `socket`.
fn probe(tools: &Tools, socket: Option<&Path>, args: &[&str]) -> Command {
    let mut cmd = under_shim(tools, socket, &tools.probe);
    cmd.args(args);
    cmd
}

/// `program` with the shim inserted, stock (`socket` `None`) or asking the
/// scratch daemon at `socket` (the probe, and `--workload`'s command).
pub(crate) fn under_shim(tools: &Tools, socket: Option<&Path>, program: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.env(INSERT_VAR, &tools.shim);
    match socket {
        Some(socket) => {
            cmd.env("METALIFT_SOCKET", socket)
                .env_remove("METALIFT_DISABLE");
        }
        None => {
            cmd.env("METALIFT_DISABLE", "1");
        }
    }
    if let Some(ms) = tools.timeout_ms {
        cmd.env("METALIFT_TIMEOUT_MS", ms.to_string());
    }
    cmd
}

/// `metalift-probe --json`: what the device answers.
pub(crate) fn answers(
    tools: &Tools,
    socket: Option<&Path>,
    bounds: &Bounds,
) -> anyhow::Result<(serde_json::Value, DeviceAnswers)> {
    let which = if socket.is_some() {
        "unlocked"
    } else {
        "stock"
    };
    let report = crate::gpu::probe_report(
        &mut probe(tools, socket, &["--json"]),
        bounds.deadline(),
        which,
    )?;
    let answers = crate::gpu::device_answers(&report);
    Ok((report, answers))
}

/// Each kernel in a child of its own, under the scratch daemon at `socket`.
pub(crate) fn kernels(
    tools: &Tools,
    socket: &Path,
    bounds: &Bounds,
) -> anyhow::Result<Vec<KernelLine>> {
    KERNELS
        .iter()
        .map(|name| one(tools, socket, bounds, name))
        .collect()
}

/// The control's result: `differs` when the comparison works.
pub(crate) fn control(tools: &Tools, socket: &Path, bounds: &Bounds) -> anyhow::Result<String> {
    Ok(one(tools, socket, bounds, CONTROL)?.result)
}

fn one(tools: &Tools, socket: &Path, bounds: &Bounds, name: &str) -> anyhow::Result<KernelLine> {
    let line = |result: &str, detail: Option<String>, ms: Option<u64>| KernelLine {
        kernel: name.to_owned(),
        result: result.to_owned(),
        detail,
        ms,
    };
    if Instant::now() >= bounds.end {
        return Ok(line(
            "not_run",
            Some("the verification's --timeout was reached before it".to_owned()),
            None,
        ));
    }
    let mut cmd = probe(
        tools,
        Some(socket),
        &["--verify", "--json", "--kernel", name],
    );
    let ended = bounded::run(&mut cmd, bounds.deadline())?;
    let (status, stdout, stderr, took) = match ended {
        Ended::Killed { after } => {
            let ms = millis(after);
            return Ok(line(
                "hung",
                Some(format!("no answer after {ms} ms: killed at its deadline")),
                Some(ms),
            ));
        }
        Ended::Exited {
            status,
            stdout,
            stderr,
            took,
        } => (status, stdout, stderr, millis(took)),
    };
    // 0: it passed; 4: it failed (metalift-probe's EXIT_VERIFY_FAILED).
    if !matches!(status.code(), Some(0 | 4)) {
        return Ok(line(
            "run_failed",
            Some(format!(
                "the probe exited with {status}: {}",
                String::from_utf8_lossy(&stderr).trim()
            )),
            Some(took),
        ));
    }
    let report: serde_json::Value = serde_json::from_slice(&stdout)
        .with_context(|| format!("{name}: the probe printed no JSON"))?;
    let row = if name == CONTROL {
        &report["verification"]["control"]
    } else {
        &report["verification"]["kernels"][0]
    };
    let Some(result) = row["result"].as_str() else {
        bail!("{name}: the probe's JSON has no result for it (an older probe?): {report}");
    };
    Ok(line(
        result,
        row["detail"].as_str().map(str::to_owned),
        Some(took),
    ))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
