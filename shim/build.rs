//! Builds libmetalift from `shim/c/*.c` with the system C compiler.
//!
//! # What it produces
//!
//! - **Linux target**: `libmetalift.so` (`-O2 -fPIC -fvisibility=hidden`, the
//!   version script made from `c/exports.txt`, libc only), written to `OUT_DIR`
//!   and copied to `target/<profile>/libmetalift.so` — the directory three levels
//!   above `OUT_DIR` (`target/<profile>/build/metalift-shim-<hash>/out`, or
//!   `target/<triple>/<profile>/...` when cross-compiling), where `cargo build`
//!   puts the workspace's binaries. `metalift exec`, `metalift demo`,
//!   `pkg/stage.sh`, the probe tests and the benchmark find it there, as they
//!   found the Rust cdylib before. Its full path is also exported to this crate
//!   as `env!("METALIFT_SHIM_LIBRARY")` ([`metalift_shim::LIBRARY`]).
//! - **macOS host and target**: `libmetalift.dylib` with clang, install name
//!   `/usr/local/metalift/lib/libmetalift.dylib`, no exported symbol, copied the
//!   same way. (pkg/build.sh builds the shipped arm64 + arm64e + x86_64 slices itself.)
//! - **Any other combination** (e.g. `cargo check --target aarch64-apple-darwin`
//!   on Linux): nothing; the crate has no C then.
//! - **For this crate's own tests** (whenever the target is the host): the pure
//!   C helpers (`wire.c`, `config.c`) as a static library, linked into the rlib,
//!   and `cfg(shim_c)` so the FFI module exists.
//!
//! `CC` overrides the compiler (default `cc`; `clang` on macOS). When
//! `cargo fuzz` builds (`cfg(fuzzing)`), the static library is compiled with
//! clang's `-fsanitize=fuzzer-no-link` if a clang is found, so libFuzzer sees
//! the C decoder's coverage.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The shim's C sources, one concern each (see c/metalift_shim.h).
const SOURCES: [&str; 14] = [
    "c/job.c",
    "c/loader.c",
    "c/fork.c",
    "c/session.c",
    "c/socket.c",
    "c/wire.c",
    "c/hook.c",
    "c/imp_owner.c",
    "c/macho.c",
    "c/log.c",
    "c/config.c",
    "c/xpc.c",
    "c/unresponsive.c",
    "c/xpc_reply.c",
];
/// The pure helpers the Rust tests and the fuzz target call.
const TESTED: [&str; 5] = [
    "c/wire.c",
    "c/config.c",
    "c/xpc_reply.c",
    "c/job.c",
    "c/macho.c",
];
/// `-fno-jump-tables`: on arm64e a jump table's `br` is an indirect branch no
/// pointer-authentication key covers (scripts/shim-arm64e-check.sh refuses it);
/// the same flags on every target keep one object code shape.
const FLAGS: [&str; 8] = [
    "-O2",
    "-fno-jump-tables",
    "-fPIC",
    "-fvisibility=hidden",
    "-std=c11",
    "-Wall",
    "-Wextra",
    "-Werror",
];

/// `-DML_SHIM_VERSION="…"`: the shim reports the workspace's version (the one
/// `Cargo.toml` sets for every crate), from this one place, like the CLI and the
/// daemon; pkg/build.sh passes the same define from the same line.
fn version_define() -> String {
    format!(
        "-DML_SHIM_VERSION=\"{}\"",
        std::env::var("CARGO_PKG_VERSION").expect("cargo sets CARGO_PKG_VERSION")
    )
}

fn main() {
    println!("cargo:rerun-if-changed=c");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CC");
    println!("cargo::rustc-check-cfg=cfg(shim_c)");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let host = std::env::var("HOST").unwrap_or_default();
    let target = std::env::var("TARGET").unwrap_or_default();
    let host_is_mac = host.contains("apple-darwin");
    let native = host == target;

    let library = match target_os.as_str() {
        "linux" => Some(build_linux(&out)),
        "macos" if host_is_mac => Some(build_macos(&out)),
        _ => None,
    };
    if let Some(library) = &library {
        let profile_dir = out
            .ancestors()
            .nth(3)
            .expect("OUT_DIR is target/<profile>/build/<crate>/out");
        let name = library.file_name().expect("library has a name");
        let installed = profile_dir.join(name);
        let staging = profile_dir.join(format!(".{}.tmp", name.to_string_lossy()));
        std::fs::copy(library, &staging).expect("copy libmetalift next to the binaries");
        std::fs::rename(&staging, &installed).expect("install libmetalift next to the binaries");
        println!(
            "cargo:rustc-env=METALIFT_SHIM_LIBRARY={}",
            installed.display()
        );
    } else {
        println!("cargo:rustc-env=METALIFT_SHIM_LIBRARY=");
    }
    if native && (target_os == "linux" || target_os == "macos") {
        build_test_helpers(&out);
        generate_bindings(&out);
        println!("cargo:rustc-cfg=shim_c");
    }
}

/// The C functions the tests and the fuzz target call (src/c.rs).
const TESTED_FUNCTIONS: &str = "ml_known_family|ml_wire_frame_length|ml_wire_decode_verdict|\
ml_wire_encode_check_in|ml_wire_encode_check_in_job|ml_wire_encode_outcome|ml_job_format|\
ml_expected_answers|ml_config_parse_timeout|ml_config_socket_path|\
ml_config_agent_dir_trustworthy|ml_xpc_next_step|ml_macho_is_metal|ml_macho_holds";

