//! `metalift exec`: runs one command with libmetalift injected.
//!
//! The shim goes in through the loader's variable (`DYLD_INSERT_LIBRARIES` on
//! macOS, `LD_PRELOAD` elsewhere), appended to any value already there, and the
//! command replaces this process directly (`execvp`-style, no shell), so no
//! SIP-protected wrapper such as `/bin/sh` or `/usr/bin/env` sits in between to
//! purge it. Injection only *asks*: the daemon's policy still decides per
//! executable whether the process is unlocked.
//!
//! When the loader is known to refuse the shim for this target (SIP-protected
//! path, Hardened Runtime, setuid, missing architecture slice) the command still
//! runs, stock, after a `metalift: warning:` line on stderr, so a wrapper script
//! never breaks, and nobody is left wondering why nothing changed.

pub mod binary;
mod daemon_health;
#[cfg(any(target_os = "macos", test))]
#[cfg_attr(not(target_os = "macos"), allow(dead_code))]
pub mod macos;
mod require_unlock;

use std::env;
use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{bail, Context};

use self::binary::{Arch, Format};

/// The loader variable that inserts libraries at launch.
#[cfg(target_os = "macos")]
pub const INSERT_VAR: &str = "DYLD_INSERT_LIBRARIES";
/// The loader variable that inserts libraries at launch.
#[cfg(not(target_os = "macos"))]
pub const INSERT_VAR: &str = "LD_PRELOAD";

/// The shim's file name on this platform.
#[cfg(target_os = "macos")]
pub const SHIM_FILE: &str = "libmetalift.dylib";
/// The shim's file name on this platform.
#[cfg(not(target_os = "macos"))]
pub const SHIM_FILE: &str = "libmetalift.so";

/// Where the .pkg installs the shim's directory (see pkg/stage.sh).
pub const INSTALL_LIB_DIR: &str = "/usr/local/metalift/lib";

/// Environment variable naming the shim, checked after `--shim`.
pub const SHIM_ENV: &str = "METALIFT_SHIM";

/// Exit status of `metalift exec` when the command could not be found.
pub const NOT_FOUND: u8 = 127;
/// Exit status of `metalift exec` when the command could not be executed.
pub const NOT_EXECUTABLE: u8 = 126;
/// Exit status of `metalift exec --require-unlock` when the unlock is not confirmed.
pub const NOT_UNLOCKED: u8 = 4;
/// Exit status of `metalift exec --require-unlock` when no unlock happened and the
/// daemon unlocks nothing (the ladder's [`crate::judgement::EXIT_UNLOCKS_NOTHING`]).
pub const UNLOCKS_NOTHING: u8 = crate::judgement::EXIT_UNLOCKS_NOTHING;

/// Arguments of `metalift exec`.
#[derive(Debug, clap::Args)]
#[command(mut_arg("socket", |a| a.help(
    "The daemon's socket, passed to the shim as METALIFT_SOCKET [default: as `metalift status`]"
)))]
#[command(
    trailing_var_arg = true,
    after_help = "\
Exit status:
  N    the command's own exit status (128+N when killed by signal N); with
       --require-unlock a failing command's status is passed through, with a line
  2    metalift itself failed (e.g. no shim found)
  4    --require-unlock: the command succeeded, but no process of it got an unlock
       verdict with the shim's outcome applied (and the family --expect-family
       asks), as the daemon's audit log records it (or that could not be learned)
  5    --require-unlock: no unlock, and the daemon unlocks nothing (as `metalift
       status` exits 5: no daemon, no policy live, an audit log that cannot write)
  126  the command is not executable
  127  the command was not found

Without a reachable daemon the command runs stock, after a warning on stderr."
)]
pub struct Args {
    /// The shim to inject. Default: $METALIFT_SHIM, then ../lib/ and the
    /// directory of this executable, then /usr/local/metalift/lib.
    #[arg(long, value_name = "PATH")]
    pub shim: Option<PathBuf>,
    // The daemon (its socket is passed to the shim as METALIFT_SOCKET).
    #[command(flatten)]
    pub daemon: crate::daemon_args::DaemonArgs,
    /// Run the command as a child and exit 4 unless the daemon's audit log shows
    /// that it, or a process it started (a wrapper script's child), got an `unlock`
    /// verdict and the shim's outcome `applied` (for CI). A command that fails
    /// keeps its own exit status.
    #[arg(long)]
    pub require_unlock: bool,
    /// With --require-unlock (implied): the unlocked process must also answer
    /// AppleN or above (`N`, what llama.cpp's fast paths need: 7 holds on every
    /// host chip), or exactly AppleN (`=N`).
    #[arg(long, value_name = "N|=N")]
    pub expect_family: Option<metalift_policy::FamilyExpectation>,
    /// Say nothing on stderr unless it explains a non-zero exit status (for scripts).
    #[arg(long, short)]
    pub quiet: bool,
    /// The audit log --require-unlock reads the command's decision from.
    #[arg(long, visible_alias = "audit-log", value_name = "PATH", default_value = metalift_daemon::audit::DEFAULT_LOG_PATH, env = "METALIFT_AUDIT_LOG")]
    pub log: PathBuf,
    /// The command to run, and its arguments (put `--` first if it starts with `-`).
    #[arg(required = true, num_args = 1.., allow_hyphen_values = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// Runs `metalift exec`. Returns only if the command could not be started, or
/// (with `--require-unlock`) when it has finished.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let shim = find_shim(args.shim.as_deref(), env::var_os(SHIM_ENV).as_deref())?;
    let (name, rest) = args.command.split_first().context("no command given")?;
    let program = match locate(name, env::var_os("PATH").as_deref()) {
        Ok(program) => program,
        Err(code) => return Ok(code),
    };

