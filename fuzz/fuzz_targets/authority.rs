//! The target normalizer: never a panic, and what it accepts prints as an authority it
//! accepts again as the same target.
#![no_main]

use beige_core::egress::target::parse_authority;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(target) = parse_authority(text, 443) {
        let shown = target.to_string();
        assert_eq!(
            parse_authority(&shown, 443).as_ref(),
            Ok(&target),
            "{text:?} became {shown:?}"
        );
    }
});
