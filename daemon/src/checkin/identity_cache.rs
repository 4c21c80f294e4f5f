//! The identity cache: an executable's sha256, computed once per file version.
//!
//! A 50 MB binary launched a hundred times is hashed once. The key is the open
//! file's `(device, inode, size, mtime, ctime)`: rewriting, replacing or even
//! `touch`ing the file changes the key, so a stale hash is never served (ctime
//! changes on every content or metadata change and cannot be set by users).
//!
//! Residual, documented: ctime has the file system's timestamp granularity (a
//! few milliseconds on kernels without fine-grained timestamps). A file rewritten
//! in place to the same size, with its mtime set back, within the same tick as
//! the version that was hashed, would keep its key. Writing a binary that is
//! running fails (`ETXTBSY`), so this needs the hashed process to have exited
//! within that tick too; and an unlock is a hint to a cooperating shim, not a
//! privilege a hostile process could not take by hooking Metal itself.
//!
//! Hashing runs on the daemon's bounded blocking pool
//! ([`crate::checkin::blocking_pool`]), never on the async executor. Concurrent
//! requests for the same key share one computation (a per-key `OnceCell`). The
//! cache is bounded: when full, the least recently used entry is evicted.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::{Arc, Mutex, PoisonError};

use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;

use crate::checkin::blocking_pool::BlockingPool;
use crate::checkin::peer::ExeFile;

/// Entries kept by default: far more distinct executables than a VM runs.
pub const DEFAULT_CAPACITY: usize = 4096;

/// The most bytes hashed for one executable (512 MiB): hashing is the one
/// identity step whose cost the asker chooses (a large file, re-touched between
/// launches so the cache never holds it). Larger, the subject has no sha256 and
/// the decision says why ([`HashError::TooLarge`]); exact-path, cdhash and
/// signature rules still apply. docs/src/limits.md.
pub const MAX_HASHED_BYTES: u64 = 512 * 1024 * 1024;