    if !args.quiet {
        for warning in injection_warnings(&program, &shim) {
            eprintln!("metalift: warning: {warning}");
        }
    }
    let socket = args.daemon.known_socket();
    if let Some(problem) = daemon_problem(&args.daemon, socket.as_deref()).filter(|_| !args.quiet) {
        eprintln!(
            "metalift: warning: {problem}: {} will run stock unless that clears before it checks in",
            program.display()
        );
    }

    let value = append_library(env::var_os(INSERT_VAR).as_deref(), &shim);
    let mut command = Command::new(&program);
    command.arg0(name).args(rest).env(INSERT_VAR, value);
    if let Some(socket) = args.daemon.given() {
        command.env("METALIFT_SOCKET", socket);
    }
    if args.require_unlock || args.expect_family.is_some() {
        let requirement = require_unlock::Requirement {
            log: args.log.clone(),
            socket,
            daemon: args.daemon.clone(),
            expect: args.expect_family,
            quiet: args.quiet,
        };
        return require_unlock::run(command, &program, &requirement);
    }
    let err = command.exec();
    Ok(exec_failure(&program, &err))
}

/// Why the shim will get no unlock, if it will not, as every tool judges it: no
/// socket known, or the daemon's judgement is that it unlocks nothing (no daemon
/// answers, no policy live, an audit log that cannot hold decisions).
fn daemon_problem(
    daemon: &crate::daemon_args::DaemonArgs,
    socket: Option<&Path>,
) -> Option<String> {
    let Some(socket) = socket else {
        return Some("no daemon socket is known (set METALIFT_SOCKET or pass --socket)".into());
    };
    let judged = crate::judgement::ask(daemon, socket);
    if judged.level < crate::judgement::Level::UnlocksNothing {
        return None;
    }
    if judged.report.is_none() {
        return Some(format!(
            "no metalift daemon answers on {} ({}; {})",
            socket.display(),
            judged.error.as_deref().unwrap_or("no answer"),
            crate::judgement::DAEMON_UNREACHABLE
        ));
    }
    judged.cause().map(|cause| {
        format!(
            "metaliftd on {}: {}",
            socket.display(),
            daemon_health::describe(cause)
        )
    })
}

/// Finds the command as a shell would; on failure says why on stderr and
/// returns the shell's status: 127 not found, 126 found but not executable.
fn locate(name: &OsStr, path_var: Option<&OsStr>) -> Result<PathBuf, ExitCode> {
    let shown = name.to_string_lossy();
    if let Some(program) = resolve_command(name, path_var) {
        if name.as_encoded_bytes().contains(&b'/') {
            match program.metadata() {
                Err(_) => {
                    eprintln!("metalift: {shown}: No such file or directory");
                    return Err(ExitCode::from(NOT_FOUND));
                }
                Ok(m) if m.is_dir() => {
                    eprintln!("metalift: {shown}: is a directory");
                    return Err(ExitCode::from(NOT_EXECUTABLE));
                }
                Ok(m) if m.permissions().mode() & 0o111 == 0 => {
                    eprintln!("metalift: {shown}: Permission denied");
                    return Err(ExitCode::from(NOT_EXECUTABLE));
                }
                Ok(_) => {}
            }
        }
        return Ok(program);
    }
    // Like bash: a file of that name in PATH that is not executable is "permission denied".
    let not_executable = path_var.is_some_and(|p| {
        !name.is_empty() && env::split_paths(p).any(|dir| dir.join(name).is_file())
    });
    if not_executable {
        eprintln!("metalift: {shown}: Permission denied");
        Err(ExitCode::from(NOT_EXECUTABLE))
    } else {
        eprintln!("metalift: {shown}: command not found");
        Err(ExitCode::from(NOT_FOUND))
    }
}

