//! The two top-level fields of a record line the syslog header needs, `"kind"` and
//! `"time"`, read without parsing the whole record.
//!
//! The writer puts `schema`, `id`, `host` first and the record's `kind` and `time`
//! right after them ([`crate::audit::stamp::Stamped`]), so a scan of the top-level
//! keys that stops once both are seen reads about a third of a decision line;
//! parsing it whole with serde (skipping every other field) was most of the
//! forwarder's CPU per record once the cursor's saves were batched (perf,
//! `metalift-bench forwarding`). Anything the scan is not sure of (an escape in
//! either value, a value that is not a string, a line that is not an object) is
//! left to serde, which answers as before.

use std::borrow::Cow;

/// A record's `"kind"` and `"time"` (`None` when it has none).
#[derive(Debug, PartialEq, Eq, serde::Deserialize)]
pub struct Head<'a> {
    /// `"kind"`.
    #[serde(borrow)]
    pub kind: Cow<'a, str>,
    /// `"time"`.
    #[serde(borrow, default)]
    pub time: Option<Cow<'a, str>>,
}

impl<'a> Head<'a> {
    /// The head of `line`, `None` when it is not a JSON object with a string `"kind"`
    /// (read as serde reads it: borrowed strings, every other field skipped, and a
    /// `"kind"` nested in `"host"`'s labels is not the record's).
    #[must_use]
    pub fn of(line: &'a [u8]) -> Option<Head<'a>> {
        match scan(line) {
            Some(head) => Some(head),
            None => serde_json::from_slice(line).ok(),
        }
    }
}

/// Each top-level key of `line` (raw, escapes as written) with its value's raw
/// JSON, in order, until `f` breaks; `None` when the line is not an object the
/// scanner can walk (then ask serde). `metalift audit` reads a record's `id`,
/// `host`, `kind` and `decision_id` this way before deciding to parse it whole.
pub fn top_level<'a>(
    line: &'a [u8],
    f: &mut dyn FnMut(&'a [u8], &'a [u8]) -> std::ops::ControlFlow<()>,
) -> Option<()> {
    let mut s = Scanner { b: line, i: 0 };
    s.ws();
    s.eat(b'{')?;
    loop {
        s.ws();
        let key = s.string()?;
        s.ws();
        s.eat(b':')?;
        s.ws();
        let start = s.i;
        s.value()?;
        if f(key, &line[start..s.i]).is_break() {
            return Some(());
        }
        s.ws();
        match s.next()? {
            b',' => {}
            b'}' => return Some(()),
            _ => return None,
        }
    }
}

/// A raw JSON string value (with its quotes) as text, when it has no escapes.
#[must_use]
pub fn plain_str(raw: &[u8]) -> Option<&str> {
    let inner = raw.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    if inner.contains(&b'\\') || inner.contains(&b'"') {
        return None;
    }
    std::str::from_utf8(inner).ok()
}

