//! `sysctlbyname` for a string value: the host chip's brand
//! (`machdep.cpu.brand_string`), the macOS build (`kern.osversion`) and the boot
//! session (`kern.bootsessionuuid`) are read through this one function.

use std::ffi::CStr;

/// Longest value accepted (each of the above is well under 256 bytes).
const MAX_LEN: usize = 4096;

/// The string sysctl `name`, trimmed; `None` when it is missing, empty, longer
/// than [`MAX_LEN`] or not UTF-8.
#[must_use]
pub fn string(name: &CStr) -> Option<String> {
    let mut len: libc::size_t = 0;
    // SAFETY: `name` is NUL-terminated; a null `oldp` with a valid `oldlenp` asks
    // only for the size, written to `len`, which we own.
    let rc = unsafe {
        libc::sysctlbyname(
            name.as_ptr(),
            std::ptr::null_mut(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    if rc != 0 || len == 0 || len > MAX_LEN {
        return None;
    }
    let mut buf = vec![0u8; len];
    // SAFETY: `buf` is writable for `len` bytes and `len` says so; sysctlbyname
    // writes at most `len` bytes and updates `len` to what it wrote.
    let rc = unsafe {
        libc::sysctlbyname(
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    if rc != 0 {
        return None;
    }
    buf.truncate(len);
    let text = CStr::from_bytes_until_nul(&buf).ok()?.to_str().ok()?.trim();
    (!text.is_empty()).then(|| text.to_owned())
}
