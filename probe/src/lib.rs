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
//!
//! Two binaries sit on top: `metalift-probe` links the Metal library (like llama.cpp
//! links Metal.framework), `metalift-probe-dlopen` loads it later with `dlopen`
//! (like Python loading PyTorch's MPS backend), so tests cover both orders in which
//! libmetalift can meet Metal.

pub mod report;

#[cfg(target_os = "linux")]
pub mod sim;

#[cfg(target_os = "macos")]
pub mod macos;

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
    /// `--threads N` (Linux): first create N devices at once on N threads.
    pub threads: usize,
    /// Positional arguments (the library path for `metalift-probe-dlopen`).
    pub positional: Vec<String>,
}

/// Exit status when `--expect-family N` does not hold.
pub const EXIT_FAMILY_MISMATCH: u8 = 3;

/// The options both probes document in `--help`.
/// (No `\` line continuation at the start: it would eat the first line's indent.)
pub const OPTIONS_HELP: &str = "  --json               one JSON document instead of the table
  --expect-family N    exit 3 unless the device answers YES for AppleN (AppleN or above:
                       what llama.cpp's fast paths need; 7 holds on every host chip)
  --expect-family =N   exit 3 unless the device answers exactly AppleN (YES for AppleN,
                       NO for Apple(N+1))
  -h, --help           print this and exit 0
  --threads N          (Linux) first create N devices at the same moment on N threads
  --simmetal-dir       print where the simulated Metal variants were built
exit status: 0 ok; 1 no Metal device; 2 usage; 3 --expect-family did not hold";

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
    if options.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
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
