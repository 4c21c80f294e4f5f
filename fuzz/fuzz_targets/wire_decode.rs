//! Fuzzes the check-in frame decoder: arbitrary bytes never panic, and whatever
//! decodes re-encodes to a frame that decodes to the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metalift_policy::wire::{decode_frame, encode_frame};

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((message, used))) = decode_frame(data) {
        assert!(used <= data.len());
        let frame = encode_frame(&message);
        match decode_frame(&frame) {
            Ok(Some((again, again_used))) => {
                assert_eq!(again, message);
                assert_eq!(again_used, frame.len());
            }
            other => panic!("re-encoded {message:?} does not decode: {other:?}"),
        }
    }
});
