//! Where a glob that globset refuses goes wrong, and what to write instead: the
//! diagnostic underlines the bad character (the `[` that never closes, the stray
//! `}`), not the whole string, in metalift's words rather than globset's.
//!
//! globset reports only the kind of error, so the place is found again here by
//! scanning the pattern the way globset reads it with metalift's options
//! (`crate::rule::parse_glob`: `\` escapes; a class is `[`, an optional `!` or `^`,
//! an optional literal `]`, then anything up to the next `]`; `{…}` nests).

use std::ops::Range;

use globset::ErrorKind;

/// The byte range of `pattern` to underline and the message, for globset's `kind`.
/// The range is empty-free: at least the one bad character; `None` when the place
/// cannot be found again (the caller underlines the whole value).
pub(super) fn locate(pattern: &str, kind: &ErrorKind) -> (Option<Range<usize>>, String) {
    let scan = Scan::of(pattern);
    match kind {
        ErrorKind::UnclosedClass => (
            scan.unclosed_class.map(|at| at..at + 1),
            "this `[` opens a character class that is never closed with `]` (for a literal `[`, write `[[]`)".to_owned(),
        ),
        ErrorKind::UnopenedAlternates => (
            scan.stray_close.map(|at| at..at + 1),
            "this `}` closes no `{` (for a literal `}`, write `[}]`)".to_owned(),
        ),
        ErrorKind::UnclosedAlternates => (
            scan.unclosed_open.map(|at| at..at + 1),
            "this `{` opens alternatives that are never closed with `}` (for a literal `{`, write `[{]`)".to_owned(),
        ),
        ErrorKind::DanglingEscape => (
            pattern.len().checked_sub(1).map(|at| at..pattern.len()),
            "a `\\` at the end escapes nothing: remove it".to_owned(),
        ),
        ErrorKind::InvalidRange(from, to) => {
            let text = format!("{from}-{to}");
            (
                pattern.find(&text).map(|at| at..at + text.len()),
                format!("the range `{text}` runs backwards: write `{to}-{from}`"),
            )
        }
        other => (None, other.to_string()),
    }
}

/// The first place each kind of error could be, read in one pass.
#[derive(Debug, Default)]
struct Scan {
    /// A `[` whose class has no closing `]`.
    unclosed_class: Option<usize>,
    /// A `}` outside any `{…}`.
    stray_close: Option<usize>,
    /// The outermost `{` still open at the end.
    unclosed_open: Option<usize>,
}

impl Scan {
    fn of(pattern: &str) -> Scan {
        let bytes = pattern.as_bytes();
        let mut scan = Scan::default();
        let mut open: Vec<usize> = Vec::new();
        let mut i = 0;
        while let Some(&b) = bytes.get(i) {
            match b {
                b'\\' => i += 1,
                b'[' => match class_end(bytes, i) {
                    Some(end) => i = end,
                    None => {
                        scan.unclosed_class.get_or_insert(i);
                        break;
                    }
                },
                b'{' => open.push(i),
                // The guard closes the innermost `{`; with none open, `}` is stray.
                b'}' if open.pop().is_none() => {
                    scan.stray_close.get_or_insert(i);
                }
                _ => {}
            }
            i += 1;
        }
        scan.unclosed_open = open.first().copied();
        scan
    }
}

/// The index of the `]` closing the class that starts at `bytes[start] == b'['`.
fn class_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    if matches!(bytes.get(i), Some(b'!' | b'^')) {
        i += 1;
    }
    if bytes.get(i) == Some(&b']') {
        i += 1;
    }
    bytes
        .get(i..)?
        .iter()
        .position(|&b| b == b']')
        .map(|at| i + at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind_of(pattern: &str) -> ErrorKind {
        crate::rule::parse_glob(pattern)
            .expect_err("refused")
            .kind()
            .clone()
    }

    fn place(pattern: &str) -> Option<Range<usize>> {
        locate(pattern, &kind_of(pattern)).0
    }

    #[test]
    fn each_refused_glob_is_located_at_its_bad_character() {
        assert_eq!(place("/opt/x/ab[cd/e*"), Some(9..10));
        assert_eq!(place("/opt/[]]/[x"), Some(9..10), "the first class closes");
        assert_eq!(place("/opt/a}b"), Some(6..7));
        assert_eq!(place("/opt/{a,{b,c}"), Some(5..6));
        assert_eq!(place("/opt/x\\"), Some(6..7));
        assert_eq!(place("/opt/[z-a]"), Some(6..9));
    }

    #[test]
    fn the_message_says_what_to_write_instead() {
        let (_, message) = locate("/a[b", &kind_of("/a[b"));
        assert!(
            message.contains("never closed") && message.contains("`[[]`"),
            "{message}"
        );
    }
}
