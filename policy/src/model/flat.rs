//! The fast way to stage 1 for the policy files almost everyone writes: top-level
//! `version`/`mode`, `[profile.NAME]` tables and `[[rule]]` tables, each holding
//! `key = scalar` lines of the right types. Such a file is read straight from the
//! TOML parser's events (`toml_parser`, the layer under `toml`), without building
//! `toml`'s span-carrying tree first: about half the parse time at 10,000 rules,
//! and far fewer allocations on a reload.
//!
//! It answers only when it is sure. Anything else — a syntax error, an array or
//! inline table, a dotted key, another table header, an unknown or repeated key, a
//! value of the wrong type — makes it give up (`None`), and [`super::parse_file`]
//! takes the general path, which owns every diagnostic. So a file read here is a
//! file the general path reads without any diagnostic, into the same
//! [`FileModel`]; the tests below and the `policy_parse` fuzz target check exactly
//! that on every input where this path answers.

use std::borrow::Cow;
use std::ops::Range;

use toml_parser::decoder::ScalarKind;
use toml_parser::lexer::{Token, TokenKind};
use toml_parser::parser::{parse_document, Event, EventKind, RecursionGuard, ValidateWhitespace};
use toml_parser::{ParseError, Source, Span};

use super::{At, FamilyText, FileModel, RawProfile, RawRule, SizeText};

/// The nesting `toml` allows before it reports an error (its `LIMIT`): the same
/// guard here, so both paths see the same events.
const RECURSION_LIMIT: u32 = 80;

/// Tokens lexed and parsed at a time: the batch ends at the first line break
/// outside brackets after this many, so memory stays small whatever the file size
/// (a 10,000-rule file is about 300,000 tokens).
const BATCH: usize = 4096;

/// `text` as a [`FileModel`], or `None` when the general path must read it.
pub(crate) fn parse(text: &str) -> Option<FileModel> {
    parse_in_batches(text, BATCH)
}

/// [`parse`], reading about `batch` tokens at a time.
fn parse_in_batches(text: &str, batch: usize) -> Option<FileModel> {
    let source = Source::new(text);
    let mut lexer = source.lex();
    let mut tokens: Vec<Token> = Vec::with_capacity(batch + 64);
    let mut events: Vec<Event> = Vec::with_capacity(batch + 64);
    let mut model = FileModel {
        parsed: true,
        ..FileModel::default()
    };
    let mut table = Table::Top;
    let mut lexed_all = false;
    while !lexed_all {
        // A TOML document is a sequence of lines (`expression *( newline
        // expression )`); only an array or inline table spans lines, inside
        // brackets. So a line break outside brackets ends a run of whole
        // expressions, which the parser reads alone exactly as in the whole file.
        tokens.clear();
        lexed_all = true;
        let mut depth = 0usize;
        for token in lexer.by_ref() {
            match token.kind() {
                TokenKind::LeftSquareBracket | TokenKind::LeftCurlyBracket => depth += 1,
                TokenKind::RightSquareBracket | TokenKind::RightCurlyBracket => {
                    depth = depth.saturating_sub(1);
                }
                _ => {}
            }
            let line_end = token.kind() == TokenKind::Newline && depth == 0;
            tokens.push(token);
            if line_end && tokens.len() >= batch {
                lexed_all = false;
                break;
            }
        }
        events.clear();
        let mut errors: Vec<ParseError> = Vec::new();
        {
            let mut checked = ValidateWhitespace::new(&mut events, source);
            let mut guarded = RecursionGuard::new(&mut checked, RECURSION_LIMIT);
            parse_document(&tokens, &mut guarded, &mut errors);
        }
        if !errors.is_empty() {
            return None;
        }
        let mut reader = Reader {
            source,
            events: &events,
            next: 0,
        };
        reader.read_into(&mut model, &mut table)?;
    }
    // The general path lists profiles as `toml`'s table iterates them: by name.
    model.profiles.sort_by(|a, b| {
        let name = |p: &RawProfile| p.name.as_ref().map(|n| n.value.clone());
        name(a).cmp(&name(b))
    });
    Some(model)
}

