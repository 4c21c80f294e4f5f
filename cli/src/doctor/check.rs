//! One line of `metalift doctor`: what was checked, how it went, and the fix.

use serde::Serialize;

/// How a check went. The order is the severity: the worst decides the exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Not applicable on this system (e.g. SIP on Linux); counts as ok.
    #[serde(rename = "n/a")]
    NotApplicable,
    /// Fine.
    Ok,
    /// Works, but something will surprise the admin.
    Warn,
    /// Broken: processes will stay stock, or the policy is not what is live.
    Fail,
}

impl Status {
    /// The word printed at the start of the line.
    #[must_use]
    pub fn word(self) -> &'static str {
        match self {
            Status::NotApplicable => "n/a",
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// The result of one check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Short name, e.g. `daemon`, `policy`, `shim`.
    pub name: &'static str,
    /// How it went.
    pub status: Status,
    /// What was found.
    pub message: String,
    /// What to do about it (empty when nothing).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub fix: String,
}

impl Check {
    /// A check with no fix to suggest.
    #[must_use]
    pub fn new(name: &'static str, status: Status, message: impl Into<String>) -> Check {
        Check {
            name,
            status,
            message: message.into(),
            fix: String::new(),
        }
    }

    /// The same check with a fix.
    #[must_use]
    pub fn fix(mut self, fix: impl Into<String>) -> Check {
        self.fix = fix.into();
        self
    }
}
