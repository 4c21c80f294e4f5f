//! metalift-probe: ask a Metal device what it supports, the way llama.cpp asks.
//!
//! # Layout
//!
//! - [`report`]: the answers a device gives ([`Report`]), the three llama.cpp flags
//!   derived exactly as `ggml-metal-device.m` derives them, text and JSON output.
//!   Pure; no unsafe.
//! - `sim` (Linux): the simulated Metal (`probe/simmetal/simmetal.m`) on the GCC
//!   Objective-C runtime, reached through `objc_msg_lookup` like compiled
//!   Objective-C would.
//! - `macos` (macOS): the real Metal through `objc2-metal`.
//! - [`verify`]: `--verify`, the kernels an unlock promises, run and compared with
//!   the CPU; its GPU is `sim_compute` (Linux, `probe/simmetal/compute.m`) or
//!   `macos_compute` (the real Metal).
//!
//! Two binaries sit on top: `metalift-probe` links the Metal library (like llama.cpp
//! links Metal.framework), `metalift-probe-dlopen` loads it later with `dlopen`
//! (like Python loading PyTorch's MPS backend), so tests cover both orders in which
//! libmetalift can meet Metal.

pub mod report;
pub mod verify;

#[cfg(target_os = "linux")]
pub mod sim;
#[cfg(target_os = "linux")]
pub mod sim_compute;

#[cfg(target_os = "macos")]
pub mod macos;
#[cfg(target_os = "macos")]
pub mod macos_compute;

pub use metalift_policy::FamilyExpectation;
pub use report::{Device, LlamaFlags, Report};

/// Where the build put the simulated Metal variants (`normal/`, `noinit/`, `nows/`,
/// each holding a `libsimmetal.so`). Empty of libraries on macOS.
pub const SIMMETAL_DIR: &str = env!("SIMMETAL_DIR");

/// Parsed command line shared by both probe binaries.
#[derive(Debug, Default)]
pub struct Options {
    /// `--json`: one JSON document instead of the table.
    pub json: bool,
    /// `--simmetal-dir`: print [`SIMMETAL_DIR`] and exit.
    pub simmetal_dir: bool,
    /// `--expect-family N` (AppleN or above) or `=N` (exactly AppleN): exit with
    /// [`EXIT_FAMILY_MISMATCH`] unless the device's answers meet it.
    pub expect_family: Option<FamilyExpectation>,
    /// `--verify`: also compile and run a kernel for each capability the device
    /// claims, and exit with [`EXIT_VERIFY_FAILED`] unless all compute correctly.
    pub verify: bool,
    /// `--kernel NAME` (with `--verify`): run only that kernel (a function name,
    /// or `control`: the check that must come out `differs`, see
    /// [`verify::control`]). `metalift verify` runs each in a child of its own,
    /// killed at a deadline.
    pub kernel: Option<String>,
    /// `--threads N` (Linux): first create N devices at once on N threads.
    pub threads: usize,
    /// Positional arguments (the library path for `metalift-probe-dlopen`).
    pub positional: Vec<String>,
}

/// Exit status when `--expect-family N` does not hold.
pub const EXIT_FAMILY_MISMATCH: u8 = 3;

/// Exit status when `--verify` found a claimed kernel that fails to compile, to
/// run, or computes something else than the CPU.
pub const EXIT_VERIFY_FAILED: u8 = 4;

