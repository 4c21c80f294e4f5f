//! A Linux stand-in for llama.cpp's `llama-bench`, for `metalift verify --workload`
//! on the simulated Metal: it prints llama-bench's `-o json` (and `-o jsonl`)
//! output exactly as llama.cpp writes it, and its tests run faster when the device
//! answers what llama.cpp's fast paths need.
//!
//! # What it models, and from where
//!
//! - **The output**, field for field: ggml-org/llama.cpp
//!   `tools/llama-bench/llama-bench.cpp` (commit 050fc7f3): the field names and
//!   their order are `test::get_fields()`, their JSON types `test::get_field_type()`
//!   (`no_op_offload` and `n_cpu_moe` are INT there, `cpu_strict` a BOOL), the
//!   values `test::get_values()` (`std::to_string`: integers as such, doubles as
//!   `%f`); the layout `json_printer::print_header/print_test/print_footer` (`[`,
//!   then each test as `  {` with one `    "field": value,` line per field,
//!   `samples_ns` and `samples_ts` last, `,\n` between tests, `\n]` at the end)
//!   and `jsonl_printer::print_test`; `samples_ts` joined through an `ostream`
//!   (`join()`: six significant digits, `%g`). `avg_ns`/`stddev_ns` are the
//!   integer `avg()`/`stdev()` templates over `uint64_t`, `avg_ts`/`stddev_ts` the
//!   same over the `get_ts()` doubles (`1e9 * (n_prompt + n_gen) / ns`).
//! - **The tests run**: `get_cmd_params_instances()`: a `pp` test per `-p` value
//!   (n_gen 0), a `tg` test per `-n` value (n_prompt 0), a `pp+tg` test per `-pg`
//!   pair; zero values skipped. `main()`: a warm-up (the whole prompt; one
//!   generated token) unless `--no-warmup`, then `-r` timed repetitions, each one
//!   sample.
//! - **The speed**: tokens per second from the published guest figures
//!   (`bench/llama-guest.sh`: M1 Ultra host, TinyLlama 1.1B Q4_0, pp512 431.86 →
//!   4786.70 tok/s, tg128 12.63 → 206.60). Prompt processing runs at the fast rate
//!   when the device's answers give llama.cpp `has_simdgroup_mm` (its matrix-matrix
//!   kernels), generation when they give `has_simdgroup_reduction` (its
//!   matrix-vector kernels): the flags `report::LlamaFlags::derive` derives as
//!   `ggml-metal-device.m` does. The device is created and asked the way
//!   `metalift-probe` asks (the binary: `MTLCreateSystemDefaultDevice` linked, as
//!   llama.cpp links Metal.framework), so the shim unlocks it as it would llama.cpp.
//!
//! # What it does not model
//!
//! No model is loaded (the file named by `-m` is only measured for `model_size`;
//! `model_type` says so, `model_n_params` is 0); no tokens are computed: each
//! repetition sleeps for the tokens at its rate. The rates do not depend on the
//! model, the batch size, the threads, `-ngl`, the depth or the flash attention
//! flag; `has_bfloat` and the threadgroup memory change nothing. Only
//! `-o json`/`jsonl` are written (`md`, `csv`, `sql` are refused).

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use crate::report::LlamaFlags;

/// Prompt processing, tokens per second, without and with `has_simdgroup_mm`.
pub const PP_RATES: (f64, f64) = (431.86, 4786.70);
/// Generation, tokens per second, without and with `has_simdgroup_reduction`.
pub const TG_RATES: (f64, f64) = (12.63, 206.60);

/// The output formats the stand-in writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// `-o json`: `json_printer`.
    Json,
    /// `-o jsonl`: `jsonl_printer`.
    Jsonl,
}

/// The command line, as llama-bench's `parse_cmd_params` reads the options the
/// stand-in knows.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub model: String,
    pub n_prompt: Vec<u32>,
    pub n_gen: Vec<u32>,
    pub n_pg: Vec<(u32, u32)>,
    pub reps: u32,
    pub n_threads: u32,
    pub n_gpu_layers: i64,
    pub no_warmup: bool,
    pub output: Output,
}

impl Params {
    /// llama-bench's defaults (`cmd_params_defaults`), but `-o json`: the
    /// stand-in has no markdown printer.
    fn defaults() -> Params {
        Params {
            model: "models/7B/ggml-model-q4_0.gguf".to_owned(),
            n_prompt: vec![512],
            n_gen: vec![128],
            n_pg: Vec::new(),
            reps: 5,
            n_threads: std::thread::available_parallelism()
                .map_or(1, |n| u32::try_from(n.get()).unwrap_or(1)),
            n_gpu_layers: 99,
            no_warmup: false,
            output: Output::Json,
        }
    }

