//! Where `DYLD_INSERT_LIBRARIES` is configured: launchd jobs' `EnvironmentVariables`
//! (system agents and daemons, every user's agents), and `launchctl getenv` for
//! the whole session (which the admin guide advises against).

use std::path::{Path, PathBuf};

use super::check::{Check, Status};
use super::paths::Install;
use crate::exec::SHIM_FILE;

const VAR: &str = "DYLD_INSERT_LIBRARIES";

/// One job that inserts libraries.
#[derive(Debug)]
struct Job {
    plist: PathBuf,
    label: String,
    libraries: Vec<String>,
}

fn jobs(dirs: &[PathBuf]) -> Vec<Job> {
    let mut jobs = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut plists: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "plist"))
            .collect();
        plists.sort();
        for plist in plists {
            let Ok(value) = plist::Value::from_file(&plist) else {
                continue;
            };
            let Some(dict) = value.as_dictionary() else {
                continue;
            };
            let Some(inserted) = dict
                .get("EnvironmentVariables")
                .and_then(plist::Value::as_dictionary)
                .and_then(|env| env.get(VAR))
                .and_then(plist::Value::as_string)
            else {
                continue;
            };
            jobs.push(Job {
                label: dict
                    .get("Label")
                    .and_then(plist::Value::as_string)
                    .unwrap_or("?")
                    .to_owned(),
                libraries: inserted
                    .split(':')
                    .filter(|l| !l.is_empty())
                    .map(str::to_owned)
                    .collect(),
                plist,
            });
        }
    }
    jobs
}

/// The fix for a missing shim: the launchd jobs that still insert it (by file
/// name, wherever they point), which dyld refuses to start, or that none does.
pub fn missing_shim_fix(install: &Install) -> String {
    let naming: Vec<String> = jobs(&install.launchd_dirs())
        .into_iter()
        .filter(|j| {
            j.libraries
                .iter()
                .any(|l| Path::new(l).file_name().is_some_and(|n| n == SHIM_FILE))
        })
        .map(|j| format!("{} ({})", j.label, j.plist.display()))
        .collect();
    if naming.is_empty() {
        "reinstall metalift (no launchd job names the shim; a job that sets \
         DYLD_INSERT_LIBRARIES itself, or `metalift exec`, fails until then)"
            .to_owned()
    } else {
        format!(
            "reinstall metalift, or remove {VAR} from the jobs that name it: {}",
            naming.join(", ")
        )
    }
}

/// One check per job that inserts libraries, or one saying none does.
pub fn injection(install: &Install) -> Vec<Check> {
    let dirs = install.launchd_dirs();
    if !dirs.iter().any(|d| d.is_dir()) {
        return vec![Check::new(
            "injection",
            Status::NotApplicable,
            "no launchd job directories (not macOS)",
        )];
    }
    let found = jobs(&dirs);
    if found.is_empty() {
        return vec![Check::new(
            "injection",
            Status::Warn,
            format!("no launchd job sets {VAR}: only `metalift exec` runs get the shim"),
        )
        .fix("add EnvironmentVariables/DYLD_INSERT_LIBRARIES to the CI agent's or workload's plist (the guide: Getting the shim into processes)")];
    }
    let mut checks = Vec::new();
    for job in found {
        let at = format!("{} ({})", job.label, job.plist.display());
        for lib in &job.libraries {
            let on_disk = Install::under(&install.root, lib);
            let is_shim = Path::new(lib).file_name().is_some_and(|n| n == SHIM_FILE);
            let check = if !on_disk.exists() {
                Check::new(
                    "injection",
                    Status::Fail,
                    format!("{at} inserts {lib}, which is missing: dyld refuses to start the job"),
                )
                .fix(format!(
                    "reinstall metalift, or remove {VAR} from {}",
                    job.plist.display()
                ))
            } else if is_shim {
                Check::new(
                    "injection",
                    Status::Ok,
                    format!("{at} inserts the shim {lib}"),
                )
            } else {
                Check::new(
                    "injection",
                    Status::Warn,
                    format!("{at} inserts {lib}, not metalift's shim (another unlocker?)"),
                )
                .fix("two unlockers in one process fight over Metal's answers: keep one")
            };
            checks.push(check);
        }
    }
    checks
}

/// `launchctl getenv DYLD_INSERT_LIBRARIES`: set for the whole session (macOS only).
pub fn session(install: &Install) -> Check {
    if !cfg!(target_os = "macos") || install.root != Path::new("/") {
        return Check::new(
            "session env",
            Status::NotApplicable,
            "launchctl getenv: macOS only",
        );
    }
    let out = std::process::Command::new("launchctl")
        .args(["getenv", VAR])
        .output();
    match out {
        Ok(out) if !String::from_utf8_lossy(&out.stdout).trim().is_empty() => Check::new(
            "session env",
            Status::Warn,
            format!(
                "launchctl getenv {VAR} = {}: every app in the session loads it",
                String::from_utf8_lossy(&out.stdout).trim()
            ),
        )
        .fix(format!("launchctl unsetenv {VAR}; inject per job instead")),
        Ok(_) => Check::new(
            "session env",
            Status::Ok,
            format!("{VAR} is not set for the whole session"),
        ),
        Err(e) => Check::new(
            "session env",
            Status::Warn,
            format!("cannot run launchctl: {e}"),
        ),
    }
}
