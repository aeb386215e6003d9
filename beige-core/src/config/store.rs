//! `store`: where the gateway keeps its state. Without it, SQLite in `BEIGE_HOME`
//! (`beige.db`), the default for one gateway on one machine. With `url`, a PostgreSQL
//! database that several gateways may share (`spec/scale.md` §2; cargo feature
//! `postgres` of beige-core, on in the `beige` binary).

use std::path::PathBuf;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::mcp::TimeLimit;

/// `store`: the database of the gateway's state.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StoreConfig {
    /// `postgres://user@host/database?sslmode=verify-full` (a `host=/dir` parameter names
    /// a Unix socket directory). Put no password here: use `passwordFile`. A server not
    /// on this machine must be verified (`sslmode=verify-full`, with `sslrootcert=` for a
    /// private CA) unless `allowInsecure` is true.
    pub url: String,
    /// A file holding the database password (trailing newlines are ignored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// The connection pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<StorePool>,
    /// Send the data to a server off this machine without verifying it (not
    /// recommended).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_insecure: bool,
}

/// `store.pool`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StorePool {
    /// Connections at most (default 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
    /// How long a call waits for a free connection (default `"5s"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquire_timeout: Option<TimeLimit>,
    /// The server cancels a statement running longer (default `"10s"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statement_timeout: Option<TimeLimit>,
}

impl StoreConfig {
    /// What is wrong with the section, as (key below `store`, message).
    pub fn problem(&self) -> Option<(&'static str, String)> {
        let url = self.url.trim();
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Some((
                "url",
                "store.url must be a PostgreSQL URL (postgres://user@host/database); leave \
                 the store section out to keep the state in BEIGE_HOME (SQLite)"
                    .into(),
            ));
        }
        let pool = self.pool.clone().unwrap_or_default();
        if pool.max == Some(0) {
            return Some(("pool.max", "store.pool.max must be at least 1".into()));
        }
        for (key, limit) in [
            ("pool.acquireTimeout", &pool.acquire_timeout),
            ("pool.statementTimeout", &pool.statement_timeout),
        ] {
            if limit.as_ref().is_some_and(|l| l.duration().is_none()) {
                return Some((
                    key,
                    format!("store.{key} must be whole seconds or a text like \"10s\", \"2m\""),
                ));
            }
        }
        None
    }

    /// Connections at most.
    pub fn max_connections(&self) -> u32 {
        self.pool.as_ref().and_then(|p| p.max).unwrap_or(16)
    }

    /// How long a call waits for a connection.
    pub fn acquire_timeout(&self) -> Duration {
        self.pool
            .as_ref()
            .and_then(|p| p.acquire_timeout.as_ref())
            .and_then(TimeLimit::duration)
            .unwrap_or(Duration::from_secs(5))
    }

    /// The longest a statement may run.
    pub fn statement_timeout(&self) -> Duration {
        self.pool
            .as_ref()
            .and_then(|p| p.statement_timeout.as_ref())
            .and_then(TimeLimit::duration)
            .unwrap_or(Duration::from_secs(10))
    }
}

/// `cluster`: how this gateway shares its `store.url` database with other gateways
/// (`spec/scale.md` §3). Only with `store.url`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterConfig {
    /// When another gateway holds a lease this one needs (one of its agents, or the
    /// Telegram channel): wait for it and take over when that gateway stops renewing it
    /// (a hot standby), instead of refusing to start. Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub standby: bool,
    /// The leases this gateway takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<ClusterLease>,
}

/// `cluster.lease`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterLease {
    /// How long a lease lasts without renewal (default `"15s"`, at least `"5s"`). It is
    /// renewed every third of that; a standby takes over at most this long, plus about
    /// two seconds, after its holder stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<TimeLimit>,
}

/// The shortest lease time to live: a gateway stops acting on its agents 2 s before its
/// lease could run out, and renews every third of the time.
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(5);

/// The lease time to live without `cluster.lease.ttl`.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(15);

impl ClusterConfig {
    /// What is wrong with the section, as (key below `cluster`, message).
    pub fn problem(&self, store: Option<&StoreConfig>) -> Option<(&'static str, String)> {
        if store.is_none() {
            return Some((
                "standby",
                "cluster needs store.url: only gateways that share a PostgreSQL database \
                 form a cluster; remove the cluster section or add store.url"
                    .into(),
            ));
        }
        match self.lease.as_ref().and_then(|l| l.ttl.as_ref()) {
            Some(ttl) => match ttl.duration() {
                None => Some((
                    "lease.ttl",
                    "cluster.lease.ttl must be whole seconds or a text like \"15s\"".into(),
                )),
                Some(d) if d < MIN_LEASE_TTL => Some((
                    "lease.ttl",
                    format!(
                        "cluster.lease.ttl must be at least {}s (a gateway stops acting 2s \
                         before its lease could run out)",
                        MIN_LEASE_TTL.as_secs()
                    ),
                )),
                Some(_) => None,
            },
            None => None,
        }
    }

    /// The lease time to live.
    pub fn lease_ttl(&self) -> Duration {
        self.lease
            .as_ref()
            .and_then(|l| l.ttl.as_ref())
            .and_then(TimeLimit::duration)
            .unwrap_or(DEFAULT_LEASE_TTL)
    }
}
