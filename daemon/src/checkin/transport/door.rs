//! The door: connections accepted but not yet heard from (no first frame, no
//! first XPC message), counted per uid as well as in all.
//!
//! Before this, the pending stage was one global pool that the socket's accept
//! loop waited on: one local user holding every pending place with silent
//! connections stopped the daemon accepting anyone (issue 42, item 4). Now both
//! transports always accept, learn the uid from the kernel at once
//! (`SO_PEERCRED`/`LOCAL_PEERCRED` on the socket, the peer's euid on XPC) and
//! ask the door for a [`Pass`]:
//!
//! - a uid holds at most [`user_share`] of [`Limits::max_pending`]
//!   (a quarter: 1024 of 4096 by default); its next connection takes the place
//!   of its own oldest silent one (told through [`Pass::evicted`]), so a silent
//!   flood only ever costs the flooder, and even the flooder's own honest
//!   check-in, sent right after its connect, gets in (the oldest silent
//!   connections are the ones that say nothing);
//! - [`Limits::max_pending`] is the hard cap on them all (fitted to the
//!   open-file limit, `service::fit_limits`). When it is reached, a newcomer
//!   whose uid holds at least two fewer than the uid holding the most takes the
//!   place of that uid's oldest silent connection (told through
//!   [`Pass::evicted`]; "two" so that two uids never trade places back and
//!   forth); otherwise the newcomer is closed. So however many uids flood at
//!   once, a uid with no silent connection is turned away only when every place
//!   is held by a different uid, one each.
//!
//! A [`Pass`] is given back (dropped) when the first message arrives, or with
//! its connection. The door never waits: the socket's accept loop and libxpc's
//! listener queue call it inline.
#![forbid(unsafe_code)]

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

use super::Limits;
use crate::checkin::per_user::user_share;

/// The pending stage's places, per uid and in all. Cheap to share.
#[derive(Debug, Clone)]
pub struct Door {
    /// How many silent connections one uid may hold.
    per_user: usize,
    /// How many silent connections all uids together may hold.
    total_cap: usize,
    /// A std mutex: held for a few map operations, never across an await, and
    /// taken on libxpc's listener queue too (outside any runtime).
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Passes held, in all.
    total: usize,
    /// Numbers passes in the order they were given (oldest first per uid).
    next_id: u64,
    /// Each uid's passes by number, with the signal that evicts one. A uid is
    /// present only while it holds a pass.
    users: HashMap<u32, BTreeMap<u64, Arc<Notify>>>,
}

/// Why the door closed a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Every place is taken and no uid holds two more than this one.
    #[error("{cap} connections sent nothing yet and no uid holds two more than uid {uid}")]
    Full {
        /// The connecting uid.
        uid: u32,
        /// The hard cap.
        cap: usize,
    },
}

/// One connection's place at the door, until its first message arrives.
#[derive(Debug)]
pub struct Pass {
    id: u64,
    uid: u32,
    evict: Arc<Notify>,
    inner: Arc<Mutex<Inner>>,
}

impl Door {
    /// The door for a transport with these limits.
    #[must_use]
    pub fn new(limits: &Limits) -> Door {
        let total_cap = limits.max_pending.max(1);
        Door {
            per_user: user_share(total_cap),
            total_cap,
            inner: Arc::default(),
        }
    }

    /// How many silent connections one uid may hold.
    #[must_use]
    pub fn per_user(&self) -> usize {
        self.per_user
    }

    /// A place for a connection of `uid` just accepted, or why it must be closed.
    pub fn enter(&self, uid: u32) -> Result<Pass, Refused> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let held = inner.users.get(&uid).map_or(0, BTreeMap::len);
        if held >= self.per_user {
            // At its share: its own oldest silent connection gives way.
            inner.evict_oldest_of(uid);
        } else if inner.total >= self.total_cap && !inner.evict_from_the_largest_above(held) {
            return Err(Refused::Full {
                uid,
                cap: self.total_cap,
            });
        }
        let id = inner.next_id;
        inner.next_id += 1;
        inner.total += 1;
        let evict = Arc::new(Notify::new());
        inner
            .users
            .entry(uid)
            .or_default()
            .insert(id, Arc::clone(&evict));
        Ok(Pass {
            id,
            uid,
            evict,
            inner: Arc::clone(&self.inner),
        })
    }

    /// Silent connections held now, in all (for tests and status).
    #[must_use]
    pub fn held(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .total
    }
}

