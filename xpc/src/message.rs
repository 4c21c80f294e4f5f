//! An owned XPC message dictionary, carrying one frame body as a `data` value
//! ([`crate::frame`]): the only libxpc dictionary code metalift has in Rust.

use crate::frame::{self, key, Received};
use crate::sys::{
    _xpc_type_dictionary, xpc_dictionary_create_reply, xpc_dictionary_get_data,
    xpc_dictionary_get_value, xpc_dictionary_set_data, xpc_dictionary_set_string,
    xpc_dictionary_set_uint64, xpc_get_type, xpc_object_t, xpc_release, xpc_retain,
};
use metalift_policy::wire::Message;

/// One +1 reference to an XPC dictionary.
#[derive(Debug)]
pub struct XpcMessage(xpc_object_t);

// SAFETY: XPC objects are reference counted with atomic operations and this type
// only mutates the dictionary through `&mut self` (libxpc documents dictionaries
// as safe to use from any queue as long as mutation is not concurrent).
unsafe impl Send for XpcMessage {}

impl XpcMessage {
    /// A reply to `request`, or `None` when the sender expects no reply.
    #[must_use]
    pub fn reply_to(request: &XpcMessage) -> Option<Self> {
        // SAFETY: `request` holds a live dictionary reference.
        let raw = unsafe { xpc_dictionary_create_reply(request.0) };
        (!raw.is_null()).then_some(XpcMessage(raw))
    }

    /// Takes a new reference to `object` if it is a dictionary (borrowed
    /// objects from event handlers are not ours to keep otherwise).
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
        // SAFETY: `object` is live; retaining gives us our own reference.
        Some(XpcMessage(unsafe { xpc_retain(object) }))
    }

    /// The raw object, still owned by `self`.
    #[must_use]
    pub fn as_raw(&self) -> xpc_object_t {
        self.0
    }

    /// What the dictionary carries: its frame, decoded, or an older shim's
    /// dictionary ([`frame::decode`]).
    #[must_use]
    pub fn decode(&self) -> Received {
        let mut len = 0usize;
        // Per <xpc/xpc.h> the result is NULL when the key is absent or not a data
        // value; otherwise it points at `len` bytes of the data object the
        // dictionary holds (xpc_dictionary_get_value "does not grant the caller
        // a reference"), alive while `self` is and the key is not replaced.
        // SAFETY: live dictionary, NUL-terminated key, writable length (above).
        let ptr = unsafe { xpc_dictionary_get_data(self.0, key::FRAME.as_ptr(), &mut len) };
        let body = (!ptr.is_null()).then(|| {
            // SAFETY: see above: `len` readable bytes, borrowed from `self`,
            // which outlives this function; decoding copies what it keeps.
            unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
        });
        // SAFETY: live dictionary, NUL-terminated key; the value is not retained
        // and only compared with NULL.
        let legacy =
            !unsafe { xpc_dictionary_get_value(self.0, key::LEGACY_VERSION.as_ptr()) }.is_null();
        frame::decode(body, legacy)
    }

    /// Stores `msg`'s frame body as the dictionary's data value.
    pub fn set(&mut self, msg: &Message) {
        let body = frame::encode(msg);
        // SAFETY: live dictionary, NUL-terminated key; libxpc copies the
        // `body.len()` bytes (<xpc/xpc.h> xpc_dictionary_set_data).
        unsafe {
            xpc_dictionary_set_data(
                self.0,
                key::FRAME.as_ptr(),
                body.as_ptr().cast(),
                body.len(),
            );
        }
    }

    /// Stores the "declined: use the socket" an older shim reads
    /// ([`frame::legacy`]).
    pub fn set_legacy_decline(&mut self) {
        // SAFETY: live dictionary, NUL-terminated key.
        unsafe {
            xpc_dictionary_set_uint64(self.0, key::LEGACY_VERSION.as_ptr(), frame::legacy::VERSION);
        }
        for (k, v) in frame::legacy::STRINGS {
            // SAFETY: live dictionary, NUL-terminated key and value (copied).
            unsafe { xpc_dictionary_set_string(self.0, k.as_ptr(), v.as_ptr()) }
        }
    }
}

impl Drop for XpcMessage {
    fn drop(&mut self) {
        // SAFETY: `self.0` is our +1 reference, released exactly once.
        unsafe { xpc_release(self.0) }
    }
}
