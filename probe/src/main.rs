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
            return metalift_probe::usage(
                "metalift-probe",
                "metalift-probe [--json] [--expect-family N|=N] [--verify [--kernel NAME]] [--threads N] [--simmetal-dir]",
                &msg,
            );
        }
    };
    if options.simmetal_dir {
        println!("{}", metalift_probe::SIMMETAL_DIR);
        return ExitCode::SUCCESS;
    }
    if options.verify {
        return match platform::verify(&options) {
            Ok((report, verification)) => {
                metalift_probe::print_verified(&report, Some(&verification), &options)
            }
            Err(err) => {
                eprintln!("metalift-probe: no Metal device: {err}");
                ExitCode::FAILURE
            }
        };
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

    /// The report, then the kernels it claims run on the simulated compute path.
    pub fn verify(
        options: &metalift_probe::Options,
    ) -> Result<(Report, metalift_probe::verify::Verification), String> {
        // SAFETY: the linked symbol is the simulated Metal's MTLCreateSystemDefaultDevice.
        let device = unsafe { sim::default_device(MTLCreateSystemDefaultDevice, Scope::Global) }?;
        let report = Report::probe(&device);
        let gpu = metalift_probe::sim_compute::SimCompute::new(&device)?;
        let verification =
            metalift_probe::verify::verify_selected(&gpu, &report, options.kernel.as_deref())?;
        Ok((report, verification))
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

    /// The report, then the kernels it claims run on the real Metal.
    pub fn verify(
        options: &metalift_probe::Options,
    ) -> Result<(Report, metalift_probe::verify::Verification), String> {
        let device = metalift_probe::macos::default_device()?;
        let report = Report::probe(&device);
        let gpu = metalift_probe::macos_compute::MetalCompute(&device);
        let verification =
            metalift_probe::verify::verify_selected(&gpu, &report, options.kernel.as_deref())?;
        Ok((report, verification))
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
mod platform {
    use metalift_probe::Report;

    pub fn default_device(_options: &metalift_probe::Options) -> Result<Report, String> {
        Err("no Metal (real or simulated) on this platform".into())
    }

    pub fn verify(
        _options: &metalift_probe::Options,
    ) -> Result<(Report, metalift_probe::verify::Verification), String> {
        Err("no Metal (real or simulated) on this platform".into())
    }
}
