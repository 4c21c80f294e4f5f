//! The one blocking client of the check-in protocol: connect, check in, report the
//! outcome, ask the status. The CLI, the benchmarks and every test reach metaliftd
//! through it (the shim speaks the same frames from C).
//!
//! A connection the daemon ends is reported one way, [`ClientError::Closed`] (or
//! `None` from [`Client::receive`]), whether the client sees an end of file or a
//! reset: on a Unix socket, a daemon that closes a connection with bytes of the
//! client's still unread (a refusal, a connection over a limit) makes the client's
//! next read fail with `ECONNRESET` instead of returning end of file, and which of
//! the two the client sees depends on scheduling, not on what the daemon decided.
//! Telling them apart made callers flaky; both mean "the daemon closed it".

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{
    decode_body, encode_frame, frame_length, CheckIn, Message, Outcome, VerdictMsg, WireError,
    LENGTH_PREFIX,
};

/// Why an exchange with the daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing accepts connections on the socket.
    #[error("no daemon answers: {source} (is metaliftd running? tried {})", socket.display())]
    Connect {
        /// The socket tried.
        socket: PathBuf,
        /// The connect error.
        source: std::io::Error,
    },
    /// The daemon accepted the connection but did not answer in time.
    #[error("no answer from metaliftd within {} s on {} (the daemon is hung or overloaded: restart it)", timeout.as_secs_f64(), socket.display())]
    NoAnswer {
        /// The socket.
        socket: PathBuf,
        /// How long each read and write was given.
        timeout: Duration,
    },
    /// The daemon closed the connection (end of file or reset: see the module doc).
    #[error("metaliftd on {} closed the connection", socket.display())]
    Closed {
        /// The socket.
        socket: PathBuf,
    },
    /// Any other failure of a read or a write.
    #[error("talking to metaliftd on {}: {source}", socket.display())]
    Io {
        /// The socket.
        socket: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The daemon sent a frame that does not decode.
    #[error("metaliftd on {} answered with a malformed frame: {error}", socket.display())]
    Protocol {
        /// The socket.
        socket: PathBuf,
        /// The decoding error.
        error: WireError,
    },
    /// The daemon sent another message than the one due.
    #[error("metaliftd on {} answered with a {} where a {expected} was due", socket.display(), got.kind_name())]
    Unexpected {
        /// The socket.
        socket: PathBuf,
        /// The kind of message that was due.
        expected: &'static str,
        /// What came instead.
        got: Box<Message>,
    },
}

/// One connection to metaliftd; every read and write is bounded by the timeout
/// given to [`Client::connect`].
#[derive(Debug)]
pub struct Client {
    stream: UnixStream,
    socket: PathBuf,
    timeout: Duration,
}

impl Client {
    /// Connects to `socket`. `timeout` bounds each later read and write (a Unix
    /// socket's connect does not wait for the daemon: it succeeds once the kernel
    /// queues the connection, or fails at once).
    pub fn connect(socket: &Path, timeout: Duration) -> Result<Client, ClientError> {
        let stream = UnixStream::connect(socket).map_err(|source| ClientError::Connect {
            socket: socket.to_owned(),
            source,
        })?;
        let client = Client {
            stream,
            socket: socket.to_owned(),
            timeout,
        };
        client
            .stream
            .set_read_timeout(Some(timeout))
            .and_then(|()| client.stream.set_write_timeout(Some(timeout)))
            .map_err(|e| client.io(e))?;
        Ok(client)
    }

    /// Asks the daemon on `socket` for its status on a fresh connection: the JSON
    /// document as sent.
    pub fn status(socket: &Path, timeout: Duration) -> Result<String, ClientError> {
        let mut client = Client::connect(socket, timeout)?;
        client.send(&Message::StatusRequest)?;
        match client.answer()? {
            Message::Status(json) => Ok(json),
            other => Err(client.unexpected("status", other)),
        }
    }

    /// Checks in as a shim does and returns the verdict (a `declined` answer is
    /// [`ClientError::Unexpected`]; [`Client::send`] and [`Client::receive`] see it).
    pub fn check_in(&mut self, check_in: &CheckIn) -> Result<VerdictMsg, ClientError> {
        self.send(&Message::CheckIn(check_in.clone()))?;
        match self.answer()? {
            Message::Verdict(v) => Ok(v),
            other => Err(self.unexpected("verdict", other)),
        }
    }

    /// Reports what the shim did with the verdict (the daemon sends nothing back).
    pub fn outcome(&mut self, outcome: &Outcome) -> Result<(), ClientError> {
        self.send(&Message::Outcome(outcome.clone()))
    }

    /// Sends one message.
    pub fn send(&mut self, msg: &Message) -> Result<(), ClientError> {
        self.send_bytes(&encode_frame(msg))
    }

