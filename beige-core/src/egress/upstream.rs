//! The two seams of the egress engine: [`Resolver`] (a name to its addresses) and
//! [`Dialer`] (a checked, pinned address to a connection), with the production
//! implementations [`HickoryResolver`] and [`TcpDialer`]. The address classifier sits
//! between them inside the engine and cannot be switched off: whatever a `Resolver`
//! answers is checked before a `Dialer` sees it, and a `Dialer` is only ever given an
//! address that passed.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::TokioResolver;
use tokio::io::{AsyncRead, AsyncWrite};

/// How long one name may take to resolve (per attempt).
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);
/// How many times a name is asked before it counts as failed.
pub const RESOLVE_ATTEMPTS: usize = 2;
/// How long a dial may take.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a name has no addresses. Any of these is a refusal (`dns_failed`): a DNS failure
/// never lets a connection through.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// The name does not exist, or has no address records.
    #[error("'{name}' has no addresses")]
    NoAddresses {
        /// The name asked for.
        name: String,
    },
    /// The resolver failed (a server error, no answer in time, no servers).
    #[error("resolving '{name}' failed: {message}")]
    Failed {
        /// The name asked for.
        name: String,
        /// What the resolver said.
        message: String,
    },
}

/// A name to its addresses. The engine checks every address it answers.
#[async_trait]
pub trait Resolver: Send + Sync + fmt::Debug {
    /// Every address of `name` (already normalised: lower-case ASCII, no trailing dot).
    async fn resolve(&self, name: &str) -> Result<Vec<IpAddr>, ResolveError>;
}

/// A connection to an upstream.
pub trait Upstream: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> Upstream for T {}

/// A boxed [`Upstream`], as a [`Dialer`] returns it.
pub type BoxUpstream = Pin<Box<dyn Upstream>>;

/// A pinned, checked address to a connection. Never given an address that the
/// classifier or the rules refused.
#[async_trait]
pub trait Dialer: Send + Sync + fmt::Debug {
    /// Connect to `addr`.
    async fn dial(&self, addr: SocketAddr) -> std::io::Result<BoxUpstream>;
}

/// The production [`Resolver`]: hickory, with the host's resolver configuration or the
/// servers given, 2 s per attempt and 2 attempts, and never a search domain.
#[derive(Clone)]
pub struct HickoryResolver {
    inner: TokioResolver,
}

impl fmt::Debug for HickoryResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HickoryResolver").finish_non_exhaustive()
    }
}

impl HickoryResolver {
    /// The host's configuration (`/etc/resolv.conf`), without its search domains.
    pub fn system() -> Result<Self, ResolveError> {
        let mut builder = TokioResolver::builder_tokio().map_err(|e| ResolveError::Failed {
            name: String::new(),
            message: format!("cannot read the host's resolver configuration: {e}"),
        })?;
        tune(builder.options_mut());
        let inner = builder.build().map_err(|e| ResolveError::Failed {
            name: String::new(),
            message: e.to_string(),
        })?;
        Ok(Self { inner })
    }

    /// These name servers (UDP, then TCP), e.g. `egress.dns.servers`.
    pub fn with_servers(servers: &[SocketAddr]) -> Result<Self, ResolveError> {
        let name_servers = servers
            .iter()
            .map(|s| {
                let mut udp = ConnectionConfig::udp();
                udp.port = s.port();
                let mut tcp = ConnectionConfig::tcp();
                tcp.port = s.port();
                NameServerConfig::new(s.ip(), true, vec![udp, tcp])
            })
            .collect();
        let config = ResolverConfig::from_parts(None, Vec::new(), name_servers);
        let mut builder =
            TokioResolver::builder_with_config(config, TokioRuntimeProvider::default());
        tune(builder.options_mut());
        let inner = builder.build().map_err(|e| ResolveError::Failed {
            name: String::new(),
            message: e.to_string(),
        })?;
        Ok(Self { inner })
    }
}

fn tune(opts: &mut ResolverOpts) {
    opts.timeout = RESOLVE_TIMEOUT;
    opts.attempts = RESOLVE_ATTEMPTS;
    // A name is taken as written: `api` never becomes `api.corp.example`.
    opts.ndots = 0;
}

#[async_trait]
impl Resolver for HickoryResolver {
    async fn resolve(&self, name: &str) -> Result<Vec<IpAddr>, ResolveError> {
        // The trailing dot makes the name absolute: no search list applies.
        let fqdn = format!("{name}.");
        match self.inner.lookup_ip(fqdn.as_str()).await {
            Ok(lookup) => {
                let addrs: Vec<IpAddr> = lookup.iter().collect();
                if addrs.is_empty() {
                    Err(ResolveError::NoAddresses {
                        name: name.to_string(),
                    })
                } else {
                    Ok(addrs)
                }
            }
            Err(e) if e.is_no_records_found() || e.is_nx_domain() => {
                Err(ResolveError::NoAddresses {
                    name: name.to_string(),
                })
            }
            Err(e) => Err(ResolveError::Failed {
                name: name.to_string(),
                message: e.to_string(),
            }),
        }
    }
}

/// The production [`Dialer`]: a TCP connection to the pinned address, within
/// [`DIAL_TIMEOUT`], with `TCP_NODELAY`.
#[derive(Debug, Default, Clone, Copy)]
pub struct TcpDialer;

#[async_trait]
impl Dialer for TcpDialer {
    async fn dial(&self, addr: SocketAddr) -> std::io::Result<BoxUpstream> {
        let stream = tokio::time::timeout(DIAL_TIMEOUT, tokio::net::TcpStream::connect(addr))
            .await
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no connection to {addr} within {}s", DIAL_TIMEOUT.as_secs()),
                )
            })??;
        stream.set_nodelay(true)?;
        Ok(Box::pin(stream))
    }
}
