//! Finding credential placeholders in bytes a client sends: the detector behind
//! `placeholder_misuse` (spec §5.3).
//!
//! A placeholder is `<prefix>bgph_<base32>`; this module finds every `bgph_<base32>` run
//! in a request line, a header value or the first part of a body, as sent (`raw`) and
//! after the decodings a client might apply on its way out: percent-encoding
//! (`percent`), JSON string escapes (`json`) and base64, standard or URL-safe, at every
//! alignment (`base64`). Whether a candidate is a real placeholder, and whose, is for
//! [`super::placeholder`] to say: this module only finds candidates, and never
//! allocates more than a bounded copy of its input. It needs no feature, so the fuzz
//! targets and the tests can run it without the TLS stack.

use base64::Engine as _;

/// What every placeholder has after its prefix.
pub const MARKER: &[u8] = b"bgph_";

/// Fewest base32 characters after [`MARKER`] that can be a placeholder (a shorter run is
/// never one the gateway minted).
pub const MIN_TOKEN: usize = 32;

/// Most base32 characters after [`MARKER`] that are read as one candidate.
pub const MAX_TOKEN: usize = 256;

/// How much of a request body is scanned (spec: the first 1 MiB).
pub const BODY_SCAN_LIMIT: usize = 1024 * 1024;

/// How a candidate was written when it was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Encoding {
    /// As is.
    Raw,
    /// Percent-encoded (`%62gph_…`).
    Percent,
    /// Inside a JSON string with escapes (`\u0062gph_…`).
    Json,
    /// Base64, standard or URL-safe, at any alignment (as in `Authorization: Basic`).
    Base64,
}

impl Encoding {
    /// Its name in audit records.
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Raw => "raw",
            Encoding::Percent => "percent",
            Encoding::Json => "json",
            Encoding::Base64 => "base64",
        }
    }
}

/// One candidate: the base32 run after [`MARKER`] and how it was written.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Found {
    /// The base32 characters after `bgph_` (lower case, `a-z2-7`).
    pub token: String,
    /// How it was written.
    pub encoding: Encoding,
}

fn is_base32(b: u8) -> bool {
    b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b)
}

/// Every `bgph_<base32>` run of `bytes` as is, in order, without duplicates.
fn raw(bytes: &[u8], encoding: Encoding, out: &mut Vec<Found>) {
    let mut at = 0;
    while let Some(pos) = find(&bytes[at..], MARKER) {
        let start = at + pos + MARKER.len();
        let len = bytes[start..]
            .iter()
            .take(MAX_TOKEN)
            .take_while(|b| is_base32(**b))
            .count();
        if len >= MIN_TOKEN {
            let token = String::from_utf8_lossy(&bytes[start..start + len]).into_owned();
            let found = Found { token, encoding };
            if !out.contains(&found) {
                out.push(found);
            }
        }
        at = start;
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// `bytes` with `%XX` decoded (a malformed escape stays as is); `None` when it has none.
fn percent_decoded(bytes: &[u8]) -> Option<Vec<u8>> {
    if !bytes.contains(&b'%') {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push(hex(h).unwrap_or(0) << 4 | hex(l).unwrap_or(0));
                i += 3;
            }
            (b, ..) => {
                out.push(b);
                i += 1;
            }
        }
    }
    Some(out)
}

/// `bytes` with JSON string escapes decoded (`\uXXXX` for ASCII, `\/`, `\\`, `\"`);
/// `None` when it has no backslash.
fn json_unescaped(bytes: &[u8]) -> Option<Vec<u8>> {
    if !bytes.contains(&b'\\') {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            match bytes.get(i + 1) {
                Some(b'u') if i + 6 <= bytes.len() => {
                    let digits = &bytes[i + 2..i + 6];
                    let value = digits
                        .iter()
                        .try_fold(0u32, |acc, d| hex(*d).map(|v| acc << 4 | u32::from(v)));
                    if let Some(v) = value.filter(|v| *v < 0x80) {
                        out.push(v as u8);
                        i += 6;
                        continue;
                    }
                }
                Some(&c @ (b'/' | b'\\' | b'"')) => {
                    out.push(c);
                    i += 2;
                    continue;
                }
                _ => {}
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    Some(out)
}

fn is_base64(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'-' | b'_')
}

/// The decodings of every base64 run of `bytes` long enough to hold a placeholder, at
/// each of the four starting offsets, in both alphabets.
fn base64_decoded(bytes: &[u8], mut each: impl FnMut(&[u8])) {
    // `bgph_` plus MIN_TOKEN characters is 37 bytes, 48 base64 characters.
    const MIN_RUN: usize = (MARKER.len() + MIN_TOKEN) * 4 / 3;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    // Lenient: no padding needed, stray low bits of the last character allowed (a run
    // read from an offset inside it ends anywhere).
    let config = GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_allow_trailing_bits(true)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent);
    let engines = [
        GeneralPurpose::new(&base64::alphabet::STANDARD, config),
        GeneralPurpose::new(&base64::alphabet::URL_SAFE, config),
    ];
    let mut i = 0;
    while i < bytes.len() {
        if !is_base64(bytes[i]) {
            i += 1;
            continue;
        }
        let len = bytes[i..].iter().take_while(|b| is_base64(**b)).count();
        let run = &bytes[i..i + len];
        i += len;
        if len < MIN_RUN {
            continue;
        }
        for skip in 0..4 {
            let part = &run[skip..];
            // One character past whole quads holds no byte.
            let part = &part[..part.len() - usize::from(part.len() % 4 == 1)];
            for engine in &engines {
                if let Ok(decoded) = engine.decode(part) {
                    each(&decoded);
                }
            }
        }
    }
}

