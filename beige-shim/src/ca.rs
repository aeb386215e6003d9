//! The egress CA in the sandbox (spec `egress.md` §3, "CA"): at boot, before the link or
//! any agent process starts, PID 1 writes the gateway's public CA and a merged bundle to
//! the root-owned tmpfs at [`CA_DIR`], which every TLS client in the sandbox is pointed
//! at by environment variables the gateway sets (`CURL_CA_BUNDLE`, `SSL_CERT_FILE`,
//! `GIT_SSL_CAINFO`, `REQUESTS_CA_BUNDLE`, `PIP_CERT`, `CARGO_HTTP_CAINFO` name the
//! bundle; `NODE_EXTRA_CA_CERTS` and `DENO_CERT` the CA alone).
//!
//! The bundle is the image's own (the first of the usual paths that is a regular file of
//! at most [`MAX_BUNDLE`] bytes), keeping only its `CERTIFICATE` blocks, plus the beige
//! CA: merged, never replaced, so public hosts in tunnel mode still verify. The image's
//! bundle is read before any agent process exists, so none can swap it under PID 1.
//! `update-ca-certificates` is never run and nothing outside [`CA_DIR`] is written.

use std::path::Path;

use base64::Engine as _;

use crate::fsutil::atomic_write;

/// Where the CA and the bundle go (a tmpfs the container spec mounts).
pub const CA_DIR: &str = beige_protocol::link::EGRESS_CA_DIR;

/// The image bundles looked for, in order.
const IMAGE_BUNDLES: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// The largest image bundle read.
pub const MAX_BUNDLE: u64 = 4 * 1024 * 1024;

const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
const END: &str = "-----END CERTIFICATE-----";

/// The PEM of one DER certificate.
pub fn pem(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::with_capacity(b64.len() + b64.len() / 64 + 64);
    out.push_str(BEGIN);
    out.push('\n');
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(END);
    out.push('\n');
    out
}

/// The `CERTIFICATE` blocks of `text`, each ending in a newline; everything else
/// (comments, keys, other blocks) is dropped.
pub fn certificate_blocks(text: &str) -> String {
    let mut out = String::new();
    let mut block: Option<String> = None;
    for line in text.lines() {
        let line = line.trim_end();
        match (&mut block, line) {
            (None, BEGIN) => block = Some(format!("{BEGIN}\n")),
            (Some(b), END) => {
                b.push_str(END);
                b.push('\n');
                out.push_str(b);
                block = None;
            }
            (Some(_), BEGIN) => block = Some(format!("{BEGIN}\n")),
            (Some(b), l)
                if l.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || b"+/=".contains(&c)) =>
            {
                b.push_str(l);
                b.push('\n');
            }
            // A stray line inside a block: the block is not a certificate.
            (Some(_), _) => block = None,
            (None, _) => {}
        }
    }
    out
}

/// The image's bundle: the first usual path that is a regular file within the size
/// limit, as its certificate blocks; empty when there is none.
fn image_bundle() -> (Option<&'static str>, String) {
    for path in IMAGE_BUNDLES {
        let Ok(meta) = std::fs::metadata(path) else {
            continue;
        };
        if !meta.is_file() || meta.len() > MAX_BUNDLE {
            continue;
        }
        if let Ok(text) = std::fs::read_to_string(path) {
            return (Some(path), certificate_blocks(&text));
        }
    }
    (None, String::new())
}

/// Writes `beige-ca.pem` and `bundle.pem` (mode 0644) into `dir`: the CA of `der`, and
/// the image's bundle with the CA appended. Returns which image bundle was merged.
pub fn install_in(dir: &Path, der: &[u8]) -> std::io::Result<Option<&'static str>> {
    let ca = pem(der);
    let (source, mut bundle) = image_bundle();
    bundle.push_str(&ca);
    atomic_write(&dir.join("beige-ca.pem"), ca.as_bytes(), Some(0o644))?;
    atomic_write(&dir.join("bundle.pem"), bundle.as_bytes(), Some(0o644))?;
    Ok(source)
}

/// The CA of `--egress …,ca=<base64url DER>`.
pub fn decode_flag(value: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(value)
        .ok()
        .filter(|der| !der.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_round_trips_through_the_block_filter() {
        let der: Vec<u8> = (0..200u8).collect();
        let p = pem(&der);
        assert!(
            p.starts_with(BEGIN) && p.ends_with(&format!("{END}\n")),
            "{p}"
        );
        assert!(p.lines().all(|l| l.len() <= 64), "{p}");
        assert_eq!(certificate_blocks(&p), p);
    }

    #[test]
    fn only_certificate_blocks_are_kept() {
        let cert = pem(b"a certificate");
        let text = format!(
            "# a comment\n{cert}-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n\
             {BEGIN}\nnot base64 at all!\n{END}\n{cert}trailing junk"
        );
        assert_eq!(certificate_blocks(&text), format!("{cert}{cert}"));
        assert_eq!(certificate_blocks(""), "");
        // An unterminated block is dropped.
        assert_eq!(certificate_blocks(&format!("{BEGIN}\nAAAA\n")), "");
    }

    #[test]
    fn installs_the_ca_and_a_bundle_that_ends_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let der = b"the beige egress CA".to_vec();
        install_in(dir.path(), &der).unwrap();
        let ca = std::fs::read_to_string(dir.path().join("beige-ca.pem")).unwrap();
        let bundle = std::fs::read_to_string(dir.path().join("bundle.pem")).unwrap();
        assert_eq!(ca, pem(&der));
        assert!(bundle.ends_with(&ca), "{bundle}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("bundle.pem"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o644);
    }

    #[test]
    fn the_flag_value_is_base64url_der() {
        let der = vec![0x30, 0x82, 0xff, 0xfe];
        let flag = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&der);
        assert_eq!(decode_flag(&flag), Some(der));
        assert_eq!(decode_flag("!!"), None);
        assert_eq!(decode_flag(""), None);
    }
}
