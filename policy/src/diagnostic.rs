//! Problems found in a policy, located by `file:line:col`, and their sudo-style rendering.

use std::fmt;
use std::ops::Range;

/// One policy file's text as it was read, under the name diagnostics show for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// Display path, e.g. `/etc/metalift/policy.d/10-fleet.toml`.
    pub name: String,
    /// The file's contents (lossily decoded when it was not UTF-8; a diagnostic says so).
    pub text: String,
}

impl Source {
    /// A source from a name and its text.
    pub fn new(name: impl Into<String>, text: impl Into<String>) -> Self {
        Source {
            name: name.into(),
            text: text.into(),
        }
    }
}

/// How bad a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// The policy is refused.
    Error,
    /// The policy is accepted, but probably not what the admin meant.
    Warning,
    /// Said for the reader: nothing in the policy to change, and `validate --strict`
    /// does not count it (`metalift validate` turns a [`Basis::HostChipUnknown`]
    /// warning into one).
    Note,
}

impl Severity {
    /// `"error"` or `"warning"`, as rendered and in JSON.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Note => "note",
        }
    }
}

/// What a diagnostic judges: the policy's text alone, or how it meets the host chip
/// it was compiled for. The daemon judges against its own host; `metalift validate`
/// may run elsewhere (an admin's laptop, a CI runner), so it needs to tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Basis {
    /// The policy's text: the same wherever it is checked.
    #[default]
    Text,
    /// The text against the host chip: a numeric ceiling applied at the host's lower
    /// family, or one of Apple9 or more that cannot be capped because the chip is
    /// unknown. `validate --skip-host-checks` leaves these out.
    HostChip,
    /// What `apple_family_max = "host"` resolves to where the chip is unknown: a
    /// fact about the machine, with nothing in the policy to change (`"host"` is the
    /// recommended ceiling). `validate` prints it as a note.
    HostChipUnknown,
}

/// A problem at a place in a policy file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// The [`Source::name`] of the file.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub col: usize,
    /// Characters to underline from `col` (at least 1 when rendered).
    pub len: usize,
    /// What is wrong, and when useful what to write instead.
    pub message: String,
    /// Whether it judges the text alone or the text against the host chip.
    pub basis: Basis,
}

impl Diagnostic {
    /// A diagnostic for the byte range `span` of `source`.
    pub(crate) fn at(
        severity: Severity,
        source: &Source,
        span: Range<usize>,
        message: impl Into<String>,
    ) -> Self {
        Self::located(
            severity,
            source,
            &LineIndex::new(&source.text),
            span,
            message,
        )
    }

    /// As [`Diagnostic::at`], with the source's line index already built.
    pub(crate) fn located(
        severity: Severity,
        source: &Source,
        lines: &LineIndex,
        span: Range<usize>,
        message: impl Into<String>,
    ) -> Self {
        let (line, col, len) = lines.line_col_len(&source.text, span);
        Diagnostic {
            severity,
            file: source.name.clone(),
            line,
            col,
            len,
            message: message.into(),
            basis: Basis::Text,
        }
    }

    /// The same diagnostic, judged on `basis`.
    #[must_use]
    pub fn on_basis(self, basis: Basis) -> Self {
        Diagnostic { basis, ..self }
    }

    /// Whether this diagnostic refuses the policy.
    #[must_use]
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// `path:line:col: error: message`, then the offending line and a `^~~~` underline
    /// (as sudo-rs prints sudoers errors). Without a matching source, only the first line.
    #[must_use]
    pub fn render(&self, sources: &[Source]) -> String {
        let mut out = self.to_string();
        // A line with control characters (binary data, an escape sequence) is not
        // echoed: it would drive the admin's terminal, not show them the problem.
        let text_line = sources
            .iter()
            .find(|s| s.name == self.file)
            .and_then(|s| s.text.lines().nth(self.line.saturating_sub(1)))
            .filter(|line| {
                !line
                    .chars()
                    .any(|c| c.is_control() && c != '\t' && c != '\r')
            });
        if let Some(text_line) = text_line {
            out.push('\n');
            out.push_str(text_line);
            out.push('\n');
            // Keep tabs so the caret lines up under the same terminal column.
            for c in text_line.chars().take(self.col.saturating_sub(1)) {
                out.push(if c == '\t' { '\t' } else { ' ' });
            }
            out.push('^');
            for _ in 1..self.len.max(1) {
                out.push('~');
            }
        }
        out
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}: {}",
            self.file,
            self.line,
            self.col,
            self.severity.as_str(),
            self.message
        )
    }
}

/// 1-based line and character column of `span.start`, and the span's length in
/// characters clipped to the end of that line.
#[cfg(test)]
pub(crate) fn line_col_len(text: &str, span: Range<usize>) -> (usize, usize, usize) {
    LineIndex::new(text).line_col_len(text, span)
}

/// Where each line of a text starts, so locating many spans stays linear in the
/// text's size (a 100,000-rule policy locates every rule).
#[derive(Debug, Clone)]
pub(crate) struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    pub(crate) fn new(text: &str) -> Self {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        LineIndex { starts }
    }

    /// The 1-based line of byte offset `at` (what a rule records as its place).
    pub(crate) fn line(&self, at: usize) -> usize {
        self.starts.partition_point(|&s| s <= at).max(1)
    }

    /// As [`line_col_len`], for the text this index was built from.
    pub(crate) fn line_col_len(&self, text: &str, span: Range<usize>) -> (usize, usize, usize) {
        let start = floor_char_boundary(text, span.start.min(text.len()));
        let end = floor_char_boundary(text, span.end.clamp(start, text.len()));
        let line = self.starts.partition_point(|&s| s <= start).max(1);
        let line_start = self.starts.get(line - 1).copied().unwrap_or(0).min(start);
        let col = text.get(line_start..start).map_or(0, |t| t.chars().count()) + 1;
        let rest = text.get(start..end).unwrap_or("");
        let on_line = rest.split('\n').next().unwrap_or("");
        let len = on_line.trim_end_matches('\r').chars().count().max(1);
        (line, col, len)
    }
}

fn floor_char_boundary(text: &str, mut i: usize) -> usize {
    while i > 0 && !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_offsets_become_one_based_line_and_character_column() {
        let text = "a = 1\nbé = \"x\"\n";
        assert_eq!(line_col_len(text, 0..1), (1, 1, 1));
        // "é" is two bytes: the `=` after it is character 4 of line 2.
        let eq = text.find("= \"").unwrap_or(0);
        assert_eq!(line_col_len(text, eq..eq + 1), (2, 4, 1));
        // A span past the end is clipped, never panics.
        assert_eq!(line_col_len(text, 100..200).0, 3);
    }

    #[test]
    fn render_prints_location_line_and_underline() {
        let source = Source::new("p.toml", "version = 1\nmode = \"loud\"\n");
        let d = Diagnostic::at(Severity::Error, &source, 19..25, "bad mode");
        assert_eq!(
            d.render(&[source]),
            "p.toml:2:8: error: bad mode\nmode = \"loud\"\n       ^~~~~~"
        );
    }

    #[test]
    fn render_without_its_source_is_the_first_line_only() {
        let d = Diagnostic {
            severity: Severity::Warning,
            file: "x".into(),
            line: 3,
            col: 2,
            len: 0,
            message: "m".into(),
            basis: Basis::Text,
        };
        assert_eq!(d.render(&[]), "x:3:2: warning: m");
    }
}