/// `OUT_DIR/c_bindings.rs`: those functions, with every struct, enum and
/// constant they speak, generated from c/metalift_shim.h by bindgen, so the
/// Rust side has no hand-kept copy of a C layout (src/c.rs includes it).
fn generate_bindings(out: &Path) {
    let bindings = bindgen::Builder::default()
        .header("c/metalift_shim.h")
        .clang_arg(version_define())
        // bindgen leaves out functions declared hidden; the tests link them
        // from libmetalift_c.a, where hidden is no obstacle.
        .clang_arg("-DML_HIDDEN=")
        .allowlist_function(TESTED_FUNCTIONS)
        .allowlist_var("ML_(RESULT|OTHER|DECLINED)_.*")
        // `ml_wire_status` / `ml_xpc_next` as integer constants named as in C
        // (ML_WIRE_OVERSIZE): a C enum may hold any value, a Rust enum may not.
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .generate_comments(false)
        .generate()
        .unwrap_or_else(|e| {
            panic!(
                "bindgen over c/metalift_shim.h: {e} (it needs libclang: \
                 `bash scripts/setup.sh` installs Debian's libclang1-22)"
            )
        });
    bindings
        .write_to_file(out.join("c_bindings.rs"))
        .expect("write OUT_DIR/c_bindings.rs");
}

fn compiler(default: &str) -> String {
    std::env::var("CC").unwrap_or_else(|_| default.to_owned())
}

fn build_linux(out: &Path) -> PathBuf {
    let exports = std::fs::read_to_string("c/exports.txt").expect("read c/exports.txt");
    let mut script = String::from("{\n  global:\n");
    for symbol in exports.lines().map(str::trim).filter(|l| !l.is_empty()) {
        script.push_str(&format!("    {symbol};\n"));
    }
    script.push_str("  local: *;\n};\n");
    let map = out.join("exports.map");
    std::fs::write(&map, script).expect("write the version script");
    let library = out.join("libmetalift.so");
    let mut cmd = Command::new(compiler("cc"));
    cmd.args(FLAGS)
        .arg(version_define())
        .args(["-shared", "-Wl,--as-needed", "-Wl,-z,relro"])
        .arg("-Wl,-soname,libmetalift.so")
        .arg(format!("-Wl,--version-script={}", map.display()))
        .arg("-o")
        .arg(&library)
        .args(SOURCES)
        // glibc < 2.34 keeps dlsym/pthread_atfork in libdl/libpthread; with
        // --as-needed they are recorded only where they are still separate.
        .args(["-ldl", "-lpthread"]);
    run(cmd, "libmetalift.so");
    library
}

fn build_macos(out: &Path) -> PathBuf {
    // The slice cargo asked for (pkg/build.sh builds arm64, arm64e and x86_64 and lipos them).
    let target = std::env::var("TARGET").unwrap_or_default();
    let arch = if target.starts_with("arm64e") {
        "arm64e"
    } else if target.starts_with("aarch64") {
        "arm64"
    } else {
        "x86_64"
    };
    let empty = out.join("exports-none.txt");
    std::fs::write(&empty, "").expect("write the empty export list");
    let library = out.join("libmetalift.dylib");
    let mut cmd = Command::new(compiler("clang"));
    cmd.args(FLAGS)
        .arg(version_define())
        .arg("-fblocks")
        .args(["-arch", arch, "-dynamiclib", "-mmacosx-version-min=13.0"])
        .arg("-Wl,-install_name,/usr/local/metalift/lib/libmetalift.dylib")
        .arg(format!("-Wl,-exported_symbols_list,{}", empty.display()))
        .arg("-o")
        .arg(&library)
        .args(SOURCES);
    run(cmd, "libmetalift.dylib");
    library
}

/// `wire.c` and `config.c` as `libmetalift_c.a`, for the cross-implementation
/// tests and the fuzz target.
fn build_test_helpers(out: &Path) {
    let fuzzing = std::env::var_os("CARGO_CFG_FUZZING").is_some();
    let (cc, extra): (String, &[&str]) = match fuzzing.then(find_clang).flatten() {
        Some(clang) => (clang, &["-fsanitize=fuzzer-no-link"]),
        None => (compiler("cc"), &[]),
    };
    let mut objects = Vec::new();
    for source in TESTED {
        let object = out.join(format!(
            "{}.o",
            Path::new(source).file_stem().unwrap().to_string_lossy()
        ));
        let mut cmd = Command::new(&cc);
        cmd.args(FLAGS)
            .arg(version_define())
            .args(extra)
            .arg("-c")
            .arg(source)
            .arg("-o")
            .arg(&object);
        run(cmd, source);
        objects.push(object);
    }
    let archive = out.join("libmetalift_c.a");
    let _ = std::fs::remove_file(&archive);
    let mut ar = Command::new(std::env::var("AR").unwrap_or_else(|_| "ar".to_owned()));
    ar.arg("crs").arg(&archive).args(&objects);
    run(ar, "libmetalift_c.a");
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static=metalift_c");
}

fn find_clang() -> Option<String> {
    ["clang", "clang-22", "clang-19", "clang-16", "clang-14"]
        .into_iter()
        .find(|c| Command::new(c).arg("--version").output().is_ok())
        .map(str::to_owned)
}

fn run(mut cmd: Command, what: &str) {
    match cmd.status() {
        Ok(status) if status.success() => {}
        Ok(status) => panic!("building {what} failed ({status}): {cmd:?}"),
        Err(e) => panic!(
            "cannot run the C compiler to build {what} ({e}): install a C compiler \
             (Debian: apt-get install gcc) or set CC"
        ),
    }
}
