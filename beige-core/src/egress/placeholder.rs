//! Credential placeholders (spec §5.3): what a sandbox sees in place of a secret.
//!
//! A placeholder is `<prefix>bgph_<base32(credential ‖ exec ‖ tag)>`, where `tag` is the
//! first 16 bytes of HMAC-SHA256 under the home's placeholder key over the agent, the
//! credential and the exec id. The gateway verifies one without keeping state (so
//! placeholders survive a restart), and a forged one, or one minted for another agent,
//! fails. Each `exec` gets its own, so a leaked placeholder names the exec that had it.
//! The key lives beside the egress CA in `<BEIGE_HOME>/keys/egress-placeholder.key`
//! (mode 0600), made on first use.

use std::path::Path;

use base64::Engine as _;
use ring::hmac;

use super::ca::{create_exclusive, CaError};
use super::scan::MARKER;

/// The key's file in the keys directory.
pub const KEY_FILE: &str = "egress-placeholder.key";

/// Bytes of the tag a placeholder carries.
const TAG_LEN: usize = 16;

/// Domain separation for the tag.
const CONTEXT: &[u8] = b"beige egress placeholder v1";

/// What a verified placeholder names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Minted {
    /// The credential's name in `egress.credentials`.
    pub credential: String,
    /// The exec it was made for.
    pub exec: String,
}

/// The home's placeholder key.
pub struct PlaceholderKey(hmac::Key);

impl std::fmt::Debug for PlaceholderKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PlaceholderKey(<redacted>)")
    }
}

impl PlaceholderKey {
    /// A key from its 32 bytes.
    pub fn from_bytes(bytes: &[u8; 32]) -> Self {
        Self(hmac::Key::new(hmac::HMAC_SHA256, bytes))
    }

    /// The key of the home whose keys directory is `keys_dir`: read, or made and written
    /// (atomically, mode 0600) on first use.
    pub fn load_or_create(keys_dir: &Path) -> Result<Self, CaError> {
        let path = keys_dir.join(KEY_FILE);
        let io = |source| CaError::Io {
            path: path.clone(),
            source,
        };
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(keys_dir)
                .map_err(|e| CaError::Io {
                    path: keys_dir.to_path_buf(),
                    source: e,
                })?;
        }
        if !path.exists() {
            let fresh: [u8; 32] = rand::random();
            let text = base64::engine::general_purpose::STANDARD.encode(fresh);
            // Another gateway of this home may be first; then its key is the one.
            create_exclusive(&path, format!("{text}\n").as_bytes())?;
        }
        let text = std::fs::read_to_string(&path).map_err(io)?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .ok_or_else(|| CaError::BadKey {
                path: path.clone(),
                message: "not 32 bytes of base64; remove the file to make a new key (every \
                          placeholder handed out so far stops working)"
                    .into(),
            })?;
        Ok(Self::from_bytes(&bytes))
    }

    fn tag(&self, agent: &str, credential: &str, exec: &str) -> [u8; TAG_LEN] {
        let mut ctx = hmac::Context::with_key(&self.0);
        for part in [
            CONTEXT,
            agent.as_bytes(),
            credential.as_bytes(),
            exec.as_bytes(),
        ] {
            ctx.update(&(part.len() as u64).to_be_bytes());
            ctx.update(part);
        }
        let full = ctx.sign();
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&full.as_ref()[..TAG_LEN]);
        tag
    }

    /// The placeholder of `credential` for `exec` of `agent`, with `prefix` in front.
    /// `None` when a name is longer than 255 bytes.
    pub fn mint(&self, agent: &str, credential: &str, exec: &str, prefix: &str) -> Option<String> {
        let cred_len = u8::try_from(credential.len()).ok()?;
        let exec_len = u8::try_from(exec.len()).ok()?;
        let mut payload = Vec::with_capacity(2 + credential.len() + exec.len() + TAG_LEN);
        payload.push(cred_len);
        payload.extend_from_slice(credential.as_bytes());
        payload.push(exec_len);
        payload.extend_from_slice(exec.as_bytes());
        payload.extend_from_slice(&self.tag(agent, credential, exec));
        Some(format!(
            "{prefix}{}{}",
            String::from_utf8_lossy(MARKER),
            base32_encode(&payload)
        ))
    }

    /// What `token` (the base32 after `bgph_`, as [`super::scan`] finds it) names, when
    /// this key minted it for `agent`; `None` for a forged, altered or foreign one.
    pub fn verify(&self, agent: &str, token: &str) -> Option<Minted> {
        let payload = base32_decode(token)?;
        let (&cred_len, rest) = payload.split_first()?;
        let credential = rest.get(..usize::from(cred_len))?;
        let rest = &rest[usize::from(cred_len)..];
        let (&exec_len, rest) = rest.split_first()?;
        let exec = rest.get(..usize::from(exec_len))?;
        let tag = &rest[usize::from(exec_len)..];
        if tag.len() != TAG_LEN {
            return None;
        }
        let credential = std::str::from_utf8(credential).ok()?;
        let exec = std::str::from_utf8(exec).ok()?;
        let expected = self.tag(agent, credential, exec);
        // Constant time: every byte is compared.
        let diff = expected
            .iter()
            .zip(tag)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        (diff == 0).then(|| Minted {
            credential: credential.to_string(),
            exec: exec.to_string(),
        })
    }
}

