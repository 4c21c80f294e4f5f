//! The generated documentation: man pages (`metalift(1)` and one page per
//! subcommand, `metaliftd(8)`) and the bash, zsh and fish completions, from the
//! clap definitions. `metalift __generate-docs DIR` writes `DIR/man/` and
//! `DIR/completions/`; the committed copies (`man/`, `completions/`) are checked
//! against a fresh generation by the tests and `scripts/test.sh`.
//! `man/metalift-policy.5` is written by hand (the file format is not a CLI).

use std::fs;
use std::path::Path;

use anyhow::Context as _;
use clap_complete::Shell;

/// The exit status of metaliftd, for its man page.
const METALIFTD_EXIT: &str = "\
Exit status:
  0  stopped on SIGTERM or SIGINT after finishing the requests in flight
  1  could not start for another reason (bad flags: 2, from the argument parser)
  73 could not create or listen on the Unix socket (directory, permissions, in use)
  74 could not open the audit log for appending
  78 no usable configuration (e.g. no --socket and no $XDG_RUNTIME_DIR for a user's daemon)
NO_COLOR (any non-empty value) turns colour off on stderr; colour is used only at a terminal.";

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
    let daemon = metaliftd.name("metaliftd").after_help(METALIFTD_EXIT);
    clap_mangen::Man::new(daemon)
        .section("8")
        .generate_to(&man)
        .with_context(|| format!("cannot write metaliftd.8 to {}", man.display()))?;
    for (shell, file) in COMPLETIONS {
        let mut script = Vec::new();
        super::completions::write(shell, &mut metalift.clone(), &mut script);
        let path = completions.join(file);
        fs::write(&path, script).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}
