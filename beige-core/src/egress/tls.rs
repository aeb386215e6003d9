//! The SNI peek: reading the server name out of a client's TLS ClientHello without a TLS
//! library (spec `egress.md` §5.2).
//!
//! A tunnelled stream is spliced, not decrypted, so before the first upstream byte the
//! gateway looks at what the client sent: with `sni: required` the ClientHello must name
//! the host the stream was opened for, else it is refused as `not_tls` or `sni_missing`.
//! [`client_hello_sni`] reassembles the ClientHello from however many handshake records
//! carry it (at most [`MAX_HELLO`] bytes of them), checks every length it walks through
//! (this is hostile input), and returns the `host_name` of the `server_name` extension.
//! It never allocates more than [`MAX_HELLO`] bytes and never panics.

/// Most bytes of TLS records (headers included) that may carry the ClientHello. A caller
/// never needs to buffer more: at this length the answer is never "need more bytes".
pub const MAX_HELLO: usize = 16 * 1024;

/// Largest plaintext record body TLS allows (2^14 bytes, RFC 8446 §5.1).
const MAX_RECORD: usize = 16 * 1024;
/// The record content type of handshake messages.
const HANDSHAKE: u8 = 22;
/// The handshake message type of a ClientHello.
const CLIENT_HELLO: u8 = 1;
/// The extension type of `server_name` (RFC 6066 §3).
const SERVER_NAME: u16 = 0;
/// The `NameType` of a DNS host name in a `server_name` list.
const HOST_NAME: u8 = 0;
/// Longest server name accepted (a DNS name is at most 253 bytes).
const MAX_NAME: usize = 255;

/// What a complete ClientHello says about the server it wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// The `host_name` of the `server_name` extension, lower-cased ASCII of letters,
    /// digits, `-`, `_` and `.` (any trailing dot kept; normalising is the target module's
    /// work).
    Sni(String),
    /// A well-formed ClientHello without a `server_name` extension, or whose extension
    /// holds no `host_name`.
    NoSni,
}

/// Why the bytes are refused as a ClientHello.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HelloError {
    /// The first record is not a TLS handshake record (`not_tls`): plain HTTP, SSLv2, or
    /// anything else.
    #[error("not a TLS handshake")]
    NotTls,
    /// A TLS handshake whose records or ClientHello do not add up.
    #[error("malformed TLS ClientHello: {0}")]
    Malformed(&'static str),
    /// The ClientHello does not fit in [`MAX_HELLO`] bytes of records.
    #[error("the TLS ClientHello is larger than {} bytes", MAX_HELLO)]
    TooLarge,
}