/// The status for an `execve` that failed, after saying why: 127 when the file
/// (or its `#!` interpreter) does not exist, 126 otherwise.
pub fn exec_failure(program: &Path, err: &std::io::Error) -> ExitCode {
    eprintln!("metalift: could not run {}: {err}", program.display());
    if err.kind() == std::io::ErrorKind::NotFound {
        ExitCode::from(NOT_FOUND)
    } else {
        ExitCode::from(NOT_EXECUTABLE)
    }
}

/// Finds the shim: `--shim`, then `$METALIFT_SHIM` (both must exist when
/// given), then next to this executable (`../lib/`, then its own directory,
/// as in the installed tree and in cargo's target directory), then the
/// install prefix. Returns an absolute path: children inherit the variable and
/// may change directory.
pub fn find_shim(flag: Option<&Path>, env_value: Option<&OsStr>) -> anyhow::Result<PathBuf> {
    if let Some(path) = flag {
        return absolute_file(path).with_context(|| format!("--shim {}", path.display()));
    }
    if let Some(value) = env_value.filter(|v| !v.is_empty()) {
        let path = Path::new(value);
        return absolute_file(path).with_context(|| format!("{SHIM_ENV}={}", path.display()));
    }
    let mut candidates = Vec::new();
    if let Some(dir) = env::current_exe()
        .and_then(|exe| exe.canonicalize())
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
    {
        candidates.push(dir.join("../lib").join(SHIM_FILE));
        candidates.push(dir.join(SHIM_FILE));
    }
    candidates.push(Path::new(INSTALL_LIB_DIR).join(SHIM_FILE));
    for candidate in &candidates {
        if candidate.is_file() {
            return absolute_file(candidate);
        }
    }
    let looked: Vec<String> = candidates.iter().map(|c| c.display().to_string()).collect();
    bail!(
        "cannot find {SHIM_FILE} (looked in: {}); pass --shim PATH or set {SHIM_ENV}",
        looked.join(", ")
    )
}

fn absolute_file(path: &Path) -> anyhow::Result<PathBuf> {
    let path = path
        .canonicalize()
        .with_context(|| format!("cannot open {}", path.display()))?;
    if !path.is_file() {
        bail!("{} is not a file", path.display());
    }
    Ok(path)
}

/// Resolves `name` the way `execvp` does: a name with a `/` is used as given,
/// anything else is looked up in `PATH` (an empty entry meaning the current
/// directory), taking the first executable regular file.
pub fn resolve_command(name: &OsStr, path_var: Option<&OsStr>) -> Option<PathBuf> {
    let name_path = Path::new(name);
    if name.is_empty() {
        return None;
    }
    if name.as_encoded_bytes().contains(&b'/') {
        return Some(name_path.to_path_buf());
    }
    let path_var = path_var?;
    env::split_paths(path_var)
        .map(|dir| {
            if dir.as_os_str().is_empty() {
                PathBuf::from(".").join(name_path)
            } else {
                dir.join(name_path)
            }
        })
        .find(|candidate| is_executable_file(candidate))
}

