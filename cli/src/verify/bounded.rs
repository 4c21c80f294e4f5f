//! A child process with a deadline: `metalift verify` runs each probe (the stock
//! and unlocked reports, each kernel, the control) this way, so a kernel that
//! never completes is killed and named `hung` instead of hanging the image bake.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

/// How a bounded child ended.
#[derive(Debug)]
pub(crate) enum Ended {
    /// It exited (or was killed by a signal of its own) before the deadline.
    Exited {
        status: ExitStatus,
        stdout: Vec<u8>,
        stderr: Vec<u8>,
        took: Duration,
    },
    /// It was still running at the deadline and was killed (SIGKILL).
    Killed { after: Duration },
}

/// Runs `cmd` (stdin null, stdout and stderr captured) until it exits or
/// `deadline` passes; then kills and reaps it.
pub(crate) fn run(cmd: &mut Command, deadline: Instant) -> anyhow::Result<Ended> {
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    // Read both pipes as the child writes: a full pipe must not stall it.
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    loop {
        if let Some(status) = child.try_wait().context("waiting for the probe")? {
            return Ok(Ended::Exited {
                status,
                stdout: stdout.join().unwrap_or_default(),
                stderr: stderr.join().unwrap_or_default(),
                took: start.elapsed(),
            });
        }
        if Instant::now() >= deadline {
            kill(&mut child);
            // The pipes close with the child (the probe starts no others).
            let _ = stdout.join();
            let _ = stderr.join();
            return Ok(Ended::Killed {
                after: start.elapsed(),
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        bytes
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_past_its_deadline_is_killed_in_time() {
        let start = Instant::now();
        let ended = run(
            Command::new("sleep").arg("30"),
            Instant::now() + Duration::from_millis(200),
        )
        .unwrap();
        assert!(matches!(ended, Ended::Killed { .. }), "{ended:?}");
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_child_that_exits_gives_its_output() {
        let ended = run(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 4"]),
            Instant::now() + Duration::from_secs(20),
        )
        .unwrap();
        match ended {
            Ended::Exited {
                status,
                stdout,
                stderr,
                ..
            } => {
                assert_eq!(status.code(), Some(4));
                assert_eq!(stdout, b"out\n");
                assert_eq!(stderr, b"err\n");
            }
            other => panic!("{other:?}"),
        }
    }
}
