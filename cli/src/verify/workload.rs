//! `metalift verify --workload -- CMD…`: the workload's own speed-up. The command
//! runs stock (the shim disabled) and unlocked (the scratch daemon's profile),
//! `--workload-runs` times each, alternately (so a machine getting slower or
//! faster meanwhile weighs on both), each run a process group killed at the
//! verification's `--timeout` ([`super::bounded`]).
//!
//! What is measured: for llama.cpp's `llama-bench -o json` (or `jsonl`) output,
//! each test's tokens per second (`avg_ts`), prompt processing (`ppN`) and
//! generation (`tgN`) separately, as llama-bench's markdown names them
//! (`tools/llama-bench/llama-bench.cpp`, `markdown_printer::print_test`); for any
//! other output, the command's wall time. A test's speed-up is its median unlocked
//! over its median stock (wall time: stock over unlocked); `--min-speedup X` must
//! hold for every test.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use metalift_daemon::audit::receipt::{Measure, WorkloadReceipt, WorkloadTest};

use super::bounded::{self, Ended, Group};
use super::runs::{self, Bounds};
use crate::tools::Tools;

/// What `--workload` asks for.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    /// The command as given.
    pub(crate) command: Vec<String>,
    /// Its first word, resolved on `PATH`.
    pub(crate) program: PathBuf,
    /// Runs each way.
    pub(crate) runs: u32,
    /// `--min-speedup`.
    pub(crate) min_speedup: Option<f64>,
}

impl Spec {
    /// Checks the command can be started before anything runs (a typo is a
    /// verification that could not run, not a failed one).
    pub(crate) fn new(
        command: Vec<String>,
        runs: u32,
        min_speedup: Option<f64>,
    ) -> anyhow::Result<Spec> {
        let Some(first) = command.first() else {
            bail!("--workload needs a command after `--` (e.g. -- llama-bench -m MODEL -o json)");
        };
        if runs == 0 {
            bail!("--workload-runs must be at least 1");
        }
        if let Some(x) = min_speedup {
            if !(x.is_finite() && x > 0.0) {
                bail!("--min-speedup {x}: must be a positive number (e.g. 2 or 1.5)");
            }
        }
        let program = resolve(first, std::env::var_os("PATH").as_deref())?;
        Ok(Spec {
            command,
            program,
            runs,
            min_speedup,
        })
    }
}

/// `name` as `execvp` would find it: a path when it holds a `/`, else the first
/// executable file of that name on `path`.
fn resolve(name: &str, path: Option<&std::ffi::OsStr>) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.contains('/') {
        let p = PathBuf::from(name);
        if executable(&p) {
            return Ok(p);
        }
        bail!("the workload {name} is not an executable file");
    }
    std::env::split_paths(path.unwrap_or_default())
        .map(|dir| dir.join(name))
        .find(|p| executable(p))
        .with_context(|| format!("the workload {name} is not on PATH"))
}

/// One run's measure: each llama-bench test's tokens per second, or the wall time.
#[derive(Debug, Clone, PartialEq)]
enum Measured {
    /// `(test name, avg_ts)` in llama-bench's order.
    Tokens(Vec<(String, f64)>),
    /// Milliseconds.
    Wall(f64),
}

/// How one run ended, when not measured.
struct Failed {
    result: &'static str,
    detail: String,
}

/// Runs the workload under `socket`'s scratch daemon and stock, and judges it.
pub(crate) fn run(tools: &Tools, socket: &Path, bounds: &Bounds, spec: &Spec) -> WorkloadReceipt {
    let mut stock = Vec::new();
    let mut unlocked = Vec::new();
    let mut failed = None;
    'runs: for i in 1..=spec.runs {
        for (which, socket, into) in [
            ("stock", None, &mut stock),
            ("unlocked", Some(socket), &mut unlocked),
        ] {
            let label = format!("{which} run {i} of {}", spec.runs);
            match one(tools, socket, bounds, spec, &label) {
                Ok(measured) => into.push(measured),
                Err(f) => {
                    failed = Some(f);
                    break 'runs;
                }
            }
        }
    }
    let mut receipt = WorkloadReceipt {
        command: spec.command.clone(),
        runs: spec.runs,
        measure: match stock.first() {
            Some(Measured::Wall(_)) => "wall_time",
            Some(Measured::Tokens(_)) => "llama_bench",
            None => "none",
        }
        .to_owned(),
        result: "pass".to_owned(),
        detail: None,
        min_speedup: spec.min_speedup.map(Measure),
        pp_speedup: None,
        tg_speedup: None,
        speedup: None,
        tests: Vec::new(),
    };
    if let Some(f) = failed.or_else(|| same_shape(&stock, &unlocked).err()) {
        receipt.result = f.result.to_owned();
        receipt.detail = Some(f.detail);
        return receipt;
    }
    receipt.tests = tests(&stock, &unlocked);
    // JSON has no infinity or NaN (serde_json would write null, which no reader
    // takes back): a test that reported 0 tokens per second is a failed run.
    if let Some(t) = receipt.tests.iter().find(|t| !t.speedup.0.is_finite()) {
        receipt.result = "run_failed".to_owned();
        receipt.detail = Some(format!(
            "{}: no speed-up can be computed (stock median {}, unlocked median {})",
            t.test, t.stock_median.0, t.unlocked_median.0
        ));
        receipt.tests.clear();
        return receipt;
    }
    let lowest = |prefix: Option<&str>| {
        receipt
            .tests
            .iter()
            .filter(|t| prefix.is_none_or(|p| kind(&t.test) == p))
            .map(|t| t.speedup.0)
            .reduce(f64::min)
            .map(Measure)
    };
    receipt.pp_speedup = lowest(Some("pp"));
    receipt.tg_speedup = lowest(Some("tg"));
    receipt.speedup = lowest(None);
    if let Some(min) = spec.min_speedup {
        let below: Vec<String> = receipt
            .tests
            .iter()
            .filter(|t| t.speedup.0 < min)
            .map(|t| format!("{} {:.2}x", t.test, t.speedup.0))
            .collect();
        if !below.is_empty() {
            receipt.result = "below_min_speedup".to_owned();
            receipt.detail = Some(format!(
                "the workload's speed-up is below --min-speedup {min}: {}",
                below.join(", ")
            ));
        }
    }
    receipt
}

