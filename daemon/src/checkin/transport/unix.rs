//! The Unix-socket transport: length-prefixed frames ([`metalift_policy::wire`]).
//!
//! Shaped like mini-redis: [`run`] accepts until `shutdown` resolves; a
//! `broadcast` tells every connection to stop, and the server learns they all
//! have when the last clone of an `mpsc::Sender` is dropped. Every await a
//! connection makes on its client sits in a `select!` with that shutdown; a
//! check-in already read is decided, audited and answered before it stops.
//!
//! A connection is one of two exchanges:
//!
//! - `CheckIn` → `Verdict`, then optionally one `Outcome` (a shim);
//! - `StatusRequest` → `Status` (`metalift status`; counts only).
//!
//! Limits ([`Limits`]): every connection is accepted at once and charged to its
//! uid (`SO_PEERCRED`/`LOCAL_PEERCRED`, read at accept) at the door
//! ([`super::door`]): it waits for its first frame in one of its uid's share of
//! the `max_pending` places, for at most `first_frame_timeout` (a shim sends its
//! check-in right after `connect`), holding nothing but its socket; past its
//! uid's share it takes the place of that uid's oldest silent connection. So clients that connect and say nothing
//! never stop the accepting, and one uid's silent flood never keeps another
//! uid's check-in out. Any later frame must arrive
//! within `read_timeout` of its first byte. At most `max_active` connections are
//! being decided or answered. A check-in takes one of `max_waiting` places when
//! it is admitted (its first frame read), as over XPC, and holds it until its
//! outcome; with none free it is answered `Declined(Busy)` at once and nothing
//! is decided (the shim stays stock, saying why). An answered shim gives its
//! active place up and may stay silent for `outcome_idle`. So idle shims never
//! block new check-ins, and a slowloris client holds an active place for at
//! most `read_timeout`. Every place is per user as well as global
//! ([`crate::checkin::per_user`]): one uid holds at most a quarter of each, so
//! its flood never turns another uid's check-in busy or late. An oversize or
//! malformed frame, a message out of order, or a timeout closes that connection
//! only.
//!
//! Identifying the peer may block (`SecCode` on macOS, a test's slow stand-in),
//! and then it never runs on the executor: the connection's socket is duplicated
//! and identified on the core's bounded blocking pool
//! ([`crate::checkin::blocking_pool`]) while the accept loop, the deadlines and
//! every other connection go on. An identity that reads kernel memory only (Linux:
//! `SO_PEERCRED`, pidfd, procfs; [`IdentifyPeer::may_block`]) runs inline, where it
//! costs less than the hop; hashing for `sha256` rules still goes to the pool, on
//! an identity-cache miss only.
//!
//! The socket file itself (creation, stale replacement, mode 0666, removal) is
//! [`super::socket_file`]'s.

use std::future::Future;
use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use metalift_policy::wire::{self, Message, WireError};
use metalift_xpc::exchange::{Refusal, Serving};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;

use super::door::{Door, Pass};
use super::Limits;
use crate::checkin::peer::{self, IdentifyPeer, KernelIdentity, PeerFacts};
use crate::checkin::server::Core;
use crate::checkin::session::{Active, Admission, Admitted, Origin, Places, Session};

/// The transport's name in audit records.
pub const TRANSPORT: &str = "unix";

/// Serves check-ins on `listener` until `shutdown` resolves, then waits for every
/// connection to finish (in-flight check-ins are answered; idle ones are closed).
pub async fn run(
    listener: UnixListener,
    core: Arc<Core>,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    run_with_identity(listener, core, limits, Arc::new(KernelIdentity), shutdown).await;
}

/// [`run`], learning who is asking from `identity` instead of the kernel: the
/// seam through which tests slow identification down or make it fail.
pub async fn run_with_identity(
    listener: UnixListener,
    core: Arc<Core>,
    limits: Limits,
    identity: Arc<dyn IdentifyPeer>,
    shutdown: impl Future<Output = ()>,
) {
    let (notify_shutdown, _) = broadcast::channel(1);
    let (shutdown_complete_tx, mut shutdown_complete_rx) = mpsc::channel::<()>(1);
    let mut server = Listener {
        listener,
        session: Session::new(
            core,
            Places::new(limits.max_active, limits.max_waiting),
            TRANSPORT,
        ),
        limits,
        identity,
        door: Door::new(&limits),
        notify_shutdown,
        shutdown_complete_tx,
    };
    tokio::select! {
        () = server.accept_loop() => {}
        () = shutdown => tracing::info!("shutting down: no new connections"),
    }
    let Listener {
        notify_shutdown,
        shutdown_complete_tx,
        ..
    } = server;
    drop(notify_shutdown);
    drop(shutdown_complete_tx);
    // Every connection holds a sender clone; recv returns None once all are gone.
    let _ = shutdown_complete_rx.recv().await;
}

