//! How many bytes a TCP socket's kernel send queue still holds (sent or not, not
//! yet acknowledged by the peer): what `metalift audit flush` waits to see at zero.
//!
//! - Linux: `ioctl(fd, SIOCOUTQ)` (= `TIOCOUTQ`), tcp(7).
//! - macOS: `getsockopt(fd, SOL_SOCKET, SO_NWRITE)`, xnu `bsd/sys/socket.h`
//!   ("APPLE: Get number of bytes currently in send socket buffer"), answered in
//!   `bsd/kern/uipc_socket.c` (`sooptcopyout` of `so->so_snd.sb_cc`). Verify on a Mac.
#![allow(unsafe_code)]

use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;

/// Unacknowledged bytes in `sock`'s send queue.
#[cfg(target_os = "linux")]
pub fn unacknowledged(sock: &TcpStream) -> io::Result<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one c_int through the pointer, which is valid for
    // the call; the fd is open (borrowed from `sock`).
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Unacknowledged bytes in `sock`'s send queue.
#[cfg(target_os = "macos")]
pub fn unacknowledged(sock: &TcpStream) -> io::Result<u64> {
    let mut n: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: SO_NWRITE writes one c_int and its length through the pointers,
    // valid for the call; the fd is open (borrowed from `sock`).
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NWRITE,
            (&raw mut n).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::try_from(n).unwrap_or(0))
}
