//! Job claims: which CI job a process says it runs in, read by the shim from
//! its own environment at check-in (`shim/c/job.c`) and sent in the check-in as
//! one text field of `NAME=value` lines (`wire`'s `job` field, XPC's `"job"`).
//!
//! Advisory, like every other claim a client makes about itself: the daemon
//! records them under the decision's `advisory.job`, `metalift audit --job ID`
//! filters by them, and no rule ever reads them, so they never change a verdict.
//! Only the [`JOB_VARIABLES`] are kept, each value at most [`MAX_VALUE_LEN`]
//! bytes, the whole field at most [`MAX_JOB_LEN`] bytes (the shim's bounds; the
//! daemon applies them again, since the shim is not trusted).
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

/// The environment variables a job claim may name, in the order the shim reads them:
/// metalift's own, which any orchestrator sets (a Tart or Anka runner of the
/// admin's own, a script: `METALIFT_JOB_ID`, and `METALIFT_JOB_URL` for a link to
/// the job), then GitHub Actions, GitLab CI, Buildkite, Jenkins.
pub const JOB_VARIABLES: [&str; 13] = [
    "METALIFT_JOB_ID",
    "METALIFT_JOB_URL",
    "GITHUB_RUN_ID",
    "GITHUB_RUN_ATTEMPT",
    "GITHUB_JOB",
    "GITHUB_REPOSITORY",
    "RUNNER_NAME",
    "CI_JOB_ID",
    "CI_PIPELINE_ID",
    "CI_PROJECT_PATH",
    "BUILDKITE_JOB_ID",
    "BUILDKITE_BUILD_ID",
    "BUILD_TAG",
];
/// Longest value kept, in bytes (`ML_JOB_VALUE_MAX` in the shim).
pub const MAX_VALUE_LEN: usize = 128;
/// Longest `job` field accepted, in bytes (`ML_JOB_CLAIMS_MAX` in the shim, NUL excluded).
pub const MAX_JOB_LEN: usize = 1023;

/// The claims in a check-in's `job` text: allow-listed names only, each once, with a
/// value of 1..=[`MAX_VALUE_LEN`] bytes and no control character; anything else is
/// dropped (never an error: a claim cannot refuse a check-in). Text past
/// [`MAX_JOB_LEN`] is ignored.
#[must_use]
pub fn parse(text: &str) -> BTreeMap<String, String> {
    let mut end = text.len().min(MAX_JOB_LEN);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut claims = BTreeMap::new();
    for line in text[..end].split('\n') {
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        if !JOB_VARIABLES.contains(&name)
            || value.is_empty()
            || value.len() > MAX_VALUE_LEN
            || value.chars().any(char::is_control)
        {
            continue;
        }
        claims
            .entry(name.to_owned())
            .or_insert_with(|| value.to_owned());
    }
    claims
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allow_listed_bounded_values_are_kept() {
        let long = "9".repeat(MAX_VALUE_LEN + 1);
        let claims = parse(&format!(
            "GITHUB_RUN_ID=42\nPATH=/bin\nCI_JOB_ID={long}\nGITHUB_JOB=build=x\nRUNNER_NAME=\nGITHUB_RUN_ID=43\nBUILD_TAG=a\tb"
        ));
        assert_eq!(claims.get("GITHUB_RUN_ID").map(String::as_str), Some("42"));
        assert_eq!(
            claims.get("GITHUB_JOB").map(String::as_str),
            Some("build=x")
        );
        assert_eq!(claims.len(), 2, "{claims:?}");
    }

    #[test]
    fn text_past_the_bound_is_ignored() {
        let filler = format!("X={}\n", "y".repeat(MAX_JOB_LEN));
        assert!(parse(&format!("{filler}CI_JOB_ID=7")).is_empty());
    }

    #[test]
    fn the_generic_claims_are_kept_like_the_ci_ones() {
        let claims = parse(
            "METALIFT_JOB_ID=nightly-17\nMETALIFT_JOB_URL=https://ci.example/jobs/17\nMETALIFT_JOB=x",
        );
        assert_eq!(claims.len(), 2, "{claims:?}");
        assert_eq!(claims["METALIFT_JOB_ID"], "nightly-17");
        assert_eq!(claims["METALIFT_JOB_URL"], "https://ci.example/jobs/17");
    }
}