/// The accepting half of the server.
struct Listener {
    listener: UnixListener,
    /// The check-in steps, with this transport's active and waiting places
    /// (per user as well as global: [`crate::checkin::per_user`]).
    session: Session,
    limits: Limits,
    /// Who is asking (the kernel, or a test's stand-in).
    identity: Arc<dyn IdentifyPeer>,
    /// Places for connections waiting for their first frame, per uid
    /// ([`Limits::max_pending`], [`super::door`]).
    door: Door,
    /// Dropped at shutdown: every connection's receiver then wakes.
    notify_shutdown: broadcast::Sender<()>,
    /// Cloned into every connection; when all clones are dropped, they are done.
    shutdown_complete_tx: mpsc::Sender<()>,
}

impl Listener {
    /// Accepts forever. Accept errors (e.g. out of file descriptors) are retried
    /// with a growing pause instead of stopping the daemon: the clients already
    /// connected will close and free descriptors.
    async fn accept_loop(&mut self) {
        let mut pause = Duration::from_millis(10);
        loop {
            let stream = match self.listener.accept().await {
                Ok((stream, _)) => {
                    pause = Duration::from_millis(10);
                    stream
                }
                Err(error) => {
                    tracing::error!(%error, retry_in_ms = pause.as_millis() as u64, "accept failed");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                    continue;
                }
            };
            // The connecting uid, from the kernel (SO_PEERCRED / LOCAL_PEERCRED:
            // no blocking); one bucket for a peer the kernel cannot name.
            let uid = stream.peer_cred().map_or(u32::MAX, |c| c.uid());
            let pass = match self.door.enter(uid) {
                Ok(pass) => pass,
                Err(refused) => {
                    // One line per refused connection would let a flood fill the log.
                    tracing::debug!(%refused, "connection closed at the door");
                    continue; // dropping `stream` closes it
                }
            };
            let connection = Connection {
                frames: Frames {
                    stream,
                    buf: Vec::with_capacity(256),
                    read_timeout: self.limits.read_timeout,
                },
                session: self.session.clone(),
                identity: Arc::clone(&self.identity),
                limits: self.limits,
                shutdown: self.notify_shutdown.subscribe(),
                _shutdown_complete: self.shutdown_complete_tx.clone(),
            };
            tokio::spawn(async move {
                match connection.serve(pass).await {
                    Ok(()) => {}
                    // A shim that never reports is normal; an unidentified peer
                    // was already counted by the core; a peer that exits or hangs
                    // up mid-exchange (a short-lived process) is normal too: one
                    // line per peer would bury real problems.
                    Err(error) if error.is_peer_leaving() => {
                        tracing::debug!(%error, "connection closed")
                    }
                    Err(error) => tracing::warn!(%error, "connection closed"),
                }
            });
        }
    }
}

/// One client connection.
struct Connection {
    frames: Frames,
    session: Session,
    identity: Arc<dyn IdentifyPeer>,
    limits: Limits,
    /// Wakes (with an error: the sender is dropped) when the daemon stops.
    shutdown: broadcast::Receiver<()>,
    /// Held, never used: its drop tells [`run`] this connection is done.
    _shutdown_complete: mpsc::Sender<()>,
}

