//! `metalift gpu`: what the GPU answers with no unlock involved — the stock
//! device's families, threadgroup memory, working set, name and class, what
//! llama.cpp concludes from them, and the host chip — and, for each profile of
//! the policy, whether the stock device already answers what it claims.
//!
//! Image manifests record the guest's GPU with it, and a fleet notices the day
//! Apple's paravirtual device answers Apple7 by itself: the unlock is then
//! unneeded (doctor's `stock gpu` check says so too, [`profile_notes`]).
//!
//! The stock answers come from `metalift-probe --json` (beside this executable)
//! with the shim kept out of it: no `DYLD_INSERT_LIBRARIES`/`LD_PRELOAD`, and
//! `METALIFT_DISABLE=1` should one be inherited some other way. No daemon and no
//! rule is asked for them; the host chip is the daemon's (its status) when one
//! answers, else this machine's reading.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use metalift_daemon::audit::receipt::DeviceAnswers;
use metalift_policy::{Capabilities, LoadOptions};
use serde::Serialize;

use crate::daemon_args::DaemonArgs;
use crate::exec::INSERT_VAR;
use crate::verify::bounded::{self, Ended};

/// Longest the probe may take to answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Arguments of `metalift gpu`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Exit status:\n  \
    0  the stock device answered\n  \
    2  metalift-probe is missing, failed or did not answer (named on stderr)")]
pub struct Args {
    // Where the daemon is (for the host chip it reads).
    #[command(flatten)]
    pub daemon: DaemonArgs,
    /// The policy whose profiles are compared with the stock answers (none
    /// compared when the file does not exist)
    #[arg(long, value_name = "PATH", default_value = metalift_daemon::service::config::DEFAULT_POLICY)]
    pub policy: PathBuf,
    /// Print one JSON object instead of text
    #[arg(long)]
    pub json: bool,
}

/// What the stock device answers, as `metalift-probe --json` reports it.
#[derive(Debug, Clone, Serialize)]
pub struct Stock {
    /// `[device name]`.
    pub name: String,
    /// The device object's class (`AppleParavirtDevice` in a guest).
    pub class: Option<String>,
    /// Every family the probe asks, and the answer.
    pub families: serde_json::Value,
    /// The answers a profile's claims are compared with.
    #[serde(flatten)]
    pub answers: DeviceAnswers,
}

/// One profile against the stock answers.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileNote {
    /// The profile's name.
    pub profile: String,
    /// Whether the stock device falls short of a claim (the unlock changes something).
    pub unlock_needed: bool,
    /// The claims the stock device does not answer, in words; empty when none.
    pub short_of: Vec<String>,
}

/// What `metalift gpu --json` prints.
#[derive(Debug, Serialize)]
struct Report {
    stock: Stock,
    /// The host chip's brand string (`null`: unknown).
    host_chip: Option<String>,
    /// Where it came from: `metaliftd` (its status) or why not.
    host_chip_from: String,
    /// Every profile of `--policy`, against the stock answers.
    profiles: Vec<ProfileNote>,
}

/// The answers in a `metalift-probe --json` report (stock or unlocked).
#[must_use]
pub fn device_answers(report: &serde_json::Value) -> DeviceAnswers {
    let flag = |name: &str| report["llama_cpp"][name].as_bool().unwrap_or(false);
    DeviceAnswers {
        apple_family: report["apple_family"]
            .as_u64()
            .and_then(|f| u8::try_from(f).ok()),
        max_threadgroup_memory: report["max_threadgroup_memory"].as_u64().unwrap_or(0),
        recommended_working_set: report["recommended_working_set"].as_u64(),
        has_simdgroup_reduction: flag("has_simdgroup_reduction"),
        has_simdgroup_mm: flag("has_simdgroup_mm"),
        has_bfloat: flag("has_bfloat"),
    }
}

/// The claims of `caps` that `answers` does not meet, in words (empty: it meets
/// them all). The working set is not a claim the unlock is needed for (it only
/// ever raises a floor), so it is not compared.
#[must_use]
pub fn short_of(answers: &DeviceAnswers, caps: &Capabilities) -> Vec<String> {
    let mut short = Vec::new();
    let family = answers.apple_family.unwrap_or(0);
    if family < caps.apple_family_max {
        short.push(format!(
            "Apple{} (stock: {})",
            caps.apple_family_max,
            answers
                .apple_family
                .map_or_else(|| "no Apple family".to_owned(), |f| format!("Apple{f}"))
        ));
    }
    if answers.max_threadgroup_memory < caps.max_threadgroup_memory {
        short.push(format!(
            "{} bytes of threadgroup memory (stock: {})",
            caps.max_threadgroup_memory, answers.max_threadgroup_memory
        ));
    }
    short
}

/// Each profile of `profiles` against the stock answers.
#[must_use]
pub fn profile_notes<'a>(
    stock: &DeviceAnswers,
    profiles: impl IntoIterator<Item = (&'a String, &'a Capabilities)>,
) -> Vec<ProfileNote> {
    profiles
        .into_iter()
        .map(|(name, caps)| {
            let short_of = short_of(stock, caps);
            ProfileNote {
                profile: name.clone(),
                unlock_needed: !short_of.is_empty(),
                short_of,
            }
        })
        .collect()
}

