//! Where identity work runs: tokio's blocking threads, a bounded number at once.
//!
//! Identifying a peer blocks: `/proc` reads and `getsockopt` on Linux, `SecCode`
//! (which reads the executable and may wait on `securityd`) on macOS, hashing a
//! 50 MB binary for a `sha256` rule, an NSS user lookup. Run inline on the async
//! executor, a burst of check-ins would occupy every worker thread, and the
//! accept loop, every timer (read deadlines, idle limits) and every other
//! connection would wait behind them. So every transport hands that work to
//! [`BlockingPool::run`]: it runs on tokio's blocking threads, at most
//! [`IDENTITY_WORKERS`] at a time over all transports, and a check-in that finds
//! them all busy waits asynchronously, holding no thread.
//!
//! Per user as well ([`BlockingPool::run_for`]): one uid holds at most
//! [`user_share`] of the workers (2 of 8), so a uid whose check-ins keep the
//! workers busy — a large executable re-touched between launches under a
//! `sha256` rule, a slow `SecCode` — leaves the rest to every other user.

use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio::task::JoinError;

use crate::checkin::per_user::{user_share, UserLimit};

/// Identity computations running at once, over every transport. Enough to
/// overlap a few slow `SecCode` checks or hashes; few enough that a flood of
/// check-ins cannot start hundreds of threads (tokio's blocking pool allows 512)
/// all reading executables from one disk.
pub const IDENTITY_WORKERS: usize = 8;

/// A bound on concurrent blocking work. Cheap to share (`Arc` inside).
#[derive(Debug, Clone)]
pub struct BlockingPool {
    /// One permit per computation running now; waiting for one holds no thread.
    permits: Arc<Semaphore>,
    /// Each uid's share of them, taken before a global one.
    per_user: UserLimit,
}

impl BlockingPool {
    /// A pool running at most `workers` computations at once (at least one).
    #[must_use]
    pub fn new(workers: usize) -> Self {
        BlockingPool {
            permits: Arc::new(Semaphore::new(workers.max(1))),
            per_user: UserLimit::new(user_share(workers.max(1))),
        }
    }

    /// Runs `work` on a blocking thread once a place is free, and returns its
    /// result (`Err` only if the runtime is shutting down or `work` panicked).
    pub async fn run<T, F>(&self, work: F) -> Result<T, JoinError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        // Never closed, so acquiring only waits.
        let permit = Arc::clone(&self.permits).acquire_owned().await;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work()
        })
        .await
    }

    /// [`BlockingPool::run`] on behalf of `uid`: it first waits for one of that
    /// uid's places, so one user's work never takes more than its share.
    pub async fn run_for<T, F>(&self, uid: u32, work: F) -> Result<T, JoinError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let _user = self.per_user.acquire(uid).await;
        self.run(work).await
    }

    /// Places free now (for tests and status).
    #[must_use]
    pub fn available(&self) -> usize {
        self.permits.available_permits()
    }
}

impl Default for BlockingPool {
    fn default() -> Self {
        BlockingPool::new(IDENTITY_WORKERS)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_more_than_the_bound_run_at_once_and_all_finish() {
        let pool = BlockingPool::new(2);
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..6)
            .map(|i| {
                let (pool, running, most) = (pool.clone(), running.clone(), most.clone());
                tokio::spawn(async move {
                    pool.run(move || {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(30));
                        running.fetch_sub(1, Ordering::SeqCst);
                        i
                    })
                    .await
                    .expect("ran")
                })
            })
            .collect();
        let mut done = Vec::new();
        for t in tasks {
            done.push(t.await.expect("joined"));
        }
        assert_eq!(done, [0, 1, 2, 3, 4, 5]);
        assert_eq!(most.load(Ordering::SeqCst), 2);
        assert_eq!(pool.available(), 2);
    }
}
