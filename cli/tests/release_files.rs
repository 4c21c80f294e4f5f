//! The release's files, checked on Linux: the workflow's scripts
//! (scripts/release-version.sh, release-mode.sh, release-notarize.sh,
//! release-cask.sh), the MDM profiles in profiles/ (plists with the keys Apple
//! documents for their payload types), and the Homebrew cask template (`ruby -c`).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use plist::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn script(name: &str) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg(repo().join("scripts").join(name));
    cmd
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

const VERSION: &str = env!("CARGO_PKG_VERSION");

#[test]
fn the_tag_of_the_crates_version_passes_and_any_other_fails() {
    let out = script("release-version.sh")
        .arg(format!("v{VERSION}"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), VERSION);
    let out = script("release-version.sh")
        .arg(format!("refs/tags/v{VERSION}"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    for tag in ["v99.0.0", VERSION, "v0.1", "latest"] {
        let out = script("release-version.sh").arg(tag).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{tag}: {}", text(&out));
    }
}

#[test]
fn the_pkg_must_carry_the_tags_version_too() {
    let dir = tempfile::tempdir().unwrap();
    let info = dir.path().join("PackageInfo");
    // The root element pkgbuild writes (pkgutil --expand's PackageInfo).
    for (pkg_version, ok) in [(VERSION, true), ("0.0.9", false)] {
        fs::write(
            &info,
            format!(
                "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<pkg-info overwrite-permissions=\"true\" relocatable=\"false\" identifier=\"com.metalift.pkg\" postinstall-action=\"none\" version=\"{pkg_version}\" format-version=\"2\" generator-version=\"InstallCmds-1000\" install-location=\"/usr/local/metalift\" auth=\"root\">\n</pkg-info>\n"
            ),
        )
        .unwrap();
        let out = script("release-version.sh")
            .arg(format!("v{VERSION}"))
            .arg("--package-info")
            .arg(&info)
            .output()
            .unwrap();
        assert_eq!(
            out.status.success(),
            ok,
            "pkg {pkg_version}: {}",
            text(&out)
        );
    }
}

const SECRETS: [&str; 7] = [
    "DEVELOPER_ID_APPLICATION_P12",
    "DEVELOPER_ID_INSTALLER_P12",
    "P12_PASSWORD",
    "NOTARY_KEY",
    "NOTARY_KEY_ID",
    "NOTARY_ISSUER",
    "TEAM_ID",
];

/// release-mode.sh with `set` secrets: (exit, $GITHUB_OUTPUT, $GITHUB_STEP_SUMMARY).
fn mode(set: &[&str]) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let (output, summary) = (dir.path().join("output"), dir.path().join("summary"));
    let mut cmd = script("release-mode.sh");
    cmd.env("GITHUB_OUTPUT", &output)
        .env("GITHUB_STEP_SUMMARY", &summary);
    for name in SECRETS {
        cmd.env_remove(name);
    }
    for name in set {
        cmd.env(
            name,
            if *name == "TEAM_ID" {
                "ABCDE12345"
            } else {
                "secret"
            },
        );
    }
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        fs::read_to_string(output).unwrap_or_default(),
        fs::read_to_string(summary).unwrap_or_default(),
    )
}

#[test]
fn without_signing_secrets_the_build_is_unsigned_and_the_summary_says_so() {
    let (code, output, summary) = mode(&[]);
    assert_eq!(code, Some(0));
    assert_eq!(output, "mode=unsigned\n");
    assert!(
        summary.contains("UNSIGNED build: not a release"),
        "{summary}"
    );
}

#[test]
fn with_every_secret_the_build_is_signed_and_with_some_it_fails() {
    let (code, output, summary) = mode(&SECRETS);
    assert_eq!((code, output.as_str()), (Some(0), "mode=signed\n"));
    assert!(summary.is_empty(), "{summary}");
    let (code, output, _) = mode(&SECRETS[..3]);
    assert_eq!(code, Some(1));
    assert!(
        output.is_empty(),
        "a half-configured environment decides nothing: {output}"
    );
}

