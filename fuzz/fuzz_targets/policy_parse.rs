//! Fuzzes the policy parser and validator: any text either compiles or yields
//! diagnostics that render; a compiled policy decides and explains without panicking,
//! and `evaluate` agrees with `explain`; wherever the fast path for plain policy
//! files answers, it agrees with the general parser.
//!
//! A `\n#--\n` line splits the input into a main file and a policy.d/ drop-in, so
//! cross-file checks (duplicates, profile references, `mode` placement) are reached.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metalift_policy::{compile_sources, LoadError, Source, Subject};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for part in text.split("\n#--\n").take(4) {
        // The fast path for plain files reads them as the general path does.
        assert!(metalift_policy::fast_parse_agrees(part), "fast parse disagrees:\n{part}");
    }
    let sources: Vec<Source> = text
        .split("\n#--\n")
        .take(4)
        .enumerate()
        .map(|(i, part)| Source::new(format!("policy.d/{i}.toml"), part))
        .collect();
    match compile_sources(sources) {
        Ok(loaded) => {
            for d in &loaded.warnings {
                let _ = d.render(&loaded.sources);
            }
            let subject = Subject {
                path: "/opt/llama.cpp/bin/llama-server".into(),
                uid: 501,
                user: Some("ci".into()),
                parent_path: Some("/bin/zsh".into()),
                sha256: Some([0xaa; 32]),
                cdhash: Some(vec![0xcc; 20]),
                team_id: Some("ABCDE12345".into()),
                signing_id: Some("org.ggml.llama-server".into()),
                anchor: Some(metalift_policy::Anchor::Apple),
                unreadable: None,
            };
            let fast = loaded.policy.evaluate(&subject, std::time::SystemTime::now());
            let slow = loaded.policy.explain(&subject, std::time::SystemTime::now());
            assert_eq!(fast.rule, slow.rule);
            assert_eq!(fast.action, slow.action);
            assert_eq!(slow.trace.len(), loaded.policy.rule_count());
        }
        Err(LoadError::Invalid {
            diagnostics,
            sources,
        }) => {
            assert!(diagnostics.iter().any(|d| d.is_error()));
            for d in &diagnostics {
                assert!(d.line >= 1 && d.col >= 1);
                let _ = d.render(&sources);
            }
        }
        Err(other) => panic!("compile_sources returned a non-Invalid error: {other}"),
    }
});