/// Reads the ClientHello at the start of `buf`, the bytes a client sent on a tunnel.
///
/// Returns `Ok(None)` while more bytes are needed (only possible while `buf` is shorter
/// than [`MAX_HELLO`]); call again with the whole buffer once more have arrived. The
/// ClientHello may be split across any number of handshake records; bytes after it are
/// ignored, and so is everything past [`MAX_HELLO`]. A prefix of the input never gives an
/// answer other than `Ok(None)` or the answer for the whole input.
pub fn client_hello_sni(buf: &[u8]) -> Result<Option<Hello>, HelloError> {
    let window = &buf[..buf.len().min(MAX_HELLO)];
    // The handshake bytes reassembled so far; never longer than `window`.
    let mut hs: Vec<u8> = Vec::new();
    // The length of the ClientHello message (header included), once its header is in.
    let mut need: Option<usize> = None;
    let mut pos = 0usize;
    while pos < window.len() {
        let rest = &window[pos..];
        let first = pos == 0;
        let not_record = |what: &'static str| {
            if first {
                HelloError::NotTls
            } else {
                HelloError::Malformed(what)
            }
        };
        if rest.first() != Some(&HANDSHAKE) {
            return Err(not_record(
                "a record that is not a handshake inside the ClientHello",
            ));
        }
        if rest.get(1).is_some_and(|&major| major != 3)
            || rest.get(2).is_some_and(|&minor| !(1..=4).contains(&minor))
        {
            return Err(not_record(
                "a record with a version other than TLS 1.0 to 1.3",
            ));
        }
        let (Some(&hi), Some(&lo)) = (rest.get(3), rest.get(4)) else {
            break;
        };
        let len = usize::from(u16::from_be_bytes([hi, lo]));
        if len == 0 {
            return Err(HelloError::Malformed("an empty handshake record"));
        }
        if len > MAX_RECORD {
            return Err(HelloError::Malformed("a record longer than 16 KiB"));
        }
        let fragment = rest.get(5..rest.len().min(5 + len)).unwrap_or_default();
        hs.extend_from_slice(fragment);

        if need.is_none() && hs.len() >= 4 {
            if hs[0] != CLIENT_HELLO {
                return Err(HelloError::Malformed(
                    "the first handshake message is not a ClientHello",
                ));
            }
            need =
                Some(4 + (usize::from(hs[1]) << 16 | usize::from(hs[2]) << 8 | usize::from(hs[3])));
        }
        if let Some(need) = need {
            // The fewest record bytes that could still carry the rest of the message: this
            // bound only grows as bytes arrive, so a prefix and the whole input agree.
            let raw_end = pos + 5 + fragment.len();
            if raw_end + need.saturating_sub(hs.len()) > MAX_HELLO {
                return Err(HelloError::TooLarge);
            }
            if let Some(message) = hs.get(4..need) {
                return parse_client_hello(message).map(Some);
            }
        }
        if fragment.len() < len {
            break; // the record is still arriving
        }
        pos += 5 + len;
    }
    if buf.len() >= MAX_HELLO {
        Err(HelloError::TooLarge)
    } else {
        Ok(None)
    }
}