/// `pp`, `tg` or `pg` (`ppN+tgM`) for a llama-bench test name; `wall` else.
fn kind(test: &str) -> &'static str {
    match (
        test.starts_with("pp"),
        test.contains("+tg"),
        test.starts_with("tg"),
    ) {
        (true, true, _) => "pg",
        (true, false, _) => "pp",
        (false, _, true) => "tg",
        _ => "wall",
    }
}

fn one(
    tools: &Tools,
    socket: Option<&Path>,
    bounds: &Bounds,
    spec: &Spec,
    label: &str,
) -> Result<Measured, Failed> {
    if Instant::now() >= bounds.end {
        return Err(Failed {
            result: "not_run",
            detail: format!("the verification's --timeout was reached before the {label}"),
        });
    }
    let mut cmd: Command = runs::under_shim(tools, socket, &spec.program);
    cmd.args(&spec.command[1..]);
    let ended = bounded::run_in(&mut cmd, bounds.end, Group::Own).map_err(|e| Failed {
        result: "run_failed",
        detail: format!("the {label} did not start: {e:#}"),
    })?;
    let (status, stdout, stderr, took) = match ended {
        Ended::Killed { after } => {
            return Err(Failed {
                result: "hung",
                detail: format!(
                "the {label} had not finished after {} ms: killed at the verification's --timeout",
                after.as_millis()
            ),
            })
        }
        Ended::Exited {
            status,
            stdout,
            stderr,
            took,
        } => (status, stdout, stderr, took),
    };
    if !status.success() {
        let text = String::from_utf8_lossy(&stderr);
        let tail: String = text
            .trim()
            .chars()
            .rev()
            .take(400)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        return Err(Failed {
            result: "run_failed",
            detail: format!("the {label} exited with {status}: {tail}"),
        });
    }
    Ok(match llama_bench_tests(&stdout) {
        Some(tests) => Measured::Tokens(tests),
        None => Measured::Wall(millis(took)),
    })
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// llama-bench's `-o json` (an array of tests) or `-o jsonl` (a test a line):
/// each test's name and `avg_ts`. `None`: not llama-bench's output.
fn llama_bench_tests(stdout: &[u8]) -> Option<Vec<(String, f64)>> {
    let text = std::str::from_utf8(stdout).ok()?;
    let rows: Vec<serde_json::Value> = match serde_json::from_str(text) {
        Ok(serde_json::Value::Array(rows)) => rows,
        _ => text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()
            .ok()?,
    };
    if rows.is_empty() {
        return None;
    }
    rows.iter()
        .map(|row| {
            let n_prompt = row.get("n_prompt")?.as_u64()?;
            let n_gen = row.get("n_gen")?.as_u64()?;
            let avg_ts = row.get("avg_ts")?.as_f64()?;
            // markdown_printer::print_test's names.
            let mut name = match (n_prompt, n_gen) {
                (p, 0) => format!("pp{p}"),
                (0, g) => format!("tg{g}"),
                (p, g) => format!("pp{p}+tg{g}"),
            };
            if let Some(d) = row.get("n_depth").and_then(serde_json::Value::as_u64) {
                if d > 0 {
                    name.push_str(&format!(" @ d{d}"));
                }
            }
            Some((name, avg_ts))
        })
        .collect()
}

/// Every run measured the same way, with the same tests as the first.
fn same_shape(stock: &[Measured], unlocked: &[Measured]) -> Result<(), Failed> {
    let names = |m: &Measured| match m {
        Measured::Tokens(t) => Some(t.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>()),
        Measured::Wall(_) => None,
    };
    let Some(first) = stock.first() else {
        return Err(Failed {
            result: "not_run",
            detail: "no run".to_owned(),
        });
    };
    let want = names(first);
    for (i, m) in stock.iter().chain(unlocked).enumerate() {
        let got = names(m);
        if got != want {
            let show = |n: &Option<Vec<String>>| {
                n.as_ref()
                    .map_or("no llama-bench JSON (wall time)".to_owned(), |n| {
                        n.join(", ")
                    })
            };
            return Err(Failed {
                result: "run_failed",
                detail: format!(
                    "run {} printed other tests than the first stock run ({}; the first: {})",
                    i + 1,
                    show(&got),
                    show(&want)
                ),
            });
        }
    }
    Ok(())
}

/// The median: the middle value, or the mean of the two middle ones.
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn tests(stock: &[Measured], unlocked: &[Measured]) -> Vec<WorkloadTest> {
    let column = |runs: &[Measured], i: usize| -> Vec<f64> {
        runs.iter()
            .map(|m| match m {
                Measured::Tokens(t) => t.get(i).map_or(f64::NAN, |(_, ts)| *ts),
                Measured::Wall(ms) => *ms,
            })
            .collect()
    };
    let names: Vec<String> = match stock.first() {
        Some(Measured::Tokens(t)) => t.iter().map(|(n, _)| n.clone()).collect(),
        _ => vec!["wall".to_owned()],
    };
    let wall = matches!(stock.first(), Some(Measured::Wall(_)));
    names
        .into_iter()
        .enumerate()
        .map(|(i, test)| {
            let s = column(stock, i);
            let u = column(unlocked, i);
            let (sm, um) = (median(&s), median(&u));
            WorkloadTest {
                test,
                unit: if wall { "ms" } else { "tokens/s" }.to_owned(),
                stock: s.into_iter().map(Measure).collect(),
                unlocked: u.into_iter().map(Measure).collect(),
                stock_median: Measure(sm),
                unlocked_median: Measure(um),
                speedup: Measure(if wall { sm / um } else { um / sm }),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_bench_json_gives_each_tests_tokens_per_second_and_other_output_none() {
        let json = br#"[
  {
    "n_prompt": 512,
    "n_gen": 0,
    "n_depth": 0,
    "avg_ts": 431.860000,
    "samples_ts": [ 431.86 ]
  },
  {
    "n_prompt": 0,
    "n_gen": 128,
    "n_depth": 512,
    "avg_ts": 12.630000,
    "samples_ts": [ 12.63 ]
  }
]
"#;
        assert_eq!(
            llama_bench_tests(json),
            Some(vec![
                ("pp512".to_owned(), 431.86),
                ("tg128 @ d512".to_owned(), 12.63)
            ])
        );
        let jsonl = b"{\"n_prompt\": 8, \"n_gen\": 4, \"avg_ts\": 2.5}\n";
        assert_eq!(
            llama_bench_tests(jsonl),
            Some(vec![("pp8+tg4".to_owned(), 2.5)])
        );
        assert_eq!(llama_bench_tests(b"hello\n"), None);
        assert_eq!(llama_bench_tests(b"[]"), None);
    }

    #[test]
    fn the_speedup_is_median_over_median_and_the_minimum_is_checked() {
        assert_eq!(median(&[3.0, 1.0, 100.0]), 3.0);
        assert_eq!(median(&[1.0, 3.0]), 2.0);
        let stock = vec![
            Measured::Tokens(vec![("pp64".into(), 400.0), ("tg4".into(), 10.0)]),
            Measured::Tokens(vec![("pp64".into(), 1.0), ("tg4".into(), 12.0)]),
            Measured::Tokens(vec![("pp64".into(), 430.0), ("tg4".into(), 11.0)]),
        ];
        let unlocked = vec![
            Measured::Tokens(vec![("pp64".into(), 4000.0), ("tg4".into(), 200.0)]),
            Measured::Tokens(vec![("pp64".into(), 4300.0), ("tg4".into(), 220.0)]),
            Measured::Tokens(vec![("pp64".into(), 9e9), ("tg4".into(), 1.0)]),
        ];
        let t = tests(&stock, &unlocked);
        assert_eq!(t[0].speedup, Measure(4300.0 / 400.0));
        assert_eq!(t[1].speedup, Measure(200.0 / 11.0));
        let wall = tests(&[Measured::Wall(900.0)], &[Measured::Wall(300.0)]);
        assert_eq!(wall[0].speedup, Measure(3.0));
        assert_eq!(wall[0].unit, "ms");
    }

    #[test]
    fn a_workload_name_is_found_on_path_as_execvp_finds_it() {
        let path = std::ffi::OsString::from("/nonexistent:/bin:/usr/bin");
        let sh = resolve("sh", Some(&path)).unwrap();
        assert!(sh.ends_with("sh"), "{}", sh.display());
        assert!(resolve("no-such-tool-here", Some(&path)).is_err());
        assert!(resolve("/", None).is_err(), "a directory");
        let file = std::env::temp_dir().join(format!("metalift-not-exec-{}", std::process::id()));
        std::fs::write(&file, "x").unwrap();
        let refused = resolve(file.to_str().unwrap(), None);
        let _ = std::fs::remove_file(&file);
        assert!(refused.is_err(), "a file without an execute bit");
    }
}
