//! A connection to the collector: plain TCP, or TLS (RFC 5425) through rustls with
//! the configured CA and, for mutual TLS, a client certificate, or a RELP session
//! over TCP ([`super::relp`]: opened here, answers read here).

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use metalift_policy::forward::{Forward, Transport};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::relp;

/// How long a connect, a TLS handshake or one write may take.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// An open connection.
#[derive(Debug)]
pub struct Conn {
    stream: Stream,
    /// Bytes handed to the kernel on this connection since it was set up (after
    /// the TLS handshake: TLS records as they go on the wire), so that this
    /// minus the send queue is what the collector's TCP stack acknowledged.
    written: u64,
    /// The RELP session, with `transport = "relp"` or `"relp-tls"`.
    relp: Option<relp::Session>,
}

/// The stream under a [`Conn`].
enum Stream {
    /// Plain TCP.
    Tcp(TcpStream),
    /// TLS over TCP.
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stream::Tcp(_) => "Tcp",
            Stream::Tls(_) => "Tls",
        })
    }
}

impl Conn {
    /// Connects (and for TLS, completes the handshake, so a refused or untrusted
    /// certificate is an error here, not at the first record).
    pub fn open(cfg: &Forward) -> anyhow::Result<Conn> {
        let addr = (cfg.host.as_str(), cfg.port)
            .to_socket_addrs()
            .with_context(|| format!("resolving {}", cfg.address))?
            .next()
            .with_context(|| format!("{} resolves to no address", cfg.address))?;
        let tcp = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
            .with_context(|| format!("connecting to {}", cfg.address))?;
        tcp.set_write_timeout(Some(IO_TIMEOUT))?;
        tcp.set_read_timeout(Some(IO_TIMEOUT))?;
        tcp.set_nodelay(true)?;
        let stream = match cfg.transport {
            Transport::Tcp | Transport::Relp => Stream::Tcp(tcp),
            Transport::Tls | Transport::RelpTls => {
                let config = tls_config(cfg)?;
                let name = ServerName::try_from(cfg.server_name.clone())
                    .with_context(|| format!("server name {:?}", cfg.server_name))?;
                let conn = rustls::ClientConnection::new(Arc::new(config), name)
                    .context("starting TLS")?;
                let mut stream = rustls::StreamOwned::new(conn, tcp);
                while stream.conn.is_handshaking() {
                    stream
                        .conn
                        .complete_io(&mut stream.sock)
                        .with_context(|| format!("TLS handshake with {}", cfg.address))?;
                }
                // A collector that refuses our client certificate says so with an
                // alert right after the handshake (TLS 1.3): read it now if it came.
                stream
                    .sock
                    .set_read_timeout(Some(Duration::from_millis(200)))?;
                let mut probe = [0u8; 1];
                match io::Read::read(&mut stream, &mut probe) {
                    Ok(0) => return Err(closed_after_handshake(cfg, None)),
                    Err(e)
                        if e.kind() == io::ErrorKind::WouldBlock
                            || e.kind() == io::ErrorKind::TimedOut => {}
                    Err(e) => return Err(closed_after_handshake(cfg, Some(e))),
                    Ok(_) => {}
                }
                stream.sock.set_read_timeout(Some(IO_TIMEOUT))?;
                Stream::Tls(Box::new(stream))
            }
        };
        let mut conn = Conn {
            stream,
            written: 0,
            relp: None,
        };
        if cfg.transport.is_relp() {
            conn.open_relp(cfg)?;
        }
        Ok(conn)
    }

    /// Opens the RELP session: `open` with our offers, and the collector's `rsp
    /// 200` offering the `syslog` command, within [`IO_TIMEOUT`].
    fn open_relp(&mut self, cfg: &Forward) -> anyhow::Result<()> {
        let mut session = relp::Session::default();
        let mut out = Vec::new();
        let txnr = session.push(&mut out, "open", relp::Session::offers().as_bytes());
        self.relp = Some(session);
        let what = || format!("opening a RELP session with {}", cfg.address);
        self.send(&out).with_context(what)?;
        let deadline = Instant::now() + IO_TIMEOUT;
        loop {
            // The first frame answers the open (nothing else was sent).
            if let Some(f) = self.replies(true).with_context(what)?.into_iter().next() {
                if f.txnr != txnr {
                    anyhow::bail!(
                        "{}: the collector answered {} {} before the session was open",
                        what(),
                        f.txnr,
                        f.command
                    );
                }
                return match f.status() {
                    Some((200, _)) if relp::offers_syslog(&f.data) => Ok(()),
                    Some((200, _)) => Err(anyhow::anyhow!(
                        "{}: the collector does not offer the syslog command: {:?}",
                        what(),
                        String::from_utf8_lossy(&f.data)
                    )),
                    _ => Err(anyhow::anyhow!(
                        "{}: refused: {:?}",
                        what(),
                        String::from_utf8_lossy(&f.data)
                    )),
                };
            }
            if Instant::now() >= deadline {
                anyhow::bail!("{}: no answer within {IO_TIMEOUT:?}", what());
            }
        }
    }

