//! A connection to the collector: plain TCP, or TLS (RFC 5425) through rustls with
//! the configured CA and, for mutual TLS, a client certificate.

use std::io::{self, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use metalift_policy::forward::{Forward, Transport};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// How long a connect, a TLS handshake or one write may take.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// An open connection.
pub enum Conn {
    /// Plain TCP.
    Tcp(TcpStream),
    /// TLS over TCP.
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Conn::Tcp(_) => "Conn::Tcp",
            Conn::Tls(_) => "Conn::Tls",
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
        match cfg.transport {
            Transport::Tcp => Ok(Conn::Tcp(tcp)),
            Transport::Tls => {
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
                Ok(Conn::Tls(Box::new(stream)))
            }
        }
    }

    /// Writes `bytes` wholly and flushes them out of any TLS buffer into the kernel.
    pub fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.write_all(bytes),
            Conn::Tls(s) => {
                s.write_all(bytes)?;
                s.flush()?;
                while s.conn.wants_write() {
                    s.conn.write_tls(&mut s.sock)?;
                }
                Ok(())
            }
        }
    }

    /// How long one write may block from now on (a stop's drain bounds it by its
    /// deadline; [`IO_TIMEOUT`] otherwise).
    pub fn set_write_timeout(&self, timeout: Duration) -> io::Result<()> {
        let sock = match self {
            Conn::Tcp(s) => s,
            Conn::Tls(s) => &s.sock,
        };
        sock.set_write_timeout(Some(timeout.max(Duration::from_millis(1))))
    }

    /// A second handle on the connection's socket, for [`Shared::abort`] to shut it
    /// down from another thread while a write blocks.
    ///
    /// [`Shared::abort`]: super::Shared::abort
    pub fn abort_handle(&self) -> io::Result<TcpStream> {
        match self {
            Conn::Tcp(s) => s.try_clone(),
            Conn::Tls(s) => s.sock.try_clone(),
        }
    }

    /// Bytes in the kernel's send queue not yet acknowledged by the collector.
    pub fn unacknowledged(&self) -> io::Result<u64> {
        let sock = match self {
            Conn::Tcp(s) => s,
            Conn::Tls(s) => &s.sock,
        };
        super::send_queue::unacknowledged(sock)
    }

    /// Whether the collector closed the connection (reads what it sent: syslog
    /// collectors send nothing, so data or EOF both mean it is going away).
    pub fn peer_closed(&self) -> bool {
        let sock = match self {
            Conn::Tcp(s) => s,
            Conn::Tls(s) => &s.sock,
        };
        let mut b = [0u8; 1];
        if sock.set_nonblocking(true).is_err() {
            return false;
        }
        let closed = matches!(sock.peek(&mut b), Ok(0));
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
