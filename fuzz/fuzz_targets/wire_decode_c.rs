//! Fuzzes the shim's C verdict decoder (`shim/c/wire.c`) against the Rust
//! reference: arbitrary bodies never crash it, and it accepts exactly the
//! verdicts `decode_body` accepts, with the same fields, and refuses the rest
//! with the same error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metalift_policy::wire::decode_body;
use metalift_shim::c::{decode_verdict, expected_verdict};

fuzz_target!(|data: &[u8]| {
    let expected = expected_verdict(decode_body(data));
    assert_eq!(decode_verdict(data), expected);
});
