//! A child process with a deadline: `metalift verify` runs each probe (the stock
//! and unlocked reports, each kernel, the control) this way, so a kernel that
//! never completes is killed and named `hung` instead of hanging the image bake.
//! A workload (`--workload`) runs as the leader of a process group of its own
//! ([`Group::Own`]), so what it starts (llama-bench under a script, a server's
//! children) is killed with it and nothing is left running.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
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

/// Which processes a deadline kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Group {
    /// The child only (the probe starts no others).
    Child,
    /// The child as the leader of a new process group, and everything in it:
    /// killed at the deadline, and also when the leader exits first (a
    /// background process it left would hold the pipes open).
    Own,
}

/// How long the pipes may stay open after the processes were killed or exited
/// (a process that left the group can hold them): then the output read so far
/// is dropped rather than waited for.
const PIPE_GRACE: Duration = Duration::from_secs(5);

/// Runs `cmd` (stdin null, stdout and stderr captured) until it exits or
/// `deadline` passes; then kills and reaps it.
pub(crate) fn run(cmd: &mut Command, deadline: Instant) -> anyhow::Result<Ended> {
    run_in(cmd, deadline, Group::Child)
}

/// [`run`], killing `group` at the deadline.
pub(crate) fn run_in(cmd: &mut Command, deadline: Instant, group: Group) -> anyhow::Result<Ended> {
    let start = Instant::now();
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if group == Group::Own {
        cmd.process_group(0);
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    // Read both pipes as the child writes: a full pipe must not stall it.
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let pid = rustix::process::Pid::from_child(&child);
    loop {
        if let Some(status) = child
            .try_wait()
            .with_context(|| format!("waiting for {:?}", cmd.get_program()))?
        {
            if group == Group::Own {
                // The group outlives its reaped leader while a member is left, so
                // its id is not reused: this reaches only what the workload left.
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
            return Ok(Ended::Exited {
                status,
                stdout: collect(&stdout),
                stderr: collect(&stderr),
                took: start.elapsed(),
            });
        }
        if Instant::now() >= deadline {
            if group == Group::Own {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
            kill(&mut child);
            let _ = collect(&stdout);
            let _ = collect(&stderr);
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

fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> mpsc::Receiver<Vec<u8>> {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        let _ = send.send(bytes);
    });
    receive
}

fn collect(pipe: &mpsc::Receiver<Vec<u8>>) -> Vec<u8> {
    pipe.recv_timeout(PIPE_GRACE).unwrap_or_default()
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
    fn a_workload_past_its_deadline_is_killed_with_what_it_started() {
        let start = Instant::now();
        // The shell's child holds the pipes: only killing the group ends it.
        let ended = run_in(
            Command::new("sh").args(["-c", "sleep 30; echo never"]),
            Instant::now() + Duration::from_millis(300),
            Group::Own,
        )
        .unwrap();
        assert!(matches!(ended, Ended::Killed { .. }), "{ended:?}");
        assert!(
            start.elapsed() < Duration::from_secs(4),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn a_workload_that_leaves_a_background_process_ends_with_its_leader() {
        let start = Instant::now();
        let ended = run_in(
            Command::new("sh").args(["-c", "sleep 30 & echo done"]),
            Instant::now() + Duration::from_secs(20),
            Group::Own,
        )
        .unwrap();
        match ended {
            Ended::Exited { stdout, .. } => assert_eq!(stdout, b"done\n"),
            other => panic!("{other:?}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(4),
            "{:?}",
            start.elapsed()
        );
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