/// Whether the fast path, where it answers for `text` (whole, and a few tokens at
/// a time), agrees with the general path and the general path reports nothing.
/// For the `policy_parse` fuzz target; true when the fast path declines.
pub(crate) fn agrees_with_general(text: &str) -> bool {
    let fast = parse(text);
    if parse_in_batches(text, 3) != fast {
        return false;
    }
    let Some(fast) = fast else {
        return true;
    };
    let mut out = Vec::new();
    let general = super::parse_general(&crate::diagnostic::Source::new("p.toml", text), &mut out);
    out.is_empty() && general == fast
}

/// Which table the key-value lines belong to.
#[derive(Clone, Copy)]
enum Table {
    Top,
    Profile,
    /// `described`: the rule's `description` was given.
    Rule {
        described: bool,
    },
}

/// A decoded scalar and its span (quotes included, as `toml` reports it).
struct Scalar<'i> {
    value: Value<'i>,
    span: Range<usize>,
}

enum Value<'i> {
    String(Cow<'i, str>),
    Integer(i64),
    Boolean(bool),
}

impl Scalar<'_> {
    fn string(self) -> Option<At<String>> {
        match self.value {
            Value::String(s) => Some(At {
                value: s.into_owned(),
                span: self.span,
            }),
            _ => None,
        }
    }

    fn int(self) -> Option<At<i64>> {
        match self.value {
            Value::Integer(n) => Some(At {
                value: n,
                span: self.span,
            }),
            _ => None,
        }
    }

    fn bool(self) -> Option<At<bool>> {
        match self.value {
            Value::Boolean(b) => Some(At {
                value: b,
                span: self.span,
            }),
            _ => None,
        }
    }
}

/// Sets `slot` to `value` unless the key was already given (a TOML error: the
/// general path reports it).
fn set<T>(slot: &mut Option<At<T>>, value: Option<At<T>>) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value?);
    Some(())
}

fn top_key(model: &mut FileModel, key: &str, value: Scalar<'_>) -> Option<()> {
    match key {
        "version" => set(&mut model.version, value.int()),
        "mode" => set(&mut model.mode, value.string()),
        _ => None,
    }
}

fn profile_key(profile: &mut RawProfile, key: &str, value: Scalar<'_>) -> Option<()> {
    match key {
        "apple_family_max" => {
            let span = value.span.clone();
            let family = match value.value {
                Value::Integer(n) => FamilyText::Number(n),
                Value::String(s) => FamilyText::Word(s.into_owned()),
                Value::Boolean(_) => return None,
            };
            set(
                &mut profile.apple_family_max,
                Some(At {
                    value: family,
                    span,
                }),
            )
        }
        "max_threadgroup_memory" => set(&mut profile.max_threadgroup_memory, value.int()),
        "require_verified" => set(&mut profile.require_verified, value.bool()),
        "recommended_working_set" => {
            let span = value.span.clone();
            let size = match value.value {
                Value::Integer(n) => SizeText::Bytes(n),
                Value::String(s) => SizeText::Human(s.into_owned()),
                Value::Boolean(_) => return None,
            };
            set(
                &mut profile.recommended_working_set,
                Some(At { value: size, span }),
            )
        }
        _ => None,
    }
}

fn rule_key(rule: &mut RawRule, key: &str, value: Scalar<'_>) -> Option<()> {
    let slot = match key {
        "id" => &mut rule.id,
        "path" => &mut rule.path,
        "name" => &mut rule.name,
        "sha256" => &mut rule.sha256,
        "cdhash" => &mut rule.cdhash,
        "team_id" => &mut rule.team_id,
        "signing_id" => &mut rule.signing_id,
        "user" => &mut rule.user,
        "parent" => &mut rule.parent,
        "unlock" => &mut rule.unlock,
        "uid" => return set(&mut rule.uid, value.int()),
        "stock" => return set(&mut rule.stock, value.bool()),
        "platform" => return set(&mut rule.platform, value.bool()),
        _ => return None,
    };
    set(slot, value.string())
}