    /// Parses `args` (without the program name). `Err("")`: `-h`.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Params, String> {
        let mut params = Params::defaults();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let mut value = || {
                args.next()
                    .ok_or_else(|| format!("error: missing value for {arg}"))
            };
            match arg.as_str() {
                "-m" | "--model" => params.model = value()?,
                "-p" | "--n-prompt" => params.n_prompt = list(&value()?)?,
                "-n" | "--n-gen" => params.n_gen = list(&value()?)?,
                "-pg" => {
                    let v = value()?;
                    let pair = list(&v)?;
                    let [pp, tg] = pair[..] else {
                        return Err(format!("error: -pg {v}: expected PP,TG"));
                    };
                    params.n_pg.push((pp, tg));
                }
                "-r" | "--repetitions" => params.reps = number(&value()?)?,
                "-t" | "--threads" => params.n_threads = number(&value()?)?,
                "-ngl" | "--n-gpu-layers" => {
                    let v = value()?;
                    params.n_gpu_layers = v
                        .parse()
                        .map_err(|_| format!("error: -ngl {v}: not a number"))?;
                }
                "--no-warmup" => params.no_warmup = true,
                "-o" | "--output" => {
                    params.output = match value()?.as_str() {
                        "json" => Output::Json,
                        "jsonl" => Output::Jsonl,
                        other => {
                            return Err(format!(
                                "error: -o {other}: the stand-in writes json and jsonl only"
                            ))
                        }
                    }
                }
                "-h" | "--help" => return Err(String::new()),
                other => return Err(format!("error: invalid parameter for argument: {other}")),
            }
        }
        Ok(params)
    }

    /// The tests in `get_cmd_params_instances` order: pp, tg, pp+tg.
    pub fn tests(&self) -> Vec<(u32, u32)> {
        let pp = self.n_prompt.iter().filter(|&&n| n > 0).map(|&n| (n, 0));
        let tg = self.n_gen.iter().filter(|&&n| n > 0).map(|&n| (0, n));
        let pg = self.n_pg.iter().copied().filter(|&(p, g)| p > 0 || g > 0);
        pp.chain(tg).chain(pg).collect()
    }
}

fn number(text: &str) -> Result<u32, String> {
    text.trim()
        .parse()
        .map_err(|_| format!("error: {text}: not a number"))
}

fn list(text: &str) -> Result<Vec<u32>, String> {
    text.split(',').map(number).collect()
}

/// How long `n_prompt` prompt tokens and `n_gen` generated ones take on a device
/// whose answers give llama.cpp `flags`.
pub fn duration(flags: &LlamaFlags, n_prompt: u32, n_gen: u32) -> Duration {
    let pp = if flags.has_simdgroup_mm {
        PP_RATES.1
    } else {
        PP_RATES.0
    };
    let tg = if flags.has_simdgroup_reduction {
        TG_RATES.1
    } else {
        TG_RATES.0
    };
    Duration::from_secs_f64(f64::from(n_prompt) / pp + f64::from(n_gen) / tg)
}

/// One finished test: what `test` holds when `print_test` is called.
#[derive(Debug, Clone)]
pub struct TestResult {
    pub n_prompt: u32,
    pub n_gen: u32,
    pub samples_ns: Vec<u64>,
    pub test_time: SystemTime,
}

impl TestResult {
    fn ts(&self) -> Vec<f64> {
        let tokens = f64::from(self.n_prompt + self.n_gen);
        self.samples_ns
            .iter()
            .map(|&ns| 1e9 * tokens / ns as f64)
            .collect()
    }
}

/// What the run knows besides the tests (the `test` fields that are the same for
/// every test of one run).
#[derive(Debug, Clone)]
pub struct Run<'a> {
    pub params: &'a Params,
    /// `gpu_info`: the device's name.
    pub gpu: String,
    /// `model_size`: the model file's length, 0 when it cannot be read.
    pub model_size: u64,
}

/// `avg<uint64_t>`: integer division.
fn avg_u64(v: &[u64]) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.iter().sum::<u64>() / v.len() as u64
}

/// `stdev<uint64_t>`: the same formula in unsigned integer arithmetic (wrapping
/// as `uint64_t` does), then `std::sqrt` of the result.
fn stdev_u64(v: &[u64]) -> u64 {
    if v.len() <= 1 {
        return 0;
    }
    let n = v.len() as u64;
    let mean = avg_u64(v);
    let sq_sum = v
        .iter()
        .fold(0u64, |s, &x| s.wrapping_add(x.wrapping_mul(x)));
    let inner = (sq_sum / (n - 1)).wrapping_sub(mean.wrapping_mul(mean).wrapping_mul(n) / (n - 1));
    (inner as f64).sqrt() as u64
}

