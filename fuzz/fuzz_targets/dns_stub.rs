//! The DNS stub's answer to any datagram: never a panic, and an answer is a well-formed
//! DNS message with the query's id.
#![no_main]

use std::time::Instant;

use beige_fuzz::dns::{answer, SyntheticNames};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut names = SyntheticNames::new();
    if let Some(reply) = answer(data, &mut names, Instant::now()) {
        assert!(reply.len() >= 12, "a reply shorter than a DNS header");
        assert_eq!(reply[..2], data[..2], "the reply has another id");
        // Asked again, the same name gets the same answer.
        let again = answer(data, &mut names, Instant::now());
        assert_eq!(again.as_deref(), Some(reply.as_slice()));
    }
});
