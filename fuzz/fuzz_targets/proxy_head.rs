//! The gateway's reader of a proxy request head (what PID 1 forwards from a client):
//! never a panic, and a parsed head can always be rewritten to origin form or refused.
#![no_main]

use beige_core::egress::http::{origin_form_head, parse_proxy_head};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(parsed)) = parse_proxy_head(data) {
        let _ = origin_form_head(&parsed);
    }
});