const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// RFC 4648 base32, lower case, without padding.
fn base32_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(5) * 8);
    let (mut buffer, mut bits) = (0u32, 0u32);
    for &b in bytes {
        buffer = buffer << 8 | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(ALPHABET[(buffer >> bits & 31) as usize]));
        }
    }
    if bits > 0 {
        out.push(char::from(ALPHABET[(buffer << (5 - bits) & 31) as usize]));
    }
    out
}

/// The inverse of [`base32_encode`]; `None` for a character outside the alphabet.
fn base32_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 5 / 8);
    let (mut buffer, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = ALPHABET.iter().position(|&a| a == c)? as u32;
        buffer = (buffer << 5 | v) & 0xffff;
        bits += 5;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
        }
    }
    // Canonical only: no stray character, no set padding bit.
    if bits >= 5 || buffer & ((1 << bits) - 1) != 0 {
        return None;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::scan::scan;

    fn key(seed: u8) -> PlaceholderKey {
        PlaceholderKey::from_bytes(&[seed; 32])
    }

    #[test]
    fn base32_round_trips() {
        for len in 0..40 {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            assert_eq!(base32_decode(&base32_encode(&bytes)).unwrap(), bytes);
        }
        assert_eq!(base32_encode(b"foobar"), "mzxw6ytboi");
        assert!(base32_decode("ABC").is_none());
        assert!(base32_decode("a1").is_none());
    }

    #[test]
    fn a_placeholder_verifies_for_its_agent_only() {
        let k = key(7);
        let p = k
            .mint("intern", "openai", "x00000000000000aa", "sk-")
            .unwrap();
        assert!(p.starts_with("sk-bgph_"), "{p}");
        let found = scan(p.as_bytes());
        assert_eq!(found.len(), 1, "{p}");
        let minted = k.verify("intern", &found[0].token).unwrap();
        assert_eq!(minted.credential, "openai");
        assert_eq!(minted.exec, "x00000000000000aa");
        // Another agent, another key: foreign.
        assert!(k.verify("other", &found[0].token).is_none());
        assert!(key(8).verify("intern", &found[0].token).is_none());
        // Each exec has its own.
        let q = k
            .mint("intern", "openai", "x00000000000000bb", "sk-")
            .unwrap();
        assert_ne!(p, q);
    }

    #[test]
    fn forged_and_altered_placeholders_fail() {
        let k = key(1);
        let p = k.mint("a", "gh", "x1", "").unwrap();
        let token = p.strip_prefix("bgph_").unwrap();
        // Every single-character change fails.
        for i in 0..token.len() {
            let mut bytes = token.as_bytes().to_vec();
            bytes[i] = if bytes[i] == b'a' { b'b' } else { b'a' };
            let altered = String::from_utf8(bytes).unwrap();
            assert!(k.verify("a", &altered).is_none(), "changed at {i}");
        }
        // A hand-made payload with a made-up tag.
        let mut forged = vec![2u8];
        forged.extend_from_slice(b"gh");
        forged.push(2);
        forged.extend_from_slice(b"x1");
        forged.extend_from_slice(&[0u8; TAG_LEN]);
        assert!(k.verify("a", &base32_encode(&forged)).is_none());
        assert!(k.verify("a", "").is_none());
        assert!(k.verify("a", "aaaa").is_none());
    }

    #[test]
    fn the_key_is_made_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        let a = PlaceholderKey::load_or_create(&keys).unwrap();
        let b = PlaceholderKey::load_or_create(&keys).unwrap();
        let p = a.mint("x", "c", "e", "").unwrap();
        assert!(b.verify("x", p.strip_prefix("bgph_").unwrap()).is_some());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(keys.join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(keys.join(KEY_FILE), "short\n").unwrap();
        let e = PlaceholderKey::load_or_create(&keys)
            .unwrap_err()
            .to_string();
        assert!(e.contains("32 bytes"), "{e}");
    }
}
