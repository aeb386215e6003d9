//! Egress end to end with real clients in the Debian sandbox: `pip download` from a
//! loopback package index, Node's `fetch` (which ignores the proxy variables, so it takes
//! the transparent path) and a WebSocket echo, each to an allowed host and to a host no
//! rule allows, each with its audit records.
//!
//! Loopback only: the resolver maps the test names to the public-looking `11.0.0.2`, and
//! the dialer maps `11.0.0.2:443` to one TLS upstream on `127.0.0.1:0` and refuses (and
//! records) any other address.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use beige_core::egress::upstream::{BoxUpstream, Dialer};
use beige_core::GatewayBuilder;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::egress_support::{egress_records, exec, records_for, TestResolver, IMAGE};
use super::support::TestHome;
use crate::docker_or_skip;

/// The package index.
const PYPI: &str = "pypi.example.test";
/// A plain HTTPS API for Node's `fetch`.
const FETCH: &str = "fetch.example.test";
/// The WebSocket echo server.
const WS: &str = "ws.example.test";
/// What the resolver answers for all three; the dialer maps it to the upstream.
const UPSTREAM_IP: &str = "11.0.0.2";
const PKG: &str = "beigepkg";
const WHEEL: &str = "beigepkg-1.0-py3-none-any.whl";
const PKG_VALUE: &str = "fetched through the gateway";
/// The binary frame the WebSocket client sends: over 64 KiB, so it takes the 64-bit
/// length form, and several relay buffers long.
const WS_BINARY_LEN: usize = 1024 * 1024;

/// Dials `11.0.0.2:443` on the upstream's loopback port; records every other address
/// and refuses it.
#[derive(Debug)]
struct ClientsDialer {
    upstream: SocketAddr,
    unexpected: Mutex<Vec<SocketAddr>>,
}

#[async_trait]
impl Dialer for ClientsDialer {
    async fn dial(&self, addr: SocketAddr) -> std::io::Result<BoxUpstream> {
        if addr != SocketAddr::new(UPSTREAM_IP.parse().unwrap(), 443) {
            self.unexpected.lock().unwrap().push(addr);
            return Err(std::io::Error::other(
                "the test dialer refuses this address",
            ));
        }
        Ok(Box::pin(
            tokio::net::TcpStream::connect(self.upstream).await?,
        ))
    }
}

/// What the upstream saw.
#[derive(Default)]
struct Seen {
    /// `(sni, request line)` of every request.
    requests: Vec<(String, String)>,
    /// `(opcode, payload length)` of every data frame the WebSocket echo got.
    frames: Vec<(u8, usize)>,
}

struct ClientsUpstream {
    addr: SocketAddr,
    ca_pem: String,
    wheel_sha256: String,
    seen: Arc<Mutex<Seen>>,
}

