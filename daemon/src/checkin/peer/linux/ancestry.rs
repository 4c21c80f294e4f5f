//! A peer's ancestors, read once per parent and reused while every process in the
//! chain lives.
//!
//! Every check-in records the pids above its process ([`PeerFacts::ancestors`]) so
//! `metalift exec --require-unlock` can count a command's whole tree. Read fresh,
//! that is one `/proc/<pid>/stat` per ancestor on every check-in, on the verdict's
//! path: under `perf` with `metalift-bench throughput` the stat reads were about a
//! fifth of the daemon's CPU samples, most of them the walk. Siblings share their chain — every compiler one `make` starts, every test
//! one runner starts, every check-in of the benchmark's client process — so the
//! chain is kept per first ancestor, each process in it pinned by a pidfd:
//!
//! - while a pidfd's process lives, its pid names that process and no other;
//! - a live process's parent changes only when that parent exits (the kernel then
//!   re-parents it to a subreaper or init). `ptrace` changes a tracee's `parent`,
//!   not the `real_parent` that `/proc/<pid>/stat` shows (`fs/proc/array.c`,
//!   `do_task_stat`).
//!
//! So a kept chain whose every pidfd still polls "running" — one `poll(2)` for
//! the whole chain — names the processes a fresh walk would read now. A chain
//! that ended at an ancestor that could not be read (it exited mid-walk), or that
//! could not be pinned whole, is returned but not kept.
//!
//! The pidfds are bounded: all the cache holds at once, kept chains and walks
//! in progress together, is at most [`PINS_MAX`] (a walk that finds no room
//! drops the chains of exited processes, then every chain, and walks once more;
//! failing that it reads its chain unpinned). The lock is held for a lookup or
//! an insert only: the `poll(2)` and a walk's procfs reads run outside it, so
//! concurrent check-ins do not queue behind one another's reads.
//!
//! What a fresh walk cannot rule out, kept or not: an ancestor that exits between
//! the read of its child's stat and the `pidfd_open` of its pid, the pid reused
//! in those microseconds. The chain is logged, never matched by a rule.
//!
//! [`PeerFacts::ancestors`]: super::super::PeerFacts::ancestors
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{any_exited, pidfd_open, ProcStat};
use crate::checkin::peer::MAX_ANCESTORS;

/// How many pidfds the cache may hold at once, kept chains and walks in
/// progress together: part of the descriptors the service reserves for
/// everything but connections (`service::FD_RESERVE`). Enough for a handful of
/// busy parents.
pub const PINS_MAX: usize = 32;

/// The kept chains, by the first ancestor (the peer's parent).
#[derive(Debug)]
pub struct Ancestry {
    /// A std `Mutex`: held for a lookup or an insert, never across a system call
    /// on the hit path, never across an await.
    chains: Mutex<HashMap<u32, Arc<Chain>>>,
    /// Pidfds open now; a [`Pin`] takes one place and gives it back when closed.
    pins: Arc<AtomicUsize>,
    /// The most pidfds open at once.
    limit: usize,
}

/// One chain: `pids[0]` is the first ancestor, each next one its parent.
#[derive(Debug)]
struct Chain {
    pids: Vec<u32>,
    /// One per pid, in the same order: while all poll "running", `pids` is true.
    pins: Vec<Pin>,
}

impl Chain {
    /// Every pinned process still runs (a poll error counts as "not").
    fn alive(&self) -> bool {
        matches!(any_exited(&self.pins), Ok(false))
    }
}

/// A pidfd counted against [`Ancestry`]'s limit while it is open.
#[derive(Debug)]
struct Pin {
    fd: OwnedFd,
    count: Arc<AtomicUsize>,
}

impl AsFd for Pin {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why a walk's chain was not pinned whole.
#[derive(Debug, PartialEq, Eq)]
enum Unpinned {
    /// A link exited, or could not be opened or read: not to be kept.
    Broken,
    /// The pidfd limit was reached: room may be made and the walk tried again.
    NoRoom,
}

impl Default for Ancestry {
    fn default() -> Self {
        Self::with_limit(PINS_MAX)
    }
}

impl Ancestry {
    /// A cache that holds at most `limit` pidfds at once.
    #[must_use]
    pub fn with_limit(limit: usize) -> Self {
        Ancestry {
            chains: Mutex::default(),
            pins: Arc::default(),
            limit,
        }
    }

    /// `ppid`, its parent, … up to [`MAX_ANCESTORS`], stopping before pid 1 (init
    /// or the pid namespace's reaper, the parent of every orphan) and after the
    /// first that cannot be read (it exited).
    pub fn ancestors(&self, ppid: u32) -> Vec<u32> {
        let kept = self.chains().get(&ppid).cloned();
        if let Some(chain) = kept {
            if chain.alive() {
                return chain.pids.clone();
            }
            let mut chains = self.chains();
            if chains.get(&ppid).is_some_and(|c| Arc::ptr_eq(c, &chain)) {
                chains.remove(&ppid);
            }
        }
        let (pids, pinned) = match self.walk(ppid) {
            (_, Err(Unpinned::NoRoom)) => {
                self.make_room();
                self.walk(ppid)
            }
            walked => walked,
        };
        if let Ok(pins) = pinned {
            if !pins.is_empty() {
                let chain = Arc::new(Chain {
                    pids: pids.clone(),
                    pins,
                });
                self.chains().insert(ppid, chain);
            }
        }
        pids
    }

