//! How a check-in protocol [`Message`] rides XPC: as its frame body, one `data`
//! value under [`key::FRAME`] in the message dictionary. The bytes are
//! [`metalift_policy::wire`]'s, exactly what the Unix socket carries after the
//! length prefix (the data value knows its length), so there is one codec per
//! language: `wire.rs` here and in the daemon, `shim/c/wire.c` in the shim. The
//! dictionary holds nothing else of ours; XPC is used for what it alone gives,
//! the kernel's audit token of each message (`sys.rs`).
//!
//! Pure (no XPC, no unsafe): `message.rs` (macOS) reads and writes the data
//! value with libxpc; the daemon's tests use [`encode`] and [`decode`] as the
//! bytes a dictionary would carry.
//!
//! # Older peers (refuse clearly)
//!
//! Before this format (metalift 0.1.0 as first built) the XPC messages were
//! dictionaries with one key per field
//! (`metalift.version`, `kind`, …; `xpc/src/dict.rs`, `shim/c/xpc_dict.c`).
//! Neither side accepts that form any more, for a reason: keeping its decoder
//! "for one release" keeps the second codec pair this format replaced, and the
//! shim and the daemon ship in one package, so the two forms meet only while a
//! machine is being upgraded. What each side does with the other form:
//!
//! - An older shim (a process that loaded it before the upgrade) sends a
//!   dictionary with `metalift.version` and no frame: [`decode`] says
//!   [`Received::OlderShim`]; the daemon logs it and answers in the older
//!   shim's own words, "declined: use the socket" ([`legacy`]), which every
//!   older shim understands: it checks in on the Unix socket at once, within
//!   the same deadline, and gets its verdict there. Nothing is decided over
//!   XPC for it, so no audit record names the XPC transport.
//! - A newer shim talking to an older daemon (the daemon not yet restarted):
//!   the older daemon decodes no version key, refuses the message as malformed
//!   (its audit log records `refused`, reason `malformed`) and closes; the shim
//!   sees an XPC error instead of a reply and checks in on the socket, whose
//!   frames did not change (`shim/c/xpc_reply.c`).
#![forbid(unsafe_code)]

use metalift_policy::wire::{self, Message, WireError, LENGTH_PREFIX};

/// The mach service metaliftd listens on and the shim looks up by default; both
/// launchd plists advertise it in `MachServices`.
pub const DEFAULT_SERVICE: &str = "com.metalift.policy";

/// The dictionary keys metalift reads and writes.
pub mod key {
    use std::ffi::CStr;

    /// data: the message's frame body (`shim/c/xpc.c` `ML_XPC_FRAME_KEY`).
    pub const FRAME: &CStr = c"metalift.frame";
    /// uint64, in an older peer's dictionaries only (see [`super::legacy`]).
    pub const LEGACY_VERSION: &CStr = c"metalift.version";
}

/// What a received dictionary holds.
#[derive(Debug, PartialEq, Eq)]
pub enum Received {
    /// A frame body, decoded (or why not).
    Message(Result<Message, WireError>),
    /// An older shim's one-key-per-field dictionary: answer it with
    /// [`legacy`]'s decline.
    OlderShim,
}

/// The data value's bytes for `msg`: its frame without the length prefix.
#[must_use]
pub fn encode(msg: &Message) -> Vec<u8> {
    let mut frame = wire::encode_frame(msg);
    frame.drain(..LENGTH_PREFIX);
    frame
}

/// A received dictionary, from what it holds under [`key::FRAME`] (`None`: no
/// data value there) and whether it has an older peer's [`key::LEGACY_VERSION`].
#[must_use]
pub fn decode(frame: Option<&[u8]>, legacy_version: bool) -> Received {
    match frame {
        Some(body) => Received::Message(wire::decode_body(body)),
        None if legacy_version => Received::OlderShim,
        None => Received::Message(Err(WireError::Missing("metalift.frame"))),
    }
}

/// The answer an older shim understands: its dictionary layout's "declined,
/// use the socket" (the older `xpc_dict.c` read `metalift.version` = 1, `kind`,
/// `decline` and an optional `reason`, and then checked in on the socket).
pub mod legacy {
    use std::ffi::CStr;

    /// uint64 under [`super::key::LEGACY_VERSION`].
    pub const VERSION: u64 = 1;
    /// Strings, each under its key.
    pub const STRINGS: [(&CStr, &CStr); 3] = [
        (c"kind", c"declined"),
        (c"decline", c"use_socket"),
        (
            c"reason",
            c"this metaliftd reads XPC check-ins as frames only: restart the process to load the new libmetalift",
        ),
    ];
}

#[cfg(test)]
mod tests {
    use super::*;
    use metalift_policy::wire::{CheckIn, DeclineReason, Declined};

    #[test]
    fn a_message_rides_as_the_sockets_frame_body_and_decodes_to_itself() {
        for msg in [
            Message::CheckIn(CheckIn {
                shim_version: "0.1.0".into(),
                arch: "arm64e".into(),
                claimed_executable: None,
                job: Some("GITHUB_RUN_ID=1".into()),
            }),
            Message::StatusRequest,
            Message::Declined(Declined {
                reason: DeclineReason::Busy,
                detail: "full".into(),
            }),
        ] {
            let body = encode(&msg);
            assert_eq!(body, wire::encode_frame(&msg)[LENGTH_PREFIX..]);
            assert_eq!(decode(Some(&body), false), Received::Message(Ok(msg)));
        }
    }

    #[test]
    fn a_dictionary_without_a_frame_is_malformed_unless_an_older_shim_sent_it() {
        assert_eq!(
            decode(None, false),
            Received::Message(Err(WireError::Missing("metalift.frame")))
        );
        assert_eq!(decode(None, true), Received::OlderShim);
        // A frame wins: the key an older peer used is then just ignored.
        assert_eq!(
            decode(Some(&encode(&Message::StatusRequest)), true),
            Received::Message(Ok(Message::StatusRequest))
        );
        assert_eq!(
            decode(Some(&[9, 4]), false),
            Received::Message(Err(WireError::Version(9)))
        );
    }
}
