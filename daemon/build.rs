//! Compiles `c/oslog.c` (the unified log's format buffers, which only clang can
//! build) for macOS targets, when a C compiler for the target is at hand: on a Mac
//! host (Apple clang) or under cargo-zigbuild (which sets `CC_<target>`). On Linux a
//! plain `cargo check --target aarch64-apple-darwin` needs none: check does not link.

use std::env;

fn main() {
    println!("cargo:rerun-if-changed=c/oslog.c");
    println!("cargo:rerun-if-changed=c/metalift_oslog.h");
    println!("cargo:rerun-if-env-changed=TARGET_CC");
    let target = env::var("TARGET").unwrap_or_default();
    println!("cargo:rerun-if-env-changed=CC_{target}");
    println!("cargo:rerun-if-env-changed=CC_{}", target.replace('-', "_"));
    if env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("macos") {
        return;
    }
    let host = env::var("HOST").unwrap_or_default();
    let cross_cc = env::var_os("TARGET_CC").is_some()
        || env::var_os(format!("CC_{target}")).is_some()
        || env::var_os(format!("CC_{}", target.replace('-', "_"))).is_some();
    if !host.contains("apple-darwin") && !cross_cc {
        // cargo check/clippy from Linux: nothing links, the extern declarations suffice.
        return;
    }
    let source =
        std::path::Path::new(&env::var("CARGO_MANIFEST_DIR").unwrap_or_default()).join("c/oslog.c");
    // zig's cc (under cargo-zigbuild) leaves an empty `a.o` in the working
    // directory while cc-rs probes it: keep that out of the source tree.
    if let Some(out_dir) = env::var_os("OUT_DIR") {
        let _ = env::set_current_dir(out_dir);
    }
    // cc's defaults add -Wall -Wextra.
    cc::Build::new().file(source).compile("metalift_oslog");
}