fn avg_f64(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.iter().sum::<f64>() / v.len() as f64
}

fn stdev_f64(v: &[f64]) -> f64 {
    if v.len() <= 1 {
        return 0.0;
    }
    let n = v.len() as f64;
    let mean = avg_f64(v);
    let sq_sum: f64 = v.iter().map(|x| x * x).sum();
    (sq_sum / (n - 1.0) - mean * mean * n / (n - 1.0)).sqrt()
}

/// `std::to_string(double)`: `%f`.
fn to_string_f64(x: f64) -> String {
    format!("{x:.6}")
}

/// A double through an `ostream` with its default flags: `%g`, six significant
/// digits, trailing zeros dropped.
pub fn ostream_f64(x: f64) -> String {
    if x == 0.0 {
        return "0".to_owned();
    }
    if !x.is_finite() {
        return if x.is_nan() {
            "nan".to_owned()
        } else if x > 0.0 {
            "inf".to_owned()
        } else {
            "-inf".to_owned()
        };
    }
    // The exponent after rounding to six significant digits.
    let sci = format!("{x:.5e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..6).contains(&exp) {
        let decimals = usize::try_from(5 - exp).unwrap_or(0);
        trim_zeros(&format!("{x:.decimals$}"))
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim_zeros(mantissa), exp.abs())
    }
}

fn trim_zeros(text: &str) -> String {
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text.to_owned()
    }
}

/// `escape_json`.
fn escape_json(value: &str) -> String {
    let mut out = String::new();
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) <= 0x1f => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// A value as `format_json_value` writes it for its field's type.
enum Value {
    Str(String),
    Bool(bool),
    /// INT and FLOAT: the text as `get_values` made it.
    Raw(String),
}

impl Value {
    fn json(&self) -> String {
        match self {
            Value::Str(s) => format!("\"{}\"", escape_json(s)),
            Value::Bool(b) => b.to_string(),
            Value::Raw(r) => r.clone(),
        }
    }
}

/// `get_fields()` with `get_values()`, in order.
fn fields(run: &Run<'_>, t: &TestResult) -> Vec<(&'static str, Value)> {
    let p = run.params;
    let ts = t.ts();
    let int = |n: i64| Value::Raw(n.to_string());
    vec![
        ("build_commit", Value::Str("metalift-stand-in".to_owned())),
        ("build_number", int(0)),
        ("cpu_info", Value::Str(String::new())),
        ("gpu_info", Value::Str(run.gpu.clone())),
        ("backends", Value::Str("Metal".to_owned())),
        ("model_filename", Value::Str(p.model.clone())),
        (
            "model_type",
            Value::Str("stand-in (no model loaded)".to_owned()),
        ),
        ("model_size", Value::Raw(run.model_size.to_string())),
        ("model_n_params", int(0)),
        ("n_batch", int(2048)),
        ("n_ubatch", int(512)),
        ("n_threads", int(i64::from(p.n_threads))),
        ("cpu_mask", Value::Str("0x0".to_owned())),
        ("cpu_strict", Value::Bool(false)),
        ("poll", int(50)),
        ("type_k", Value::Str("f16".to_owned())),
        ("type_v", Value::Str("f16".to_owned())),
        ("n_gpu_layers", int(p.n_gpu_layers)),
        ("n_cpu_moe", int(0)),
        ("split_mode", Value::Str("layer".to_owned())),
        ("main_gpu", int(0)),
        ("no_kv_offload", Value::Bool(false)),
        ("flash_attn", Value::Bool(false)),
        ("devices", Value::Str("auto".to_owned())),
        ("tensor_split", Value::Str("0.00".to_owned())),
        ("tensor_buft_overrides", Value::Str("none".to_owned())),
        ("use_mmap", Value::Bool(true)),
        ("embeddings", Value::Bool(false)),
        ("no_op_offload", int(0)),
        ("no_host", Value::Bool(false)),
        ("n_prompt", int(i64::from(t.n_prompt))),
        ("n_gen", int(i64::from(t.n_gen))),
        ("n_depth", int(0)),
        (
            "test_time",
            Value::Str(humantime::format_rfc3339_seconds(t.test_time).to_string()),
        ),
        ("avg_ns", Value::Raw(avg_u64(&t.samples_ns).to_string())),
        (
            "stddev_ns",
            Value::Raw(stdev_u64(&t.samples_ns).to_string()),
        ),
        ("avg_ts", Value::Raw(to_string_f64(avg_f64(&ts)))),
        ("stddev_ts", Value::Raw(to_string_f64(stdev_f64(&ts)))),
    ]
}

fn join<T>(values: &[T], show: impl Fn(&T) -> String) -> String {
    values.iter().map(show).collect::<Vec<_>>().join(", ")
}