/// One TLS server on `127.0.0.1:0` for [`PYPI`], [`FETCH`] and [`WS`]: a PEP 503 simple
/// index with one wheel, a fixed body for anything else, and a WebSocket echo for a
/// request with `Upgrade: websocket`.
async fn clients_upstream() -> ClientsUpstream {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "beige egress clients test CA");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf =
        rcgen::CertificateParams::new(vec![PYPI.to_string(), FETCH.to_string(), WS.to_string()])
            .unwrap()
            .signed_by(&leaf_key, &issuer)
            .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();

    let wheel = Arc::new(wheel());
    let wheel_sha256 = hex::encode(Sha256::digest(wheel.as_slice()));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (seen2, sha) = (seen.clone(), wheel_sha256.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, seen, wheel, sha) =
                (acceptor.clone(), seen2.clone(), wheel.clone(), sha.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let sni = tls.get_ref().1.server_name().unwrap_or("").to_string();
                let Some((head, rest)) = read_head(&mut tls).await else {
                    return;
                };
                let line = head.lines().next().unwrap_or("").to_string();
                seen.lock().unwrap().requests.push((sni, line.clone()));
                if let Some(key) = header(&head, "sec-websocket-key") {
                    let upgrade = header(&head, "upgrade").unwrap_or_default();
                    if upgrade.eq_ignore_ascii_case("websocket") {
                        let answer = format!(
                            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                             Connection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n\r\n",
                            websocket_accept(&key)
                        );
                        if tls.write_all(answer.as_bytes()).await.is_ok() {
                            echo_frames(&mut tls, rest, &seen).await;
                        }
                        return;
                    }
                }
                let path = line.split(' ').nth(1).unwrap_or("/");
                let (status, kind, body) = match path {
                    "/simple/" => (
                        "200 OK",
                        "text/html",
                        format!("<!DOCTYPE html><html><body><a href=\"/simple/{PKG}/\">{PKG}</a></body></html>\n")
                            .into_bytes(),
                    ),
                    p if p == format!("/simple/{PKG}/") => (
                        "200 OK",
                        "text/html",
                        format!(
                            "<!DOCTYPE html><html><body>\
                             <a href=\"/files/{WHEEL}#sha256={sha}\">{WHEEL}</a></body></html>\n"
                        )
                        .into_bytes(),
                    ),
                    p if p == format!("/files/{WHEEL}") => {
                        ("200 OK", "application/octet-stream", wheel.to_vec())
                    }
                    p if p.starts_with("/simple/") => {
                        ("404 Not Found", "text/plain", b"no such project\n".to_vec())
                    }
                    _ => ("200 OK", "text/plain", b"hello from the upstream\n".to_vec()),
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n",
                    body.len()
                );
                let _ = tls.write_all(head.as_bytes()).await;
                let _ = tls.write_all(&body).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    ClientsUpstream {
        addr,
        ca_pem: ca.pem(),
        wheel_sha256,
        seen,
    }
}

/// A request head (at most 64 KiB) and the bytes that came after it.
async fn read_head<S: AsyncRead + Unpin>(s: &mut S) -> Option<(String, Vec<u8>)> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).into_owned();
            return Some((head, got[end + 4..].to_vec()));
        }
        if got.len() > 64 * 1024 {
            return None;
        }
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

fn header(head: &str, name: &str) -> Option<String> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
    })
}

/// Echoes the client's (masked) data frames back unmasked until a close frame, which it
/// answers. Single-frame messages only, which is what the test client sends.
async fn echo_frames<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    rest: Vec<u8>,
    seen: &Mutex<Seen>,
) {
    let mut buf = rest;
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        // Parse one complete frame from `buf`, reading more as needed.
        let frame = loop {
            if let Some((consumed, opcode, payload)) = parse_frame(&buf) {
                buf.drain(..consumed);
                break Some((opcode, payload));
            }
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => break None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let Some((opcode, payload)) = frame else {
            return;
        };
        match opcode {
            0x8 => {
                let _ = s.write_all(&frame_bytes(0x8, &payload)).await;
                let _ = s.shutdown().await;
                return;
            }
            0x9 => {
                let _ = s.write_all(&frame_bytes(0xA, &payload)).await;
            }
            0x1 | 0x2 => {
                seen.lock().unwrap().frames.push((opcode, payload.len()));
                if s.write_all(&frame_bytes(opcode, &payload)).await.is_err() {
                    return;
                }
            }
            _ => {}
        }
    }
}

