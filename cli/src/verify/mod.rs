//! `metalift verify --profile NAME`: run the kernels a profile's unlock promises,
//! on this machine, and record the result for the daemon (verified unlock).
//!
//! 1. Reads the profile from the policy (`--policy`), `"host"` and the host's
//!    ceiling resolved as metaliftd resolves them.
//! 2. Probes the stock device (the shim disabled, `METALIFT_DISABLE=1`), then
//!    starts a throw-away `metaliftd` (`metalift_daemon::scratch`) whose policy
//!    unlocks `metalift-probe` with exactly that profile and runs, with
//!    libmetalift injected, the probe's report, each kernel
//!    (`metalift-probe --verify --json --kernel NAME`) and the control, each in a
//!    child killed at its deadline (`runs`, `bounded`): a kernel that does not
//!    finish is `hung`, and the whole run ends by `--timeout`. The control must
//!    come out `differs`, or the run is void (recorded as failed). The system
//!    daemon is not asked: a profile with `require_verified = true` is stock there
//!    until this command has recorded a pass.
//! 3. With `--workload -- CMD…` (`workload`), runs the command stock and unlocked
//!    (the scratch daemon's policy unlocks every process it serves, so the
//!    command's children too), `--workload-runs` times each, within `--timeout`,
//!    and records each test's speed-up (llama-bench's tokens per second, prompt
//!    and generation apart; else wall time). Below `--min-speedup` the
//!    verification fails.
//! 4. Appends a `verification` record with its receipt (`receipt`: hashes of
//!    the shim and probe, stock and effective answers, times) to the audit log
//!    (`--audit-log`) and then the same record to the verification file beside the
//!    policy (`verifications.jsonl`, replaced whole: `store`), which the daemon
//!    reads: audited before it takes effect, as every decision is. Both are root's files, so only root records a
//!    verification the daemon trusts (`metalift_daemon::live_policy::verification`).
//!
//! The record names what the result depends on: the profile's capabilities, the
//! host chip, the macOS build (`kern.osversion`) and the metalift version. The
//! daemon unlocks the profile only while the last record for its capabilities on
//! its host chip and build passed: after a macOS update it answers stock until
//! this command is run again.

pub(crate) mod bounded;
mod receipt;
mod runs;
mod store;
mod workload;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context};
use metalift_daemon::audit::receipt::Receipt;
use metalift_daemon::audit::{AuditLog, Record, Rotation};
use metalift_daemon::live_policy::verification::{self, VerificationRecord};
use metalift_daemon::live_policy::{host_chip, host_os};
use metalift_policy::{Capabilities, LoadOptions};

use crate::tools::{start_daemon, TempDir, Tools};

/// Exit status when the verification ran and failed (the answer is no).
pub const FAILED: u8 = 1;

/// Arguments of `metalift verify`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Exit status:\n  \
    0  every claimed kernel computed correctly (recorded: the daemon may unlock\n     \
       the profile on this host chip and macOS build)\n  \
    1  a kernel failed to compile, to run, computed wrongly, or hung; or the\n     \
       control did not come out `differs` (void); or (--workload) the workload\n     \
       failed, hung, or its speed-up was below --min-speedup (recorded: the\n     \
       daemon answers stock for it)\n  \
    2  the verification could not run (nothing recorded)")]
pub struct Args {
    /// The profile to verify (`[profile.NAME]` in the policy).
    #[arg(long, value_name = "NAME")]
    pub profile: String,
    /// The policy file the profile is read from; the verification file
    /// (`verifications.jsonl`) is written beside it.
    #[arg(
        long,
        value_name = "PATH",
        default_value = metalift_daemon::service::config::DEFAULT_POLICY,
        env = "METALIFT_POLICY"
    )]
    pub policy: PathBuf,
    /// The audit log the `verification` record is appended to.
    #[arg(
        long,
        value_name = "PATH",
        default_value = metalift_daemon::audit::DEFAULT_LOG_PATH,
        env = "METALIFT_AUDIT_LOG",
        visible_alias = "log"
    )]
    pub audit_log: PathBuf,
    // The running daemon: the host chip and macOS build are recorded as it reads them.
    #[command(flatten)]
    pub daemon: crate::daemon_args::DaemonArgs,
    /// The shim's verdict deadline for the probe (METALIFT_TIMEOUT_MS).
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
    /// Each kernel's deadline: its probe child is killed then and the kernel is
    /// `hung` (the verification fails).
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub kernel_timeout: u64,
    /// The whole verification's bound: kernels not started by then are
    /// `not_run` (the verification fails). Nothing is written until it ends.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    pub timeout: u64,
    /// Print the record as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Also run the command after `--` stock (the shim disabled) and unlocked,
    /// and record its speed-up: each test's tokens per second for llama-bench's
    /// `-o json`, wall time for anything else. It runs after the kernels, within
    /// `--timeout` (killed at it: the verification fails).
    #[arg(long, requires = "command")]
    pub workload: bool,
    /// How many times the workload runs each way (stock, unlocked; alternately).
    #[arg(long, value_name = "N", default_value_t = 3, requires = "workload")]
    pub workload_runs: u32,
    /// Fail the verification (exit 1) when any test's speed-up (median unlocked
    /// over median stock) is below X, e.g. 2.
    #[arg(long, value_name = "X", requires = "workload")]
    pub min_speedup: Option<f64>,
    /// The workload (`--workload`): a command and its arguments.
    #[arg(last = true, value_name = "CMD", requires = "workload")]
    pub command: Vec<String>,
}

