//! The fuzz targets' seed corpora (`fuzz/corpus/<target>`), run through the same entry
//! points and checks on the stable build, so `cargo test` covers them without the
//! instrumentation that `scripts/fuzz` needs.

use std::path::PathBuf;

use beige_core::egress::http::{origin_form_head, parse_proxy_head};
use beige_core::egress::scan::{scan, StreamScanner};
use beige_core::egress::target::parse_authority;
use beige_core::egress::tls::{client_hello_sni, Hello};

fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{}: no seeds", dir.display());
    files
}

#[test]
fn authority_seeds_parse_and_round_trip() {
    for (name, bytes) in corpus("authority") {
        let text = String::from_utf8(bytes).unwrap();
        let target = parse_authority(&text, 443).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            parse_authority(&target.to_string(), 443),
            Ok(target),
            "{name}"
        );
    }
}

#[test]
fn proxy_head_seeds_parse_or_are_refused() {
    for (name, bytes) in corpus("proxy_head") {
        if name.starts_with("reject-") {
            assert!(parse_proxy_head(&bytes).is_err(), "{name}");
            continue;
        }
        let parsed = parse_proxy_head(&bytes)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .unwrap_or_else(|| panic!("{name}: incomplete"));
        let _ = origin_form_head(&parsed);
    }
}

#[test]
fn client_hello_seeds_name_their_server() {
    let seeds = corpus("client_hello");
    let sni = |name: &str| {
        let (_, bytes) = seeds.iter().find(|(n, _)| n == name).unwrap();
        client_hello_sni(bytes).unwrap().unwrap()
    };
    assert_eq!(sni("sni"), Hello::Sni("api.example.test".into()));
    assert_eq!(sni("nosni"), Hello::NoSni);
}

#[test]
fn placeholder_seeds_are_found_whole_and_split() {
    for (name, bytes) in corpus("placeholder_scan") {
        let (&cut, body) = bytes.split_first().unwrap();
        let whole = scan(body);
        assert_eq!(whole.len(), 1, "{name}: {whole:?}");
        let at = usize::from(cut) * body.len() / 256;
        let mut split = StreamScanner::new();
        split.push(&body[..at]);
        split.push(&body[at..]);
        assert_eq!(split.finish(), whole, "{name}");
    }
}