fn is_executable_file(path: &Path) -> bool {
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The loader variable's new value: the existing list with the shim appended
/// (colon-separated, which both dyld and ld.so accept), unless already present.
pub fn append_library(existing: Option<&OsStr>, shim: &Path) -> OsString {
    let shim = shim.as_os_str();
    match existing.filter(|v| !v.is_empty()) {
        None => shim.to_os_string(),
        Some(existing) => {
            let already = existing
                .as_encoded_bytes()
                .split(|&b| b == b':' || b == b' ')
                .any(|entry| entry == shim.as_encoded_bytes());
            if already {
                return existing.to_os_string();
            }
            let mut value = existing.to_os_string();
            value.push(":");
            value.push(shim);
            value
        }
    }
}

/// Every reason known in advance why the loader will not load `shim` into `program`.
pub fn injection_warnings(program: &Path, shim: &Path) -> Vec<String> {
    let mut warnings = Vec::new();
    if !matches!(binary::read_format(shim), Ok(Format::Native(_))) {
        warnings.push(format!(
            "{} is not a shared library the loader can use (it will run stock)",
            shim.display()
        ));
    }
    let resolved = program
        .canonicalize()
        .unwrap_or_else(|_| program.to_path_buf());
    check_image(&resolved, shim, &mut warnings);

    if let Ok(Format::Script {
        interpreter,
        argument,
    }) = binary::read_format(&resolved)
    {
        // The kernel starts the interpreter; that is the process the loader sees.
        let mut image = interpreter.canonicalize().unwrap_or(interpreter);
        #[cfg(target_os = "macos")]
        check_macos_launcher(&image, &resolved, &mut warnings);
        if image.file_name() == Some(OsStr::new("env")) {
            if let Some(real) = argument
                .as_deref()
                .and_then(|a| resolve_command(OsStr::new(a), env::var_os("PATH").as_deref()))
            {
                image = real.canonicalize().unwrap_or(real);
            }
        }
        check_image(&image, shim, &mut warnings);
    }
    warnings
}

/// Warnings about one image the loader will start: setuid, arch slices, and on
/// macOS SIP and the Hardened Runtime.
fn check_image(image: &Path, shim: &Path, warnings: &mut Vec<String>) {
    if let Ok(meta) = image.metadata() {
        if meta.permissions().mode() & 0o6000 != 0 {
            warnings.push(format!(
                "{} is setuid/setgid: the loader restricts {INSERT_VAR} for it to trusted \
                 system libraries (it will run stock)",
                image.display()
            ));
        }
    }
    #[cfg(target_os = "macos")]
    {
        if macos::is_sip_protected(image) {
            warnings.push(format!(
                "{} is protected by System Integrity Protection: dyld ignores {INSERT_VAR} \
                 for it and its children (it will run stock); run the workload's own binary \
                 instead of a system wrapper",
                image.display()
            ));
            return;
        }
        // The Mach-O reader below answers for files it can read; codesign for the rest.
        if crate::macho::slices(&std::fs::read(image).unwrap_or_default()).is_err() {
            if let Some(problem) = macos::hardened_runtime_problem(image) {
                warnings.push(format!("{problem} (it will run stock)"));
            }
        }
    }
    // The code signature's flags and entitlements, read from the file (any platform).
    if let Ok(slices) = std::fs::read(image).map(|b| crate::macho::slices(&b)) {
        for unfit in crate::macho::shim_fit::check_slices(image, &slices.unwrap_or_default()) {
            if unfit.kind != "no-slice" {
                warnings.push(format!(
                    "{} (it will run stock): {}",
                    unfit.message, unfit.fix
                ));
            }
        }
    }
    if let (Ok(Format::Native(target)), Ok(Format::Native(shim_arches))) =
        (binary::read_format(image), binary::read_format(shim))
    {
        let missing = binary::missing_slices(&target, &shim_arches);
        if !missing.is_empty() {
            warnings.push(format!(
                "{} runs as {} but {} only has {}: the loader will not load it (it will run stock)",
                image.display(),
                list(&missing),
                shim.display(),
                list(&shim_arches)
            ));
        }
    }
}

/// On macOS a script's interpreter is the process dyld sees: a protected
/// `/bin/sh` or `/usr/bin/env` purges `DYLD_*` before the real program starts.
#[cfg(target_os = "macos")]
fn check_macos_launcher(interpreter: &Path, script: &Path, warnings: &mut Vec<String>) {
    if macos::is_sip_protected(interpreter) && interpreter.file_name() == Some(OsStr::new("env")) {
        warnings.push(format!(
            "{} starts through {}, which is SIP-protected: {INSERT_VAR} is purged before \
             the interpreter runs; name the interpreter itself, e.g. metalift exec \
             /opt/homebrew/bin/python3 {}",
            script.display(),
            interpreter.display(),
            script.display()
        ));
    }
}

fn list(arches: &[Arch]) -> String {
    let names: Vec<String> = arches.iter().map(Arch::to_string).collect();
    names.join(" + ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shim_is_appended_to_an_existing_list_not_replacing_it() {
        let shim = Path::new("/usr/local/metalift/lib/libmetalift.dylib");
        assert_eq!(append_library(None, shim), OsString::from(shim));
        assert_eq!(
            append_library(Some(OsStr::new("")), shim),
            OsString::from(shim)
        );
        assert_eq!(
            append_library(Some(OsStr::new("/opt/a.dylib")), shim),
            OsString::from("/opt/a.dylib:/usr/local/metalift/lib/libmetalift.dylib")
        );
    }

    #[test]
    fn shim_already_in_the_list_is_not_added_twice() {
        let shim = Path::new("/l/libmetalift.so");
        let existing = OsStr::new("/x.so:/l/libmetalift.so");
        assert_eq!(
            append_library(Some(existing), shim),
            existing.to_os_string()
        );
    }

    #[test]
    fn command_with_a_slash_is_used_as_given() {
        assert_eq!(
            resolve_command(OsStr::new("./run"), None),
            Some(PathBuf::from("./run"))
        );
        assert_eq!(
            resolve_command(OsStr::new(""), Some(OsStr::new("/bin"))),
            None
        );
    }

    #[test]
    fn explicit_shim_that_does_not_exist_is_an_error_not_a_fallback() {
        let err = find_shim(Some(Path::new("/nonexistent/libmetalift.so")), None).unwrap_err();
        assert!(format!("{err:#}").contains("--shim /nonexistent/libmetalift.so"));
        let err = find_shim(None, Some(OsStr::new("/nonexistent/x.so"))).unwrap_err();
        assert!(format!("{err:#}").contains("METALIFT_SHIM=/nonexistent/x.so"));
    }
}
