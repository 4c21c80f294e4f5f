//! macOS reasons why dyld will drop `DYLD_INSERT_LIBRARIES` for a target: System
//! Integrity Protection and the Hardened Runtime.
//!
//! The code-signature checks ask `/usr/bin/codesign` rather than parsing the
//! embedded signature: it is on every Mac, it understands every signature
//! format Apple has shipped, and its output for these two questions (the
//! CodeDirectory flags and the entitlements as an XML plist) has been stable
//! for a decade. If it is missing or fails, the check says nothing rather than
//! guess. The parsers below are plain functions, unit-tested on any OS.

use std::path::Path;
use std::process::Command;

/// Directories whose binaries are SIP-protected ("restricted"): dyld ignores
/// every `DYLD_*` variable in them and purges the variables from their
/// children, so a protected `/bin/sh` or `/usr/bin/env` in a launch chain
/// strips the shim from everything after it.
const SIP_PROTECTED: &[&str] = &[
    "/bin",
    "/sbin",
    "/usr/bin",
    "/usr/sbin",
    "/usr/libexec",
    "/System",
];

/// `CS_RUNTIME`: the Hardened Runtime flag in a CodeDirectory.
const CS_RUNTIME: u64 = 0x0001_0000;

const ALLOW_DYLD_ENV: &str = "com.apple.security.cs.allow-dyld-environment-variables";
const DISABLE_LIBRARY_VALIDATION: &str = "com.apple.security.cs.disable-library-validation";

/// Whether `path` (already resolved through symlinks) lies in a SIP-protected directory.
pub fn is_sip_protected(path: &Path) -> bool {
    SIP_PROTECTED.iter().any(|dir| path.starts_with(dir))
}

/// Why the Hardened Runtime will keep the shim out of `path`, if it will.
pub fn hardened_runtime_problem(path: &Path) -> Option<String> {
    let details = Command::new("codesign")
        .args(["--display", "--verbose=2", "--"])
        .arg(path)
        .output()
        .ok()?;
    // codesign prints the details on stderr; an unsigned binary fails here.
    if !details.status.success() || !has_runtime_flag(&String::from_utf8_lossy(&details.stderr)) {
        return None;
    }
    let entitlements = Command::new("codesign")
        .args(["--display", "--entitlements", "-", "--xml", "--"])
        .arg(path)
        .output()
        .ok()?;
    let xml = String::from_utf8_lossy(&entitlements.stdout);
    if !entitlement_is_true(&xml, ALLOW_DYLD_ENV) {
        return Some(format!(
            "{} uses the Hardened Runtime without {ALLOW_DYLD_ENV}: dyld ignores \
             DYLD_INSERT_LIBRARIES for it",
            path.display()
        ));
    }
    if !entitlement_is_true(&xml, DISABLE_LIBRARY_VALIDATION) {
        return Some(format!(
            "{} uses the Hardened Runtime with library validation: dyld loads the shim \
             only if it is signed by the same team (or the target has {DISABLE_LIBRARY_VALIDATION})",
            path.display()
        ));
    }
    None
}

/// Whether `codesign --display --verbose=2` output shows `flags=0x…` with `CS_RUNTIME` set.
pub fn has_runtime_flag(codesign_details: &str) -> bool {
    codesign_details
        .lines()
        .filter(|line| line.starts_with("CodeDirectory"))
        .flat_map(str::split_whitespace)
        .filter_map(|word| word.strip_prefix("flags=0x"))
        .filter_map(|hex| {
            let digits = hex.split('(').next().unwrap_or(hex);
            u64::from_str_radix(digits, 16).ok()
        })
        .any(|flags| flags & CS_RUNTIME != 0)
}

/// Whether the entitlements plist (XML) sets `key` to `<true/>`.
pub fn entitlement_is_true(xml: &str, key: &str) -> bool {
    let needle = format!("<key>{key}</key>");
    xml.match_indices(&needle)
        .any(|(at, _)| xml[at + needle.len()..].trim_start().starts_with("<true/>"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_directories_are_protected_and_usr_local_is_not() {
        assert!(is_sip_protected(Path::new("/bin/sh")));
        assert!(is_sip_protected(Path::new("/usr/bin/env")));
        assert!(is_sip_protected(Path::new(
            "/System/Library/Frameworks/Python.framework/python3"
        )));
        assert!(!is_sip_protected(Path::new("/usr/local/bin/llama-server")));
        assert!(!is_sip_protected(Path::new("/opt/homebrew/bin/python3")));
        // A prefix match on whole components only.
        assert!(!is_sip_protected(Path::new("/binaries/tool")));
    }

    #[test]
    fn runtime_flag_is_read_from_the_code_directory_line() {
        let hardened = "Executable=/Applications/X.app/Contents/MacOS/X\n\
            Identifier=com.example.x\nFormat=app bundle with Mach-O thin (arm64)\n\
            CodeDirectory v=20500 size=1234 flags=0x10000(runtime) hashes=27+7 location=embedded\n";
        let plain =
            "CodeDirectory v=20400 size=573 flags=0x2(adhoc) hashes=13+2 location=embedded\n";
        assert!(has_runtime_flag(hardened));
        assert!(!has_runtime_flag(plain));
        assert!(!has_runtime_flag("code object is not signed at all\n"));
    }

    #[test]
    fn entitlement_must_be_true_not_merely_present() {
        let xml = format!(
            "<?xml version=\"1.0\"?><plist version=\"1.0\"><dict>\n\
             \t<key>{ALLOW_DYLD_ENV}</key>\n\t<true/>\n\
             \t<key>{DISABLE_LIBRARY_VALIDATION}</key>\n\t<false/>\n</dict></plist>"
        );
        assert!(entitlement_is_true(&xml, ALLOW_DYLD_ENV));
        assert!(!entitlement_is_true(&xml, DISABLE_LIBRARY_VALIDATION));
        assert!(!entitlement_is_true("", ALLOW_DYLD_ENV));
    }
}