/// `(bytes consumed, opcode, unmasked payload)` of the first frame in `b`, if complete.
fn parse_frame(b: &[u8]) -> Option<(usize, u8, Vec<u8>)> {
    if b.len() < 2 {
        return None;
    }
    let opcode = b[0] & 0x0f;
    let masked = b[1] & 0x80 != 0;
    let (len, mut at) = match b[1] & 0x7f {
        126 if b.len() >= 4 => (u16::from_be_bytes([b[2], b[3]]) as usize, 4),
        127 if b.len() >= 10 => (
            u64::from_be_bytes(b[2..10].try_into().unwrap()) as usize,
            10,
        ),
        126 | 127 => return None,
        n => (n as usize, 2),
    };
    let mask = if masked {
        let m: [u8; 4] = b.get(at..at + 4)?.try_into().unwrap();
        at += 4;
        Some(m)
    } else {
        None
    };
    let mut payload = b.get(at..at + len)?.to_vec();
    if let Some(m) = mask {
        for (i, byte) in payload.iter_mut().enumerate() {
            *byte ^= m[i % 4];
        }
    }
    Some((at + len, opcode, payload))
}

/// An unmasked, final server frame.
fn frame_bytes(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => out.push(n as u8),
        n if n <= 0xffff => {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
    out
}

/// `Sec-WebSocket-Accept` for a key (RFC 6455 §4.2.2).
fn websocket_accept(key: &str) -> String {
    let digest = sha1(format!("{key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11").as_bytes());
    base64::engine::general_purpose::STANDARD.encode(digest)
}

/// SHA-1 (FIPS 180-4), only for the WebSocket handshake: no SHA-1 crate is in the tree.
fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for block in msg.chunks(64) {
        let mut w = [0u32; 80];
        for (i, word) in block.chunks(4).enumerate() {
            w[i] = u32::from_be_bytes(word.try_into().unwrap());
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A827999),
                20..=39 => (b ^ c ^ d, 0x6ED9EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1BBCDC),
                _ => (b ^ c ^ d, 0xCA62C1D6),
            };
            let t = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(*wi);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = t;
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 20];
    for (i, x) in h.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&x.to_be_bytes());
    }
    out
}

/// A minimal pure-Python wheel for [`PKG`] 1.0: a stored (uncompressed) zip with the
/// module, `METADATA`, `WHEEL` and a `RECORD` with each file's hash.
fn wheel() -> Vec<u8> {
    let b64 = |d: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(d);
    let info = format!("{PKG}-1.0.dist-info");
    let mut files: Vec<(String, Vec<u8>)> = vec![
        (
            format!("{PKG}/__init__.py"),
            format!("VALUE = {PKG_VALUE:?}\n").into_bytes(),
        ),
        (
            format!("{info}/METADATA"),
            format!("Metadata-Version: 2.1\nName: {PKG}\nVersion: 1.0\nSummary: beige egress test package\n")
                .into_bytes(),
        ),
        (
            format!("{info}/WHEEL"),
            b"Wheel-Version: 1.0\nGenerator: beige-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
                .to_vec(),
        ),
    ];
    let mut record = String::new();
    for (name, data) in &files {
        record.push_str(&format!(
            "{name},sha256={},{}\n",
            b64(&Sha256::digest(data)),
            data.len()
        ));
    }
    record.push_str(&format!("{info}/RECORD,,\n"));
    files.push((format!("{info}/RECORD"), record.into_bytes()));
    zip_stored(&files)
}

