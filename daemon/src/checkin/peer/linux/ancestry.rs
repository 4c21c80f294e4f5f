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
//! that ended at an ancestor that could not be read (it exited mid-walk) is
//! returned but not kept: its last link has nothing to pin.
//!
//! What a fresh walk cannot rule out, kept or not: an ancestor that exits between
//! the read of its child's stat and the `pidfd_open` of its pid, the pid reused
//! in those microseconds. The chain is logged, never matched by a rule.
//!
//! [`PeerFacts::ancestors`]: super::super::PeerFacts::ancestors
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::os::fd::OwnedFd;

use super::{any_exited, pidfd_open, ProcStat};
use crate::checkin::peer::MAX_ANCESTORS;

/// How many pidfds the kept chains may hold together: part of the descriptors
/// the service reserves for everything but connections
/// (`service::FD_RESERVE`). Enough for a handful of busy parents; beyond it the
/// chains of processes that exited are dropped, then all of them.
pub const PINS_MAX: usize = 32;

/// The kept chains, by the first ancestor (the peer's parent).
#[derive(Debug)]
pub struct Ancestry {
    chains: HashMap<u32, Chain>,
    /// The most pidfds all chains may hold together.
    limit: usize,
}

/// One chain: `pids[0]` is the first ancestor, each next one its parent.
#[derive(Debug)]
struct Chain {
    pids: Vec<u32>,
    /// One per pid, in the same order: while all poll "running", `pids` is true.
    pins: Vec<OwnedFd>,
}

impl Chain {
    /// Every pinned process still runs (a poll error counts as "not").
    fn alive(&self) -> bool {
        matches!(any_exited(&self.pins), Ok(false))
    }
}

impl Default for Ancestry {
    fn default() -> Self {
        Self::with_limit(PINS_MAX)
    }
}

impl Ancestry {
    /// A cache whose chains hold at most `limit` pidfds together.
    #[must_use]
    pub fn with_limit(limit: usize) -> Self {
        Ancestry {
            chains: HashMap::new(),
            limit,
        }
    }

    /// `ppid`, its parent, … up to [`MAX_ANCESTORS`], stopping before pid 1 (init
    /// or the pid namespace's reaper, the parent of every orphan) and after the
    /// first that cannot be read (it exited).
    pub fn ancestors(&mut self, ppid: u32) -> Vec<u32> {
        if let Some(chain) = self.chains.get(&ppid) {
            if chain.alive() {
                return chain.pids.clone();
            }
            self.chains.remove(&ppid);
        }
        let (pids, pins) = walk(ppid);
        if let Some(pins) = pins {
            self.keep(ppid, pids.clone(), pins);
        }
        pids
    }

    /// How many pidfds the kept chains hold.
    #[must_use]
    pub fn pinned(&self) -> usize {
        self.chains.values().map(|c| c.pins.len()).sum()
    }

    /// Keeps a chain, first dropping the chains of processes that exited and
    /// then, if that is not room enough, all of them.
    fn keep(&mut self, first: u32, pids: Vec<u32>, pins: Vec<OwnedFd>) {
        if pins.is_empty() || pins.len() > self.limit {
            return;
        }
        if self.pinned() + pins.len() > self.limit {
            self.chains.retain(|_, chain| chain.alive());
        }
        if self.pinned() + pins.len() > self.limit {
            self.chains.clear();
        }
        self.chains.insert(first, Chain { pids, pins });
    }
}

/// A fresh walk from `ppid`: the chain, and its pins when every link was read
/// from a process that still ran after the reads (else `None`: not to be kept).
fn walk(ppid: u32) -> (Vec<u32>, Option<Vec<OwnedFd>>) {
    let mut pids = Vec::new();
    let mut pins = Vec::new();
    let mut pid = ppid;
    while pid > 1 && pids.len() < MAX_ANCESTORS {
        pids.push(pid);
        // Pinned before the read, checked after: the stat is this process's.
        let Some(pin) = libc::pid_t::try_from(pid)
            .ok()
            .and_then(|p| pidfd_open(p).ok())
        else {
            return (pids, None);
        };
        let Ok(stat) = ProcStat::read(pid) else {
            return (pids, None);
        };
        pins.push(pin);
        pid = stat.ppid;
    }
    let keep = matches!(any_exited(&pins), Ok(false));
    (pids, keep.then_some(pins))
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
        let mut cache = Ancestry::default();
        let first = cache.ancestors(pid_of(&child));
        // The sleeper, then this test process, then its parents; never pid 1.
        assert_eq!(first.first(), Some(&pid_of(&child)));
        assert_eq!(first.get(1), Some(&std::process::id()));
        assert!(!first.contains(&1), "{first:?}");
        assert_eq!(cache.pinned(), first.len());
        let again = cache.ancestors(pid_of(&child));
        assert_eq!(again, first);
        assert_eq!(again, walk(pid_of(&child)).0);
        child.kill().expect("kill");
        child.wait().expect("reap");
    }

    /// The case the pins exist for: once a process of the chain has exited (its
    /// pid free for reuse, its children re-parented), the kept chain is not used.
    #[test]
    fn a_chain_whose_process_exited_is_read_again_not_reused() {
        let mut child = sleeper();
        let pid = pid_of(&child);
        let mut cache = Ancestry::default();
        assert_eq!(cache.ancestors(pid).len(), walk(pid).0.len());
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
        let depth = walk(pid_of(&children[0])).0.len();
        let limit = depth * 2;
        let mut cache = Ancestry::with_limit(limit);
        for child in &children {
            let chain = cache.ancestors(pid_of(child));
            assert_eq!(chain.first(), Some(&pid_of(child)));
            assert!(cache.pinned() <= limit, "{} > {limit}", cache.pinned());
        }
        // The last one is always kept (the others were dropped to make room).
        let last = pid_of(children.last().expect("children"));
        assert!(cache.chains.contains_key(&last));
        for child in &mut children {
            child.kill().expect("kill");
            child.wait().expect("reap");
        }
    }
}