/// The fast path: `None` means "ask serde", never "no head".
fn scan(line: &[u8]) -> Option<Head<'_>> {
    let mut s = Scanner { b: line, i: 0 };
    s.ws();
    s.eat(b'{')?;
    let (mut kind, mut time) = (None, None);
    loop {
        s.ws();
        let key = s.string()?;
        s.ws();
        s.eat(b':')?;
        s.ws();
        match key {
            b"kind" if kind.is_none() => kind = Some(s.plain_string()?),
            b"time" if time.is_none() => time = Some(s.plain_string()?),
            // A repeated key: serde refuses the line; let it say so.
            b"kind" | b"time" => return None,
            _ => s.value()?,
        }
        if let (Some(kind), Some(time)) = (kind, time) {
            return Some(Head {
                kind: Cow::Borrowed(kind),
                time: Some(Cow::Borrowed(time)),
            });
        }
        s.ws();
        match s.next()? {
            b',' => {}
            // Both are needed for the fast path; a line without `time` is rare.
            _ => return None,
        }
    }
}

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scanner<'a> {
    fn next(&mut self) -> Option<u8> {
        let c = *self.b.get(self.i)?;
        self.i += 1;
        Some(c)
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.next()? == c).then_some(())
    }

    fn ws(&mut self) {
        while self
            .b
            .get(self.i)
            .is_some_and(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
        {
            self.i += 1;
        }
    }

    /// A string's raw bytes between its quotes (escapes left as written).
    fn string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.i;
        loop {
            self.i += memchr::memchr2(b'"', b'\\', self.b.get(self.i..)?)?;
            match self.next()? {
                b'"' => return Some(&self.b[start..self.i - 1]),
                _ => {
                    // A backslash: the next byte is escaped.
                    self.next()?;
                }
            }
        }
    }

    /// A string without escapes, as UTF-8; `None` (ask serde) otherwise.
    fn plain_string(&mut self) -> Option<&'a str> {
        let raw = self.string()?;
        if raw.contains(&b'\\') {
            return None;
        }
        std::str::from_utf8(raw).ok()
    }

    /// Skips one value: a string, an object or array (strings inside skipped as
    /// strings, so a bracket in one is not counted), or a scalar.
    fn value(&mut self) -> Option<()> {
        match *self.b.get(self.i)? {
            b'"' => self.string().map(|_| ()),
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match *self.b.get(self.i)? {
                        b'"' => {
                            self.string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                self.i += 1;
                                return Some(());
                            }
                        }
                        _ => {}
                    }
                    self.i += 1;
                }
            }
            _ => {
                while self.b.get(self.i).is_some_and(|c| {
                    !matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
                }) {
                    self.i += 1;
                }
                Some(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(line: &str) -> (Option<Head<'_>>, Option<Head<'_>>) {
        (
            scan(line.as_bytes()),
            serde_json::from_slice(line.as_bytes()).ok(),
        )
    }

    #[test]
    fn the_scan_finds_what_serde_finds_past_nested_kinds_strings_and_arrays() {
        let line = r#"{"schema":1,"id":"r-1","host":{"name":"h","labels":{"kind":"x","y":"}]\"{"},"l":[1,{"a":[]}]},"kind":"decision","time":"2026-11-30T06:01:02.123456Z","path":"/a b","n":-1.5e3,"ok":true}"#;
        let (fast, slow) = both(line);
        assert_eq!(fast.as_ref().map(|h| &*h.kind), Some("decision"));
        assert_eq!(fast, slow);
    }

    #[test]
    fn a_line_as_the_writer_writes_it_takes_the_fast_path() {
        let record = crate::audit::Record::ForwardGap {
            time: std::time::SystemTime::UNIX_EPOCH,
            file: "audit.jsonl.3".into(),
            records: Some(2),
            total: Some(2),
        };
        let line = crate::audit::stamp::Stamper::new().line(&record).unwrap();
        let head = scan(&line).expect("kind and time found by the scan");
        assert_eq!(head.kind, "forward_gap");
        assert_eq!(head.time.as_deref(), Some("1970-01-01T00:00:00.000000Z"));
    }

    #[test]
    fn top_level_gives_each_key_with_its_raw_value_and_stops_when_told() {
        let line = br#"{"id":"r-1","host":{"labels":{"kind":"x"}},"kind":"outcome","decision_id":42,"x":[1]}"#;
        let mut seen = Vec::new();
        top_level(line, &mut |k, v| {
            seen.push((
                String::from_utf8_lossy(k).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
            ));
            if k == b"decision_id" {
                std::ops::ControlFlow::Break(())
            } else {
                std::ops::ControlFlow::Continue(())
            }
        })
        .unwrap();
        let keys: Vec<&str> = seen.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["id", "host", "kind", "decision_id"]);
        assert_eq!(seen[1].1, r#"{"labels":{"kind":"x"}}"#);
        assert_eq!(plain_str(seen[2].1.as_bytes()), Some("outcome"));
        assert_eq!(seen[3].1, "42");
        assert_eq!(plain_str(br#""a\"b""#), None);
        assert!(top_level(b"not json", &mut |_, _| std::ops::ControlFlow::Continue(())).is_none());
    }

    #[test]
    fn what_the_scan_is_not_sure_of_is_left_to_serde() {
        // Escapes in the value, a non-string, no time, a repeated key, not an object.
        for line in [
            r#"{"kind":"deci\u0073ion","time":"2026-01-01T00:00:00Z"}"#,
            r#"{"kind":7,"time":"2026-01-01T00:00:00Z"}"#,
            r#"{"kind":"outcome"}"#,
            r#"{"kind":"a","kind":"b","time":"t"}"#,
            "not json",
        ] {
            assert_eq!(scan(line.as_bytes()), None, "{line}");
        }
        let h = Head::of(br#"{"kind":"deci\u0073ion","time":"2026-01-01T00:00:00Z"}"#).unwrap();
        assert_eq!(h.kind, "decision", "serde unescapes it");
        assert_eq!(Head::of(br#"{"kind":"outcome"}"#).unwrap().time, None);
        assert_eq!(Head::of(br#"{"kind":"a","kind":"b","time":"t"}"#), None);
    }
}