/// Identifies one version of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileKey {
    /// The key of an open file (`fstat`).
    pub fn of(file: &File) -> io::Result<Self> {
        let m = file.metadata()?;
        Ok(FileKey {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

/// Why an executable could not be hashed. The subject then has no sha256, so
/// `sha256` rules do not match it.
#[derive(Debug, thiserror::Error)]
pub enum HashError {
    /// Reading or `fstat`ing the file failed.
    #[error("reading the executable: {0}")]
    Io(#[from] io::Error),
    /// The file changed while it was being hashed; the result would describe no version.
    #[error("the executable changed while it was being hashed")]
    Changed,
    /// Larger than [`MAX_HASHED_BYTES`]: not hashed, so no `sha256` rule matches it.
    #[error("the executable is {size} bytes, over the {MAX_HASHED_BYTES}-byte cap on what is hashed for a sha256 rule")]
    TooLarge {
        /// Its size.
        size: u64,
    },
    /// The blocking task did not complete (runtime shutting down).
    #[error("the hashing task was cancelled")]
    Cancelled,
}

/// Bounded map from file version to sha256. Share it in an `Arc`.
#[derive(Debug)]
pub struct IdentityCache {
    /// A std `Mutex`, not tokio's: it guards map operations only and is never held
    /// across an `.await`; waiting for a hash happens on the per-key `OnceCell`.
    slots: Mutex<Slots>,
    /// The most entries kept.
    capacity: usize,
}

#[derive(Debug, Default)]
struct Slots {
    map: HashMap<FileKey, Slot>,
    /// Logical clock for least-recently-used eviction.
    tick: u64,
}

#[derive(Debug)]
struct Slot {
    /// Filled once by whichever request hashes first; the others wait on it.
    hash: Arc<OnceCell<[u8; 32]>>,
    last_used: u64,
}

impl IdentityCache {
    /// An empty cache holding at most `capacity` entries (at least 1).
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        IdentityCache {
            slots: Mutex::new(Slots::default()),
            capacity: capacity.max(1),
        }
    }

    /// Entries currently held (including ones being computed).
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether the cache holds nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sha256 of `exe`'s contents, from the cache or computed on `pool`
    /// (within `uid`'s share of it: [`BlockingPool::run_for`]).
    pub async fn sha256(
        &self,
        exe: &ExeFile,
        pool: &BlockingPool,
        uid: u32,
    ) -> Result<[u8; 32], HashError> {
        let key = FileKey::of(exe.file())?;
        if key.size > MAX_HASHED_BYTES {
            return Err(HashError::TooLarge { size: key.size });
        }
        let cell = self.slot(key);
        let exe = exe.clone();
        let hash = cell
            .get_or_try_init(|| async move {
                pool.run_for(uid, move || hash_file(exe.file(), key))
                    .await
                    .map_err(|_| HashError::Cancelled)?
            })
            .await?;
        Ok(*hash)
    }

    /// The cell for `key`, inserted (evicting the least recently used) if absent.
    fn slot(&self, key: FileKey) -> Arc<OnceCell<[u8; 32]>> {
        let mut slots = self.lock();
        slots.tick += 1;
        let tick = slots.tick;
        if let Some(slot) = slots.map.get_mut(&key) {
            slot.last_used = tick;
            return Arc::clone(&slot.hash);
        }
        if slots.map.len() >= self.capacity {
            let oldest = slots
                .map
                .iter()
                .min_by_key(|(_, s)| s.last_used)
                .map(|(k, _)| *k);
            if let Some(oldest) = oldest {
                slots.map.remove(&oldest);
            }
        }
        let hash = Arc::new(OnceCell::new());
        slots.map.insert(
            key,
            Slot {
                hash: Arc::clone(&hash),
                last_used: tick,
            },
        );
        hash
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        // The map stays consistent even if a holder panicked: every update is one call.
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Hashes the whole file with positioned reads (the shared fd's offset is never
/// used), then checks that the file version did not change meanwhile.
fn hash_file(file: &File, key: FileKey) -> Result<[u8; 32], HashError> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut offset = 0u64;
    loop {
        let n = match file.read_at(&mut buf, offset) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        hasher.update(&buf[..n]);
        offset += n as u64;
        if offset > key.size {
            return Err(HashError::Changed); // growing: never read past what was judged
        }
    }
    if FileKey::of(file)? != key || offset != key.size {
        return Err(HashError::Changed);
    }
    Ok(hasher.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[tokio::test]
    async fn an_executable_over_the_cap_is_not_hashed_and_says_why() {
        let (file, exe) = exe_with(b"x");
        file.as_file().set_len(MAX_HASHED_BYTES + 1).unwrap(); // sparse: nothing to read
        let cache = IdentityCache::new(4);
        let error = cache
            .sha256(&exe, &BlockingPool::default(), 0)
            .await
            .unwrap_err();
        assert!(matches!(error, HashError::TooLarge { .. }), "{error}");
        assert!(
            error.to_string().contains("cap on what is hashed"),
            "{error}"
        );
        assert!(cache.is_empty(), "nothing was hashed or kept");
    }

    fn exe_with(contents: &[u8]) -> (tempfile::NamedTempFile, ExeFile) {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(contents).expect("write");
        f.flush().expect("flush");
        let exe = ExeFile::new(File::open(f.path()).expect("open"));
        (f, exe)
    }

    fn sha(bytes: &[u8]) -> [u8; 32] {
        Sha256::digest(bytes).into()
    }

    #[tokio::test]
    async fn the_hash_is_the_files_sha256_and_is_cached_per_version() {
        let cache = IdentityCache::new(8);
        let (tmp, exe) = exe_with(b"version one");
        assert_eq!(
            cache
                .sha256(&exe, &BlockingPool::default(), 0)
                .await
                .unwrap(),
            sha(b"version one")
        );
        assert_eq!(
            cache
                .sha256(&exe, &BlockingPool::default(), 0)
                .await
                .unwrap(),
            sha(b"version one")
        );
        assert_eq!(cache.len(), 1);

        // Rewriting in place changes size/mtime/ctime: a new key, a new hash.
        std::fs::write(tmp.path(), b"version two, longer").expect("rewrite");
        let exe2 = ExeFile::new(File::open(tmp.path()).expect("open"));
        assert_eq!(
            cache
                .sha256(&exe2, &BlockingPool::default(), 0)
                .await
                .unwrap(),
            sha(b"version two, longer")
        );
        assert_eq!(cache.len(), 2);
    }

    #[tokio::test]
    async fn a_same_size_rewrite_with_its_mtime_set_back_gets_a_new_hash() {
        let cache = IdentityCache::new(8);
        let (tmp, exe) = exe_with(b"version AAA");
        let mtime = std::fs::metadata(tmp.path()).unwrap().modified().unwrap();
        assert_eq!(
            cache
                .sha256(&exe, &BlockingPool::default(), 0)
                .await
                .unwrap(),
            sha(b"version AAA")
        );

        // Same size, same mtime (set back, as `cp -p` or a tar extract would):
        // only the ctime, which no user can set, tells the versions apart.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(tmp.path(), b"version BBB").unwrap();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(tmp.path())
            .unwrap();
        f.set_modified(mtime).unwrap();
        drop(f);
        let exe2 = ExeFile::new(File::open(tmp.path()).unwrap());
        assert_eq!(
            std::fs::metadata(tmp.path()).unwrap().modified().unwrap(),
            mtime
        );
        assert_eq!(
            cache
                .sha256(&exe2, &BlockingPool::default(), 0)
                .await
                .unwrap(),
            sha(b"version BBB")
        );
        assert_eq!(cache.len(), 2);
    }

    #[tokio::test]
    async fn touching_the_file_makes_it_hashed_again() {
        let cache = IdentityCache::new(8);
        let (tmp, exe) = exe_with(b"unchanged bytes");
        assert_eq!(
            cache
                .sha256(&exe, &BlockingPool::default(), 0)
                .await
                .unwrap(),
            sha(b"unchanged bytes")
        );
        let before = FileKey::of(exe.file()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        // `touch`: new mtime (and ctime), same bytes.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(tmp.path())
            .unwrap();
        f.set_modified(std::time::SystemTime::now()).unwrap();
        drop(f);
        let after = FileKey::of(exe.file()).unwrap();
        assert_ne!(before, after, "touch changed no part of the key");
        assert_eq!(
            cache
                .sha256(&exe, &BlockingPool::default(), 0)
                .await
                .unwrap(),
            sha(b"unchanged bytes")
        );
        assert_eq!(cache.len(), 2, "the touched file was not hashed again");
    }

    #[tokio::test]
    async fn the_cache_never_holds_more_than_its_capacity() {
        let cache = IdentityCache::new(2);
        let mut keep = Vec::new();
        for i in 0..5u8 {
            let (tmp, exe) = exe_with(&[i; 10]);
            assert_eq!(
                cache
                    .sha256(&exe, &BlockingPool::default(), 0)
                    .await
                    .unwrap(),
                sha(&[i; 10])
            );
            keep.push(tmp);
        }
        assert_eq!(cache.len(), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_requests_for_one_file_share_one_entry() {
        let cache = Arc::new(IdentityCache::new(8));
        let (_tmp, exe) = exe_with(&vec![7u8; 1 << 20]);
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (cache, exe) = (Arc::clone(&cache), exe.clone());
                tokio::spawn(async move {
                    cache
                        .sha256(&exe, &BlockingPool::default(), 0)
                        .await
                        .unwrap()
                })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap(), sha(&vec![7u8; 1 << 20]));
        }
        assert_eq!(cache.len(), 1);
    }
}
