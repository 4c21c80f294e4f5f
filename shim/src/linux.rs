//! Linux: the constructor (`.init_array`) and an interposed `dlopen`, the
//! simulation's stand-in for dyld's add-image callback.
//!
//! Injected with `LD_PRELOAD`, the shim's `dlopen` comes first in the global
//! scope, so every `dlopen` the program and its libraries make goes through it:
//! it calls the real one (`dlsym(RTLD_NEXT, "dlopen")`) and, when a library was
//! loaded and Metal has not been found yet, looks for `_MTLDevice` through the new
//! handle (which also covers an `RTLD_LOCAL` library's dependencies, such as
//! `libobjc`). glibc's own internal loads (NSS, iconv) do not pass through it.
//!
//! Known limit: glibc resolves a bare library name against the *calling* object's
//! `DT_RUNPATH`, and the caller it sees is now the shim (which has none). A
//! program that `dlopen`s a bare name found only through its own `DT_RUNPATH`
//! would not find it; `DT_RPATH`, `LD_LIBRARY_PATH`, the cache and paths with a
//! `/` are unaffected. macOS has no such limit (dyld tells the shim directly).

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::objc::Scope;

/// Runs when the shim is loaded, before `main` (or inside the `dlopen` that loads it).
extern "C" fn constructor() {
    ffi_boundary!(crate::on_load_failed(), {
        crate::on_load();
    })
}

#[used]
#[link_section = ".init_array"]
static CONSTRUCTOR: extern "C" fn() = constructor;

type DlopenFn = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;

/// The next `dlopen` in the lookup order (glibc's), resolved on first use: another
/// preloaded library's constructor may call `dlopen` before ours has run.
static REAL_DLOPEN: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

fn real_dlopen() -> Option<DlopenFn> {
    let mut sym = REAL_DLOPEN.load(Ordering::Acquire);
    if sym.is_null() {
        // SAFETY: RTLD_NEXT lookup of a NUL-terminated name; no other precondition.
        sym = unsafe { libc::dlsym(libc::RTLD_NEXT, c"dlopen".as_ptr()) };
        if sym.is_null() {
            return None;
        }
        REAL_DLOPEN.store(sym, Ordering::Release);
    }
    // SAFETY: the symbol is glibc's `void *dlopen(const char *, int)`.
    Some(unsafe { std::mem::transmute::<*mut c_void, DlopenFn>(sym) })
}

/// The interposed `dlopen(3)`: exactly the real one, then a look for Metal.
///
/// # Safety
///
/// Same contract as `dlopen(3)`: `filename` is NULL or a NUL-terminated path.
#[no_mangle]
pub unsafe extern "C" fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void {
    let Some(real) = real_dlopen() else {
        return std::ptr::null_mut();
    };
    // SAFETY: forwarding the caller's arguments unchanged; the caller upholds dlopen's contract.
    let handle = unsafe { real(filename, flags) };
    if !handle.is_null() {
        ffi_boundary!((), crate::on_library_loaded(Scope::Library(handle)));
    }
    handle
}
