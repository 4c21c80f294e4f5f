//! Which editor `metalift edit` runs, and how: `$VISUAL`, else `$EDITOR`, else
//! `vi`, split into words the way a shell would (`code --wait`, quoted paths),
//! with the file to edit as the last argument.

use std::path::Path;
use std::process::{Command, ExitStatus};

use anyhow::{bail, Context as _};

/// The editor's command line, from the environment.
pub fn command_line() -> anyhow::Result<Vec<String>> {
    let text = ["VISUAL", "EDITOR"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.trim().is_empty()))
        .unwrap_or_else(|| "vi".to_owned());
    let words =
        split(&text).with_context(|| format!("cannot parse the editor command {text:?}"))?;
    if words.is_empty() {
        bail!("the editor command {text:?} is empty");
    }
    Ok(words)
}

/// Runs the editor on `file` and waits for it.
pub fn edit(words: &[String], file: &Path) -> anyhow::Result<ExitStatus> {
    let (program, args) = words.split_first().context("no editor")?;
    Command::new(program)
        .args(args)
        .arg(file)
        .status()
        .with_context(|| format!("cannot start the editor {program:?} (set VISUAL or EDITOR)"))
}

/// Splits `text` into words like `sh` does for a simple command: blanks separate,
/// `'…'` is literal, `"…"` allows `\"` and `\\`, a backslash outside quotes
/// escapes the next character. No expansions.
pub fn split(text: &str) -> anyhow::Result<Vec<String>> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\n' => {
                if let Some(w) = word.take() {
                    words.push(w);
                }
            }
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => bail!("unterminated single quote"),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => w.push(c),
                            Some(c) => {
                                w.push('\\');
                                w.push(c);
                            }
                            None => bail!("unterminated double quote"),
                        },
                        Some(c) => w.push(c),
                        None => bail!("unterminated double quote"),
                    }
                }
            }
            '\\' => match chars.next() {
                Some(c) => word.get_or_insert_with(String::new).push(c),
                None => bail!("trailing backslash"),
            },
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    if let Some(w) = word {
        words.push(w);
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn the_editor_command_is_split_like_a_shell_splits_it() {
        assert_eq!(split("code --wait").unwrap(), ["code", "--wait"]);
        assert_eq!(
            split("'/Applications/Sublime Text.app/bin/subl' -w").unwrap(),
            ["/Applications/Sublime Text.app/bin/subl", "-w"]
        );
        assert_eq!(
            split(r#"emacs\ client "-a \"\"""#).unwrap(),
            ["emacs client", r#"-a """#]
        );
        assert_eq!(split("  vi  ").unwrap(), ["vi"]);
        assert_eq!(split("''").unwrap(), [""]);
        assert!(split("'unterminated").is_err());
    }
}
