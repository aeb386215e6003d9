//! The TLS ClientHello reader (the SNI check): never a panic on any bytes.
#![no_main]

use beige_core::egress::tls::client_hello_sni;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = client_hello_sni(data);
});
