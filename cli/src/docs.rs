//! The generated documentation: man pages (`metalift(1)` and one page per
//! subcommand, `metaliftd(8)`) and the bash, zsh and fish completions, from the
//! clap definitions. `metalift __generate-docs DIR` writes `DIR/man/` and
//! `DIR/completions/`, and the guide's generated pages `DIR/docs/src/reference/`
//! (`exit-codes.md`, `cli.md`: [`super::reference`]); the committed copies are
//! checked against a fresh generation by the tests and `scripts/test.sh`.
//! `man/metalift-policy.5` is written by hand (the file format is not a CLI).

use std::fs;
use std::path::Path;

use anyhow::Context as _;
use clap_complete::Shell;

/// The completion files and the shells they are for.
pub const COMPLETIONS: [(Shell, &str); 3] = [
    (Shell::Bash, "metalift.bash"),
    (Shell::Zsh, "_metalift"),
    (Shell::Fish, "metalift.fish"),
];

/// The date in every generated page's `.TH` line (and in the hand-written
/// `man/metalift-policy.5`): the date of the pages' last change, a constant so
/// that the same source always generates the same pages. The build's date would
/// make every regeneration differ from the committed copies (scripts/test.sh
/// diffs them) and two builds of one commit differ (no reproducible pkg).
/// Bump it when a page's content changes for a release.
pub const MAN_DATE: &str = "2026-12-03";

/// The `.TH` source field: the product and its version (one for every component).
const MAN_SOURCE: &str = concat!("metalift ", env!("CARGO_PKG_VERSION"));

/// Writes every generated page and script under `dir`.
pub fn generate(
    metalift: clap::Command,
    metaliftd: clap::Command,
    dir: &Path,
) -> anyhow::Result<()> {
    let man = dir.join("man");
    let completions = dir.join("completions");
    for d in [&man, &completions] {
        fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    write_pages(&metalift, "1", &man)?;
    let about = metaliftd.get_about().map(|about| about.to_string());
    let mut daemon = metaliftd
        .clone()
        .name("metaliftd")
        .after_help(super::reference::metaliftd_exit_help());
    if let Some(about) = about {
        // NAME is "metaliftd \- ABOUT": the help's "metaliftd: " prefix would repeat it.
        let bare = about
            .strip_prefix("metaliftd: ")
            .unwrap_or(&about)
            .to_owned();
        daemon = daemon.about(bare);
    }
    write_page(daemon, "8", &man)?;
    let reference = dir.join("docs/src/reference");
    fs::create_dir_all(&reference)
        .with_context(|| format!("cannot create {}", reference.display()))?;
    for (name, text) in [
        ("exit-codes.md", super::reference::exit_codes_page()),
        (
            "cli.md",
            super::reference::cli_page(&metalift, &metaliftd.name("metaliftd")),
        ),
    ] {
        let path = reference.join(name);
        fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    for (shell, file) in COMPLETIONS {
        let mut script = Vec::new();
        super::completions::write(shell, &mut metalift.clone(), &mut script);
        let path = completions.join(file);
        fs::write(&path, script).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// The manual a section's pages belong to (the names man-pages(7) gives them).
fn manual(section: &str) -> &'static str {
    match section {
        "8" => "System Manager's Manual",
        "5" => "File Formats Manual",
        _ => "General Commands Manual",
    }
}

/// Writes `cmd`'s page and, recursively, one per visible subcommand, named
/// `metalift-SUB.1` as `clap_mangen::generate_to` names them, each with the
/// full `.TH` line (title, section, date, source, manual).
fn write_pages(cmd: &clap::Command, section: &str, dir: &Path) -> anyhow::Result<()> {
    let mut cmd = cmd.clone().disable_help_subcommand(true);
    cmd.build();
    fn walk(cmd: &clap::Command, section: &str, dir: &Path) -> anyhow::Result<()> {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            walk(sub, section, dir)?;
        }
        write_page(cmd.clone(), section, dir)
    }
    walk(&cmd, section, dir)
}

/// Renders one page with the full `.TH` line and writes it to `dir`.
fn write_page(cmd: clap::Command, section: &str, dir: &Path) -> anyhow::Result<()> {
    let name = cmd.get_display_name().unwrap_or(cmd.get_name()).to_owned();
    let page = clap_mangen::Man::new(cmd)
        .title(name.to_uppercase())
        .section(section)
        .date(MAN_DATE)
        .source(MAN_SOURCE)
        .manual(manual(section));
    let mut roff = Vec::new();
    page.render(&mut roff)
        .with_context(|| format!("cannot render {name}.{section}"))?;
    let text = String::from_utf8(roff).context("clap_mangen wrote a page that is not UTF-8")?;
    let path = dir.join(format!("{name}.{section}"));
    fs::write(&path, tidy(&text)).with_context(|| format!("cannot write {}", path.display()))
}

/// What `mandoc -T lint` reports in clap_mangen's output, fixed: it separates
/// an argument's help from its "Possible values" list with `.br`, an empty
/// line, `.br` (a WARNING: each `.br` beside the blank line, a paragraph break,
/// is skipped): one `.sp` says it; and it ends the SYNOPSIS and `.TH` lines with
/// a space (STYLE: whitespace at end of input line), dropped unless escaped.
fn tidy(roff: &str) -> String {
    let joined = roff.replace("\n.br\n\n.br\n", "\n.sp\n");
    let mut out = String::with_capacity(joined.len());
    for line in joined.split_inclusive('\n') {
        let (body, newline) = match line.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (line, ""),
        };
        let trimmed = body.trim_end_matches(' ');
        out.push_str(trimmed);
        if trimmed.ends_with('\\') && trimmed.len() < body.len() {
            out.push(' '); // "\ " is an escaped space: keep it
        }
        out.push_str(newline);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::tidy;

    #[test]
    fn a_blank_line_between_two_breaks_becomes_one_sp() {
        let roff = "help text\n.br\n\n.br\n\\fIPossible values:\\fR\n";
        assert_eq!(tidy(roff), "help text\n.sp\n\\fIPossible values:\\fR\n");
    }

    #[test]
    fn trailing_spaces_go_but_an_escaped_space_stays() {
        assert_eq!(
            tidy(".TH X 1 \n[\\fB\\-h\\fR] \nkeep\\   \n"),
            ".TH X 1\n[\\fB\\-h\\fR]\nkeep\\ \n"
        );
    }
}
