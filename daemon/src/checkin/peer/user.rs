//! User names for `user` rules, through the C library's NSS (`getpwuid_r`), the
//! same on every Unix the daemon runs on. A platform module: the one FFI call and
//! the read of its result are the only unsafe operations.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::mem::MaybeUninit;

/// The user name of `uid` through NSS (`getpwuid_r`), `None` when it has none.
#[must_use]
pub fn user_name(uid: u32) -> Option<String> {
    let mut buf = vec![0u8; 1024];
    loop {
        let mut pwd = MaybeUninit::<libc::passwd>::zeroed();
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is to writable memory owned here; `buf.len()` is its size.
        let rc = unsafe {
            libc::getpwuid_r(
                uid,
                pwd.as_mut_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut result,
            )
        };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 || result.is_null() {
            return None;
        }
        // SAFETY: getpwuid_r succeeded and set `result` to `pwd`, whose `pw_name` is a
        // NUL-terminated string inside `buf`, alive for this scope.
        let name = unsafe { CStr::from_ptr((*result).pw_name) };
        return Some(name.to_string_lossy().into_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_has_a_user_name() {
        assert_eq!(user_name(0).as_deref(), Some("root"));
    }
}