/// Runs `metalift verify`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    // Ownership is the daemon's to enforce when it loads the policy; here the file
    // is only read for the profile's values.
    let loaded = host_chip::load(
        &args.policy,
        &LoadOptions {
            allow_insecure_owner: true,
        },
        metalift_policy::DEFAULT_MAX_POLICY_BYTES,
    )
    .with_context(|| format!("reading {}", args.policy.display()))?;
    let Some(capabilities) = loaded.policy.profile(&args.profile).copied() else {
        let names: Vec<&String> = loaded.policy.profiles().keys().collect();
        bail!(
            "{}: no profile `{}` (profiles: {names:?})",
            args.policy.display(),
            args.profile
        );
    };
    if args.timeout == 0 || args.kernel_timeout == 0 {
        bail!("--timeout and --kernel-timeout must be at least 1 second");
    }
    // The chip and build exactly as the running daemon reads them (what it will
    // compare this record with), not as this process would. Asked first: a record
    // for an unknown chip proves nothing about any chip, so none is made.
    let socket = args.daemon.known_socket();
    let (host, note) = crate::judgement::daemon_host_build(&args.daemon, socket.as_deref());
    if let Some(why) = note.as_deref().filter(|_| host.chip.is_some()) {
        eprintln!(
            "metalift: verify: note: {why}: recorded this process's host chip and build \
             (the daemon's may differ)"
        );
    }
    if host.chip.is_none() {
        bail!(
            "the host chip is unknown ({}): a verification names the chip it ran on, and \
             one for no chip would vouch for none; run it where metaliftd answers and \
             reports its chip (`metalift status` shows host_chip_brand), or give metaliftd \
             {} in its environment",
            note.as_deref()
                .unwrap_or("metaliftd reports no host chip brand, nor can this process read one"),
            metalift_daemon::live_policy::host_chip::BRAND_ENV
        );
    }
    let bounds = runs::Bounds {
        per_kernel: Duration::from_secs(args.kernel_timeout),
        end: started + Duration::from_secs(args.timeout),
    };
    let workload = args
        .workload
        .then(|| workload::Spec::new(args.command.clone(), args.workload_runs, args.min_speedup))
        .transpose()?;
    let tools = Tools::find(args.timeout_ms)?;
    let dir = TempDir::create()?;
    let (_, stock) = runs::answers(&tools, None, &bounds)?;
    let (_scratch, daemon) = start_daemon(
        &tools,
        dir.path(),
        "verify",
        &private_policy(&args.profile, &capabilities, workload.is_some()),
    )?;
    let unlocked =
        runs::answers(&tools, Some(daemon.socket()), &bounds).and_then(|(report, effective)| {
            check_unlocked(&report, &capabilities)?;
            let kernels = runs::kernels(&tools, daemon.socket(), &bounds)?;
            let control = runs::control(&tools, daemon.socket(), &bounds)?;
            let workload = workload
                .as_ref()
                .map(|spec| workload::run(&tools, daemon.socket(), &bounds, spec));
            Ok((effective, kernels, control, workload))
        });
    // How the scratch daemon exited does not change the verification's result.
    let _ = daemon.stop();
    let (effective, kernels, control, workload) = unlocked?;
    let void = (control != "differs").then(|| {
        format!(
            "the control (a check whose reference is deliberately wrong) came out `{control}`, \
             not `differs`: this run's comparisons are not evidence"
        )
    });
    let workload_failure = workload.as_ref().filter(|w| w.result != "pass").map(|w| {
        format!(
            "workload: {}{}",
            w.result,
            w.detail
                .as_deref()
                .map_or(String::new(), |d| format!(" ({d})"))
        )
    });
    let kernels_pass = kernels
        .iter()
        .all(|k| k.result == "pass" || k.result == "not_claimed");
    let receipt = Receipt {
        shim: tools.shim.display().to_string(),
        shim_sha256: receipt::sha256_file(&tools.shim),
        probe: tools.probe.display().to_string(),
        probe_sha256: receipt::sha256_file(&tools.probe),
        os_product_version: receipt::os_product_version(),
        unlock_needed: Some(receipt::unlock_needed(&stock, &effective, &capabilities)),
        stock: Some(stock),
        effective: Some(effective),
        control,
        void,
        kernel_timeout_ms: args.kernel_timeout * 1000,
        timeout_ms: args.timeout * 1000,
        elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        workload,
    };
    let error = [receipt.void.clone(), workload_failure.clone()]
        .into_iter()
        .flatten()
        .reduce(|a, b| format!("{a}; {b}"));
    let record = VerificationRecord {
        time: SystemTime::now(),
        profile: args.profile.clone(),
        apple_family_max: capabilities.apple_family_max,
        max_threadgroup_memory: capabilities.max_threadgroup_memory,
        recommended_working_set: capabilities.recommended_working_set,
        host_chip: host.chip,
        os_build: host.os_build,
        metalift_version: env!("CARGO_PKG_VERSION").to_owned(),
        passed: kernels_pass && receipt.void.is_none() && workload_failure.is_none(),
        kernels,
        error,
        recorded_by_uid: rustix::process::getuid().as_raw(),
        receipt: Some(receipt),
    };
    let file = verification::path_beside(&args.policy);
    // Audited first: a verification the daemon acts on is always in the log. With
    // the policy's `[audit.labels]`, as the daemon's own records carry them.
    AuditLog::open(&args.audit_log, Rotation::default())
        .and_then(|log| {
            log.set_labels(loaded.policy.labels());
            log.append(&Record::Verification(record.clone()))
        })
        .with_context(|| format!("appending to the audit log {}", args.audit_log.display()))?;
    store::append_atomically(&file, &record)?;
    crate::judgement::say_on_stderr("verify", &args.daemon, socket.as_deref());

    if args.json {
        println!("{}", serde_json::to_string(&record)?);
    } else {
        print_text(&record, &file);
    }
    Ok(if record.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(FAILED)
    })
}

