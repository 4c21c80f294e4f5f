//! Fuzzes the shim's one C decoder (`shim/c/wire.c`, which reads the socket's
//! frames and XPC's data values alike) against the Rust reference: arbitrary
//! bodies never crash it, and it accepts only what `decode_body` accepts (a
//! verdict or a `Declined`, with the same values), refusing the rest.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metalift_policy::wire::decode_body;
use metalift_shim::c::{accepts_as_rust_does, decode_verdict};

fuzz_target!(|data: &[u8]| {
    let (rust, c) = (decode_body(data), decode_verdict(data));
    assert!(
        accepts_as_rust_does(&rust, &c),
        "Rust {rust:?}, C {c:?} for {data:02x?}"
    );
});