/// Asks the stock device, through `probe`, within `timeout`.
pub fn stock(probe: &Path, timeout: Duration) -> anyhow::Result<Stock> {
    let mut cmd = Command::new(probe);
    cmd.arg("--json")
        .env_remove(INSERT_VAR)
        .env("METALIFT_DISABLE", "1");
    let report = probe_report(&mut cmd, Instant::now() + timeout, "stock")?;
    Ok(Stock {
        name: report["name"].as_str().unwrap_or_default().to_owned(),
        class: report["class"].as_str().map(str::to_owned),
        families: report["families"].clone(),
        answers: device_answers(&report),
    })
}

/// Runs `cmd`, a `metalift-probe --json` (`which` names it in errors: "stock",
/// "unlocked", a demo's case), killed at `deadline`: its report. `metalift gpu`,
/// `verify` and `demo` each ask the device this way.
pub(crate) fn probe_report(
    cmd: &mut Command,
    deadline: Instant,
    which: &str,
) -> anyhow::Result<serde_json::Value> {
    match bounded::run(cmd, deadline)? {
        Ended::Exited {
            status,
            stdout,
            stderr,
            ..
        } => {
            if !status.success() {
                bail!(
                    "the {which} probe failed ({status}): {}",
                    String::from_utf8_lossy(&stderr).trim()
                );
            }
            serde_json::from_slice(&stdout)
                .with_context(|| format!("the {which} probe printed no JSON"))
        }
        Ended::Killed { after } => bail!(
            "the {which} probe did not answer in {} ms (killed): is the device hung?",
            after.as_millis()
        ),
    }
}

/// The families answered yes, in the probe's order.
fn yes(families: &serde_json::Value) -> Vec<&str> {
    families
        .as_object()
        .map(|m| {
            metalift_policy::wire::KNOWN_FAMILIES
                .iter()
                .map(|(name, _)| *name)
                .filter(|name| m.get(*name).and_then(serde_json::Value::as_bool) == Some(true))
                .collect()
        })
        .unwrap_or_default()
}

/// Runs `metalift gpu`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let stock = stock(&crate::tools::beside("metalift-probe")?, PROBE_TIMEOUT)?;
    let socket = args.daemon.socket().ok();
    let (host, why) = crate::judgement::daemon_host_build(&args.daemon, socket.as_deref());
    let host_chip_from = why.map_or_else(
        || "metaliftd".to_owned(),
        |why| format!("this machine ({why})"),
    );
    let profiles = match metalift_daemon::live_policy::host_chip::load(
        &args.policy,
        &LoadOptions {
            allow_insecure_owner: true,
        },
        metalift_policy::DEFAULT_MAX_POLICY_BYTES,
    ) {
        Ok(loaded) => profile_notes(&stock.answers, loaded.policy.profiles()),
        Err(metalift_policy::LoadError::NotFound { .. }) => Vec::new(),
        Err(e) => {
            eprintln!(
                "metalift: gpu: {}: {e} (profiles not compared)",
                args.policy.display()
            );
            Vec::new()
        }
    };
    let report = Report {
        stock,
        host_chip: host.chip,
        host_chip_from,
        profiles,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", text(&report));
    }
    Ok(ExitCode::SUCCESS)
}

fn text(r: &Report) -> String {
    let s = &r.stock;
    let a = &s.answers;
    let mut out = format!(
        "stock device:  {}{}\n",
        s.name,
        s.class
            .as_deref()
            .map_or_else(String::new, |c| format!(" ({c})"))
    );
    out += &format!("families:      {}\n", yes(&s.families).join(" "));
    out += &format!(
        "apple family:  {}\n",
        a.apple_family
            .map_or_else(|| "none".to_owned(), |f| format!("Apple{f}"))
    );
    out += &format!("threadgroup:   {} bytes\n", a.max_threadgroup_memory);
    out += &format!(
        "working set:   {}\n",
        a.recommended_working_set
            .map_or_else(|| "not answered".to_owned(), |w| format!("{w} bytes"))
    );
    out += &format!(
        "llama.cpp:     has_simdgroup_reduction={} has_simdgroup_mm={} has_bfloat={}\n",
        a.has_simdgroup_reduction, a.has_simdgroup_mm, a.has_bfloat
    );
    out += &format!(
        "host chip:     {} (from {})\n",
        r.host_chip.as_deref().unwrap_or("unknown"),
        r.host_chip_from
    );
    for p in &r.profiles {
        if p.unlock_needed {
            out += &format!(
                "profile {}: needs the unlock: {}\n",
                p.profile,
                p.short_of.join(", ")
            );
        } else {
            out += &format!(
                "profile {}: the stock device already answers it: the unlock is unneeded here\n",
                p.profile
            );
        }
    }
    out
}
