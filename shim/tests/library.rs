//! The built libmetalift.so: links libc only and exports only what
//! `shim/c/exports.txt` lists (contract 1 in PLAN.md).
#![cfg(target_os = "linux")]

use std::process::Command;

fn readelf(args: &[&str]) -> String {
    let output = Command::new("readelf")
        .args(args)
        .arg(metalift_shim::LIBRARY)
        .output()
        .expect("readelf (binutils) is installed");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn the_shim_needs_libc_and_nothing_else() {
    let dynamic = readelf(&["-d"]);
    let needed: Vec<&str> = dynamic
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split('[').nth(1)?.split(']').next())
        .collect();
    assert!(!needed.is_empty(), "{dynamic}");
    for library in &needed {
        assert!(
            *library == "libc.so.6" || library.starts_with("ld-linux"),
            "unexpected NEEDED {library}: {dynamic}"
        );
    }
}

#[test]
fn the_shim_exports_exactly_the_symbols_in_exports_txt() {
    let listed: Vec<String> = include_str!("../c/exports.txt")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    let symbols = readelf(&["--dyn-syms", "-W"]);
    let mut exported: Vec<String> = symbols
        .lines()
        .filter(|l| l.contains(" GLOBAL ") && !l.contains(" UND "))
        .filter_map(|l| l.split_whitespace().nth(7))
        .map(|name| name.split('@').next().unwrap_or(name).to_owned())
        .collect();
    exported.sort();
    exported.dedup();
    assert_eq!(exported, listed, "{symbols}");
}
