//! Builds the simulated Metal library (Linux only) and links `metalift-probe` to it.
//!
//! Variants of `probe/simmetal/simmetal.m` are compiled with `gcc -x
//! objective-c` against Debian's GCC Objective-C runtime, each as `libsimmetal.so`
//! (same soname) in its own directory under `OUT_DIR`:
//!
//! | directory      | what differs                                      | used by                          |
//! |----------------|---------------------------------------------------|----------------------------------|
//! | `normal/`      | nothing: the real shape (see simmetal.m)          | `metalift-probe` (linked, rpath) |
//! | `noinit/`      | no `-[_MTLDevice initGPUFamilySupport]`           | the "selector missing" tests     |
//! | `nows/`        | no `recommendedMaxWorkingSetSize`                 | the "selector missing" tests     |
//! | `moved/`       | the getters moved into the driver class           | the "method moved" test          |
//! | `cached/`      | `-initGPUFamilySupport` moves the device to a subclass answering from copies | the self-check/roll-back test |
//! | `wrapper/`     | the default device is a forwarding wrapper (`libsimmetal_tools.so`) | the wrapper test |
//! | `lateclasses/` | classes in `libsimmetal_driver.so`, dlopened by `MTLCreateSystemDefaultDevice` | the dyld-order tests |
//! | `nocompile/`   | the compute path's compiler rejects simdgroup functions (`compute.m`) | the verification tests |
//! | `wrongresults/`| the compute path's simdgroup operations give wrong numbers (`compute.m`) | the verification tests |
//! | `hang/`        | the simdgroup matrix kernel never completes (`compute.m`) | the bounded verification tests |
//! | `apple7/`      | the stock device answers Apple7 and Metal3 itself (modelled on its host's answer) | `metalift gpu`, doctor's stock GPU check |
//!
//! Every variant also compiles `probe/simmetal/compute.m` (the compute path
//! `metalift-probe --verify` uses; empty in the stub and tools images).
//!
//! Also `normal/libsimpeer.so` from `probe/second_shim/peer_shim.m`: a second
//! shim modelled on Cua's (`LumeMetalCapabilities`), linked to the simulated
//! Metal as Cua's links Metal.framework, for `tests/second_shim.rs`.
//!
//! Also the hostile test programs (`probe/hostile/hostile.c`, C) into `OUT_DIR/bin/`:
//! `metalift-hostile` (links `normal/`) and `metalift-hostile-late` (dlopens
//! `$HOSTILE_METAL`).
//!
//! `metalift-probe` (and the llama-bench test double, the package's example)
//! links `normal/` with a `DT_RUNPATH` to it, the way llama.cpp links
//! Metal.framework; a test swaps in another variant with `LD_LIBRARY_PATH`
//! (searched before `DT_RUNPATH`). The directory is exported to the package's code
//! as `env!("SIMMETAL_DIR")`, and `metalift-probe --simmetal-dir` prints it, so
//! tests, the benchmark and `metalift demo` never guess a hashed path.
//! `metalift-probe-dlopen` links nothing and `dlopen`s the path it is given.
//!
//! Set `SIMMETAL_CC` to use another compiler than `gcc` (it must have an
//! Objective-C front end for the GCC runtime: Debian's `gobjc-12`).

use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCE: &str = "simmetal/simmetal.m";

/// The compute path (kernels compiled from source, run, read back), in every variant.
const COMPUTE: &str = "simmetal/compute.m";

const HOSTILE: &str = "hostile/hostile.c";

/// The second shim (Cua's, simulated).
const PEER_SHIM: &str = "second_shim/peer_shim.m";

/// (directory, file, defines).
const VARIANTS: [(&str, &str, &[&str]); 13] = [
    ("normal", "libsimmetal.so", &[]),
    (
        "noinit",
        "libsimmetal.so",
        &["-DSIMMETAL_NO_INIT_GPU_FAMILY_SUPPORT"],
    ),
    ("nows", "libsimmetal.so", &["-DSIMMETAL_NO_WORKING_SET"]),
    ("moved", "libsimmetal.so", &["-DSIMMETAL_MOVED"]),
    ("cached", "libsimmetal.so", &["-DSIMMETAL_CACHED"]),
    ("wrapper", "libsimmetal.so", &["-DSIMMETAL_WRAPPER"]),
    ("wrapper", "libsimmetal_tools.so", &["-DSIMMETAL_TOOLS"]),
    ("lateclasses", "libsimmetal.so", &["-DSIMMETAL_STUB"]),
    (
        "lateclasses",
        "libsimmetal_driver.so",
        &["-DSIMMETAL_DRIVER"],
    ),
    (
        "nocompile",
        "libsimmetal.so",
        &["-DSIMMETAL_COMPUTE_NO_COMPILE"],
    ),
    (
        "wrongresults",
        "libsimmetal.so",
        &["-DSIMMETAL_COMPUTE_WRONG"],
    ),
    // A kernel that never completes (a separate entry: easy to merge).
    ("hang", "libsimmetal.so", &["-DSIMMETAL_COMPUTE_HANG"]),
    ("apple7", "libsimmetal.so", &["-DSIMMETAL_STOCK_APPLE7"]),
];