    /// Sends bytes as they are: a prebuilt frame (a benchmark's loop), or a
    /// malformed one (a test of the daemon's refusals).
    pub fn send_bytes(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.stream.write_all(bytes).map_err(|e| self.io(e))
    }

    /// Reads one message; `None` when the daemon closed the connection before a
    /// frame began (end of file or reset, one way: see the module doc).
    pub fn receive(&mut self) -> Result<Option<Message>, ClientError> {
        let mut prefix = [0u8; LENGTH_PREFIX];
        match self.stream.read_exact(&mut prefix) {
            Ok(()) => {}
            Err(e) if closed(&e) => return Ok(None),
            Err(e) => return Err(self.io(e)),
        }
        let len = frame_length(prefix).map_err(|e| self.protocol(e))?;
        let mut body = vec![0u8; len];
        self.stream.read_exact(&mut body).map_err(|e| self.io(e))?;
        decode_body(&body).map(Some).map_err(|e| self.protocol(e))
    }

    /// The connection itself, for what the protocol does not cover (peer
    /// credentials, a half close, a raw read).
    #[must_use]
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    /// The next message, which must come.
    fn answer(&mut self) -> Result<Message, ClientError> {
        self.receive()?.ok_or_else(|| ClientError::Closed {
            socket: self.socket.clone(),
        })
    }

    fn unexpected(&self, expected: &'static str, got: Message) -> ClientError {
        ClientError::Unexpected {
            socket: self.socket.clone(),
            expected,
            got: Box::new(got),
        }
    }

    fn protocol(&self, error: WireError) -> ClientError {
        ClientError::Protocol {
            socket: self.socket.clone(),
            error,
        }
    }

    fn io(&self, source: std::io::Error) -> ClientError {
        let socket = self.socket.clone();
        if closed(&source) {
            ClientError::Closed { socket }
        } else if matches!(source.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
            // A timeout on a blocking socket is EAGAIN ("Resource temporarily
            // unavailable"): say what it means.
            ClientError::NoAnswer {
                socket,
                timeout: self.timeout,
            }
        } else {
            ClientError::Io { socket, source }
        }
    }
}

/// End of file, a reset or abort, or a write to a connection the daemon has closed.
fn closed(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn listener() -> (tempfile::TempDir, PathBuf, UnixListener) {
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("s.sock");
        let listener = UnixListener::bind(&socket).expect("bind");
        (dir, socket, listener)
    }

    #[test]
    fn a_status_request_gets_the_json_the_daemon_sent() {
        let (_dir, socket, listener) = listener();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            let mut prefix = [0u8; LENGTH_PREFIX];
            s.read_exact(&mut prefix).expect("prefix");
            let mut body = vec![0u8; frame_length(prefix).expect("length")];
            s.read_exact(&mut body).expect("body");
            assert_eq!(decode_body(&body), Ok(Message::StatusRequest));
            s.write_all(&encode_frame(&Message::Status("{\"a\":1}".into())))
                .expect("answer");
        });
        let json = Client::status(&socket, Duration::from_secs(10)).expect("status");
        assert_eq!(json, "{\"a\":1}");
        server.join().expect("server");
    }

    #[test]
    fn a_reset_connection_is_reported_as_closed_like_an_end_of_file() {
        let (_dir, socket, listener) = listener();
        let mut client = Client::connect(&socket, Duration::from_secs(10)).expect("connect");
        client.send_bytes(b"unread by the server").expect("send");
        // Closing with unread bytes queued: Linux resets the connection.
        let (s, _) = listener.accept().expect("accept");
        drop(s);
        assert!(matches!(client.receive(), Ok(None)));
        let mut eof = Client::connect(&socket, Duration::from_secs(10)).expect("connect");
        drop(listener.accept().expect("accept"));
        assert!(matches!(eof.receive(), Ok(None)));
        assert!(matches!(
            eof.check_in(&CheckIn::default()),
            Err(ClientError::Closed { .. })
        ));
    }

    #[test]
    fn a_silent_daemon_is_no_answer_within_the_timeout() {
        let (_dir, socket, listener) = listener();
        let mut client = Client::connect(&socket, Duration::from_millis(50)).expect("connect");
        let _held = listener.accept().expect("accept");
        assert!(matches!(
            client.receive(),
            Err(ClientError::NoAnswer { .. })
        ));
    }

    #[test]
    fn another_answer_than_the_one_due_is_unexpected() {
        let (_dir, socket, listener) = listener();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            s.write_all(&encode_frame(&Message::StatusRequest))
                .expect("answer");
            s
        });
        let err = Client::status(&socket, Duration::from_secs(10)).expect_err("not a status");
        assert!(
            matches!(
                &err,
                ClientError::Unexpected {
                    expected: "status",
                    ..
                }
            ),
            "{err}"
        );
        drop(server.join());
    }
}
