//! Gives memory freed by a policy reload back to the system.
//!
//! A compiled 10,000-rule policy is tens of MiB of small allocations (glob
//! programs, index maps). After a reload frees the old one, glibc keeps those
//! pages in its arenas (one per thread that allocated), so the daemon's resident
//! size would stay at its high-water mark after every reload. `malloc_trim(0)`
//! returns free pages at the top of each arena and `madvise`s free pages inside
//! them. Other allocators (macOS's, musl's) return large frees on their own; there
//! this is a no-op. A platform module: the one FFI call is its only unsafe operation.
#![allow(unsafe_code)]

/// Returns free heap pages to the kernel where the allocator keeps them (glibc).
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes a padding size by value, has no other
        // preconditions, and may be called from any thread at any time.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}
