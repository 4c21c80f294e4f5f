//! The Unix socket's file: created for [`super::unix::run`], removed at a clean stop.
//!
//! - The parent directory is created when missing.
//! - A socket file left by a crash (nothing accepts on it) is replaced; a live
//!   daemon on the same path (a connect succeeds) is refused with a clear error;
//!   anything that is not a socket is never deleted.
//! - The socket is mode 0666: any local process may ask, because the answer
//!   depends on who the kernel says is asking, never on who may connect.
//! - At stop only the socket this daemon bound is removed (same device and
//!   inode), never one another daemon has bound at the path since.
//!
//! Two daemons starting at the same instant on a stale socket may both replace
//! it; the second bind then fails (`EADDRINUSE`) or the first loses its path.
//! launchd and systemd never start two instances of one job.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

/// Why the socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// Another daemon answers on the socket.
    #[error("another metaliftd is already listening on {}", .0.display())]
    AlreadyRunning(PathBuf),
    /// Something that is not a socket sits at the path; it is left alone.
    #[error("{} exists and is not a socket; refusing to replace it", .0.display())]
    NotASocket(PathBuf),
    /// Creating the directory, removing the stale socket, binding or chmod failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Which socket file is ours: device, inode and change time. File systems reuse
/// inode numbers at once, so the inode alone could name a successor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketId {
    dev: u64,
    ino: u64,
    ctime: (i64, i64),
}

impl SocketId {
    fn of(m: &std::fs::Metadata) -> Self {
        SocketId {
            dev: m.dev(),
            ino: m.ino(),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// A bound socket, and what is needed to remove exactly it at shutdown.
#[derive(Debug)]
pub struct BoundSocket {
    /// The listener to pass to [`super::unix::run`].
    pub listener: UnixListener,
    /// The socket's path.
    pub path: PathBuf,
    /// The socket file we created, so [`BoundSocket::remove`]
    /// never deletes a socket another daemon created at the same path since.
    id: SocketId,
}

impl BoundSocket {
    /// Removes the socket file if it is still the one we bound. Call it after the
    /// listener is dropped: a socket somebody still accepts on is then not ours,
    /// whatever its metadata says (timestamps are coarse, inodes are reused).
    pub fn remove(path: &Path, id: SocketId) {
        let listened = || std::os::unix::net::UnixStream::connect(path).is_ok();
        match std::fs::symlink_metadata(path) {
            Ok(m) if SocketId::of(&m) == id && !listened() => {
                if let Err(error) = std::fs::remove_file(path) {
                    tracing::warn!(path = %path.display(), %error, "cannot remove the socket");
                }
            }
            Ok(_) => tracing::warn!(path = %path.display(), "socket was replaced; leaving it"),
            Err(_) => {}
        }
    }

    /// The identity to pass to [`BoundSocket::remove`].
    #[must_use]
    pub fn id(&self) -> SocketId {
        self.id
    }
}

/// Creates the socket's directory, replaces a stale socket left by a crash,
/// refuses when a live daemon answers on it, binds, and makes it mode 0666.
/// Must be called inside a tokio runtime.
pub fn bind(path: &Path) -> Result<BoundSocket, BindError> {
    let io_err = |what, path: &Path| {
        let path = path.to_owned();
        move |source| BindError::Io { what, path, source }
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => return Err(BindError::NotASocket(path.into())),
        Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => return Err(BindError::AlreadyRunning(path.into())),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                tracing::info!(path = %path.display(), "replacing a stale socket");
                std::fs::remove_file(path).map_err(io_err("removing stale socket", path))?;
            }
            Err(e) => return Err(io_err("probing", path)(e)),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("inspecting", path)(e)),
    }
    let listener = UnixListener::bind(path).map_err(io_err("binding", path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(io_err("setting mode 0666 on", path))?;
    let m = std::fs::symlink_metadata(path).map_err(io_err("inspecting", path))?;
    Ok(BoundSocket {
        listener,
        path: path.to_owned(),
        id: SocketId::of(&m),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_socket_is_world_connectable_and_removed_only_while_it_is_ours() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/dir/metalift.sock");
        let bound = bind(&path).expect("binds, creating the directories");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o666);

        // Another daemon replaced it: ours is gone, theirs stays.
        let id = bound.id();
        drop(bound);
        std::fs::remove_file(&path).unwrap();
        let theirs = UnixListener::bind(&path).unwrap();
        BoundSocket::remove(&path, id);
        assert!(path.exists());
        drop(theirs);
    }

    #[tokio::test]
    async fn a_file_that_is_not_a_socket_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metalift.sock");
        std::fs::write(&path, "precious").unwrap();
        assert!(matches!(bind(&path), Err(BindError::NotASocket(_))));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "precious");
    }
}
