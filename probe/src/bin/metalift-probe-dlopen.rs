//! `metalift-probe-dlopen PATH`: loads the Metal library at PATH with `dlopen`
//! *after* start-up (as Python loads PyTorch's MPS backend), then probes its default
//! device like `metalift-probe`. It links no Metal itself, so libmetalift meets
//! Metal only through its `dlopen` hook (Linux) or dyld's add-image callback (macOS).

use std::process::ExitCode;

use metalift_probe::{Options, Report};

fn main() -> ExitCode {
    let options = match Options::parse(std::env::args().skip(1)) {
        Ok(options) if options.positional.len() == 1 => options,
        other => {
            let message = match other {
                Err(msg) => msg,
                Ok(_) => "expected one PATH-TO-METAL-LIBRARY".to_owned(),
            };
            return metalift_probe::usage(
                "metalift-probe-dlopen",
                "metalift-probe-dlopen [--json] [--expect-family N|=N] PATH-TO-METAL-LIBRARY",
                &message,
            );
        }
    };
    match open(&options.positional[0]) {
        Ok(report) => metalift_probe::print(&report, &options),
        Err(err) => {
            eprintln!("metalift-probe-dlopen: {err}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(target_os = "linux")]
fn open(path: &str) -> Result<Report, String> {
    metalift_probe::sim::open(path).map(|device| Report::probe(&device))
}

#[cfg(target_os = "macos")]
fn open(path: &str) -> Result<Report, String> {
    metalift_probe::macos::open(path).map(|device| Report::probe(&device))
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn open(_path: &str) -> Result<Report, String> {
    Err("no Metal (real or simulated) on this platform".into())
}
