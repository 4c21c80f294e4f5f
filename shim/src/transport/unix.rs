//! The check-in over a Unix stream socket, in length-prefixed frames
//! (`metalift_policy::wire`).
//!
//! The constructor's part is one non-blocking `connect` and one `send` of a frame
//! of ~100 bytes, which always fits an empty socket buffer: nothing here can block
//! a process that never touches Metal. The socket is close-on-exec (a shell's
//! children check in for themselves) and never raises `SIGPIPE` (a daemon that
//! went away must not kill its host). Before reading, the shim checks that its
//! descriptor still names the socket it opened: programs that close "all other"
//! descriptors, or reuse the number, must not have their files read as a verdict.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Instant;

use metalift_policy::wire::{self, Message, Outcome, VerdictMsg, LENGTH_PREFIX, MAX_FRAME};

use super::CheckIn;

/// A connected socket with the check-in sent.
#[derive(Debug)]
pub(crate) struct UnixCheckIn {
    /// The socket; closed when the check-in ends.
    fd: OwnedFd,
    /// `(st_dev, st_ino)` of the socket when it was opened, to recognise it later.
    identity: (u64, u64),
    /// Bytes read so far that do not yet make a frame.
    buffer: Vec<u8>,
}

/// Connects (non-blocking, close-on-exec) and sends `frame`.
pub(crate) fn start(path: &Path, frame: &[u8]) -> Result<UnixCheckIn, String> {
    let fd = socket().map_err(|e| format!("socket: {e}"))?;
    let (addr, len) = sockaddr(path)?;
    // SAFETY: `addr` is a filled sockaddr_un of `len` bytes; `fd` is an open socket.
    let rc = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        return Err(format!("no daemon at {}: {err}", path.display()));
    }
    send_all(&fd, frame).map_err(|e| format!("sending the check-in: {e}"))?;
    let identity = identity(&fd).map_err(|e| format!("fstat: {e}"))?;
    Ok(UnixCheckIn {
        fd,
        identity,
        buffer: Vec::with_capacity(256),
    })
}

impl CheckIn for UnixCheckIn {
    fn await_verdict(&mut self, deadline: Instant) -> Result<VerdictMsg, String> {
        if identity(&self.fd).ok() != Some(self.identity) {
            return Err("the check-in socket was closed or replaced by the program".into());
        }
        loop {
            match wire::decode_frame(&self.buffer) {
                Ok(Some((Message::Verdict(verdict), _))) => return Ok(verdict),
                Ok(Some((other, _))) => {
                    return Err(format!("malformed verdict: unexpected {}", kind(&other)))
                }
                Ok(None) => {}
                Err(e) => return Err(format!("malformed verdict: {e}")),
            }
            let wait = deadline.saturating_duration_since(Instant::now());
            if !readable(&self.fd, wait).map_err(|e| format!("poll: {e}"))? {
                return Err("no verdict before the deadline".into());
            }
            let mut chunk = [0u8; 1024];
            match recv(&self.fd, &mut chunk) {
                Ok(0) => return Err("the daemon closed the connection without a verdict".into()),
                Ok(n) => self.buffer.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("reading the verdict: {e}")),
            }
            if self.buffer.len() > MAX_FRAME + LENGTH_PREFIX {
                return Err("malformed verdict: oversize".into());
            }
        }
    }

    fn report(self: Box<Self>, outcome: &Outcome) {
        let this = *self;
        if identity(&this.fd).ok() != Some(this.identity) {
            // Not ours any more: do not write into someone else's file, and do not
            // close it either (the program owns that number now).
            std::mem::forget(this.fd);
            return;
        }
        let frame = wire::encode_frame(&Message::Outcome(outcome.clone()));
        // Best effort: a daemon that stopped listening loses the record, the process carries on.
        let _ = send_all(&this.fd, &frame);
    }
}

fn kind(message: &Message) -> &'static str {
    match message {
        Message::CheckIn(_) => "check-in",
        Message::Verdict(_) => "verdict",
        Message::Outcome(_) => "outcome",
        Message::StatusRequest => "status request",
        Message::Status(_) => "status",
    }
}

#[cfg(target_os = "linux")]
fn socket() -> std::io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the flags make it non-blocking and close-on-exec atomically.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket(2) and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(not(target_os = "linux"))]
fn socket() -> std::io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket(2) and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // No SOCK_CLOEXEC/SOCK_NONBLOCK at creation here: set them before anyone can fork.
    // SAFETY: F_SETFD on an open descriptor.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: F_SETFL on an open descriptor.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let one: libc::c_int = 1;
    // SAFETY: SO_NOSIGPIPE takes an int; `one` lives across the call.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NOSIGPIPE,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

#[cfg(target_os = "linux")]
const SEND_FLAGS: libc::c_int = libc::MSG_NOSIGNAL;
#[cfg(not(target_os = "linux"))]
const SEND_FLAGS: libc::c_int = 0;

fn sockaddr(path: &Path) -> Result<(libc::sockaddr_un, libc::socklen_t), String> {
    // SAFETY: sockaddr_un is plain old data; all-zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() || CString::new(bytes).is_err() {
        return Err(format!(
            "socket path too long or invalid: {}",
            path.display()
        ));
    }
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

fn send_all(fd: &OwnedFd, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is a valid buffer of the given length; `fd` is open.
        let n = unsafe {
            libc::send(
                fd.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                SEND_FLAGS,
            )
        };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

fn recv(fd: &OwnedFd, buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: `buf` is a valid writable buffer of the given length; `fd` is open.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Waits until `fd` is readable or `wait` has passed; `Ok(false)` on timeout.
fn readable(fd: &OwnedFd, wait: std::time::Duration) -> std::io::Result<bool> {
    let deadline = Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        // Round up: poll counts whole milliseconds and must not return early forever.
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; the timeout is bounded.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        match rc {
            0 if Instant::now() >= deadline => return Ok(false),
            0 => continue,
            n if n > 0 => return Ok(true),
            _ => {
                let err = std::io::Error::last_os_error();
                if err.kind() != std::io::ErrorKind::Interrupted {
                    return Err(err);
                }
            }
        }
    }
}

fn identity(fd: &OwnedFd) -> std::io::Result<(u64, u64)> {
    // SAFETY: `stat` is plain old data; all-zero is a valid value for fstat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer; an invalid fd only makes fstat fail.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(std::io::Error::other("not a socket"));
    }
    #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
    Ok((st.st_dev as u64, st.st_ino as u64))
}