/// A policy that unlocks the probe (by name) with exactly `capabilities`, and
/// with `workload` every process it is asked about: only this verification's
/// children know its socket, and the process that calls Metal may be the
/// command's child (a script, a server's worker).
fn private_policy(profile: &str, capabilities: &Capabilities, workload: bool) -> String {
    let mut text = format!(
        "# metalift verify: unlock the probe with profile {profile:?} as the policy defines it.\n\
         version = 1\nmode = \"enforce\"\n\n[profile.{profile:?}]\n\
         apple_family_max = {}\nmax_threadgroup_memory = {}\n",
        capabilities.apple_family_max, capabilities.max_threadgroup_memory
    );
    if let Some(ws) = capabilities.recommended_working_set {
        text.push_str(&format!("recommended_working_set = {ws}\n"));
    }
    text.push_str(&format!(
        "\n[[rule]]\nid = \"metalift-verify\"\nname = \"metalift-probe\"\nunlock = {profile:?}\n"
    ));
    if workload {
        text.push_str(&format!(
            "\n[[rule]]\nid = \"metalift-verify-workload\"\npath = \"/**\"\nunlock = {profile:?}\n"
        ));
    }
    text
}

/// The verification means something only if the probe saw the profile applied.
fn check_unlocked(report: &serde_json::Value, capabilities: &Capabilities) -> anyhow::Result<()> {
    let family = report["apple_family"].as_u64();
    let threadgroup = report["max_threadgroup_memory"].as_u64().unwrap_or(0);
    if family != Some(u64::from(capabilities.apple_family_max))
        || threadgroup < capabilities.max_threadgroup_memory
    {
        bail!(
            "the probe was not unlocked with the profile (it answered Apple{} and {threadgroup} \
             bytes of threadgroup memory; the profile claims Apple{} and {}): nothing recorded. \
             Is the shim working here? Try `metalift demo`.",
            family.map_or("?".to_owned(), |f| f.to_string()),
            capabilities.apple_family_max,
            capabilities.max_threadgroup_memory
        );
    }
    Ok(())
}

