//! `metalift-probe`: creates the default Metal device the way llama.cpp does and
//! prints what it answers (`--json` for one JSON document).
//!
//! On Linux it links the simulated Metal (see `build.rs`); on macOS the real one.

use std::process::ExitCode;

use metalift_probe::Options;

fn main() -> ExitCode {
    let options = match Options::parse(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(msg) => {
            if !msg.is_empty() {
                eprintln!("metalift-probe: {msg}");
            }
            eprintln!(
                "usage: metalift-probe [--json] [--expect-family N] [--threads N] [--simmetal-dir]\n{}",
                metalift_probe::OPTIONS_HELP
            );
            return ExitCode::from(2);
        }
    };
    if options.simmetal_dir {
        println!("{}", metalift_probe::SIMMETAL_DIR);
        return ExitCode::SUCCESS;
    }
    match platform::default_device(&options) {
        Ok(report) => metalift_probe::print(&report, &options),
        Err(err) => {
            eprintln!("metalift-probe: no Metal device: {err}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(target_os = "linux")]
mod platform {
    use std::ffi::c_void;

    use metalift_probe::sim::{self, Scope};
    use metalift_probe::Report;

    // Linked from libsimmetal.so (build.rs), as llama.cpp links Metal.framework.
    extern "C" {
        fn MTLCreateSystemDefaultDevice() -> *mut c_void;
    }

    pub fn default_device(options: &metalift_probe::Options) -> Result<Report, String> {
        let concurrent = if options.threads > 0 {
            sim::create_concurrently(options.threads, Scope::Global)?
        } else {
            Vec::new()
        };
        let start = std::time::Instant::now();
        // SAFETY: the linked symbol is the simulated Metal's MTLCreateSystemDefaultDevice.
        let device = unsafe { sim::default_device(MTLCreateSystemDefaultDevice, Scope::Global) }?;
        let took = start.elapsed();
        Ok(Report::probe(&device)
            .with_device_creation(took)
            .with_concurrent_creations(concurrent))
    }
}

#[cfg(target_os = "macos")]
mod platform {
    use metalift_probe::Report;

    pub fn default_device(_options: &metalift_probe::Options) -> Result<Report, String> {
        let start = std::time::Instant::now();
        let device = metalift_probe::macos::default_device()?;
        let took = start.elapsed();
        Ok(Report::probe(&device).with_device_creation(took))
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
mod platform {
    use metalift_probe::Report;

    pub fn default_device(_options: &metalift_probe::Options) -> Result<Report, String> {
        Err("no Metal (real or simulated) on this platform".into())
    }
}