/// Why a connection was closed early.
#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error("reading or writing: {0}")]
    Io(#[from] io::Error),
    #[error("no complete frame within the read deadline")]
    Deadline,
    #[error("its place at the door went to another uid's connection")]
    Evicted,
    #[error("silent for longer than the outcome idle limit")]
    Idle,
    #[error("the client closed mid-frame")]
    Truncated,
    #[error("bad frame: {0}")]
    Wire(#[from] WireError),
    #[error("{0}")]
    Refused(#[from] Refusal),
    #[error("cannot identify the peer: {0}")]
    Peer(#[from] peer::PeerError),
}

impl ConnError {
    /// The peer went away (or idled out): expected of short-lived processes.
    fn is_peer_leaving(&self) -> bool {
        match self {
            ConnError::Idle | ConnError::Peer(_) | ConnError::Truncated | ConnError::Evicted => {
                true
            }
            ConnError::Io(e) => matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
            ),
            _ => false,
        }
    }
}

/// How long [`Frames::read`] may wait.
#[derive(Debug, Clone, Copy)]
enum Wait {
    /// The whole frame must be in by then.
    Until(Instant),
    /// Up to this long for the first byte, then `read_timeout` for the rest.
    Idle(Duration),
}

/// `Ok(None)` from a read: the daemon is stopping or the client closed cleanly.
type ReadResult = Result<Option<Message>, ConnError>;

impl Connection {
    async fn serve(mut self, pending: Pass) -> Result<(), ConnError> {
        let first_frame = self
            .limits
            .first_frame_timeout
            .min(self.limits.read_timeout);
        let first = tokio::select! {
            read = self.read_or_stop(Wait::Until(Instant::now() + first_frame)) => read?,
            () = pending.evicted() => return Err(ConnError::Evicted),
        };
        let Some(first) = first else {
            return Ok(());
        };
        // Every place below is taken within the uid's share first.
        let uid = pending.uid();
        let request = self.session.first(Ok(first), Origin::Connection)?;
        // The socket decides every check-in: its kernel names the connection.
        match self.session.admit(request, Serving::Identities, uid) {
            Admission::Decline(declined) => {
                drop(pending);
                tracing::debug!(uid, detail = %declined.detail, "check-in declined");
                self.frames.write(&Message::Declined(declined)).await
            }
            Admission::Status => {
                let Some(active) = self.session.activate(uid).await else {
                    return Ok(()); // never closed
                };
                drop(pending);
                let status = self
                    .session
                    .status()
                    .map_err(|e| ConnError::Io(io::Error::other(e)))?;
                let written = self.frames.write(&status).await;
                drop(active);
                written
            }
            Admission::Decide(admitted) => {
                // Deciding takes an active place (this uid's share first); the
                // pending one is given back.
                let Some(active) = self.session.activate(uid).await else {
                    return Ok(()); // never closed
                };
                drop(pending);
                self.check_in(admitted, active, uid).await
            }
        }
    }

    async fn check_in(
        &mut self,
        admitted: Admitted,
        active: Active,
        uid: u32,
    ) -> Result<(), ConnError> {
        // Only what the live policy's rules need is read (no executable opened
        // without a sha256 rule, no parent without a parent rule). A reload between
        // here and the decision can add such a rule: this one check-in is then
        // decided without that fact, so that rule cannot match it (stock).
        let core = Arc::clone(self.session.core());
        let wants = peer::Wants::from_needs(core.needs());
        // The blocking thread gets its own descriptor for the same socket; the
        // stream stays here. Not raced against shutdown (a check-in that arrived
        // is decided); a slow identification holds this connection's active
        // place, and the pool bounds how many run at once.
        let identified = if self.identity.may_block(wants) {
            let socket = self.frames.stream.as_fd().try_clone_to_owned()?;
            let identity = Arc::clone(&self.identity);
            core.blocking()
                .run_for(uid, move || identity.identify(socket.as_fd(), wants))
                .await
        } else {
            // Kernel memory only (see `KernelIdentity`): cheaper here than the
            // hop to a blocking thread and back.
            Ok(self.identity.identify(self.frames.stream.as_fd(), wants))
        };
        let facts: PeerFacts = match identified {
            Ok(Ok(facts)) => facts,
            Ok(Err(error)) => {
                self.session.unidentified(&error);
                return Err(error.into());
            }
            Err(_) => {
                return Err(ConnError::Io(io::Error::other(
                    "identification was cancelled",
                )))
            }
        };
        let (verdict, answered) = self
            .session
            .decide(admitted, facts, Origin::Connection, active)
            .await;
        self.frames.write(&Message::Verdict(verdict)).await?;

        // Answered: the active place goes back; the waiting place, taken at
        // admission, is held until the outcome.
        let awaiting = answered.answered();
        let message = match self
            .read_or_stop(Wait::Idle(self.limits.outcome_idle))
            .await
        {
            Ok(None) => return Ok(()),
            Ok(Some(message)) => Ok(message),
            Err(ConnError::Wire(error)) => Err(error),
            // Silence, a hang-up, a deadline: nothing was refused.
            Err(error) => return Err(error),
        };
        self.session
            .outcome(awaiting, message, Origin::Connection)
            .await?;
        Ok(())
    }

    /// Reads one frame, or `None` if the daemon stops first or the client closed
    /// between frames.
    async fn read_or_stop(&mut self, wait: Wait) -> ReadResult {
        tokio::select! {
            read = self.frames.read(wait) => read,
            _ = self.shutdown.recv() => Ok(None),
        }
    }
}

/// A stream and its read buffer, with the frame deadlines.
struct Frames {
    stream: UnixStream,
    /// Bytes read but not yet decoded; never more than one frame plus one read.
    buf: Vec<u8>,
    read_timeout: Duration,
}

impl Frames {
    async fn read(&mut self, wait: Wait) -> ReadResult {
        let mut deadline = match wait {
            Wait::Until(at) => Some(at),
            Wait::Idle(_) if !self.buf.is_empty() => Some(Instant::now() + self.read_timeout),
            Wait::Idle(_) => None,
        };
        loop {
            if let Some((msg, used)) = wire::decode_frame(&self.buf)? {
                self.buf.drain(..used);
                return Ok(Some(msg));
            }
            self.buf.reserve(4096);
            let read = self.stream.read_buf(&mut self.buf);
            let n = match (deadline, wait) {
                (Some(at), _) => tokio::time::timeout_at(at, read)
                    .await
                    .map_err(|_| ConnError::Deadline)??,
                (None, Wait::Idle(idle)) => tokio::time::timeout(idle, read)
                    .await
                    .map_err(|_| ConnError::Idle)??,
                (None, Wait::Until(at)) => tokio::time::timeout_at(at, read)
                    .await
                    .map_err(|_| ConnError::Deadline)??,
            };
            if n == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(ConnError::Truncated)
                };
            }
            if deadline.is_none() {
                deadline = Some(Instant::now() + self.read_timeout);
            }
        }
    }

    /// Writes one frame, bounded by the read timeout (a client that never reads
    /// cannot hold the connection open).
    async fn write(&mut self, msg: &Message) -> Result<(), ConnError> {
        let frame = wire::encode_frame(msg);
        tokio::time::timeout(self.read_timeout, self.stream.write_all(&frame))
            .await
            .map_err(|_| ConnError::Deadline)??;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The deadlines, on tokio's paused clock: time only moves when every task
    //! waits, so no test waits out a real deadline or races a timer.

    use std::time::Duration;

    use metalift_policy::wire::{Answers, Outcome, OutcomeResult};
    use tokio::io::AsyncWriteExt;

    use super::*;

    const READ_TIMEOUT: Duration = Duration::from_secs(5);
    /// The default outcome wait (seconds: the shim reports right after Metal's
    /// `initGPUFamilySupport` returns).
    const IDLE: Duration = Limits::DEFAULT_OUTCOME_IDLE;

    fn connected() -> (Frames, UnixStream) {
        let (server, client) = UnixStream::pair().expect("pair");
        let frames = Frames {
            stream: server,
            buf: Vec::new(),
            read_timeout: READ_TIMEOUT,
        };
        (frames, client)
    }

    fn outcome_frame() -> Vec<u8> {
        wire::encode_frame(&Message::Outcome(Outcome {
            decision_id: 1,
            result: OutcomeResult::Applied,
            reason: String::new(),
            device_class: "AppleParavirtDevice".into(),
            stock: Answers::default(),
            effective: Answers::default(),
            ..Default::default()
        }))
    }

    #[tokio::test(start_paused = true)]
    async fn a_frame_left_incomplete_is_cut_at_the_read_deadline() {
        let (mut frames, mut client) = connected();
        client.write_all(&outcome_frame()[..3]).await.unwrap();
        let result = frames
            .read(Wait::Until(Instant::now() + READ_TIMEOUT))
            .await;
        assert!(matches!(result, Err(ConnError::Deadline)), "{result:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_answered_shim_may_stay_silent_until_the_idle_limit() {
        let (mut frames, mut client) = connected();
        let writer = tokio::spawn(async move {
            tokio::time::sleep(IDLE - Duration::from_secs(1)).await;
            client.write_all(&outcome_frame()).await.unwrap();
            client
        });
        let msg = frames.read(Wait::Idle(IDLE)).await.expect("frame");
        assert!(matches!(msg, Some(Message::Outcome(_))));
        drop(writer.await);
    }

    #[tokio::test(start_paused = true)]
    async fn silence_past_the_idle_limit_closes_the_connection() {
        let (mut frames, _client) = connected();
        let result = frames.read(Wait::Idle(IDLE)).await;
        assert!(matches!(result, Err(ConnError::Idle)), "{result:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn once_an_outcome_starts_it_must_finish_within_the_read_deadline() {
        let (mut frames, mut client) = connected();
        // Silence short of the idle limit is fine; then one byte starts the frame clock.
        let _writer = tokio::spawn(async move {
            tokio::time::sleep(IDLE - Duration::from_millis(100)).await;
            client.write_all(&outcome_frame()[..1]).await.unwrap();
            tokio::time::sleep(IDLE).await;
            client
        });
        let result = frames.read(Wait::Idle(IDLE)).await;
        assert!(matches!(result, Err(ConnError::Deadline)), "{result:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_closing_between_frames_is_a_clean_end_and_mid_frame_is_not() {
        let (mut frames, client) = connected();
        drop(client);
        assert!(matches!(
            frames
                .read(Wait::Until(Instant::now() + READ_TIMEOUT))
                .await,
            Ok(None)
        ));

        let (mut frames, mut client) = connected();
        client.write_all(&outcome_frame()[..5]).await.unwrap();
        drop(client);
        assert!(matches!(
            frames
                .read(Wait::Until(Instant::now() + READ_TIMEOUT))
                .await,
            Err(ConnError::Truncated)
        ));
    }
}