    /// How many pidfds the cache holds now.
    #[cfg(test)]
    #[must_use]
    pub fn pinned(&self) -> usize {
        self.pins.load(Ordering::Relaxed)
    }

    fn chains(&self) -> MutexGuard<'_, HashMap<u32, Arc<Chain>>> {
        self.chains.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Drops the chains of processes that exited and, if none had, every chain.
    fn make_room(&self) {
        let mut chains = self.chains();
        let before = chains.len();
        chains.retain(|_, chain| chain.alive());
        if chains.len() == before {
            chains.clear();
        }
    }

    /// A pidfd for `pid` within the limit (`NoRoom` past it).
    fn pin(&self, pid: u32) -> Result<Pin, Unpinned> {
        self.pins
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .map_err(|_| Unpinned::NoRoom)?;
        let count = Arc::clone(&self.pins);
        match libc::pid_t::try_from(pid).ok().map(pidfd_open) {
            Some(Ok(fd)) => Ok(Pin { fd, count }),
            _ => {
                count.fetch_sub(1, Ordering::Relaxed);
                Err(Unpinned::Broken)
            }
        }
    }

    /// A fresh walk from `ppid`: the chain, and its pins when every link was
    /// read from a process that still ran after the reads. A link that cannot be
    /// pinned is still read: the chain is complete, only not kept.
    fn walk(&self, ppid: u32) -> (Vec<u32>, Result<Vec<Pin>, Unpinned>) {
        let mut pids = Vec::new();
        let mut pins = Ok(Vec::new());
        let mut pid = ppid;
        while pid > 1 && pids.len() < MAX_ANCESTORS {
            pids.push(pid);
            // Pinned before the read, checked after: the stat is this process's.
            if let Ok(held) = &mut pins {
                match self.pin(pid) {
                    Ok(pin) => held.push(pin),
                    Err(why) => pins = Err(why),
                }
            }
            let Ok(stat) = ProcStat::read(pid) else {
                return (pids, Err(Unpinned::Broken));
            };
            pid = stat.ppid;
        }
        let pins = pins.and_then(|held| match any_exited(&held) {
            Ok(false) => Ok(held),
            _ => Err(Unpinned::Broken),
        });
        (pids, pins)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command};

    fn sleeper() -> Child {
        Command::new("sleep")
            .arg("120")
            .spawn()
            .expect("spawn sleep")
    }

    fn pid_of(child: &Child) -> u32 {
        child.id()
    }

    #[test]
    fn a_kept_chain_is_what_a_fresh_walk_reads() {
        let mut child = sleeper();
        let cache = Ancestry::default();
        let first = cache.ancestors(pid_of(&child));
        // The sleeper, then this test process, then its parents; never pid 1.
        assert_eq!(first.first(), Some(&pid_of(&child)));
        assert_eq!(first.get(1), Some(&std::process::id()));
        assert!(!first.contains(&1), "{first:?}");
        assert_eq!(cache.pinned(), first.len());
        let again = cache.ancestors(pid_of(&child));
        assert_eq!(again, first);
        assert_eq!(again, cache.walk(pid_of(&child)).0);
        child.kill().expect("kill");
        child.wait().expect("reap");
    }

    /// The case the pins exist for: once a process of the chain has exited (its
    /// pid free for reuse, its children re-parented), the kept chain is not used.
    #[test]
    fn a_chain_whose_process_exited_is_read_again_not_reused() {
        let mut child = sleeper();
        let pid = pid_of(&child);
        let cache = Ancestry::default();
        assert_eq!(cache.ancestors(pid).len(), cache.walk(pid).0.len());
        child.kill().expect("kill");
        child.wait().expect("reap");
        // A fresh walk cannot read the exited process: the chain ends with it.
        assert_eq!(cache.ancestors(pid), vec![pid]);
        assert_eq!(
            cache.pinned(),
            0,
            "a chain ending at an exited process is not kept"
        );
    }

    #[test]
    fn the_kept_chains_never_hold_more_pidfds_than_the_limit() {
        let mut children: Vec<Child> = (0..6).map(|_| sleeper()).collect();
        let depth = Ancestry::default().walk(pid_of(&children[0])).0.len();
        let limit = depth * 2;
        let cache = Ancestry::with_limit(limit);
        for child in &children {
            let chain = cache.ancestors(pid_of(child));
            assert_eq!(chain.first(), Some(&pid_of(child)));
            assert!(cache.pinned() <= limit, "{} > {limit}", cache.pinned());
        }
        // The last one is always kept (the others were dropped to make room).
        let last = pid_of(children.last().expect("children"));
        assert!(cache.chains().contains_key(&last));
        for child in &mut children {
            child.kill().expect("kill");
            child.wait().expect("reap");
        }
    }
}
