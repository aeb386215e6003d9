//! [`EgressCa`]: the per-home certificate authority of inspect mode (spec `egress.md`
//! §5.2).
//!
//! Inspect mode terminates an agent's TLS in the gateway, so the client must be shown a
//! certificate for the exact name it asked for. This module owns the P-256 CA that signs
//! those leaves and the leaves themselves. The CA is made with `rcgen` on first use: its
//! key is `<BEIGE_HOME>/keys/egress-ca.key` (mode 0600, created atomically and never
//! overwritten, never mounted into a sandbox), its certificate
//! `<BEIGE_HOME>/keys/egress-ca.pem` (what a client in a sandbox is given to trust).
//! When only the key exists the certificate is made again from it; its subject is fixed,
//! so leaves signed later still chain to a certificate written earlier.
//!
//! A leaf is P-256, names exactly one host (its only SAN), is valid from an hour ago to
//! 24 hours from now, and is cached per name (at most [`LEAF_CACHE`] names; a leaf is
//! reissued when it is half way through its life).

use std::collections::HashMap;
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The CA key's file name in the home's `keys` directory.
pub const CA_KEY_FILE: &str = "egress-ca.key";
/// The CA certificate's file name in the home's `keys` directory.
pub const CA_CERT_FILE: &str = "egress-ca.pem";
/// Most leaves kept at once.
pub const LEAF_CACHE: usize = 1024;
/// The subject of every beige egress CA (fixed: leaves chain to it by name).
const CA_NAME: &str = "beige egress CA";
/// How long a leaf is valid after it is made (it is also valid an hour before).
const LEAF_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// How long a cached leaf is handed out before a new one is made.
const LEAF_REISSUE: Duration = Duration::from_secs(12 * 3600);

/// Why the CA or a leaf could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaError {
    /// A file of the CA could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The key file is not a P-256 key in PEM.
    #[error("{}: not an egress CA key ({message}); move it away to make a new CA", path.display())]
    BadKey {
        /// The key file.
        path: PathBuf,
        /// What was wrong with it.
        message: String,
    },
    /// `rcgen` refused to make a certificate (e.g. the name is not a DNS name).
    #[error("cannot make a certificate for '{name}': {message}")]
    Cert {
        /// The name (or the CA's name).
        name: String,
        /// What `rcgen` said.
        message: String,
    },
}

/// A leaf certificate for one name: the chain a TLS server presents and its key.
pub struct Leaf {
    /// The leaf, then the CA certificate.
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's private key (PKCS#8).
    pub key: PrivateKeyDer<'static>,
}

impl fmt::Debug for Leaf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leaf")
            .field("chain", &self.chain.len())
            .field("key", &"[elided]")
            .finish()
    }
}

/// A cached leaf and when it was made.
struct Cached {
    leaf: Arc<Leaf>,
    made: Instant,
    used: Instant,
}

/// The per-home egress CA: signs a [`Leaf`] for each name inspect mode terminates.
pub struct EgressCa {
    cert_path: PathBuf,
    cert_der: CertificateDer<'static>,
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
    leaves: Mutex<HashMap<String, Cached>>,
}

impl fmt::Debug for EgressCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EgressCa")
            .field("cert_path", &self.cert_path)
            .finish_non_exhaustive()
    }
}

/// The directory of the home's keys: `<BEIGE_HOME>/keys`.
pub fn keys_dir(home: &beige_client::home::BeigeHome) -> PathBuf {
    home.root().join("keys")
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> CaError + '_ {
    move |source| CaError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The CA's parameters; the subject is fixed, so a certificate made again from the same
/// key is the same issuer.
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, CA_NAME);
    params
        .distinguished_name
        .push(DnType::OrganizationName, "beige");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = SystemTime::now();
    params.not_before = (now - Duration::from_secs(24 * 3600)).into();
    params.not_after = (now + Duration::from_secs(10 * 365 * 24 * 3600)).into();
    params
}

/// Writes `bytes` to a fresh temporary file beside `path` (mode `mode`), synced.
fn write_temp(path: &Path, bytes: &[u8], mode: u32) -> Result<PathBuf, CaError> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = dir.join(format!(".{name}.{}.tmp", super::http::new_id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&temp)
        .map_err(io_error(&temp))?;
    let written = file.write_all(bytes).and_then(|()| file.sync_all());
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(io_error(&temp)(e));
    }
    Ok(temp)
}