    /// Whether this is a RELP session.
    #[must_use]
    pub fn is_relp(&self) -> bool {
        self.relp.is_some()
    }

    /// Appends one RELP `command` frame to `out` (see [`relp::Session::push`]);
    /// `None` when this is not a RELP session.
    pub fn relp_push(&mut self, out: &mut Vec<u8>, command: &str, data: &[u8]) -> Option<u64> {
        Some(self.relp.as_mut()?.push(out, command, data))
    }

    /// The RELP frames the collector sent: what has arrived (`wait` false), or
    /// at least one read's worth, waiting up to [`IO_TIMEOUT`] (`wait` true; it
    /// may complete no frame). Empty when this is not a RELP session. The end of
    /// the stream is an error (`UnexpectedEof`), as is a malformed frame.
    pub fn replies(&mut self, wait: bool) -> io::Result<Vec<relp::Frame>> {
        let Some(session) = self.relp.as_mut() else {
            return Ok(Vec::new());
        };
        let mut frames = Vec::new();
        let mut buf = [0u8; 4096];
        let sock = match &self.stream {
            Stream::Tcp(s) => s,
            Stream::Tls(s) => &s.sock,
        };
        if !wait {
            sock.set_nonblocking(true)?;
        }
        // Waiting for answers, nothing of ours is in flight to carry the ACK of
        // the collector's first answer segment, and a collector that sends its
        // answers with Nagle's algorithm on holds the rest until that ACK comes:
        // a delayed ACK (40 ms on Linux) per window. imrelp does: strace shows
        // librelp setting TCP_CORK before each `rsp` and clearing it after, and
        // without TCP_NODELAY the uncork's push still obeys Nagle (Linux
        // `__tcp_sock_set_cork` adds TCP_NAGLE_PUSH only with TCP_NODELAY). That capped RELP
        // at about 3,000 records/s on loopback (`metalift-bench forwarding`: 19 MiB
        // behind after a 2 s round, 9 s to catch up; 0.2 MiB and 0.06 s with
        // this). TCP_QUICKACK (tcp(7): "not permanent", so set before each wait)
        // acknowledges at once. macOS has no such option: verify on a Mac (item 40).
        #[cfg(target_os = "linux")]
        if wait {
            // Best effort: without it only throughput suffers.
            let _ = rustix::net::sockopt::set_tcp_quickack(sock, true);
        }
        let result = loop {
            let got = match &mut self.stream {
                Stream::Tcp(s) => s.read(&mut buf),
                Stream::Tls(s) => s.read(&mut buf),
            };
            match got {
                Ok(0) => {
                    break Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the collector closed the connection",
                    ))
                }
                Ok(n) => match session.receive(&buf[..n]) {
                    Ok(f) => {
                        frames.extend(f);
                        if wait {
                            break Ok(());
                        }
                    }
                    Err(e) => break Err(io::Error::new(io::ErrorKind::InvalidData, e)),
                },
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !wait => break Ok(()),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    break Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no RELP answer within {IO_TIMEOUT:?}"),
                    ))
                }
                Err(e) => break Err(e),
            }
        };
        if !wait {
            let sock = match &self.stream {
                Stream::Tcp(s) => s,
                Stream::Tls(s) => &s.sock,
            };
            sock.set_nonblocking(false)?;
        }
        result.map(|()| frames)
    }

    /// The socket under the connection.
    fn sock(&self) -> &TcpStream {
        match &self.stream {
            Stream::Tcp(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }

    /// Writes `bytes` wholly and flushes them out of any TLS buffer into the kernel.
    ///
    /// An error (a write that timed out after [`IO_TIMEOUT`] included) may leave
    /// part of `bytes` written: the connection must then be dropped, never written
    /// to again, so no frame is torn while it stays up (the caller drops it and
    /// sends again from the delivered position).
    pub fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        match &mut self.stream {
            Stream::Tcp(s) => {
                let mut left = bytes;
                while !left.is_empty() {
                    match s.write(left) {
                        Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                        Ok(n) => {
                            self.written += n as u64;
                            left = &left[n..];
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            }
            Stream::Tls(s) => {
                // rustls takes plaintext up to its buffer limit: write what it
                // took out as TLS records (counted), then give it the rest.
                let mut left = bytes;
                loop {
                    while s.conn.wants_write() {
                        match s.conn.write_tls(&mut s.sock) {
                            Ok(n) => self.written += n as u64,
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(e),
                        }
                    }
                    if left.is_empty() {
                        return Ok(());
                    }
                    let n = s.conn.writer().write(left)?;
                    if n == 0 && !s.conn.wants_write() {
                        return Err(io::ErrorKind::WriteZero.into());
                    }
                    left = &left[n..];
                }
            }
        }
    }

    /// Bytes handed to the kernel on this connection so far.
    #[must_use]
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Bytes of this connection the collector's TCP stack acknowledged.
    pub fn acknowledged(&self) -> io::Result<u64> {
        Ok(self.written.saturating_sub(self.unacknowledged()?))
    }

    /// How long one write may block from now on (a stop's drain bounds it by its
    /// deadline; [`IO_TIMEOUT`] otherwise).
    pub fn set_write_timeout(&self, timeout: Duration) -> io::Result<()> {
        self.sock()
            .set_write_timeout(Some(timeout.max(Duration::from_millis(1))))
    }

    /// A second handle on the connection's socket, for [`Shared::abort`] to shut it
    /// down from another thread while a write blocks.
    ///
    /// [`Shared::abort`]: super::Shared::abort
    pub fn abort_handle(&self) -> io::Result<TcpStream> {
        self.sock().try_clone()
    }

    /// Bytes in the kernel's send queue not yet acknowledged by the collector.
    pub fn unacknowledged(&self) -> io::Result<u64> {
        super::send_queue::unacknowledged(self.sock())
    }

    /// Whether the collector ended the connection: end of stream, or a reset
    /// (a collector that closes with unread data in its socket resets it). Looks
    /// without consuming (a TLS collector may have sent a session ticket).
    pub fn peer_closed(&self) -> bool {
        let sock = self.sock();
        let mut b = [0u8; 1];
        if sock.set_nonblocking(true).is_err() {
            return false;
        }
        let closed = match sock.peek(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ),
        };
        let _ = sock.set_nonblocking(false);
        closed
    }
}

/// The collector ended the connection right after the handshake: in TLS 1.3 this
/// is where a server that checks client certificates refuses one (the client's
/// handshake is complete before the server has verified its certificate). With an
/// alert about a certificate it said so; rsyslog's gtls driver in
/// `x509/certvalid` mode just closes the socket (seen in
/// `forward_rsyslog::a_collector_requiring_a_client_certificate_*`), so the message
/// names the likely cause from what we sent.
fn closed_after_handshake(cfg: &Forward, error: Option<io::Error>) -> anyhow::Error {
    let alert = error.as_ref().and_then(|e| {
        let tls = e.get_ref()?.downcast_ref::<rustls::Error>()?;
        match tls {
            rustls::Error::AlertReceived(a) => Some(*a),
            _ => None,
        }
    });
    let ours = match &cfg.client_cert {
        Some(cert) => format!("our client certificate {cert}"),
        None => {
            "a client certificate (none is configured: set client_cert and client_key)".to_owned()
        }
    };
    let what = match alert {
        Some(
            a @ (rustls::AlertDescription::BadCertificate
            | rustls::AlertDescription::CertificateRequired
            | rustls::AlertDescription::UnknownCA
            | rustls::AlertDescription::UnsupportedCertificate
            | rustls::AlertDescription::CertificateRevoked
            | rustls::AlertDescription::CertificateExpired
            | rustls::AlertDescription::CertificateUnknown
            | rustls::AlertDescription::AccessDenied),
        ) => format!(
            "{} refused {ours} after the TLS handshake (alert {a:?})",
            cfg.address
        ),
        Some(a) => format!(
            "{} ended the TLS connection after the handshake (alert {a:?}); it may require {ours}",
            cfg.address
        ),
        None => format!(
            "{} closed the TLS connection right after the handshake: {}{}",
            cfg.address,
            if cfg.client_cert.is_some() {
                format!("it likely refused {ours}")
            } else {
                format!("it likely requires {ours}")
            },
            error.map(|e| format!(" ({e})")).unwrap_or_default()
        ),
    };
    anyhow::anyhow!(what)
}

fn tls_config(cfg: &Forward) -> anyhow::Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    let ca = cfg.ca.as_deref().context("TLS needs `ca`")?;
    for cert in CertificateDer::pem_file_iter(ca).with_context(|| format!("reading CA {ca}"))? {
        roots
            .add(cert.with_context(|| format!("reading CA {ca}"))?)
            .with_context(|| format!("CA {ca}"))?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_root_certificates(roots);
    Ok(match (&cfg.client_cert, &cfg.client_key) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .with_context(|| format!("reading client certificate {cert}"))?
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("reading client certificate {cert}"))?;
            let key = PrivateKeyDer::from_pem_file(key)
                .with_context(|| format!("reading client key {key}"))?;
            builder
                .with_client_auth_cert(chain, key)
                .context("client certificate and key")?
        }
        _ => builder.with_no_client_auth(),
    })
}
