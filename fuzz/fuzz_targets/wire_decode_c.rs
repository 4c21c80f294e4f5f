//! Fuzzes the shim's C verdict decoder (`shim/c/wire.c`) against the Rust
//! reference: arbitrary bodies never crash it, and it accepts exactly the
//! verdicts `decode_body` accepts, with the same fields, and refuses the rest
//! with the same error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metalift_policy::wire::{decode_body, Message, WireError};
use metalift_shim::c::{decode_verdict, CWireError};

fuzz_target!(|data: &[u8]| {
    let expected = match decode_body(data) {
        Ok(Message::Verdict(v)) => Ok(v),
        Ok(Message::CheckIn(_)) => Err(CWireError::NotVerdict(1)),
        Ok(Message::Outcome(_)) => Err(CWireError::NotVerdict(3)),
        Ok(Message::StatusRequest) => Err(CWireError::NotVerdict(4)),
        Ok(Message::Status(_)) => Err(CWireError::NotVerdict(5)),
        Err(WireError::Oversize(n)) => Err(CWireError::Oversize(n as u64)),
        Err(WireError::Truncated) => Err(CWireError::Truncated),
        Err(WireError::Version(v)) => Err(CWireError::Version(v)),
        Err(WireError::UnknownKind(k)) => Err(CWireError::UnknownKind(k)),
        Err(WireError::BadField(f)) => Err(CWireError::BadField(f.to_owned())),
        Err(WireError::Missing(f)) => Err(CWireError::Missing(f.to_owned())),
    };
    assert_eq!(decode_verdict(data), expected);
});
