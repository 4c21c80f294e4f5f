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
    clap_mangen::generate_to(metalift.clone(), &man)
        .with_context(|| format!("cannot write man pages to {}", man.display()))?;
    let daemon = metaliftd
        .clone()
        .name("metaliftd")
        .after_help(super::reference::metaliftd_exit_help());
    clap_mangen::Man::new(daemon)
        .section("8")
        .generate_to(&man)
        .with_context(|| format!("cannot write metaliftd.8 to {}", man.display()))?;
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