/// The options both probes document in `--help`.
/// (No `\` line continuation at the start: it would eat the first line's indent.)
pub const OPTIONS_HELP: &str = "  --json               one JSON document instead of the table
  --expect-family N    exit 3 unless the device answers YES for AppleN (AppleN or above:
                       what llama.cpp's fast paths need; 7 holds on every host chip)
  --expect-family =N   exit 3 unless the device answers exactly AppleN (YES for AppleN,
                       NO for Apple(N+1))
  --verify             run a kernel for each claimed capability (simd_sum, simd_max, 8x8
                       simdgroup matrix, bfloat, threadgroup memory); exit 4 if any fails
  --kernel NAME        with --verify: only that kernel (metalift_simd_sum, ...), or
                       `control`: a check built to come out `differs` (its reference
                       perturbed); it does not fail the verification
  -h, --help           print this and exit 0
  --threads N          (Linux) first create N devices at the same moment on N threads
  --simmetal-dir       print where the simulated Metal variants were built
exit status: 0 ok; 1 no Metal device; 2 usage; 3 --expect-family did not hold;
             4 --verify: a claimed kernel failed to compile or run, or computed wrongly";

impl Options {
    /// Parses `args` (without the program name). `Err` with an empty message is
    /// `-h`/`--help`: the caller prints the usage on stdout and exits 0.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Options, String> {
        let mut options = Options::default();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--json" => options.json = true,
                "--simmetal-dir" => options.simmetal_dir = true,
                "--verify" => options.verify = true,
                "--kernel" => {
                    options.kernel = Some(args.next().ok_or("--kernel needs a kernel name")?);
                }
                "--expect-family" => {
                    let value = args.next().ok_or("--expect-family needs N or =N")?;
                    options.expect_family =
                        Some(value.parse().map_err(|e| format!("--expect-family {e}"))?);
                }
                "--threads" => {
                    let value = args.next().ok_or("--threads needs a number")?;
                    options.threads = value
                        .parse()
                        .map_err(|_| format!("--threads {value}: not a number"))?;
                }
                "-h" | "--help" => return Err(String::new()),
                flag if flag.starts_with('-') => return Err(format!("unknown option {flag}")),
                _ => options.positional.push(arg),
            }
        }
        Ok(options)
    }
}

/// Prints `report` as the options ask and returns the exit status.
pub fn print(report: &Report, options: &Options) -> std::process::ExitCode {
    print_verified(report, None, options)
}

/// Prints `report` and, with `--verify`, its `verification` (a table after the
/// report; a `verification` object in the JSON), and returns the exit status: a
/// failed verification first, then `--expect-family`.
pub fn print_verified(
    report: &Report,
    verification: Option<&verify::Verification>,
    options: &Options,
) -> std::process::ExitCode {
    if options.json {
        let mut json = report.to_json();
        if let (Some(v), Some(object)) = (verification, json.as_object_mut()) {
            object.insert("verification".into(), v.to_json());
        }
        println!("{json}");
    } else {
        print!("{}", report.to_text());
        if let Some(v) = verification {
            print!("{}", v.to_text());
        }
    }
    if let Some(v) = verification.filter(|v| !v.passed()) {
        let failed: Vec<&str> = v
            .kernels
            .iter()
            .filter(|k| k.outcome.is_failure())
            .map(|k| k.capability.function())
            .collect();
        eprintln!(
            "metalift-probe: verification failed: {} (the device claims what it does not compute)",
            failed.join(", ")
        );
        return std::process::ExitCode::from(EXIT_VERIFY_FAILED);
    }
    match options.expect_family {
        Some(expected) if !report.meets(expected) => {
            eprintln!(
                "metalift-probe: expected {expected}, the device answers {}",
                report
                    .apple_family()
                    .map_or("no Apple family".to_owned(), |f| format!("up to Apple{f}"))
            );
            std::process::ExitCode::from(EXIT_FAMILY_MISMATCH)
        }
        _ => std::process::ExitCode::SUCCESS,
    }
}

/// Prints `usage` and the options: on stdout and exit 0 for `--help` (an empty
/// `message`), else after the message on stderr with exit 2.
pub fn usage(program: &str, usage: &str, message: &str) -> std::process::ExitCode {
    let text = format!("usage: {usage}\n{OPTIONS_HELP}");
    if message.is_empty() {
        // `metalift-probe --help | head`: a closed pipe is not an error.
        let _ = std::io::Write::write_all(&mut std::io::stdout(), format!("{text}\n").as_bytes());
        return std::process::ExitCode::SUCCESS;
    }
    eprintln!("{program}: {message}\n{text}");
    std::process::ExitCode::from(2)
}
