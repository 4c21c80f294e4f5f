//! Every plist and pkg XML file in the repository is well-formed XML, read by a
//! strict parser: launchd reads our plists with CoreFoundation, but admins' tools
//! (Python's plistlib, config management, MDM profile builders) check
//! well-formedness and refuse the whole file otherwise. The `plist` crate's reader
//! accepted `--` inside a comment, so it is not the judge here; roxmltree is.

use std::fs;
use std::path::{Path, PathBuf};

use plist::Value;

use super::{plist_dict, repo, LABEL};

/// Every `*.plist` under the repository, and the pkg's XML (`pkg/*.xml`), skipping
/// build output and version-control directories.
fn xml_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if name != "target" && name != ".git" && name != "node_modules" {
                    walk(&path, out);
                }
            } else if name.ends_with(".plist")
                || (name.ends_with(".xml") && path.parent() == Some(&repo().join("pkg")))
            {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&repo(), &mut out);
    out
}

/// Parses `text` as XML 1.0 with every well-formedness constraint checked (a DTD
/// declaration allowed: plists name Apple's).
fn parse_strictly(text: &str) -> Result<(), roxmltree::Error> {
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..roxmltree::ParsingOptions::default()
    };
    roxmltree::Document::parse_with_options(text, options).map(drop)
}

#[test]
fn every_plist_and_pkg_xml_file_is_well_formed_xml() {
    let files = xml_files();
    let names: Vec<_> = files
        .iter()
        .map(|f| f.strip_prefix(repo()).unwrap().display().to_string())
        .collect();
    for expected in [
        "launchd/LaunchAgents/com.metalift.metaliftd.plist",
        "launchd/LaunchDaemons/com.metalift.metaliftd.plist",
        "pkg/Distribution.xml",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} not found among {names:?}"
        );
    }
    let refused: Vec<String> = files
        .iter()
        .filter_map(|file| {
            let text = fs::read_to_string(file).unwrap();
            parse_strictly(&text)
                .err()
                .map(|e| format!("{}: {e}", file.display()))
        })
        .collect();
    assert!(
        refused.is_empty(),
        "not well-formed XML:\n{}",
        refused.join("\n")
    );
}

#[test]
fn a_double_hyphen_inside_a_comment_is_refused() {
    // The defect the test above guards against, shown to the parser directly.
    let bad = "<?xml version=\"1.0\"?>\n<!-- log show --predicate x -->\n<plist version=\"1.0\"><dict/></plist>\n";
    assert!(parse_strictly(bad).is_err());
    assert!(parse_strictly(&bad.replace("--predicate", "predicate")).is_ok());
}

#[test]
fn both_launchd_jobs_run_interactive_so_check_ins_are_never_throttled() {
    for kind in ["LaunchAgents", "LaunchDaemons"] {
        let path = repo().join(format!("launchd/{kind}/{LABEL}.plist"));
        let dict = plist_dict(&path);
        // Adaptive boosts only on XPC activity, and the shim's socket check-ins
        // carry none (see the plist's comment, launchd.plist(5) ProcessType).
        assert_eq!(
            dict.get("ProcessType").and_then(Value::as_string),
            Some("Interactive"),
            "{kind}"
        );
        let text = fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("cannot be made Adaptive") || text.contains("never boosts an Adaptive"),
            "{kind}: the plist says why it is Interactive"
        );
    }
}
