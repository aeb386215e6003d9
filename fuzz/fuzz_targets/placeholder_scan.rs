//! The placeholder scanner: never a panic, and the same findings whether a body comes
//! whole or split at any offset (the first byte chooses where).
#![no_main]

use beige_core::egress::scan::{scan, StreamScanner};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, body)) = data.split_first() else {
        return;
    };
    let whole = scan(body);
    let at = usize::from(cut) * body.len() / 256;
    let mut split = StreamScanner::new();
    split.push(&body[..at]);
    split.push(&body[at..]);
    assert_eq!(split.finish(), whole, "split at {at}");
});