/// Walks the events of one document.
struct Reader<'e, 'i> {
    source: Source<'i>,
    events: &'e [Event],
    next: usize,
}

impl<'i> Reader<'_, 'i> {
    /// Reads every event into `model`; `table` is where key-value lines go, kept
    /// from one batch to the next.
    fn read_into(&mut self, model: &mut FileModel, table: &mut Table) -> Option<()> {
        while let Some(event) = self.next_significant() {
            match event.kind() {
                EventKind::StdTableOpen => {
                    let name = self.profile_header()?;
                    if model
                        .profiles
                        .iter()
                        .any(|p| p.name.as_ref().is_some_and(|n| n.value == name.value))
                    {
                        return None;
                    }
                    model.profiles.push(RawProfile {
                        name: Some(name),
                        ..RawProfile::default()
                    });
                    *table = Table::Profile;
                }
                EventKind::ArrayTableOpen => {
                    let close = self.rule_header()?;
                    model.rules.push(RawRule {
                        span: event.span().start()..close,
                        ..RawRule::default()
                    });
                    *table = Table::Rule { described: false };
                }
                EventKind::SimpleKey => {
                    let (key, value) = self.key_value(event)?;
                    match table {
                        Table::Top => top_key(model, &key, value)?,
                        Table::Profile => profile_key(model.profiles.last_mut()?, &key, value)?,
                        Table::Rule { described } if key == "description" => {
                            // Free text, only type-checked (and only once per rule).
                            let first = !std::mem::replace(described, true);
                            if !first || !matches!(value.value, Value::String(_)) {
                                return None;
                            }
                        }
                        Table::Rule { .. } => rule_key(model.rules.last_mut()?, &key, value)?,
                    }
                }
                _ => return None,
            }
        }
        Some(())
    }

    fn take(&mut self) -> Option<Event> {
        let event = *self.events.get(self.next)?;
        self.next += 1;
        Some(event)
    }

    /// The next event that is not whitespace, a comment or a newline.
    fn next_significant(&mut self) -> Option<Event> {
        loop {
            let event = self.take()?;
            match event.kind() {
                EventKind::Whitespace | EventKind::Comment | EventKind::Newline => {}
                _ => return Some(event),
            }
        }
    }

    /// The next event, skipping whitespace only (header and key-value lines).
    fn next_on_line(&mut self) -> Option<Event> {
        loop {
            let event = self.take()?;
            if event.kind() != EventKind::Whitespace {
                return Some(event);
            }
        }
    }

    fn key(&self, event: Event) -> Option<Cow<'i, str>> {
        let raw = self.source.get(event)?;
        // A bare key of the characters TOML allows in one is itself, decoded; any
        // other key (quoted, or with a stray character) goes through the decoder.
        if event.encoding().is_none()
            && !raw.is_empty()
            && raw
                .as_bytes()
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-')
        {
            return Some(Cow::Borrowed(raw.as_str()));
        }
        let mut decoded = Cow::Borrowed("");
        let mut errors: Vec<ParseError> = Vec::new();
        raw.decode_key(&mut decoded, &mut errors);
        errors.is_empty().then_some(decoded)
    }

    /// After `[`: `profile.NAME]`, giving NAME and its span.
    fn profile_header(&mut self) -> Option<At<String>> {
        let first = self
            .next_on_line()
            .filter(|e| e.kind() == EventKind::SimpleKey)?;
        if self.key(first)? != "profile" {
            return None;
        }
        self.next_on_line()
            .filter(|e| e.kind() == EventKind::KeySep)?;
        let name = self
            .next_on_line()
            .filter(|e| e.kind() == EventKind::SimpleKey)?;
        self.next_on_line()
            .filter(|e| e.kind() == EventKind::StdTableClose)?;
        Some(At {
            value: self.key(name)?.into_owned(),
            span: range(name.span()),
        })
    }

    /// After `[[`: `rule]]`, giving the end of the header.
    fn rule_header(&mut self) -> Option<usize> {
        let key = self
            .next_on_line()
            .filter(|e| e.kind() == EventKind::SimpleKey)?;
        if self.key(key)? != "rule" {
            return None;
        }
        let close = self
            .next_on_line()
            .filter(|e| e.kind() == EventKind::ArrayTableClose)?;
        Some(close.span().end())
    }

    /// `key = scalar`, starting at the key's event.
    fn key_value(&mut self, key: Event) -> Option<(Cow<'i, str>, Scalar<'i>)> {
        let name = self.key(key)?;
        self.next_on_line()
            .filter(|e| e.kind() == EventKind::KeyValSep)?;
        let event = self
            .next_on_line()
            .filter(|e| e.kind() == EventKind::Scalar)?;
        let raw = self.source.get(event)?;
        let mut decoded = Cow::Borrowed("");
        let mut errors: Vec<ParseError> = Vec::new();
        let kind = raw.decode_scalar(&mut decoded, &mut errors);
        if !errors.is_empty() {
            return None;
        }
        let value = match kind {
            ScalarKind::String => Value::String(decoded),
            ScalarKind::Boolean(b) => Value::Boolean(b),
            ScalarKind::Integer(radix) => {
                Value::Integer(i64::from_str_radix(&decoded.replace('_', ""), radix.value()).ok()?)
            }
            ScalarKind::Float | ScalarKind::DateTime => return None,
        };
        Some((
            name,
            Scalar {
                value,
                span: range(event.span()),
            },
        ))
    }
}

