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
    /// Positional arguments (the library path for `metalift-probe-dlopen`).
    pub positional: Vec<String>,
}

impl Options {
    /// Parses `args` (without the program name).
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Options, String> {
        let mut options = Options::default();
        for arg in args {
            match arg.as_str() {
                "--json" => options.json = true,
                "--simmetal-dir" => options.simmetal_dir = true,
                "-h" | "--help" => return Err(String::new()),
                flag if flag.starts_with('-') => return Err(format!("unknown option {flag}")),
                _ => options.positional.push(arg),
            }
        }
        Ok(options)
    }
}

/// Prints `report` as the options ask.
pub fn print(report: &Report, options: &Options) {
    if options.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
    }
}
