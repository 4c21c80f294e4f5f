//! `metalift-llama-bench`: the Linux stand-in for llama.cpp's `llama-bench`
//! (`metalift verify --workload` on the simulated Metal). It creates the default
//! Metal device the way `metalift-probe` does (linked, as llama.cpp links
//! Metal.framework), derives llama.cpp's flags from its answers, and runs
//! llama-bench's tests at the speed those flags allow, printing llama-bench's
//! `-o json` output. What it models and what it does not:
//! `metalift_probe::llama_bench`.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Instant, SystemTime};

use metalift_probe::llama_bench::{self, Output, Params, Run, TestResult};
use metalift_probe::LlamaFlags;

const USAGE: &str =
    "usage: metalift-llama-bench [-m FILE] [-p N[,N...]] [-n N[,N...]] [-pg PP,TG] \
[-r N] [-t N] [-ngl N] [--no-warmup] [-o json|jsonl]
A stand-in for llama.cpp's llama-bench on the simulated Metal: no model is loaded;
each test sleeps for its tokens at the rate the device's answers allow
(pp 431.86 tok/s, 4786.70 with has_simdgroup_mm; tg 12.63, 206.60 with
has_simdgroup_reduction) and is printed as llama-bench -o json prints it.";

fn main() -> ExitCode {
    let params = match Params::parse(std::env::args().skip(1)) {
        Ok(params) => params,
        Err(message) if message.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("{message}\n{USAGE}");
            return ExitCode::FAILURE;
        }
    };
    let (gpu, flags) = match platform::device() {
        Ok(device) => device,
        Err(err) => {
            eprintln!("metalift-llama-bench: no Metal device: {err}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "metalift-llama-bench: {gpu}: has_simdgroup_mm = {}, has_simdgroup_reduction = {}",
        flags.has_simdgroup_mm, flags.has_simdgroup_reduction
    );
    let run = Run {
        params: &params,
        gpu,
        model_size: std::fs::metadata(&params.model).map_or(0, |m| m.len()),
    };
    let mut out = std::io::stdout().lock();
    if params.output == Output::Json {
        let _ = out.write_all(llama_bench::JSON_HEADER.as_bytes());
    }
    for (i, (n_prompt, n_gen)) in params.tests().into_iter().enumerate() {
        let result = bench(&params, &flags, n_prompt, n_gen);
        let text = match params.output {
            Output::Json => llama_bench::json_test(&run, &result, i == 0),
            Output::Jsonl => llama_bench::jsonl_test(&run, &result),
        };
        // llama-bench flushes after each test (`print_test`, then `fflush`).
        if out
            .write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            return ExitCode::FAILURE;
        }
    }
    if params.output == Output::Json {
        let _ = out.write_all(llama_bench::JSON_FOOTER.as_bytes());
    }
    ExitCode::SUCCESS
}

/// One test as llama-bench's `main()` runs it: a warm-up (the whole prompt, one
/// generated token), then `reps` timed repetitions.
fn bench(params: &Params, flags: &LlamaFlags, n_prompt: u32, n_gen: u32) -> TestResult {
    let test_time = SystemTime::now();
    if !params.no_warmup {
        if n_prompt > 0 {
            std::thread::sleep(llama_bench::duration(flags, n_prompt, 0));
        }
        if n_gen > 0 {
            std::thread::sleep(llama_bench::duration(flags, 0, 1));
        }
    }
    let samples_ns = (0..params.reps)
        .map(|_| {
            let start = Instant::now();
            std::thread::sleep(llama_bench::duration(flags, n_prompt, n_gen));
            u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
        })
        .collect();
    TestResult {
        n_prompt,
        n_gen,
        samples_ns,
        test_time,
    }
}

#[cfg(target_os = "linux")]
mod platform {
    use std::ffi::c_void;

    use metalift_probe::report::Device;
    use metalift_probe::sim::{self, Scope};
    use metalift_probe::LlamaFlags;

    // Linked from libsimmetal.so (build.rs), as llama.cpp links Metal.framework.
    extern "C" {
        fn MTLCreateSystemDefaultDevice() -> *mut c_void;
    }

    pub fn device() -> Result<(String, LlamaFlags), String> {
        // SAFETY: the linked symbol is the simulated Metal's MTLCreateSystemDefaultDevice.
        let device = unsafe { sim::default_device(MTLCreateSystemDefaultDevice, Scope::Global) }?;
        Ok((
            device.name(),
            LlamaFlags::derive(|f| device.supports_family(f)),
        ))
    }
}

#[cfg(not(target_os = "linux"))]
mod platform {
    use metalift_probe::LlamaFlags;

    pub fn device() -> Result<(String, LlamaFlags), String> {
        Err("the stand-in runs on the simulated Metal (Linux); on macOS run llama.cpp's llama-bench".into())
    }
}
