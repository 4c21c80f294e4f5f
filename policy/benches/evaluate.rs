//! Policy evaluation and load+compile at 10 / 1,000 / 10,000 / 100,000 rules of mixed
//! kinds (exact path, path glob, sha256, team_id + signing_id, name), for a subject
//! that hits an exact path, one that hits a glob, and one that matches nothing.
//! Then at 10,000 rules (8,000 exact paths, 2,000 path globs) with the globs in 50
//! directories or each in its own directory (issue 19: the matcher groups globs by
//! directory, and neither spread may cost more than the other).
//!
//! `cargo bench -p metalift-policy --bench evaluate`

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use metalift_policy::{compile_sources, Policy, Source, Subject};

const SIZES: [usize; 4] = [10, 1_000, 10_000, 100_000];

/// The sizes to run: all of them under `cargo bench`; only the small ones when
/// `cargo test --all-targets` runs this file once as a smoke test (no `--bench`).
fn sizes() -> &'static [usize] {
    if std::env::args().any(|a| a == "--bench") {
        &SIZES
    } else {
        &SIZES[..2]
    }
}

/// A policy of `n` rules; rule `i` is of kind `i % 5`.
fn policy_text(n: usize) -> String {
    let mut t = String::from("version = 1\n[profile.apple7]\napple_family_max = 7\n");
    for i in 0..n {
        let _ = write!(t, "[[rule]]\nid = \"r{i}\"\n");
        let _ = match i % 5 {
            0 => writeln!(t, "path = \"/opt/app{i}/bin/tool{i}\""),
            1 => writeln!(t, "path = \"/srv/g{i}/bin/llama-*\""),
            2 => writeln!(t, "sha256 = \"{i:064x}\""),
            3 => writeln!(
                t,
                "team_id = \"T{i:09}\"\nsigning_id = \"com.example.s{i}\""
            ),
            _ => writeln!(t, "name = \"tool-n{i}\""),
        };
        t.push_str(if i % 7 == 0 {
            "stock = true\n"
        } else {
            "unlock = \"apple7\"\n"
        });
    }
    t
}

fn compile(text: &str) -> Policy {
    match compile_sources(vec![Source::new("policy.toml", text)]) {
        Ok(l) => l.policy,
        Err(e) => panic!("bench policy is invalid: {e}"),
    }
}

/// The middle rule of a kind, so a hit is neither the first nor the last entry.
fn middle(n: usize, kind: usize) -> usize {
    let i = (n / 2) / 5 * 5 + kind;
    if i < n {
        i
    } else {
        kind
    }
}

fn subjects(n: usize) -> [(&'static str, Subject); 3] {
    let e = middle(n, 0);
    let g = middle(n, 1);
    let subject = |path: String| Subject {
        path: path.into(),
        uid: 501,
        ..Subject::default()
    };
    [
        ("hit-exact", subject(format!("/opt/app{e}/bin/tool{e}"))),
        ("hit-glob", subject(format!("/srv/g{g}/bin/llama-server"))),
        ("miss", subject("/usr/local/bin/nothing-matches".to_owned())),
    ]
}

fn evaluate(c: &mut Criterion) {
    let mut group = c.benchmark_group("evaluate");
    group.warm_up_time(Duration::from_millis(300));
    group.measurement_time(Duration::from_secs(1));
    // The daemon reads the clock once per decision, outside the evaluation.
    let now = std::time::SystemTime::now();
    for &n in sizes() {
        let policy = compile(&policy_text(n));
        for (label, subject) in subjects(n) {
            // Guard against benchmarking a miss by accident.
            let verdict = policy.evaluate(&subject, now);
            assert_eq!(verdict.rule.is_some(), label != "miss", "{label} at {n}");
            group.bench_with_input(BenchmarkId::new(label, n), &subject, |b, s| {
                b.iter(|| black_box(policy.evaluate(black_box(s), now)));
            });
        }
    }
    group.finish();
}

fn load_compile(c: &mut Criterion) {
    let mut group = c.benchmark_group("load_compile");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(100));
    group.measurement_time(Duration::from_secs(2));
    for &n in sizes() {
        let text = policy_text(n);
        group.bench_with_input(BenchmarkId::from_parameter(n), &text, |b, t| {
            b.iter(|| black_box(compile(t)));
        });
    }
    group.finish();
}

/// 8,000 exact-path rules and 2,000 glob rules, glob `i` being `glob(i)`.
fn spread_policy_text(glob: impl Fn(usize) -> String) -> String {
    let mut t = String::from("version = 1\n[profile.apple7]\napple_family_max = 7\n");
    for i in 0..8000 {
        let _ = writeln!(
            t,
            "[[rule]]\nid = \"e{i}\"\npath = \"/opt/exact-{i}/bin/tool\"\nunlock = \"apple7\""
        );
    }
    for i in 0..2000 {
        let _ = writeln!(
            t,
            "[[rule]]\nid = \"g{i}\"\npath = \"{}\"\nunlock = \"apple7\"",
            glob(i)
        );
    }
    t
}

fn glob_spread(c: &mut Criterion) {
    let mut group = c.benchmark_group("glob_spread");
    group.warm_up_time(Duration::from_millis(300));
    group.measurement_time(Duration::from_secs(1));
    let subject = |path: &str| Subject {
        path: path.into(),
        uid: 501,
        ..Subject::default()
    };
    let fifty_dirs = |i: usize| format!("/opt/tool-{}/bin/t{i}-*", i % 50);
    let own_dir_each = |i: usize| format!("/opt/fleet{i}/bin/*");
    let spreads = [
        (
            "50-dirs",
            spread_policy_text(fifty_dirs),
            subject("/opt/tool-27/bin/t1027-server"),
        ),
        (
            "2000-dirs",
            spread_policy_text(own_dir_each),
            subject("/opt/fleet1027/bin/server"),
        ),
    ];
    let now = std::time::SystemTime::now();
    for (label, text, hit) in spreads {
        let policy = compile(&text);
        let miss = subject("/usr/local/bin/nothing-matches");
        assert_eq!(
            policy.evaluate(&hit, now).rule.as_deref(),
            Some("g1027"),
            "{label}"
        );
        assert_eq!(policy.evaluate(&miss, now).rule, None, "{label}");
        for (kind, s) in [("hit-glob", &hit), ("miss", &miss)] {
            group.bench_with_input(BenchmarkId::new(kind, label), s, |b, s| {
                b.iter(|| black_box(policy.evaluate(black_box(s), now)));
            });
        }
    }
    group.finish();
}

criterion_group!(benches, evaluate, load_compile, glob_spread);
criterion_main!(benches);