/// Creates `path` with `bytes` (mode 0600) unless it exists: `Ok(false)` when another
/// writer was first. Atomic: the file appears whole or not at all, and an existing one is
/// never replaced (a hard link, unlike a rename, does not overwrite).
pub(super) fn create_exclusive(path: &Path, bytes: &[u8]) -> Result<bool, CaError> {
    let temp = write_temp(path, bytes, 0o600)?;
    let linked = std::fs::hard_link(&temp, path);
    let _ = std::fs::remove_file(&temp);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(io_error(path)(e)),
    }
}

/// Replaces `path` with `bytes` (mode 0644), atomically (temp file and rename).
fn replace(path: &Path, bytes: &[u8]) -> Result<(), CaError> {
    let temp = write_temp(path, bytes, 0o644)?;
    std::fs::rename(&temp, path).map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        io_error(path)(e)
    })
}

fn read_key(path: &Path) -> Result<KeyPair, CaError> {
    let pem = std::fs::read_to_string(path).map_err(io_error(path))?;
    let key = KeyPair::from_pem(&pem).map_err(|e| CaError::BadKey {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    if !key.is_compatible(&rcgen::PKCS_ECDSA_P256_SHA256) {
        return Err(CaError::BadKey {
            path: path.to_path_buf(),
            message: "not a P-256 key".into(),
        });
    }
    Ok(key)
}

impl EgressCa {
    /// The CA of the home whose keys directory is `keys_dir` (see [`keys_dir`]): its key
    /// and certificate are read, or made and written when they do not exist yet. The
    /// directory is created (mode 0700) when missing.
    pub fn load_or_create(keys_dir: &Path) -> Result<Self, CaError> {
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(keys_dir)
                .map_err(io_error(keys_dir))?;
        }
        let key_path = keys_dir.join(CA_KEY_FILE);
        let cert_path = keys_dir.join(CA_CERT_FILE);
        let cert_error = |e: rcgen::Error| CaError::Cert {
            name: CA_NAME.into(),
            message: e.to_string(),
        };

        let mut made_key = false;
        let key = if key_path.exists() {
            read_key(&key_path)?
        } else {
            let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(cert_error)?;
            if create_exclusive(&key_path, key.serialize_pem().as_bytes())? {
                made_key = true;
                key
            } else {
                // Another gateway of this home was first: its key is the CA's.
                read_key(&key_path)?
            }
        };

        let params = ca_params();
        let existing = if made_key {
            None
        } else {
            match std::fs::read_to_string(&cert_path) {
                Ok(pem) => Some(pem),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(io_error(&cert_path)(e)),
            }
        };
        let (cert_pem, cert_der) = match existing.and_then(|pem| {
            use rustls::pki_types::pem::PemObject;
            let der = CertificateDer::from_pem_slice(pem.as_bytes()).ok()?;
            Some((pem, der))
        }) {
            Some(found) => found,
            None => {
                let cert = params.self_signed(&key).map_err(cert_error)?;
                let pem = cert.pem();
                replace(&cert_path, pem.as_bytes())?;
                (pem, cert.der().clone())
            }
        };
        Ok(Self {
            cert_path,
            cert_der,
            cert_pem,
            issuer: Issuer::new(params, key),
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate, as a client is given it to trust.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// The CA certificate in PEM (the contents of `egress-ca.pem`).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Where the CA certificate is.
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    /// The leaf for exactly `name` (a DNS name or an IP address), from the cache when it
    /// has one young enough, else made now.
    pub fn leaf(&self, name: &str) -> Result<Arc<Leaf>, CaError> {
        let now = Instant::now();
        {
            let mut leaves = self.leaves.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(cached) = leaves.get_mut(name) {
                if now.duration_since(cached.made) < LEAF_REISSUE {
                    cached.used = now;
                    return Ok(cached.leaf.clone());
                }
            }
        }
        let leaf = Arc::new(self.make_leaf(name)?);
        let mut leaves = self.leaves.lock().unwrap_or_else(PoisonError::into_inner);
        if leaves.len() >= LEAF_CACHE && !leaves.contains_key(name) {
            let oldest = leaves
                .iter()
                .min_by_key(|(_, c)| c.used)
                .map(|(n, _)| n.clone());
            if let Some(oldest) = oldest {
                leaves.remove(&oldest);
            }
        }
        leaves.insert(
            name.to_string(),
            Cached {
                leaf: leaf.clone(),
                made: now,
                used: now,
            },
        );
        Ok(leaf)
    }

    /// How many leaves are cached.
    pub fn cached_leaves(&self) -> usize {
        self.leaves
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    fn make_leaf(&self, name: &str) -> Result<Leaf, CaError> {
        let cert_error = |e: rcgen::Error| CaError::Cert {
            name: name.to_string(),
            message: e.to_string(),
        };
        let mut params = CertificateParams::new(vec![name.to_string()]).map_err(cert_error)?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let now = SystemTime::now();
        params.not_before = (now - Duration::from_secs(3600)).into();
        params.not_after = (now + LEAF_LIFETIME).into();
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(cert_error)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(cert_error)?;
        Ok(Leaf {
            chain: vec![cert.der().clone(), self.cert_der.clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use rustls::client::danger::ServerCertVerifier;
    use rustls::client::WebPkiServerVerifier;
    use rustls::pki_types::{ServerName, UnixTime};

    use super::*;

    fn verify(ca: &EgressCa, leaf: &Leaf, name: &str) -> Result<(), rustls::Error> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert_der().clone())?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        let server = ServerName::try_from(name.to_string()).unwrap();
        verifier
            .verify_server_cert(
                &leaf.chain[0],
                &leaf.chain[1..],
                &server,
                &[],
                UnixTime::now(),
            )
            .map(|_| ())
    }

    #[test]
    fn the_key_is_made_once_0600_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        let ca = EgressCa::load_or_create(&keys).unwrap();
        let key_path = keys.join(CA_KEY_FILE);
        let mode = std::fs::metadata(&key_path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let dir_mode = std::fs::metadata(&keys).unwrap().permissions().mode();
        assert_eq!(dir_mode & 0o777, 0o700);
        let key_before = std::fs::read(&key_path).unwrap();
        let pem = std::fs::read_to_string(keys.join(CA_CERT_FILE)).unwrap();
        assert_eq!(pem, ca.cert_pem());
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"));
        // No temporary files are left behind.
        let names: Vec<String> = std::fs::read_dir(&keys)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");

        let again = EgressCa::load_or_create(&keys).unwrap();
        assert_eq!(std::fs::read(&key_path).unwrap(), key_before);
        assert_eq!(again.cert_der(), ca.cert_der());

        // A leaf of the reloaded CA verifies against the certificate written first.
        let leaf = again.leaf("api.example.test").unwrap();
        verify(&ca, &leaf, "api.example.test").unwrap();

        // Without its certificate, the CA is made again from the same key: old trust
        // still holds for new leaves.
        std::fs::remove_file(keys.join(CA_CERT_FILE)).unwrap();
        let remade = EgressCa::load_or_create(&keys).unwrap();
        assert_eq!(std::fs::read(&key_path).unwrap(), key_before);
        let leaf = remade.leaf("api.example.test").unwrap();
        verify(&ca, &leaf, "api.example.test").unwrap();
    }

    #[test]
    fn a_leaf_names_exactly_its_host_and_is_cached() {
        let dir = tempfile::tempdir().unwrap();
        let ca = EgressCa::load_or_create(dir.path()).unwrap();
        let leaf = ca.leaf("api.example.test").unwrap();
        assert_eq!(leaf.chain.len(), 2);
        verify(&ca, &leaf, "api.example.test").unwrap();
        assert!(verify(&ca, &leaf, "other.example.test").is_err());
        assert!(verify(&ca, &leaf, "x.api.example.test").is_err());
        let cached = ca.leaf("api.example.test").unwrap();
        assert!(Arc::ptr_eq(&leaf, &cached));
        assert_eq!(ca.cached_leaves(), 1);

        // Another CA does not vouch for it.
        let other_dir = tempfile::tempdir().unwrap();
        let other = EgressCa::load_or_create(other_dir.path()).unwrap();
        assert!(verify(&other, &leaf, "api.example.test").is_err());
        // Nothing secret in Debug.
        let shown = format!("{ca:?} {leaf:?}");
        assert!(!shown.contains("PRIVATE"), "{shown}");
    }

    #[test]
    fn a_bad_key_file_is_an_error_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CA_KEY_FILE), "not a key").unwrap();
        let err = EgressCa::load_or_create(dir.path()).unwrap_err();
        assert!(matches!(err, CaError::BadKey { .. }), "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join(CA_KEY_FILE)).unwrap(),
            "not a key"
        );
    }
}