/// Every placeholder candidate in `bytes`, as sent and after each decoding, without
/// duplicates. Bytes past [`BODY_SCAN_LIMIT`] are not looked at.
pub fn scan(bytes: &[u8]) -> Vec<Found> {
    let bytes = &bytes[..bytes.len().min(BODY_SCAN_LIMIT)];
    let mut out = Vec::new();
    raw(bytes, Encoding::Raw, &mut out);
    let percent = percent_decoded(bytes);
    if let Some(decoded) = &percent {
        raw(decoded, Encoding::Percent, &mut out);
    }
    if let Some(decoded) = json_unescaped(bytes) {
        raw(&decoded, Encoding::Json, &mut out);
    }
    base64_decoded(bytes, |d| raw(d, Encoding::Base64, &mut out));
    // A percent-encoded base64 value (`%2B`, `%2F`, `%3D` in a query).
    if let Some(decoded) = &percent {
        base64_decoded(decoded, |d| raw(d, Encoding::Base64, &mut out));
    }
    // One finding per token, the plainest way it was written; a token cut short by a
    // misaligned decoding is a prefix of the whole one and goes.
    out.sort();
    out.dedup_by(|later, first| later.token == first.token);
    let all = out.clone();
    out.retain(|f| {
        !all.iter()
            .any(|g| g.token.len() > f.token.len() && g.token.starts_with(&f.token))
    });
    out
}

/// A body scanned as it streams: it keeps the first [`BODY_SCAN_LIMIT`] bytes, so a token
/// split across chunks is found as if the body came whole.
#[derive(Debug, Default)]
pub struct StreamScanner {
    kept: Vec<u8>,
}

impl StreamScanner {
    /// A scanner with nothing seen yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the next chunk (what is past the limit is ignored).
    pub fn push(&mut self, chunk: &[u8]) {
        let room = BODY_SCAN_LIMIT.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }

    /// Whether the limit is reached (more chunks change nothing).
    pub fn is_full(&self) -> bool {
        self.kept.len() >= BODY_SCAN_LIMIT
    }

    /// The findings of everything pushed.
    pub fn finish(&self) -> Vec<Found> {
        scan(&self.kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "mfrggzdfmztwq2lknnwg23tpobyxe43uov3ho6dzpiytemzu";

    fn tokens(found: &[Found]) -> Vec<(&str, Encoding)> {
        found
            .iter()
            .map(|f| (f.token.as_str(), f.encoding))
            .collect()
    }

    #[test]
    fn finds_a_placeholder_as_sent_and_after_each_decoding() {
        let placeholder = format!("sk-bgph_{TOKEN}");
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let cases: Vec<(String, Encoding)> = vec![
            (
                format!("Authorization: Bearer {placeholder}"),
                Encoding::Raw,
            ),
            (
                format!("GET /v1?key=sk-%62gph%5F{TOKEN} HTTP/1.1"),
                Encoding::Percent,
            ),
            (
                format!(r#"{{"key": "sk-\u0062gph_{TOKEN}"}}"#),
                Encoding::Json,
            ),
            (
                format!("Basic {}", b64(&format!("x:{placeholder}"))),
                Encoding::Base64,
            ),
            (
                format!("Basic {}", b64(&format!("xy:{placeholder}"))),
                Encoding::Base64,
            ),
            (
                format!("Basic {}", b64(&format!("xyz:{placeholder}"))),
                Encoding::Base64,
            ),
            (
                format!(
                    "q={}",
                    base64::engine::general_purpose::URL_SAFE_NO_PAD
                        .encode(format!("?>?{placeholder}"))
                ),
                Encoding::Base64,
            ),
            (
                format!(
                    "a=1&t={}",
                    b64(&format!("u:{placeholder}")).replace('+', "%2B")
                ),
                Encoding::Base64,
            ),
        ];
        for (text, encoding) in cases {
            assert_eq!(
                tokens(&scan(text.as_bytes())),
                [(TOKEN, encoding)],
                "{text}"
            );
        }
    }

    #[test]
    fn ignores_what_is_not_a_placeholder() {
        for text in [
            "no marker at all".to_string(),
            format!("bgph_{}", &TOKEN[..MIN_TOKEN - 1]),
            format!("BGPH_{TOKEN}"),
            format!("bgph-{TOKEN}"),
            String::new(),
        ] {
            assert!(scan(text.as_bytes()).is_empty(), "{text}");
        }
    }

    #[test]
    fn a_body_split_anywhere_gives_the_same_findings() {
        let body = format!(
            r#"{{"a": "bgph_{TOKEN}", "b": "{}"}}"#,
            base64::engine::general_purpose::STANDARD.encode(format!("::bgph_{TOKEN}x"))
        );
        let whole = scan(body.as_bytes());
        assert_eq!(whole.len(), 1);
        for split in 0..body.len() {
            let mut s = StreamScanner::new();
            s.push(&body.as_bytes()[..split]);
            s.push(&body.as_bytes()[split..]);
            assert_eq!(s.finish(), whole, "split at {split}");
        }
    }

    #[test]
    fn stops_at_the_body_limit() {
        let mut s = StreamScanner::new();
        s.push(&vec![b'x'; BODY_SCAN_LIMIT]);
        assert!(s.is_full());
        s.push(format!("bgph_{TOKEN}").as_bytes());
        assert!(s.finish().is_empty());
    }
}