/// An `xcrun` that answers `notarytool submit` with `json` and logs `notarytool log`.
fn fake_xcrun(dir: &Path, json: &str) -> PathBuf {
    let path = dir.join("xcrun");
    fs::write(
        &path,
        format!(
            "#!/bin/sh\ncase \"$1 $2\" in\n  'notarytool submit') echo '{json}' ;;\n  'notarytool log') echo \"LOG for $3\" >\"{}\"; echo '{{\"issues\":[{{\"message\":\"The binary is not signed.\"}}]}}' ;;\n  *) exit 64 ;;\nesac\n",
            dir.join("log-called").display()
        ),
    )
    .unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn notarize(json: &str) -> (Output, Option<String>) {
    let dir = tempfile::tempdir().unwrap();
    let xcrun = fake_xcrun(dir.path(), json);
    let out = script("release-notarize.sh")
        .arg(dir.path().join("metalift.pkg"))
        .env("XCRUN", xcrun)
        .env("NOTARY_KEY_PATH", dir.path().join("key.p8"))
        .env("NOTARY_KEY_ID", "KEYID")
        .env("NOTARY_ISSUER", "issuer")
        .output()
        .unwrap();
    (out, fs::read_to_string(dir.path().join("log-called")).ok())
}

#[test]
fn notarization_passes_only_on_accepted_and_fetches_the_log_otherwise() {
    // The JSON notarytool submit --wait --output-format json prints.
    let (out, log) = notarize(
        r#"{"id":"2efe2717-52ef-43a5-96dc-0797e4ca1041","message":"Processing complete","status":"Accepted"}"#,
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(log, None);
    for status in ["Invalid", "Rejected", "In Progress"] {
        let (out, log) = notarize(&format!(
            r#"{{"id":"2efe2717-52ef-43a5-96dc-0797e4ca1041","message":"Processing complete","status":"{status}"}}"#
        ));
        assert_eq!(out.status.code(), Some(1), "{status}: {}", text(&out));
        assert_eq!(
            log.as_deref(),
            Some("LOG for 2efe2717-52ef-43a5-96dc-0797e4ca1041\n"),
            "{status}"
        );
        assert!(
            text(&out).contains("The binary is not signed."),
            "{}",
            text(&out)
        );
    }
    let (out, _) = notarize("not json");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
}

#[test]
fn the_filled_cask_is_valid_ruby_with_pkg_uninstall_and_zap() {
    let sum = "ab".repeat(32);
    let out = script("release-cask.sh")
        .args([
            VERSION,
            &sum,
            "https://example.invalid/metalift.pkg",
            "https://example.invalid/metalift",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let cask = String::from_utf8(out.stdout).unwrap();
    for want in [
        format!("version \"{VERSION}\""),
        format!("sha256 \"{sum}\""),
        "pkg \"metalift-#{version}.pkg\"".to_owned(),
        "uninstall launchctl: \"com.metalift.metaliftd\"".to_owned(),
        "pkgutil:   \"com.metalift.pkg\"".to_owned(),
        "zap delete:".to_owned(),
    ] {
        assert!(cask.contains(&want), "no {want} in:\n{cask}");
    }
    assert!(!cask.contains('@'), "a placeholder left: {cask}");
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("metalift.rb"), &cask).unwrap();
    let ruby = Command::new("ruby")
        .arg("-c")
        .arg(dir.path().join("metalift.rb"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run ruby ({e}): install it (scripts/setup.sh)"));
    assert!(ruby.status.success(), "ruby -c: {}", text(&ruby));
    let bad = script("release-cask.sh")
        .args([VERSION, "not-a-sum", "u", "h"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(1), "{}", text(&bad));
}

fn profile(name: &str) -> plist::Dictionary {
    let path = repo().join("profiles").join(name);
    // A second reader besides the plist crate: Debian's plistutil (libplist), or
    // on a Mac Apple's own plutil.
    let other = if cfg!(target_os = "macos") {
        Command::new("plutil").arg("-lint").arg(&path).output()
    } else {
        Command::new("plistutil")
            .arg("-i")
            .arg(&path)
            .arg("-o")
            .arg("/dev/null")
            .output()
    }
    .unwrap_or_else(|e| {
        panic!("cannot run plistutil ({e}): install libplist-utils (scripts/setup.sh)")
    });
    assert!(other.status.success(), "plistutil: {}", text(&other));
    Value::from_file(&path)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .into_dictionary()
        .expect("a profile is a dictionary")
}

fn string<'a>(d: &'a plist::Dictionary, key: &str) -> &'a str {
    d.get(key)
        .and_then(Value::as_string)
        .unwrap_or_else(|| panic!("no string {key} in {d:?}"))
}

/// The keys every configuration profile and payload carries (Apple's
/// TopLevel and CommonPayloadKeys), and the one payload of `payload_type`.
fn payload(name: &str, payload_type: &str) -> plist::Dictionary {
    let top = profile(name);
    assert_eq!(string(&top, "PayloadType"), "Configuration");
    for key in ["PayloadIdentifier", "PayloadUUID", "PayloadDisplayName"] {
        assert!(!string(&top, key).is_empty());
    }
    assert_eq!(
        top.get("PayloadVersion")
            .and_then(Value::as_unsigned_integer),
        Some(1)
    );
    let content = top["PayloadContent"]
        .as_array()
        .expect("PayloadContent array");
    assert_eq!(content.len(), 1);
    let p = content[0].as_dictionary().unwrap().clone();
    assert_eq!(string(&p, "PayloadType"), payload_type);
    for key in ["PayloadIdentifier", "PayloadUUID"] {
        assert!(!string(&p, key).is_empty());
    }
    assert_eq!(
        p.get("PayloadVersion").and_then(Value::as_unsigned_integer),
        Some(1)
    );
    let uuids = [string(&top, "PayloadUUID"), string(&p, "PayloadUUID")];
    assert_ne!(uuids[0], uuids[1]);
    p
}

#[test]
fn the_background_items_profile_names_metaliftd_and_the_team() {
    let p = payload(
        "metalift-background-items.mobileconfig",
        "com.apple.servicemanagement",
    );
    let rules = p["Rules"].as_array().expect("Rules array");
    let mut kinds = Vec::new();
    for rule in rules {
        let rule = rule.as_dictionary().unwrap();
        let kind = string(rule, "RuleType");
        assert!(
            [
                "BundleIdentifier",
                "BundleIdentifierPrefix",
                "Label",
                "LabelPrefix",
                "TeamIdentifier"
            ]
            .contains(&kind),
            "{kind}"
        );
        kinds.push((kind.to_owned(), string(rule, "RuleValue").to_owned()));
        for key in rule.keys() {
            assert!(
                ["RuleType", "RuleValue", "Comment", "TeamIdentifier"].contains(&key.as_str()),
                "{key}"
            );
        }
        if kind == "Label" {
            assert_eq!(string(rule, "TeamIdentifier"), "TEAMID");
        }
    }
    assert!(
        kinds.contains(&("Label".into(), "com.metalift.metaliftd".into())),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&("TeamIdentifier".into(), "TEAMID".into())),
        "{kinds:?}"
    );
}

#[test]
fn the_pppc_profile_grants_exactly_full_disk_access_to_metaliftd() {
    let p = payload(
        "metalift-full-disk-access.mobileconfig",
        "com.apple.TCC.configuration-profile-policy",
    );
    let services = p["Services"].as_dictionary().expect("Services");
    assert_eq!(
        services.keys().collect::<Vec<_>>(),
        ["SystemPolicyAllFiles"]
    );
    let identities = services["SystemPolicyAllFiles"].as_array().unwrap();
    assert_eq!(identities.len(), 1);
    let id = identities[0].as_dictionary().unwrap();
    assert_eq!(
        string(id, "Identifier"),
        "/usr/local/metalift/bin/metaliftd"
    );
    assert_eq!(string(id, "IdentifierType"), "path");
    assert_eq!(string(id, "Authorization"), "Allow");
    let requirement = string(id, "CodeRequirement");
    assert!(
        requirement.starts_with("identifier \"com.metalift.metaliftd\" and anchor apple generic"),
        "{requirement}"
    );
    assert!(
        requirement.ends_with("certificate leaf[subject.OU] = \"TEAMID\""),
        "{requirement}"
    );
    // The path is the pkg's (launchd/LaunchDaemons names the same program).
    let daemon =
        fs::read_to_string(repo().join("launchd/LaunchDaemons/com.metalift.metaliftd.plist"))
            .unwrap();
    assert!(daemon.contains("/usr/local/metalift/bin/metaliftd"));
}
