//! The transport-only baseline: a server that speaks metalift's framing on a
//! Unix socket and answers every check-in with a fixed verdict, without peer
//! identity, policy or audit log.
//!
//! It runs in its own process (`metalift-bench serve-baseline SOCKET`) on the
//! same tokio runtime flavour as metaliftd, so "metaliftd minus baseline" is what
//! deciding and auditing cost, and the baseline's own ceiling shows how much of a
//! throughput figure is the socket layer and the load generator sharing the CPUs.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use metalift_policy::verdict::Mode;
use metalift_policy::wire::{self, Message, VerdictMsg, WireAction};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Serves on `socket` until killed.
pub fn serve(socket: &Path) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let _ = std::fs::remove_file(socket);
        let listener = tokio::net::UnixListener::bind(socket)
            .with_context(|| format!("binding {}", socket.display()))?;
        let verdict = wire::encode_frame(&Message::Verdict(VerdictMsg {
            decision_id: 1,
            action: WireAction::Stock,
            capabilities: None,
            profile: None,
            rule: None,
            mode: Mode::Enforce,
            would_unlock: false,
        }));
        loop {
            let (mut stream, _) = listener.accept().await?;
            let verdict = verdict.clone();
            tokio::spawn(async move {
                let mut buf = Vec::with_capacity(256);
                // The check-in, then the verdict; then wait for the client to close
                // (or send its outcome), as metaliftd does.
                let mut answered = false;
                loop {
                    match wire::decode_frame(&buf) {
                        Ok(Some((_, used))) => {
                            buf.drain(..used);
                            if !answered {
                                answered = true;
                                if stream.write_all(&verdict).await.is_err() {
                                    return;
                                }
                            }
                            continue;
                        }
                        Ok(None) => {}
                        Err(_) => return,
                    }
                    buf.reserve(4096);
                    match stream.read_buf(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            });
        }
    })
}

/// A baseline server process; killed on drop.
#[derive(Debug)]
pub struct BaselineServer {
    child: Child,
    /// Its socket.
    pub socket: PathBuf,
}

impl BaselineServer {
    /// Starts `bench serve-baseline dir/baseline.sock` and waits until it answers.
    pub fn start(bench: &Path, dir: &Path) -> anyhow::Result<BaselineServer> {
        let socket = dir.join("baseline.sock");
        let child = Command::new(bench)
            .arg("serve-baseline")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .context("starting the baseline server")?;
        let mut server = BaselineServer { child, socket };
        let start = Instant::now();
        while crate::harness::check_in(&server.socket).is_err() {
            if let Some(exit) = server.child.try_wait()? {
                bail!("baseline server exited at start: {exit}");
            }
            if start.elapsed() > crate::harness::HANG_GUARD {
                bail!("baseline server did not come up");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(server)
    }

    /// Its pid.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for BaselineServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