/// A bounds-checked cursor over hostile bytes.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], HelloError> {
        if n > self.0.len() {
            return Err(HelloError::Malformed(what));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, HelloError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, HelloError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Walks the ClientHello body (after the 4-byte handshake header), RFC 8446 §4.1.2.
fn parse_client_hello(body: &[u8]) -> Result<Hello, HelloError> {
    const SHORT: &str = "the ClientHello is truncated";
    let mut r = Reader(body);
    let version = r.u16(SHORT)?;
    if version >> 8 != 3 {
        return Err(HelloError::Malformed("legacy_version is not 3.x"));
    }
    r.take(32, SHORT)?; // random
    let session_id = usize::from(r.u8(SHORT)?);
    if session_id > 32 {
        return Err(HelloError::Malformed("a session id longer than 32 bytes"));
    }
    r.take(session_id, SHORT)?;
    let suites = usize::from(r.u16(SHORT)?);
    if suites == 0 || suites % 2 != 0 {
        return Err(HelloError::Malformed("a bad cipher_suites length"));
    }
    r.take(suites, SHORT)?;
    let compression = usize::from(r.u8(SHORT)?);
    if compression == 0 {
        return Err(HelloError::Malformed("no compression methods"));
    }
    r.take(compression, SHORT)?;
    if r.is_empty() {
        return Ok(Hello::NoSni); // a ClientHello without extensions (TLS 1.0 to 1.2)
    }
    let ext_len = usize::from(r.u16(SHORT)?);
    let mut exts = Reader(r.take(ext_len, "the extensions overrun the ClientHello")?);
    if !r.is_empty() {
        return Err(HelloError::Malformed("bytes after the extensions"));
    }
    let mut found: Option<Hello> = None;
    while !exts.is_empty() {
        const EXT: &str = "an extension overruns the extensions";
        let kind = exts.u16(EXT)?;
        let len = usize::from(exts.u16(EXT)?);
        let data = exts.take(len, EXT)?;
        if kind == SERVER_NAME {
            if found.is_some() {
                return Err(HelloError::Malformed("two server_name extensions"));
            }
            found = Some(parse_server_name(data)?);
        }
    }
    Ok(found.unwrap_or(Hello::NoSni))
}

/// Reads a `server_name` extension's `ServerNameList` (RFC 6066 §3).
fn parse_server_name(data: &[u8]) -> Result<Hello, HelloError> {
    const SHORT: &str = "the server_name list is truncated";
    let mut r = Reader(data);
    let list_len = usize::from(r.u16(SHORT)?);
    let mut list = Reader(r.take(list_len, SHORT)?);
    if !r.is_empty() {
        return Err(HelloError::Malformed("bytes after the server_name list"));
    }
    if list.is_empty() {
        return Err(HelloError::Malformed("an empty server_name list"));
    }
    let mut host: Option<String> = None;
    while !list.is_empty() {
        let kind = list.u8(SHORT)?;
        let len = usize::from(list.u16(SHORT)?);
        let name = list.take(len, SHORT)?;
        if kind != HOST_NAME {
            continue; // no other name type is defined; skip it as opaque
        }
        if host.is_some() {
            return Err(HelloError::Malformed("two host names in server_name"));
        }
        if name.is_empty() || name.len() > MAX_NAME {
            return Err(HelloError::Malformed(
                "a server name that is empty or longer than 255 bytes",
            ));
        }
        if !name
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        {
            return Err(HelloError::Malformed(
                "a server name with a byte other than a letter, digit, '-', '_' or '.'",
            ));
        }
        // All ASCII, so one char per byte.
        host = Some(
            name.iter()
                .map(|b| char::from(b.to_ascii_lowercase()))
                .collect(),
        );
    }
    Ok(host.map_or(Hello::NoSni, Hello::Sni))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn be16(n: usize) -> [u8; 2] {
        u16::try_from(n).unwrap().to_be_bytes()
    }

    fn ext(kind: u16, data: &[u8]) -> Vec<u8> {
        let mut e = kind.to_be_bytes().to_vec();
        e.extend_from_slice(&be16(data.len()));
        e.extend_from_slice(data);
        e
    }

    /// A `server_name` extension with these (name type, name) entries.
    fn sni_ext(entries: &[(u8, &[u8])]) -> Vec<u8> {
        let mut list = Vec::new();
        for (kind, name) in entries {
            list.push(*kind);
            list.extend_from_slice(&be16(name.len()));
            list.extend_from_slice(name);
        }
        let mut data = be16(list.len()).to_vec();
        data.extend_from_slice(&list);
        ext(SERVER_NAME, &data)
    }

    /// The extensions a current browser or curl sends, with `sni` (if any) among them.
    fn realistic_exts(sni: Option<&str>) -> Vec<Vec<u8>> {
        let mut exts = vec![
            ext(0x0a0a, &[]),                               // GREASE
            ext(0xff01, &[0]),                              // renegotiation_info
            ext(23, &[]),                                   // extended_master_secret
            ext(10, &[0, 6, 0x11, 0xec, 0, 0x1d, 0, 0x17]), // supported_groups
            ext(11, &[1, 0]),                               // ec_point_formats
        ];
        if let Some(name) = sni {
            exts.push(sni_ext(&[(HOST_NAME, name.as_bytes())]));
        }
        exts.push(ext(35, &[])); // session_ticket
        exts.push(ext(16, b"\x00\x0c\x02h2\x08http/1.1")); // ALPN
        exts.push(ext(13, &[0, 8, 4, 3, 8, 4, 4, 1, 5, 3])); // signature_algorithms
        let mut key_share = vec![0, 36, 0, 0x1d, 0, 32];
        key_share.extend_from_slice(&[0x5a; 32]);
        exts.push(ext(51, &key_share)); // key_share (x25519)
        exts.push(ext(45, &[1, 1])); // psk_key_exchange_modes
        exts.push(ext(43, &[4, 3, 4, 3, 3])); // supported_versions
        exts.push(ext(21, &[0; 40])); // padding
        exts
    }

    /// A ClientHello handshake message (header included) with these extensions, or none
    /// at all when `exts` is `None`.
    fn hello_msg(exts: Option<&[Vec<u8>]>) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend_from_slice(&[0x11; 32]); // random
        body.push(32);
        body.extend_from_slice(&[0x22; 32]); // session id
        let suites = [0x13, 0x01, 0x13, 0x02, 0x13, 0x03, 0xc0, 0x2b, 0xc0, 0x2f];
        body.extend_from_slice(&be16(suites.len()));
        body.extend_from_slice(&suites);
        body.extend_from_slice(&[1, 0]); // compression: null
        if let Some(exts) = exts {
            let all: Vec<u8> = exts.concat();
            body.extend_from_slice(&be16(all.len()));
            body.extend_from_slice(&all);
        }
        let n = body.len();
        let mut msg = vec![CLIENT_HELLO, (n >> 16) as u8, (n >> 8) as u8, n as u8];
        msg.extend_from_slice(&body);
        msg
    }

    /// `hs` in handshake records cut at these offsets (the first record says TLS 1.0, the
    /// rest TLS 1.2, as clients do).
    fn records(hs: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut cuts: Vec<usize> = cuts
            .iter()
            .copied()
            .filter(|&c| c > 0 && c < hs.len())
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        cuts.push(hs.len());
        let mut out = Vec::new();
        let mut start = 0;
        for end in cuts {
            let minor = if start == 0 { 1 } else { 3 };
            out.extend_from_slice(&[HANDSHAKE, 3, minor]);
            out.extend_from_slice(&be16(end - start));
            out.extend_from_slice(&hs[start..end]);
            start = end;
        }
        out
    }

    fn sni(name: &str) -> Result<Option<Hello>, HelloError> {
        Ok(Some(Hello::Sni(name.into())))
    }

    #[test]
    fn single_record() {
        let msg = hello_msg(Some(&realistic_exts(Some("API.Example.Test"))));
        let input = records(&msg, &[]);
        assert_eq!(client_hello_sni(&input), sni("api.example.test"));
        // Bytes after the ClientHello (the client's next flight, garbage) are ignored.
        let mut more = input.clone();
        more.extend_from_slice(b"\x14\x03\x03\x00\x01\x01garbage");
        assert_eq!(client_hello_sni(&more), sni("api.example.test"));
        // So is another handshake message after it in the same record.
        let mut two = msg.clone();
        two.extend_from_slice(&[2, 0, 0, 1, 0]);
        assert_eq!(
            client_hello_sni(&records(&two, &[])),
            sni("api.example.test")
        );
    }

    #[test]
    fn no_sni() {
        let msg = hello_msg(Some(&realistic_exts(None)));
        assert_eq!(
            client_hello_sni(&records(&msg, &[])),
            Ok(Some(Hello::NoSni))
        );
        let msg = hello_msg(None);
        assert_eq!(
            client_hello_sni(&records(&msg, &[])),
            Ok(Some(Hello::NoSni))
        );
        let msg = hello_msg(Some(&[]));
        assert_eq!(
            client_hello_sni(&records(&msg, &[])),
            Ok(Some(Hello::NoSni))
        );
        // A server_name list with only an unknown name type has no host name.
        let msg = hello_msg(Some(&[sni_ext(&[(7, b"opaque")])]));
        assert_eq!(
            client_hello_sni(&records(&msg, &[])),
            Ok(Some(Hello::NoSni))
        );
        let msg = hello_msg(Some(&[sni_ext(&[(7, b"x"), (HOST_NAME, b"a.test")])]));
        assert_eq!(client_hello_sni(&records(&msg, &[])), sni("a.test"));
    }

    #[test]
    fn split_records_and_every_truncation() {
        let msg = hello_msg(Some(&realistic_exts(Some("api.example.test"))));
        let mut splits: Vec<Vec<usize>> = vec![vec![]];
        for at in 1..msg.len() {
            splits.push(vec![at]);
        }
        splits.push((1..msg.len()).collect()); // one byte per record
        splits.push(vec![1, 2, 3, 4, 5, 40, 77, 78, 200]);
        splits.push(vec![3, msg.len() - 1]);
        for cuts in &splits {
            let input = records(&msg, cuts);
            assert_eq!(
                client_hello_sni(&input),
                sni("api.example.test"),
                "{cuts:?}"
            );
            if cuts.len() <= 1 || cuts.len() > 100 {
                for n in 0..input.len() {
                    assert_eq!(client_hello_sni(&input[..n]), Ok(None), "{cuts:?} at {n}");
                }
            }
        }
    }

    #[test]
    fn not_tls() {
        for input in [
            &b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"[..],
            b"G",
            b"CONNECT a:443 HTTP/1.1\r\n\r\n",
            b"\x80\x2e\x01\x03\x01", // SSLv2-compatible hello
            b"\x17\x03\x03\x00\x10", // application data
            b"\x15\x03\x03\x00\x02", // alert
            b"\x16\x02",
            b"\x16\x03\x00\x00\x30", // SSL 3.0 record
            b"\x16\x03\x05",
            b"SSH-2.0-OpenSSH_9.6\r\n",
        ] {
            assert_eq!(
                client_hello_sni(input),
                Err(HelloError::NotTls),
                "{input:?}"
            );
        }
        assert_eq!(client_hello_sni(b""), Ok(None));
        assert_eq!(client_hello_sni(b"\x16"), Ok(None));
        assert_eq!(client_hello_sni(b"\x16\x03\x04\x00"), Ok(None));
    }

    fn malformed(input: &[u8]) -> &'static str {
        match client_hello_sni(input) {
            Err(HelloError::Malformed(why)) => why,
            other => panic!("{input:?}: {other:?}"),
        }
    }

    /// `msg` with its 3-byte handshake length fixed up after editing the body.
    fn fix_len(mut msg: Vec<u8>) -> Vec<u8> {
        let n = msg.len() - 4;
        msg[1..4].copy_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8]);
        msg
    }

    #[test]
    fn malformed_hellos() {
        let good = hello_msg(Some(&realistic_exts(Some("a.test"))));
        assert!(malformed(b"\x16\x03\x01\x00\x00").contains("empty"));
        assert!(malformed(b"\x16\x03\x01\x40\x01").contains("longer"));
        let mut alert_inside = records(&good[..10], &[]);
        alert_inside.extend_from_slice(b"\x15\x03\x03\x00\x02\x02\x28");
        assert!(malformed(&alert_inside).contains("not a handshake"));
        let mut bad_version = records(&good[..10], &[]);
        bad_version.extend_from_slice(b"\x16\x02\x03");
        assert!(malformed(&bad_version).contains("version"));
        let mut server_hello = good.clone();
        server_hello[0] = 2;
        assert!(malformed(&records(&server_hello, &[])).contains("not a ClientHello"));
        let mut v = good.clone();
        v[4] = 2;
        assert!(malformed(&records(&v, &[])).contains("legacy_version"));
        let mut sid = good.clone();
        sid[4 + 2 + 32] = 33;
        assert!(malformed(&records(&sid, &[])).contains("session id"));
        let mut suites = good.clone();
        suites[4 + 2 + 32 + 1 + 32 + 1] = 9;
        assert!(malformed(&records(&suites, &[])).contains("cipher_suites"));
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(malformed(&records(&fix_len(trailing), &[])).contains("after the extensions"));
        let mut short = good.clone();
        short.pop();
        assert!(malformed(&records(&fix_len(short), &[])).contains("overrun"));

        let cases: &[(&[Vec<u8>], &str)] = &[
            (
                &[
                    sni_ext(&[(HOST_NAME, b"a.test")]),
                    sni_ext(&[(HOST_NAME, b"b.test")]),
                ],
                "two server_name",
            ),
            (
                &[sni_ext(&[(HOST_NAME, b"a.test"), (HOST_NAME, b"b.test")])],
                "two host names",
            ),
            (
                &[sni_ext(&[(HOST_NAME, b"a\0.test")])],
                "a server name with",
            ),
            (
                &[sni_ext(&[(HOST_NAME, b"a.test:443")])],
                "a server name with",
            ),
            (
                &[sni_ext(&[(HOST_NAME, "bücher.test".as_bytes())])],
                "a server name with",
            ),
            (&[sni_ext(&[(HOST_NAME, b"")])], "empty or longer"),
            (&[sni_ext(&[(HOST_NAME, &[b'a'; 256])])], "empty or longer"),
            (&[sni_ext(&[])], "an empty server_name list"),
            (&[ext(SERVER_NAME, &[])], "truncated"),
            (&[ext(SERVER_NAME, &[0, 9, 0, 0, 1, b'a'])], "truncated"),
            (
                &[ext(SERVER_NAME, &[0, 4, 0, 0, 1, b'a', 0])],
                "after the server_name list",
            ),
            (&[ext(SERVER_NAME, &[0, 4, 0, 0, 2, b'a'])], "truncated"),
        ];
        for (exts, want) in cases {
            let msg = hello_msg(Some(exts));
            let why = malformed(&records(&msg, &[7]));
            assert!(why.contains(want), "{want}: {why}");
        }
        // A 255-byte name is accepted.
        let msg = hello_msg(Some(&[sni_ext(&[(HOST_NAME, &[b'A'; 255])])]));
        assert_eq!(client_hello_sni(&records(&msg, &[])), sni(&"a".repeat(255)));
    }

    #[test]
    fn too_large() {
        // A header announcing more than fits is refused at once.
        assert_eq!(
            client_hello_sni(b"\x16\x03\x01\x00\x04\x01\x00\x40\x00"),
            Err(HelloError::TooLarge)
        );
        // The largest message one record can carry within the limit is read.
        let mut exts = realistic_exts(Some("a.test"));
        let base = hello_msg(Some(&exts)).len();
        let pad = MAX_HELLO - 5 - base - 4;
        exts.push(ext(21, &vec![0; pad]));
        let msg = hello_msg(Some(&exts));
        let input = records(&msg, &[]);
        assert_eq!(input.len(), MAX_HELLO);
        assert_eq!(client_hello_sni(&input), sni("a.test"));
        // Split once more, its record headers push it over.
        assert_eq!(
            client_hello_sni(&records(&msg, &[100])),
            Err(HelloError::TooLarge)
        );
        // Tiny records: 6 bytes per handshake byte exhaust the limit quickly.
        let small = hello_msg(Some(&realistic_exts(Some("a.test"))));
        let mut per_byte = records(&small, &(1..small.len()).collect::<Vec<_>>());
        assert!(per_byte.len() < MAX_HELLO);
        assert_eq!(client_hello_sni(&per_byte), sni("a.test"));
        let big = hello_msg(Some(&[
            ext(21, &[0; 3000]),
            sni_ext(&[(HOST_NAME, b"a.test")]),
        ]));
        per_byte = records(&big, &(1..big.len()).collect::<Vec<_>>());
        assert_eq!(client_hello_sni(&per_byte), Err(HelloError::TooLarge));
        // Records that cannot finish a message within the limit are refused once that is
        // certain, not left asking for more.
        let mut endless = records(&small[..4], &[]);
        endless[6..9].copy_from_slice(&[0, 0x30, 0]); // announce 12 KiB
        while endless.len() < MAX_HELLO + 10 {
            endless.extend_from_slice(&[HANDSHAKE, 3, 3, 0, 1, 0]);
        }
        assert_eq!(client_hello_sni(&endless[..100]), Ok(None));
        assert_eq!(client_hello_sni(&endless), Err(HelloError::TooLarge));
        // A message whose last record would end just past the limit: "need more" one byte
        // short of the limit, too large at it.
        let mut exts = realistic_exts(Some("a.test"));
        exts.push(ext(21, &vec![0; MAX_HELLO - 6 - base - 4]));
        let msg = hello_msg(Some(&exts));
        assert_eq!(msg.len(), MAX_HELLO - 6);
        let input = records(&msg, &[msg.len() - 1]);
        assert_eq!(input.len(), MAX_HELLO + 4);
        assert_eq!(client_hello_sni(&input[..MAX_HELLO - 1]), Ok(None));
        assert_eq!(
            client_hello_sni(&input[..MAX_HELLO]),
            Err(HelloError::TooLarge)
        );
        assert_eq!(client_hello_sni(&input), Err(HelloError::TooLarge));
    }

    /// xorshift64*: a fixed-seed source for the mutation test.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    #[test]
    fn fuzz_style_mutations() {
        let msgs = [
            hello_msg(Some(&realistic_exts(Some("api.example.test")))),
            hello_msg(Some(&realistic_exts(None))),
            hello_msg(None),
        ];
        let mut rng = Rng(0xD1B5_4A32_D192_ED03);
        let mut outcomes = [0usize; 5];
        for round in 0..4000 {
            let msg = &msgs[round % msgs.len()];
            let cuts: Vec<usize> = (0..rng.below(4)).map(|_| rng.below(msg.len())).collect();
            let valid = records(msg, &cuts);
            let want_valid = client_hello_sni(&valid);
            assert!(matches!(want_valid, Ok(Some(_))), "{cuts:?}");
            let mut m = valid.clone();
            for _ in 0..=rng.below(3) {
                let at = rng.below(m.len() + 1);
                match rng.below(5) {
                    0 | 1 if at < m.len() => m[at] = rng.next() as u8,
                    2 if at < m.len() => m[at] ^= 1 << rng.below(8),
                    3 if at < m.len() => {
                        m.remove(at);
                    }
                    _ => m.insert(at, rng.next() as u8),
                }
            }
            let full = client_hello_sni(&m);
            outcomes[match &full {
                Ok(None) => 0,
                Ok(Some(Hello::Sni(_))) => 1,
                Ok(Some(Hello::NoSni)) => 2,
                Err(HelloError::Malformed(_)) => 3,
                Err(_) => 4,
            }] += 1;
            if let Ok(Some(Hello::Sni(name))) = &full {
                assert!(name
                    .bytes()
                    .all(|b| !b.is_ascii_uppercase() && b.is_ascii_graphic()));
            }
            // Every prefix gives "need more" or the whole input's answer; so does every
            // prefix of the unmutated input, which never names another host.
            let mut lens: Vec<usize> = (0..24).map(|_| rng.below(m.len() + 1)).collect();
            lens.extend([0, 1, 5, 6, m.len().saturating_sub(1)]);
            for n in lens {
                let n = n.min(m.len());
                let r = client_hello_sni(&m[..n]);
                assert!(r == Ok(None) || r == full, "prefix {n}: {r:?} vs {full:?}");
                let n = n.min(valid.len());
                let r = client_hello_sni(&valid[..n]);
                assert!(r == Ok(None) || r == want_valid, "valid prefix {n}: {r:?}");
            }
            // Whatever follows a complete answer does not change it.
            if full.as_ref().is_ok_and(Option::is_some) {
                let mut longer = m.clone();
                longer.extend_from_slice(&[0xff; 7]);
                assert_eq!(client_hello_sni(&longer), full);
            }
        }
        // The mutations reach every kind of answer.
        assert!(outcomes.iter().all(|&n| n > 0), "{outcomes:?}");
    }
}