/// `json_printer::print_header`.
pub const JSON_HEADER: &str = "[\n";
/// `json_printer::print_footer`.
pub const JSON_FOOTER: &str = "\n]\n";

/// `json_printer::print_test` (`first`: no `,\n` before it).
pub fn json_test(run: &Run<'_>, t: &TestResult, first: bool) -> String {
    let mut out = String::new();
    if !first {
        out.push_str(",\n");
    }
    out.push_str("  {\n");
    for (name, value) in fields(run, t) {
        let _ = writeln!(out, "    \"{name}\": {},", value.json());
    }
    let _ = writeln!(
        out,
        "    \"samples_ns\": [ {} ],",
        join(&t.samples_ns, u64::to_string)
    );
    let _ = writeln!(
        out,
        "    \"samples_ts\": [ {} ]",
        join(&t.ts(), |x| ostream_f64(*x))
    );
    out.push_str("  }");
    out
}

/// `jsonl_printer::print_test`.
pub fn jsonl_test(run: &Run<'_>, t: &TestResult) -> String {
    let mut out = String::from("{");
    for (name, value) in fields(run, t) {
        let _ = write!(out, "\"{name}\": {}, ", value.json());
    }
    let _ = write!(
        out,
        "\"samples_ns\": [ {} ],",
        join(&t.samples_ns, u64::to_string)
    );
    let _ = write!(
        out,
        "\"samples_ts\": [ {} ]",
        join(&t.ts(), |x| ostream_f64(*x))
    );
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(on: bool) -> LlamaFlags {
        LlamaFlags {
            has_simdgroup_reduction: on,
            has_simdgroup_mm: on,
            has_bfloat: on,
        }
    }

    #[test]
    fn doubles_print_as_an_ostream_prints_them() {
        for (x, want) in [
            (431.86, "431.86"),
            (4786.7, "4786.7"),
            (1234567.0, "1.23457e+06"),
            (0.000012345, "1.2345e-05"),
            (999999.5, "1e+06"),
            (12.0, "12"),
            (0.5, "0.5"),
        ] {
            assert_eq!(ostream_f64(x), want, "{x}");
        }
    }

    #[test]
    fn the_tests_follow_get_cmd_params_instances_and_skip_zeros() {
        let p =
            Params::parse(["-p", "64,0", "-n", "16", "-pg", "8,4", "-o", "json"].map(String::from))
                .unwrap();
        assert_eq!(p.tests(), vec![(64, 0), (0, 16), (8, 4)]);
        assert!(Params::parse(["-o".to_owned(), "md".to_owned()]).is_err());
    }

    #[test]
    fn the_unlocked_device_runs_at_the_published_speed_ups() {
        let stock = duration(&flags(false), 512, 0).as_secs_f64();
        let fast = duration(&flags(true), 512, 0).as_secs_f64();
        assert!((stock / fast - 4786.70 / 431.86).abs() < 1e-6);
        let stock = duration(&flags(false), 0, 128).as_secs_f64();
        let fast = duration(&flags(true), 0, 128).as_secs_f64();
        assert!((stock / fast - 206.60 / 12.63).abs() < 1e-6);
    }

    #[test]
    fn the_json_is_llama_benchs_shape_and_parses() {
        let params = Params::parse(["-m", "tiny.gguf", "-p", "64"].map(String::from)).unwrap();
        let run = Run {
            params: &params,
            gpu: "Apple Paravirtual device".to_owned(),
            model_size: 42,
        };
        let t = TestResult {
            n_prompt: 64,
            n_gen: 0,
            samples_ns: vec![100_000_000, 200_000_000],
            test_time: SystemTime::UNIX_EPOCH,
        };
        let text = format!(
            "{JSON_HEADER}{}{}{JSON_FOOTER}",
            json_test(&run, &t, true),
            json_test(&run, &t, false)
        );
        assert!(text.starts_with("[\n  {\n    \"build_commit\": "), "{text}");
        assert!(text.contains("    \"avg_ts\": 480.000000,\n"), "{text}");
        assert!(
            text.contains("    \"samples_ts\": [ 640, 320 ]\n  },\n  {\n"),
            "{text}"
        );
        assert!(
            text.contains("    \"test_time\": \"1970-01-01T00:00:00Z\",\n"),
            "{text}"
        );
        assert!(text.contains("    \"cpu_strict\": false,\n"), "{text}");
        assert!(text.contains("    \"no_op_offload\": 0,\n"), "{text}");
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed[1]["n_prompt"], 64);
        assert_eq!(parsed[0]["avg_ns"], 150_000_000);
        assert_eq!(parsed[0]["stddev_ns"], 70_710_678);
        let line = jsonl_test(&run, &t);
        let parsed: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(parsed["samples_ns"][1], 200_000_000);
    }
}
