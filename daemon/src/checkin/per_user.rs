//! Limits per user as well as global: one uid flooding the daemon (idle
//! check-ins holding waiting places, slow identifications holding active
//! places, hash work holding the identity workers) never turns another uid's
//! check-in `Busy` or late (issue "libmetalift v5", item 6).
//!
//! A [`UserLimit`] gives each uid at most [`user_share`] of a global bound;
//! it is taken *before* the global place, so a uid at its share waits (or is
//! declined) without holding any global place, and the rest of the global
//! places stay for the other users. A uid's entry exists only while one of its
//! permits is alive: the map holds as many entries as users being served.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How much of a global bound one user may hold: a quarter (at least one, at
/// most the bound itself). With the defaults: 16 of 64 active connections,
/// 256 of 1024 waiting places, 2 of 8 identity workers.
#[must_use]
pub fn user_share(total: usize) -> usize {
    (total / 4).max(1).min(total.max(1))
}

/// At most `per_user` permits per uid. Cheap to share (`Arc` inside).
#[derive(Debug, Clone)]
pub struct UserLimit {
    per_user: usize,
    users: Arc<Mutex<HashMap<u32, Arc<Semaphore>>>>,
}

/// One of a uid's permits; dropping it gives the place back (and forgets the
/// uid once none of its permits is left).
#[derive(Debug)]
pub struct UserPermit {
    permit: Option<OwnedSemaphorePermit>,
    uid: u32,
    users: Arc<Mutex<HashMap<u32, Arc<Semaphore>>>>,
}

impl Drop for UserPermit {
    fn drop(&mut self) {
        drop(self.permit.take());
        let mut users = self.users.lock().unwrap_or_else(PoisonError::into_inner);
        // Only the map's own reference left: nobody holds or waits on it.
        if users
            .get(&self.uid)
            .is_some_and(|s| Arc::strong_count(s) == 1)
        {
            users.remove(&self.uid);
        }
    }
}

impl UserLimit {
    /// A limit of `per_user` permits per uid (at least one).
    #[must_use]
    pub fn new(per_user: usize) -> Self {
        UserLimit {
            per_user: per_user.max(1),
            users: Arc::default(),
        }
    }

    /// The permits one uid may hold.
    #[must_use]
    pub fn per_user(&self) -> usize {
        self.per_user
    }

    fn semaphore(&self, uid: u32) -> Arc<Semaphore> {
        let mut users = self.users.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(
            users
                .entry(uid)
                .or_insert_with(|| Arc::new(Semaphore::new(self.per_user))),
        )
    }

    /// Waits (holding no thread) until `uid` has a permit free.
    pub async fn acquire(&self, uid: u32) -> UserPermit {
        let semaphore = self.semaphore(uid);
        // Never closed, so acquiring only waits.
        let permit = semaphore.acquire_owned().await.ok();
        UserPermit {
            permit,
            uid,
            users: Arc::clone(&self.users),
        }
    }

    /// A permit for `uid` now, or `None` when it holds its share.
    #[must_use]
    pub fn try_acquire(&self, uid: u32) -> Option<UserPermit> {
        let permit = self.semaphore(uid).try_acquire_owned();
        let permit = UserPermit {
            permit: permit.ok(),
            uid,
            users: Arc::clone(&self.users),
        };
        // A failed try still made an entry: the guard's drop forgets it.
        permit.permit.is_some().then_some(permit)
    }

    /// Users with a permit held or awaited now (for tests).
    #[must_use]
    pub fn users(&self) -> usize {
        self.users
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_at_its_share_is_refused_and_another_user_is_not() {
        let limit = UserLimit::new(2);
        let a1 = limit.try_acquire(1).expect("first");
        let _a2 = limit.try_acquire(1).expect("second");
        assert!(limit.try_acquire(1).is_none(), "a third for uid 1");
        let _b = limit.try_acquire(2).expect("uid 2 is not uid 1's");
        drop(a1);
        assert!(limit.try_acquire(1).is_some(), "a place was given back");
    }

    #[test]
    fn a_user_with_nothing_held_is_forgotten() {
        let limit = UserLimit::new(1);
        let held = limit.try_acquire(7).unwrap();
        assert!(limit.try_acquire(7).is_none());
        assert_eq!(limit.users(), 1);
        drop(held);
        assert_eq!(limit.users(), 0);
    }

    #[test]
    fn a_share_is_a_quarter_at_least_one_at_most_the_whole() {
        assert_eq!(user_share(64), 16);
        assert_eq!(user_share(8), 2);
        assert_eq!(user_share(2), 1);
        assert_eq!(user_share(0), 1);
    }
}