/// A zip archive with every file stored, dated 1980-01-01.
fn zip_stored(files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data) in files {
        let crc = crc32(data).to_le_bytes();
        let size = (data.len() as u32).to_le_bytes();
        let name_len = (name.len() as u16).to_le_bytes();
        let offset = (out.len() as u32).to_le_bytes();
        // Local file header: version 2.0, no flags, stored, time 0, date 1980-01-01.
        let common = [
            &[20u8, 0, 0, 0, 0, 0, 0, 0, 0x21, 0][..],
            &crc,
            &size,
            &size,
            &name_len,
            &[0, 0],
        ]
        .concat();
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        out.extend_from_slice(&common);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);
        // Central directory entry: made by Unix 2.0, mode 0644.
        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        central.extend_from_slice(&[20, 3]);
        central.extend_from_slice(&common);
        central.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        central.extend_from_slice(&(0o100644u32 << 16).to_le_bytes());
        central.extend_from_slice(&offset);
        central.extend_from_slice(name.as_bytes());
    }
    let (cd_offset, cd_len) = (out.len() as u32, central.len() as u32);
    out.extend_from_slice(&central);
    let n = (files.len() as u16).to_le_bytes();
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&n);
    out.extend_from_slice(&n);
    out.extend_from_slice(&cd_len.to_le_bytes());
    out.extend_from_slice(&cd_offset.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    out
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= byte as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// The WebSocket client: Node 18 has no global `WebSocket`, so this is the handshake
/// and the framing by hand. `node ws.js HOST proxy|direct`: through the proxy's
/// `CONNECT` (as the `ws` package does with an agent), or straight to the name (the
/// transparent path). Prints what it saw; exits 0 only when the echo came back intact.
const WS_CLIENT: &str = r#"
const http = require('http'), https = require('https'), tls = require('tls');
const crypto = require('crypto'), fs = require('fs');
const [host, via] = process.argv.slice(2);
const ca = fs.readFileSync('/workspace/ca.pem');
const fail = (msg) => { console.log('ws: failed: ' + msg); process.exit(3); };
setTimeout(() => fail('timed out'), 30000).unref();

const key = crypto.randomBytes(16).toString('base64');
const headers = { Connection: 'Upgrade', Upgrade: 'websocket',
                  'Sec-WebSocket-Version': '13', 'Sec-WebSocket-Key': key };

function frame(opcode, payload) {
  const mask = crypto.randomBytes(4);
  const n = payload.length;
  const len = n < 126 ? Buffer.from([0x80 | n])
    : n < 65536 ? Buffer.from([0x80 | 126, n >> 8, n & 255])
    : (() => { const b = Buffer.alloc(9); b[0] = 0x80 | 127; b.writeBigUInt64BE(BigInt(n), 1); return b; })();
  const masked = Buffer.from(payload);
  for (let i = 0; i < n; i++) masked[i] ^= mask[i % 4];
  return Buffer.concat([Buffer.from([0x80 | opcode]), len, mask, masked]);
}

function parse(buf) {
  if (buf.length < 2) return null;
  let len = buf[1] & 127, at = 2;
  if (len === 126) { if (buf.length < 4) return null; len = buf.readUInt16BE(2); at = 4; }
  else if (len === 127) { if (buf.length < 10) return null; len = Number(buf.readBigUInt64BE(2)); at = 10; }
  if (buf[1] & 128) return fail('the server masked its frame');
  if (buf.length < at + len) return null;
  return { opcode: buf[0] & 15, payload: buf.subarray(at, at + len), rest: buf.subarray(at + len) };
}

function talk(sock, head) {
  const text = 'hello through the gateway';
  const binary = crypto.randomBytes(Number(process.env.WS_BINARY_LEN));
  const want = crypto.createHash('sha256').update(binary).digest('hex');
  let buf = Buffer.from(head), got = [];
  sock.on('data', (d) => {
    buf = Buffer.concat([buf, d]);
    for (let f; (f = parse(buf)); ) {
      buf = f.rest;
      if (f.opcode === 1) { got.push('text'); console.log('ws: text echo: ' + f.payload.toString()); }
      else if (f.opcode === 2) {
        const sha = crypto.createHash('sha256').update(f.payload).digest('hex');
        console.log('ws: binary echo: ' + f.payload.length + ' bytes, ' + (sha === want ? 'intact' : 'CORRUPT'));
        got.push(sha === want ? 'binary' : 'corrupt');
        sock.write(frame(8, Buffer.from([3, 232])));
      } else if (f.opcode === 8) {
        console.log('ws: closed by the server after ' + got.join(', '));
        process.exit(got.join() === 'text,binary' ? 0 : 4);
      }
    }
  });
  sock.on('error', (e) => fail('socket: ' + e.message));
  sock.write(frame(1, Buffer.from(text)));
  sock.write(frame(2, binary));
}

function upgrade(req) {
  req.on('upgrade', (res, sock, head) => {
    const accept = crypto.createHash('sha1')
      .update(key + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64');
    if (res.headers['sec-websocket-accept'] !== accept) return fail('bad Sec-WebSocket-Accept');
    console.log('ws: upgraded: ' + res.statusCode);
    talk(sock, head);
  });
  req.on('response', (res) => fail('no upgrade: ' + res.statusCode));
  req.on('error', (e) => fail((e.code || '') + ' ' + e.message));
  req.end();
}

if (via === 'proxy') {
  const proxy = new URL(process.env.HTTPS_PROXY);
  const c = http.request({ host: proxy.hostname, port: proxy.port, method: 'CONNECT',
                           path: host + ':443', headers: { Host: host + ':443' } });
  c.on('connect', (res, socket, head) => {
    if (res.statusCode !== 200) {
      let body = head.toString();
      socket.on('data', (d) => body += d);
      socket.on('close', () => fail('the proxy answered ' + res.statusCode + ' ' + res.statusMessage
        + ' (x-beige-egress: ' + res.headers['x-beige-egress'] + '): ' + body.trim()));
      return;
    }
    upgrade(https.request({ host, path: '/echo', headers,
      createConnection: () => tls.connect({ socket, servername: host, ca }) }));
  });
  c.on('error', (e) => fail('proxy: ' + e.message));
  c.end();
} else {
  upgrade(https.request({ host, port: 443, path: '/echo', headers, ca }));
}
"#;

/// Waits (up to 10 s) until `done` holds for the `egress.connect` records: a stream's
/// `finished` record is written when it closes, which may be just after the exec ended.
async fn records_when(t: &TestHome, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    for _ in 0..100 {
        let records = egress_records(t);
        if done(&records) {
            return records;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    egress_records(t)
}

fn finished(records: &[Value], host: &str) -> Vec<Value> {
    records_for(records, host, 443)
        .into_iter()
        .filter(|r| r["phase"] == "finished")
        .cloned()
        .collect()
}

/// Every record of `host:443` is an allowed stream by `rule` through `entry`, to the
/// upstream's address, and there are `n` of them, each `started` then `finished`.
fn assert_allowed(records: &[Value], host: &str, rule: &str, entry: &str, n: usize) {
    let all = records_for(records, host, 443);
    let done = finished(records, host);
    assert_eq!(done.len(), n, "{host}: {all:#?}");
    assert_eq!(all.len(), 2 * n, "{host}: {all:#?}");
    for r in &all {
        assert_eq!(r["decision"], "allowed", "{host}: {r}");
        assert_eq!(r["egress"]["rule"], rule, "{host}: {r}");
        assert_eq!(r["egress"]["entry"], entry, "{host}: {r}");
        assert_eq!(r["egress"]["mode"], "tunnel", "{host}: {r}");
        assert_eq!(r["egress"]["ip"], UPSTREAM_IP, "{host}: {r}");
    }
    for r in &done {
        assert!(r["egress"]["bytesUp"].as_u64().unwrap() > 0, "{host}: {r}");
        assert!(
            r["egress"]["bytesDown"].as_u64().unwrap() > 0,
            "{host}: {r}"
        );
    }
}

/// Every record of `host:443` is one refusal (`no_rule`) through `entry`; returns how
/// many there are (at least one).
fn assert_refused(records: &[Value], host: &str, entry: &str) -> usize {
    let all = records_for(records, host, 443);
    assert!(!all.is_empty(), "{host}: no record in {records:#?}");
    for r in &all {
        assert_eq!(r["phase"], "finished", "{host}: {r}");
        assert_eq!(r["decision"], "denied", "{host}: {r}");
        assert_eq!(r["egress"]["reason"], "no_rule", "{host}: {r}");
        assert_eq!(r["error"], "no rule allows it", "{host}: {r}");
        assert_eq!(r["egress"]["entry"], entry, "{host}: {r}");
        assert!(r["egress"].get("rule").is_none(), "{host}: {r}");
        assert!(r["egress"].get("ip").is_none(), "{host}: {r}");
    }
    all.len()
}

/// The model's footer for `n` refused connections to `host:443`.
fn footer(n: usize, host: &str) -> String {
    let s = if n == 1 { "" } else { "s" };
    format!("[beige] egress: {n} connection{s} to {host}:443 refused (no_rule: no rule allows it)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pip_node_fetch_and_websocket_reach_allowed_hosts_only() {
    // The helpers are right before anything depends on them.
    assert_eq!(
        websocket_accept("dGhlIHNhbXBsZSBub25jZQ=="),
        "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    );
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);

    let env = docker_or_skip!();
    let t = TestHome::new();
    let docker = t.docker().await;
    let missing = match docker.client().inspect_image(IMAGE).await {
        Err(_) => Some("missing".to_string()),
        Ok(image) => {
            let packages = image
                .config
                .and_then(|c| c.labels)
                .and_then(|l| l.get("io.beige.packages").cloned())
                .unwrap_or_default();
            let have: Vec<&str> = packages.split(',').collect();
            let lacks: Vec<&str> = ["python3-pip", "nodejs", "git", "curl"]
                .into_iter()
                .filter(|p| !have.contains(p))
                .collect();
            (!lacks.is_empty()).then(|| format!("built without {}", lacks.join(", ")))
        }
    };
    if let Some(why) = missing {
        assert!(
            !super::support::required(),
            "{IMAGE} {why} in CI: scripts/setup-docker --debian-base (re)builds it"
        );
        eprintln!("SKIPPED (not in CI): {IMAGE} {why}; run scripts/setup-docker --debian-base");
        return;
    }

    let upstream = clients_upstream().await;
    let ip: IpAddr = UPSTREAM_IP.parse().unwrap();
    let resolver = TestResolver(HashMap::from([
        (PYPI, Ok(vec![ip])),
        (FETCH, Ok(vec![ip])),
        (WS, Ok(vec![ip])),
    ]));
    let dialer = Arc::new(ClientsDialer {
        upstream: upstream.addr,
        unexpected: Mutex::new(Vec::new()),
    });
    let mut config = t.config(
        &env,
        &[(
            "net",
            json!({
                "sandbox": {"image": IMAGE, "memoryLimit": "512m"},
                "egress": {"rules": [
                    {"id": "pypi", "hosts": [PYPI]},
                    {"id": "fetch", "hosts": [FETCH]},
                    {"id": "ws", "hosts": [WS]},
                ]},
            }),
        )],
    );
    config.gateway.keep_sandboxes = false;
    let gw = GatewayBuilder::new(config, t.home.clone())
        .shim(&env.shim)
        .sandbox(Arc::new(docker.clone()))
        .egress_resolver(Arc::new(resolver))
        .egress_dialer(dialer.clone())
        .build()
        .await
        .unwrap();
    let ws = gw.config().agent_workspace(gw.home(), "net");
    std::fs::write(ws.join("ca.pem"), &upstream.ca_pem).unwrap();
    std::fs::write(ws.join("ws.js"), WS_CLIENT).unwrap();

    // 1. pip downloads the wheel from the index through the proxy (CONNECT), checks
    // the index's sha256 and saves it intact.
    let pip = |host: &str, dir: &str| {
        format!(
            // requests prefers REQUESTS_CA_BUNDLE (the sandbox's bundle) to pip's own
            // `--cert`, so the upstream's test CA is named there (docs/egress.md).
            "REQUESTS_CA_BUNDLE=/workspace/ca.pem python3 -m pip download --no-deps --no-cache-dir --disable-pip-version-check \
             --retries 1 --timeout 20 --index-url https://{host}/simple/ \
             --cert /workspace/ca.pem -d {dir} {PKG} 2>&1; echo \"rc=$?\""
        )
    };
    let got = exec(&gw, &pip(PYPI, "/tmp/dl")).await;
    assert!(got.contains(&format!("Saved /tmp/dl/{WHEEL}")), "{got}");
    assert!(got.contains("rc=0"), "{got}");
    let check = exec(
        &gw,
        &format!(
            "sha256sum /tmp/dl/{WHEEL}; python3 -c \"import sys; sys.path.insert(0, '/tmp/dl/{WHEEL}'); import {PKG}; print('value:', {PKG}.VALUE)\""
        ),
    )
    .await;
    assert!(check.contains(&upstream.wheel_sha256), "{check}");
    assert!(check.contains(&format!("value: {PKG_VALUE}")), "{check}");
    let lines: Vec<String> = {
        let seen = upstream.seen.lock().unwrap();
        seen.requests
            .iter()
            .filter(|(sni, _)| sni == PYPI)
            .map(|(_, line)| line.clone())
            .collect()
    };
    assert!(
        lines.contains(&format!("GET /simple/{PKG}/ HTTP/1.1")),
        "{lines:?}"
    );
    assert!(
        lines.contains(&format!("GET /files/{WHEEL} HTTP/1.1")),
        "{lines:?}"
    );
    // A host no rule names: the tunnel is refused, and pip says so.
    let refused = exec(&gw, &pip("pypi.other.test", "/tmp/dl2")).await;
    assert!(
        refused.contains("Tunnel connection failed: 403 Forbidden"),
        "{refused}"
    );
    assert!(
        refused.contains(&format!("No matching distribution found for {PKG}")),
        "{refused}"
    );
    assert!(!refused.contains("rc=0"), "{refused}");
    assert!(
        refused.contains("to pypi.other.test:443 refused (no_rule: no rule allows it)"),
        "{refused}"
    );

    // 2. Node's fetch ignores the proxy variables: the name resolves to a synthetic
    // address of PID 1's DNS stub and the connection is carried transparently.
    let fetch = |host: &str| {
        format!(
            "NODE_EXTRA_CA_CERTS=/workspace/ca.pem node -e \"fetch('https://{host}/hello')\
             .then(r => r.text().then(t => console.log('status', r.status, t.trim())))\
             .catch(e => {{ console.log('fetch error:', e.message, '-', e.cause && (e.cause.code + ': ' + e.cause.message)); process.exit(3); }})\" 2>&1; echo \"rc=$?\""
        )
    };
    let fetched = exec(&gw, &fetch(FETCH)).await;
    assert!(
        fetched.contains("status 200 hello from the upstream"),
        "{fetched}"
    );
    assert!(fetched.contains("rc=0"), "{fetched}");
    // A name no rule allows: the connection is closed after its ClientHello; Node
    // reports the closed socket, and the exec's result names the refusal.
    let unfetched = exec(&gw, &fetch("fetch.other.test")).await;
    assert!(
        unfetched.contains("fetch error: fetch failed"),
        "{unfetched}"
    );
    assert!(unfetched.contains("rc=3"), "{unfetched}");
    assert!(
        unfetched.contains(&footer(1, "fetch.other.test")),
        "{unfetched}"
    );

    // 3. A WebSocket echo over TLS, through the proxy's CONNECT and transparently: a
    // text frame and a 1 MiB binary frame come back intact.
    let wsc = |host: &str, via: &str| {
        format!(
            "WS_BINARY_LEN={WS_BINARY_LEN} node /workspace/ws.js {host} {via} 2>&1; echo \"rc=$?\""
        )
    };
    for via in ["proxy", "direct"] {
        let out = exec(&gw, &wsc(WS, via)).await;
        assert!(out.contains("ws: upgraded: 101"), "{via}: {out}");
        assert!(
            out.contains("ws: text echo: hello through the gateway"),
            "{via}: {out}"
        );
        assert!(
            out.contains(&format!("ws: binary echo: {WS_BINARY_LEN} bytes, intact")),
            "{via}: {out}"
        );
        assert!(out.contains("rc=0"), "{via}: {out}");
    }
    assert_eq!(
        upstream.seen.lock().unwrap().frames,
        [(1, 25), (2, WS_BINARY_LEN), (1, 25), (2, WS_BINARY_LEN)]
    );
    // Refused through the proxy: the client reads the 403 and its one-line reason.
    let out = exec(&gw, &wsc("ws.other.test", "proxy")).await;
    assert!(out.contains("the proxy answered 403 Forbidden"), "{out}");
    assert!(
        out.contains("x-beige-egress: denied; reason=no_rule; id="),
        "{out}"
    );
    assert!(
        out.contains(
            "beige: egress to ws.other.test:443 refused for agent 'net': no rule allows it"
        ),
        "{out}"
    );
    assert!(out.contains(&footer(1, "ws.other.test")), "{out}");
    // Refused transparently: the socket is closed before TLS is up.
    let out = exec(&gw, &wsc("wst.other.test", "direct")).await;
    assert!(out.contains("ws: failed: ECONNRESET"), "{out}");
    assert!(out.contains(&footer(1, "wst.other.test")), "{out}");

    // The dialer was only asked for the upstream's address.
    assert!(
        dialer.unexpected.lock().unwrap().is_empty(),
        "dialled: {:?}",
        dialer.unexpected.lock().unwrap()
    );

    // Audit: each allowed stream has `started` and `finished` with the rule, the entry
    // and the address; each refusal is one `finished`, `denied`, `no_rule` record.
    let records = records_when(&t, |r| {
        finished(r, PYPI).len() >= 2 && finished(r, FETCH).len() == 1 && finished(r, WS).len() == 2
    })
    .await;
    let pip_streams = finished(&records, PYPI).len();
    assert!(pip_streams >= 2, "{:#?}", records_for(&records, PYPI, 443));
    assert_allowed(&records, PYPI, "pypi", "explicit", pip_streams);
    assert_allowed(&records, FETCH, "fetch", "transparent", 1);
    let ws_streams = records_for(&records, WS, 443);
    assert_eq!(ws_streams.len(), 4, "{ws_streams:#?}");
    for entry in ["explicit", "transparent"] {
        let done: Vec<_> = finished(&records, WS)
            .into_iter()
            .filter(|r| r["egress"]["entry"] == entry)
            .collect();
        assert_eq!(done.len(), 1, "{entry}: {ws_streams:#?}");
        let r = &done[0];
        assert_eq!(r["decision"], "allowed", "{r}");
        assert_eq!(r["egress"]["rule"], "ws", "{r}");
        assert_eq!(r["egress"]["mode"], "tunnel", "{r}");
        assert_eq!(r["egress"]["ip"], UPSTREAM_IP, "{r}");
        // The 1 MiB frame went up and came back down.
        assert!(
            r["egress"]["bytesUp"].as_u64().unwrap() > WS_BINARY_LEN as u64,
            "{r}"
        );
        assert!(
            r["egress"]["bytesDown"].as_u64().unwrap() > WS_BINARY_LEN as u64,
            "{r}"
        );
    }
    // pip retried once (`--retries 1`); the model's footer counted them all.
    let pip_refusals = assert_refused(&records, "pypi.other.test", "explicit");
    assert!(
        refused.contains(&footer(pip_refusals, "pypi.other.test")),
        "{refused}"
    );
    assert_eq!(
        assert_refused(&records, "fetch.other.test", "transparent"),
        1
    );
    assert_eq!(assert_refused(&records, "ws.other.test", "explicit"), 1);
    assert_eq!(assert_refused(&records, "wst.other.test", "transparent"), 1);
    gw.shutdown().await.unwrap();
}