fn main() {
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-changed={COMPUTE}");
    println!("cargo:rerun-if-changed={HOSTILE}");
    println!("cargo:rerun-if-changed={PEER_SHIM}");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=SIMMETAL_CC");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rustc-env=SIMMETAL_DIR={}", out.display());
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        // macOS has the real Metal; nothing to simulate.
        return;
    }
    let cc = std::env::var("SIMMETAL_CC").unwrap_or_else(|_| "gcc".to_owned());
    for (name, file, defines) in VARIANTS {
        let dir = out.join(name);
        std::fs::create_dir_all(&dir).expect("create OUT_DIR/<variant>");
        compile(&cc, defines, file, &dir.join(file));
    }
    let normal = out.join("normal");
    peer_shim(&cc, &normal);
    let bin_dir = out.join("bin");
    std::fs::create_dir_all(&bin_dir).expect("create OUT_DIR/bin");
    hostile(&cc, &normal, &bin_dir.join("metalift-hostile"), false);
    hostile(&cc, &normal, &bin_dir.join("metalift-hostile-late"), true);
    // The probe, and the examples: the one example is the llama-bench test
    // double (`tests/llama_bench`), which asks the device as the probe does.
    for target in ["bin=metalift-probe", "examples"] {
        println!("cargo:rustc-link-arg-{target}=-L{}", normal.display());
        println!("cargo:rustc-link-arg-{target}=-lsimmetal");
        println!(
            "cargo:rustc-link-arg-{target}=-Wl,-rpath,{}",
            normal.display()
        );
    }
}

/// `normal/libsimpeer.so`: needs libsimmetal.so (found beside it, or in
/// `LD_LIBRARY_PATH` first, so a test can pair it with another variant).
fn peer_shim(cc: &str, normal: &Path) {
    let status = Command::new(cc)
        .args([
            "-x",
            "objective-c",
            "-std=gnu11",
            "-fPIC",
            "-shared",
            "-O2",
            "-Wall",
            "-Werror",
        ])
        .arg("-Wl,-soname,libsimpeer.so")
        .arg("-o")
        .arg(normal.join("libsimpeer.so"))
        .arg(PEER_SHIM)
        .arg("-Wl,--no-as-needed")
        .arg(format!("-L{}", normal.display()))
        .arg("-lsimmetal")
        .arg("-Wl,-rpath,$ORIGIN")
        .arg("-lobjc")
        .arg("-lpthread")
        .status();
    match status {
        Ok(s) if s.success() => {}
        other => panic!("{cc} failed building the second shim ({PEER_SHIM}): {other:?}"),
    }
}

fn hostile(cc: &str, normal: &Path, output: &Path, late: bool) {
    let mut cmd = Command::new(cc);
    cmd.args(["-O2", "-Wall", "-Werror", "-pthread", "-o"])
        .arg(output)
        .arg(HOSTILE);
    if late {
        cmd.arg("-DHOSTILE_LATE");
    } else {
        cmd.arg("-Wl,--no-as-needed")
            .arg(format!("-L{}", normal.display()))
            .arg("-lsimmetal")
            .arg(format!("-Wl,-rpath,{}", normal.display()));
    }
    cmd.arg("-ldl");
    match cmd.status() {
        Ok(s) if s.success() => {}
        other => panic!("{cc} failed building {}: {other:?}", output.display()),
    }
}

fn compile(cc: &str, defines: &[&str], file: &str, output: &Path) {
    let status = Command::new(cc)
        .args([
            "-x",
            "objective-c",
            "-fPIC",
            "-shared",
            "-O2",
            "-Wall",
            "-Werror",
        ])
        .arg(format!("-Wl,-soname,{file}"))
        .arg("-D_GNU_SOURCE")
        .args(defines)
        .arg("-o")
        .arg(output)
        .arg(SOURCE)
        .arg(COMPUTE)
        .arg("-Wl,--no-as-needed")
        .arg("-lobjc")
        .arg("-ldl")
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!(
            "{cc} failed ({s}) building the simulated Metal: install the GCC Objective-C \
             compiler and runtime (Debian: apt-get install gobjc-12 libobjc-12-dev)"
        ),
        Err(e) => panic!(
            "cannot run `{cc}` to build the simulated Metal ({e}): install gcc, gobjc-12 \
             and libobjc-12-dev, or set SIMMETAL_CC"
        ),
    }
}
