//! macOS: the constructor (`__DATA,__mod_init_func`) and dyld's add-image
//! callback, which tells the shim when Metal.framework is loaded — at once for
//! images already present when the callback is registered, later for a process
//! that `dlopen`s Metal (Python + PyTorch MPS).
//!
//! Type-checked on Linux (`cargo check --target aarch64-apple-darwin`); the same
//! hook code runs against the simulated Metal there.

use std::ffi::{c_void, CStr};

use crate::objc::Scope;

/// Runs when the shim is loaded (`DYLD_INSERT_LIBRARIES`), before `main`.
extern "C" fn constructor() {
    ffi_boundary!(crate::on_load_failed(), {
        if crate::on_load() {
            // SAFETY: registering a callback with the signature dyld expects; it stays valid
            // for the process's life (the shim is never unloaded: dyld does not unload
            // inserted libraries).
            unsafe { _dyld_register_func_for_add_image(image_added) };
        }
    })
}

#[used]
#[link_section = "__DATA,__mod_init_func"]
static CONSTRUCTOR: extern "C" fn() = constructor;

extern "C" {
    fn _dyld_register_func_for_add_image(callback: extern "C" fn(*const c_void, isize));
}

/// dyld's add-image callback: cheap for every image that is not Metal.
extern "C" fn image_added(header: *const c_void, _slide: isize) {
    ffi_boundary!((), {
        if is_metal(header) {
            crate::on_library_loaded(Scope::Global);
        }
    })
}

fn is_metal(header: *const c_void) -> bool {
    // SAFETY: Dl_info is plain old data; all-zero is valid for dladdr to overwrite.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `header` is an image's mach header (an address inside it); `info` is a valid out-pointer.
    if unsafe { libc::dladdr(header, &mut info) } == 0 || info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by dyld.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes();
    path.ends_with(b"/Metal.framework/Metal")
        || path.ends_with(b"/Metal.framework/Versions/A/Metal")
}