impl Inner {
    /// Evicts `uid`'s oldest pass; true if it held one.
    fn evict_oldest_of(&mut self, uid: u32) -> bool {
        let Some(passes) = self.users.get_mut(&uid) else {
            return false;
        };
        let Some((_, evict)) = passes.pop_first() else {
            return false;
        };
        if passes.is_empty() {
            self.users.remove(&uid);
        }
        self.total -= 1;
        // Stored if the holder is not waiting yet: it sees it at its next wait.
        evict.notify_one();
        true
    }

    /// Evicts the oldest pass of the uid holding the most, if it holds at
    /// least two more than `held`; true if a place was freed.
    fn evict_from_the_largest_above(&mut self, held: usize) -> bool {
        // The most passes; among equals, the one holding the oldest.
        let largest = self
            .users
            .iter()
            .map(|(&uid, passes)| {
                let oldest = passes.keys().next().copied().unwrap_or(u64::MAX);
                (passes.len(), Reverse(oldest), uid)
            })
            .max();
        let Some((len, _, uid)) = largest else {
            return false;
        };
        if len <= held + 1 {
            return false;
        }
        self.evict_oldest_of(uid)
    }
}

impl Pass {
    /// The uid this place is charged to.
    #[must_use]
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// Resolves when the door gave this place to another uid's connection:
    /// the holder then closes its connection.
    pub async fn evicted(&self) {
        self.evict.notified().await;
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(passes) = inner.users.get_mut(&self.uid) else {
            return; // evicted, and the uid holds nothing else
        };
        if passes.remove(&self.id).is_none() {
            return; // evicted: already uncounted
        }
        if passes.is_empty() {
            inner.users.remove(&self.uid);
        }
        inner.total -= 1;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn door(max_pending: usize) -> Door {
        Door::new(&Limits {
            max_pending,
            ..Limits::default()
        })
    }

    #[tokio::test]
    async fn a_uid_past_its_share_gives_up_its_own_oldest_and_another_uid_enters() {
        let door = door(8);
        let held: Vec<Pass> = (0..2)
            .map(|_| door.enter(1).expect("within share"))
            .collect();
        let newest = door.enter(1).expect("uid 1's newest enters");
        assert_eq!(door.held(), 2, "in place of its oldest");
        tokio::time::timeout(Duration::from_secs(1), held[0].evicted())
            .await
            .expect("uid 1's oldest is told to close");
        let other = door.enter(2).expect("uid 2 is not uid 1");
        drop((held, newest, other));
        assert_eq!(door.held(), 0, "places were given back, none twice");
    }

    #[tokio::test]
    async fn when_full_a_newcomer_takes_the_oldest_place_of_the_largest_holder() {
        let door = door(8); // 2 per uid
        let mut flood: Vec<Pass> = Vec::new();
        for uid in [10, 10, 11, 11, 12, 12, 13] {
            flood.push(door.enter(uid).unwrap());
        }
        // A uid with one place fills the door.
        let lone = door.enter(14).unwrap();
        assert_eq!(door.held(), 8);
        // A uid holding one less than the most cannot push anyone out.
        assert_eq!(
            door.enter(14).unwrap_err(),
            Refused::Full { uid: 14, cap: 8 }
        );
        // One holding fewer can: the oldest place of the largest holders (uid 10's) goes.
        let newcomer = door.enter(15).expect("uid 15 holds nothing");
        assert_eq!(door.held(), 8);
        tokio::time::timeout(Duration::from_secs(1), flood[0].evicted())
            .await
            .expect("uid 10's oldest is told to close");
        drop(flood); // the evicted pass is not counted twice
        assert_eq!(door.held(), 2);
        drop((lone, newcomer));
        assert_eq!(door.held(), 0);
    }
}
