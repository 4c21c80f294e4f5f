//! An owned XPC dictionary, read and written through `wire_dict`'s traits.
//!
//! Shared by the daemon's listener and the shim's client (included by path), so the
//! unsafe libxpc calls for dictionaries exist once.

use std::ffi::CStr;

use crate::dict::{DictSink, DictSource, DictValue};
use crate::sys::{
    _xpc_type_bool, _xpc_type_dictionary, _xpc_type_string, _xpc_type_uint64, xpc_bool_get_value,
    xpc_dictionary_create, xpc_dictionary_create_reply, xpc_dictionary_get_count,
    xpc_dictionary_get_value, xpc_dictionary_set_bool, xpc_dictionary_set_string,
    xpc_dictionary_set_uint64, xpc_get_type, xpc_object_t, xpc_release, xpc_retain,
    xpc_string_get_length, xpc_string_get_string_ptr, xpc_uint64_get_value,
};
use metalift_policy::wire::MAX_FRAME;

/// At most this many keys are looked at: the protocol defines 24.
pub const MAX_KEYS: usize = 64;

/// One +1 reference to an XPC dictionary.
#[derive(Debug)]
pub struct XpcDict(xpc_object_t);

// SAFETY: XPC objects are reference counted with atomic operations and this type
// only mutates the dictionary through `&mut self` (libxpc documents dictionaries
// as safe to use from any queue as long as mutation is not concurrent).
unsafe impl Send for XpcDict {}

impl XpcDict {
    /// A new, empty dictionary.
    #[must_use]
    pub fn new() -> Self {
        // SAFETY: NULL keys and values with a count of 0 create an empty dictionary.
        let raw = unsafe { xpc_dictionary_create(std::ptr::null(), std::ptr::null(), 0) };
        XpcDict(raw)
    }

    /// A reply to `request`, or `None` when the sender expects no reply.
    #[must_use]
    pub fn reply_to(request: &XpcDict) -> Option<Self> {
        // SAFETY: `request` holds a live dictionary reference.
        let raw = unsafe { xpc_dictionary_create_reply(request.0) };
        (!raw.is_null()).then_some(XpcDict(raw))
    }

    /// Takes a new reference to `object` if it is a dictionary with a sane number
    /// of keys (borrowed objects from event handlers are not ours to keep otherwise).
    ///
    /// # Safety
    ///
    /// `object` is null or a live XPC object (e.g. the argument of a handler).
    #[must_use]
    pub unsafe fn retain_if_dictionary(object: xpc_object_t) -> Option<Self> {
        if object.is_null() {
            return None;
        }
        // SAFETY: `object` is a live XPC object handed to us by libxpc.
        let kind = unsafe { xpc_get_type(object) };
        if kind != &raw const _xpc_type_dictionary {
            return None;
        }
        // SAFETY: `object` is a live dictionary.
        if unsafe { xpc_dictionary_get_count(object) } > MAX_KEYS {
            return None;
        }
        // SAFETY: `object` is live; retaining gives us our own reference.
        Some(XpcDict(unsafe { xpc_retain(object) }))
    }

    /// The raw object, still owned by `self`.
    #[must_use]
    pub fn as_raw(&self) -> xpc_object_t {
        self.0
    }
}

impl Default for XpcDict {
    fn default() -> Self {
        XpcDict::new()
    }
}

impl Drop for XpcDict {
    fn drop(&mut self) {
        // SAFETY: `self.0` is our +1 reference, released exactly once.
        unsafe { xpc_release(self.0) }
    }
}

impl DictSink for XpcDict {
    fn set_u64(&mut self, key: &'static CStr, value: u64) {
        // SAFETY: live dictionary, NUL-terminated key.
        unsafe { xpc_dictionary_set_uint64(self.0, key.as_ptr(), value) }
    }

    fn set_bool(&mut self, key: &'static CStr, value: bool) {
        // SAFETY: live dictionary, NUL-terminated key.
        unsafe { xpc_dictionary_set_bool(self.0, key.as_ptr(), value) }
    }

    fn set_str(&mut self, key: &'static CStr, value: &str) {
        // The encoder already cut at the first NUL; this cannot fail, but a
        // malformed string must never abort a process the shim lives in.
        let Ok(value) = std::ffi::CString::new(value) else {
            return;
        };
        // SAFETY: live dictionary, NUL-terminated key and value (copied by libxpc).
        unsafe { xpc_dictionary_set_string(self.0, key.as_ptr(), value.as_ptr()) }
    }
}

impl DictSource for XpcDict {
    fn get(&self, key: &'static CStr) -> Option<DictValue> {
        // SAFETY: live dictionary, NUL-terminated key; the value is borrowed from
        // the dictionary, which `self` keeps alive for this whole function.
        let value = unsafe { xpc_dictionary_get_value(self.0, key.as_ptr()) };
        if value.is_null() {
            return None;
        }
        // SAFETY: `value` is a live XPC object.
        let kind = unsafe { xpc_get_type(value) };
        Some(if kind == &raw const _xpc_type_uint64 {
            // SAFETY: `value` is a uint64 object.
            DictValue::U64(unsafe { xpc_uint64_get_value(value) })
        } else if kind == &raw const _xpc_type_bool {
            // SAFETY: `value` is a bool object.
            DictValue::Bool(unsafe { xpc_bool_get_value(value) })
        } else if kind == &raw const _xpc_type_string {
            // SAFETY: `value` is a string object.
            let len = unsafe { xpc_string_get_length(value) };
            if len > MAX_FRAME {
                DictValue::LongStr(len)
            } else {
                // SAFETY: `value` is a string object.
                let ptr = unsafe { xpc_string_get_string_ptr(value) };
                // SAFETY: libxpc keeps `len` bytes (plus a NUL) at `ptr` for as long
                // as the string lives; we copy them out before returning.
                let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
                DictValue::Str(bytes.to_vec())
            }
        } else {
            DictValue::Other
        })
    }
}