fn range(span: Span) -> Range<usize> {
    span.start()..span.end()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::diagnostic::Source;

    /// What the general path makes of `text`, and its diagnostics.
    fn general(text: &str) -> (FileModel, usize) {
        let mut out = Vec::new();
        let model = super::super::parse_general(&Source::new("p.toml", text), &mut out);
        (model, out.len())
    }

    /// Where the fast path answers, the general path agrees and reports nothing;
    /// and reading a few tokens at a time (a batch boundary after almost every
    /// line) answers the same as reading the whole file at once.
    fn agrees(text: &str) -> bool {
        let fast = parse(text);
        for batch in [1, 3, 8] {
            assert_eq!(
                parse_in_batches(text, batch),
                fast,
                "batches of {batch} differ on:\n{text}"
            );
        }
        let Some(fast) = fast else {
            return false;
        };
        let (slow, diagnostics) = general(text);
        assert_eq!(
            diagnostics, 0,
            "the fast path read a file with problems:\n{text}"
        );
        assert_eq!(fast, slow, "the two paths disagree on:\n{text}");
        true
    }

    #[test]
    fn the_shipped_examples_and_a_10k_rule_policy_take_the_fast_path_and_agree() {
        for file in ["default-policy.toml", "dev-policy.toml", "llama-fleet.toml"] {
            let path = format!("{}/../examples/{file}", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(agrees(&text), "{file} did not take the fast path");
        }
        let mut text = String::from("version = 1\n[profile.apple7]\napple_family_max = 7\n");
        for i in 0..10_000 {
            text.push_str(&format!(
                "\n[[rule]]\nid = \"r-{i}\"\ndescription = \"tool {i}\"\npath = \"/opt/t-{i}/bin/*\"\nunlock = \"apple7\"\n"
            ));
        }
        assert!(agrees(&text));
    }

    #[test]
    fn files_outside_the_flat_shape_go_the_general_way() {
        for text in [
            "version = 1\nversion = 2\n",
            "[profile.a]\n[profile.a]\n",
            "[profile]\na = 1\n",
            "[[rule]]\nid = \"a\"\nid = \"b\"\n",
            "[[rule]]\ndescription = \"a\"\ndescription = \"b\"\n",
            "[[rule]]\nuid = \"0\"\n",
            "[[rule]]\nid = 3\n",
            "[[rule]]\nfoo = 1\n",
            "[[rule]]\npath.x = \"/a\"\n",
            "[[rule]]\n[rule.sub]\n",
            "[[rule]]\nid = [\"a\"]\n",
            "[[rule]]\nid = { a = 1 }\n",
            "rule = []\n",
            "mode = \"enforce\"\n[profile.a]\napple_family_max = 7.5\n",
            "[[rule]]\nuid = 99999999999999999999\n",
            "[[rule]]\nid = \"unterminated\n",
            "description = \"top\"\n",
        ] {
            assert!(parse(text).is_none(), "took the fast path:\n{text}");
        }
    }

    /// Lines a policy file is made of, valid and not, in every TOML spelling the
    /// fast path must get right or refuse.
    const LINES: &[&str] = &[
        "version = 1",
        "version = +1",
        "version = 0x10",
        "version = 1_0",
        "mode = \"enforce\"",
        "mode = 'monitor'",
        "mode = \"\"\"enforce\"\"\"",
        "\"mode\" = \"enforce\"",
        "[profile.apple7]",
        "[ profile . apple8 ]",
        "[profile.\"quoted name\"]",
        "[profile.'lit']",
        "[profile]",
        "[profile.a.b]",
        "apple_family_max = 7",
        "apple_family_max = \"host\"",
        "max_threadgroup_memory = 65536",
        "max_threadgroup_memory = 0o777",
        "recommended_working_set = \"12 GiB\"",
        "recommended_working_set = 1024",
        "recommended_working_set = true",
        "require_verified = true",
        "require_verified = false",
        "require_verified = 1",
        "[[rule]]",
        "[[ rule ]]",
        "[[\"rule\"]]",
        "[[rules]]",
        "[rule]",
        "id = \"r1\"",
        "id = \"r2\"  # a comment",
        "id = 'lit\\no-escape'",
        "id = \"esc\\u00e9\\t\"",
        "id = \"bad\\q\"",
        "description = \"free text\"",
        "description = 5",
        "path = \"/opt/llama/bin/*\"",
        "path = '/usr/bin/tool'",
        "name = \"llama-server\"",
        "sha256 = \"ab\"",
        "uid = 501",
        "uid = -1",
        "uid = 1e3",
        "user = \"ci\"",
        "parent = \"/bin/zsh\"",
        "unlock = \"apple7\"",
        "stock = true",
        "stock = \"yes\"",
        "team_id.x = \"a\"",
        "x = 1",
        "i$d = \"x\"",
        "ïd = \"x\"",
        "'id' = \"x\"",
        "id = [1, 2]",
        "id = [",
        "\"a\",",
        "]",
        "x = {",
        "}",
        "id = {a = 1}",
        "when = 1979-05-27",
        "# just a comment",
        "",
        "   ",
        "\t[[rule]]\t# indented",
        "id = \"\"\"multi",
        "line\"\"\"",
        "= 1",
        "id = ",
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]
        #[test]
        fn wherever_the_fast_path_answers_the_general_path_agrees(
            picks in proptest::collection::vec(0..LINES.len(), 0..14),
            crlf in any::<bool>(),
        ) {
            let newline = if crlf { "\r\n" } else { "\n" };
            let text: String = picks.iter().map(|&i| format!("{}{newline}", LINES[i])).collect();
            agrees(&text);
        }
    }

    #[test]
    fn the_generated_files_often_take_the_fast_path() {
        // Guards the property above against passing vacuously: plain valid files
        // built from the same lines do take the fast path.
        let text = "version = 1\n[profile.apple7]\napple_family_max = \"host\"\nrecommended_working_set = \"12 GiB\"\n\n[[rule]]\nid = \"esc\\u00e9\\t\"\nuid = 501\nstock = true\n[[ rule ]]\nid = 'lit'\nuser = \"ci\"\n";
        assert!(agrees(text));
        assert!(agrees(&text.replace('\n', "\r\n")));
    }
}