fn print_text(record: &VerificationRecord, file: &Path) {
    println!(
        "profile {}: Apple{}, {} bytes of threadgroup memory",
        record.profile, record.apple_family_max, record.max_threadgroup_memory
    );
    println!(
        "host chip {}, macOS build {}, metalift {}",
        record.host_chip.as_deref().unwrap_or("(unknown)"),
        record.os_build.as_deref().unwrap_or("(unknown)"),
        record.metalift_version
    );
    println!("  {:<24} {:<15} detail", "kernel", "result");
    for k in &record.kernels {
        println!(
            "  {:<24} {:<15} {}",
            k.kernel,
            k.result,
            k.detail.as_deref().unwrap_or("")
        );
    }
    if let Some(w) = record.receipt.as_ref().and_then(|r| r.workload.as_ref()) {
        print_workload(w);
    }
    if record.recorded_by_uid != 0 {
        println!(
            "note: recorded as uid {}: metaliftd trusts {} only when root owns it and only root can write it \
             (or when it runs with --allow-insecure-owner)",
            record.recorded_by_uid,
            file.display()
        );
    }
    if record.passed {
        println!(
            "verified: recorded in {}; profiles requiring verification unlock on this host chip and build",
            file.display()
        );
    } else {
        println!(
            "FAILED: recorded in {}; the daemon answers stock for profile `{}` with require_verified = true ({})",
            file.display(),
            record.profile,
            record.failures().join(", ")
        );
    }
}

fn print_workload(w: &metalift_daemon::audit::receipt::WorkloadReceipt) {
    println!(
        "workload: {} ({} runs each way, {}): {}{}",
        w.command.join(" "),
        w.runs,
        w.measure,
        w.result,
        w.detail
            .as_deref()
            .map_or(String::new(), |d| format!(": {d}"))
    );
    if w.tests.is_empty() {
        return;
    }
    println!(
        "  {:<16} {:>18} {:>18} {:>9}",
        "test", "stock", "unlocked", "speed-up"
    );
    for t in &w.tests {
        println!(
            "  {:<16} {:>18} {:>18} {:>8.2}x",
            t.test,
            format!("{:.2} {}", t.stock_median.0, t.unit),
            format!("{:.2} {}", t.unlocked_median.0, t.unit),
            t.speedup.0
        );
    }
}

/// The verifications beside `policy_path` judged as metaliftd on this machine
/// would judge them (`chip`: the host chip's brand `validate`/`explain` resolve
/// `"host"` with; the build from `METALIFT_HOST_OS_BUILD` or `kern.osversion`).
pub(crate) fn store_here(
    policy_path: &Path,
    chip: Option<String>,
    allow_insecure_owner: bool,
) -> verification::VerificationStore {
    verification::VerificationStore::beside(
        policy_path,
        allow_insecure_owner,
        verification::HostBuild {
            chip,
            os_build: host_os::os_build(),
        },
    )
}

/// For each profile of `policy` with `require_verified = true`: whether it would
/// unlock here now, and why not (`metalift validate` prints these).
pub(crate) fn coverage_here(
    policy: &metalift_policy::Policy,
    store: &verification::VerificationStore,
) -> Vec<(String, verification::Coverage)> {
    let recorded = store.recorded();
    policy
        .profiles()
        .iter()
        .filter(|(name, _)| policy.requires_verification(name))
        .map(|(name, caps)| {
            (
                name.clone(),
                verification::coverage(&recorded, name, caps, store.host()),
            )
        })
        .collect()
}

/// One line per profile for `validate`'s text.
pub(crate) fn coverage_text(path: &Path, coverage: &[(String, verification::Coverage)]) -> String {
    coverage
        .iter()
        .map(|(name, c)| match c {
            verification::Coverage::Verified(r) => format!(
                "{}: profile `{name}` requires verification: verified for host chip {}, macOS build {} ({})\n",
                path.display(),
                r.host_chip.as_deref().unwrap_or("(unknown)"),
                r.os_build.as_deref().unwrap_or("(unknown)"),
                metalift_daemon::audit::rfc3339::format(r.time)
            ),
            verification::Coverage::Unverified(why) => format!(
                "{}: profile `{name}` requires verification: metaliftd answers stock here: {why}\n",
                path.display()
            ),
        })
        .collect()
}

/// `validate --json`'s `require_verified` array.
pub(crate) fn coverage_json(coverage: &[(String, verification::Coverage)]) -> serde_json::Value {
    coverage
        .iter()
        .map(|(name, c)| match c {
            verification::Coverage::Verified(r) => serde_json::json!({
                "profile": name, "verified": true, "reason": null,
                "host_chip": r.host_chip, "os_build": r.os_build,
                "time": metalift_daemon::audit::rfc3339::format(r.time),
            }),
            verification::Coverage::Unverified(why) => serde_json::json!({
                "profile": name, "verified": false, "reason": why,
            }),
        })
        .collect()
}
