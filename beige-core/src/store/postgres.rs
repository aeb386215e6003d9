//! [`PostgresStore`]: the whole [`Store`](super::Store) on a PostgreSQL database, for
//! gateways that share their state (spec/scale.md §2). The same tables, columns and
//! millisecond timestamps as [`SqliteStore`](super::SqliteStore), made by migrations
//! numbered as SQLite's (`postgres_schema.rs`), applied under an advisory lock so that
//! replicas starting together migrate once.
//!
//! Every method is one transaction at READ COMMITTED on a connection of a sqlx pool.
//! Read-then-write steps take row locks (`append_turn` locks the session row for its
//! `seq`) or a transaction-scoped advisory lock (plugin limits, whose usage row may not
//! exist yet), so two gateways writing at once keep every guarantee the trait states.
//! Off loopback and Unix sockets the connection must verify the server
//! (`sslmode=verify-full`) unless the config says `allowInsecure`.

use std::path::{Path, PathBuf};
use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow, PgSslMode};
use sqlx::{Executor as _, Row as _};

use super::{
    now_ms, title_from, ChannelState, Fence, HealthRecord, HealthStore, KvLimits, KvUsage, KvWrite,
    LedgerEntry, LedgerFilter, Lineage, NewMessage, NewSession, OutboxItem, PluginData,
    PromptAnswer, SessionRecord, SessionSettings, SessionStore, SettingsPatch, StoreError,
    StoredMessage, UsageGroupBy, UsageLedger, UsageQuery, UsageReport, UsageRow, UsageTotals,
    PROMPT_ANSWER_RETENTION_MS, SEEN_WINDOW,
};
use crate::llm::{Message, Role, Usage};

/// Run one method's transaction (`$body`, an async block's contents evaluating to
/// `Result<T, Fail>`), and run it again when the server aborted it as a serialization
/// failure (40001) or as a deadlock's victim (40P01): such a transaction committed
/// nothing, so running it again is safe. After [`TRANSIENT_RETRIES`] retries (with a
/// short, growing, jittered pause between them, so two victims do not collide again)
/// the error is reported as [`StoreError::Locked`]; every other result is returned as it
/// is, through `$store.finish`. A macro rather than a function taking a closure: the
/// method futures must be `Send`, which a closure returning a borrowing future cannot
/// promise for every lifetime.
macro_rules! retrying {
    ($store:expr, $body:block) => {{
        let mut retries = 0u32;
        loop {
            let attempt: Result<_, $crate::store::postgres::Fail> = async $body.await;
            match attempt {
                Err($crate::store::postgres::Fail::Sql(e))
                    if retries < $crate::store::postgres::TRANSIENT_RETRIES
                        && $crate::store::postgres::is_transient(&e) =>
                {
                    retries += 1;
                    tracing::debug!(store = %$store.name.display(), retries, error = %e,
                        "the server aborted a store transaction; running it again");
                    tokio::time::sleep($crate::store::postgres::transient_pause(retries)).await;
                }
                other => break $store.finish(other),
            }
        }
    }};
}

#[path = "postgres_coordination.rs"]
mod coordination;
#[path = "postgres_credentials.rs"]
mod credentials;
#[path = "postgres_schedules.rs"]
mod schedules;
#[path = "postgres_schema.rs"]
mod schema;

/// The schema version this binary writes (the same number as SQLite's).
pub const PG_SCHEMA_VERSION: i64 = schema::MIGRATIONS.len() as i64;

/// The server's time in Unix ms (leases and fences are judged by it alone).
pub(super) const DB_NOW: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// The key of the advisory lock migrations take (any fixed number; "beige" in ASCII).
const MIGRATION_LOCK: i64 = 0x0062_6569_6765;

/// How to reach the database: what the config's `store` section says.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// `postgres://user@host/db?sslmode=…` (a `host=/dir` query parameter names a Unix
    /// socket directory).
    pub url: String,
    /// The password, when it is not in the URL (read from `store.passwordFile`).
    pub password: Option<String>,
    /// Connections in the pool.
    pub max_connections: u32,
    /// How long a call waits for a free connection before failing.
    pub acquire_timeout: Duration,
    /// The server cancels a statement that runs longer (`statement_timeout`).
    pub statement_timeout: Option<Duration>,
    /// Allow a connection off loopback that does not verify the server's certificate.
    pub allow_insecure: bool,
}

impl PostgresOptions {
    /// Options with the defaults of spec/scale.md: 16 connections, 5 s to get one, 10 s
    /// per statement.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            password: None,
            max_connections: 16,
            acquire_timeout: Duration::from_secs(5),
            statement_timeout: Some(Duration::from_secs(10)),
            allow_insecure: false,
        }
    }
}

impl PostgresOptions {
    /// The options the config's `store` section gives, with the password read from
    /// `passwordFile`.
    pub fn from_config(store: &crate::config::store::StoreConfig) -> Result<Self, StoreError> {
        let password = match &store.password_file {
            Some(file) => {
                let text = std::fs::read_to_string(file).map_err(|e| StoreError::CannotOpen {
                    path: file.clone(),
                    detail: format!("store.passwordFile cannot be read: {e}"),
                })?;
                Some(text.trim_end_matches(['\n', '\r']).to_string())
            }
            None => None,
        };
        Ok(Self {
            password,
            max_connections: store.max_connections(),
            acquire_timeout: store.acquire_timeout(),
            statement_timeout: Some(store.statement_timeout()),
            allow_insecure: store.allow_insecure,
            ..Self::new(store.url.trim())
        })
    }
}

/// The [`Store`](super::Store) on a PostgreSQL database.
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    /// The URL without its password, for messages.
    name: Arc<Path>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("database", &self.name)
            .finish_non_exhaustive()
    }
}

/// The URL with any password replaced, safe to print.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => format!("{userinfo}@{host}"),
        },
        None => authority.to_string(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query = query
                .split('&')
                .map(|part| match part.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                    _ => part.to_string(),
                })
                .collect::<Vec<_>>()
                .join("&");
            format!("{path}?{query}")
        }
        None => tail.to_string(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// Is this host a loopback address, `localhost` or a Unix socket directory?
fn is_local_host(host: &str) -> bool {
    if host.starts_with('/') || host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<std::net::IpAddr>()
        .map(|ip| ip.is_loopback())
        .unwrap_or(false)
}

impl PostgresStore {
    /// Connect, check the connection and bring the schema up to date.
    ///
    /// Fails with [`StoreError::CannotOpen`] when the URL is invalid, refuses to verify
    /// a server off loopback (without `allow_insecure`), or the server cannot be
    /// reached; with [`StoreError::TooNew`] when a newer beige migrated the database.
    pub async fn connect(options: &PostgresOptions) -> Result<Self, StoreError> {
        let store = Self::connect_lazy(options)?;
        let mut conn = store.pool.acquire().await.map_err(|e| store.fail(e))?;
        migrate(&mut conn, &store.name).await?;
        drop(conn);
        Ok(store)
    }

    /// A store whose pool connects on first use, without migrating: for a database
    /// that [`connect`](Self::connect) migrated before (tests, tools). Must be called
    /// inside a Tokio runtime.
    pub fn connect_lazy(options: &PostgresOptions) -> Result<Self, StoreError> {
        let name: Arc<Path> = Arc::from(PathBuf::from(redact_url(&options.url)));
        let cannot = |detail: String| StoreError::CannotOpen {
            path: name.to_path_buf(),
            detail,
        };
        let mut connect = PgConnectOptions::from_str(&options.url)
            .map_err(|e| cannot(format!("the store URL is not valid: {e}")))?;
        if let Some(password) = &options.password {
            connect = connect.password(password);
        }
        let host = connect.get_host().to_string();
        let verified = matches!(connect.get_ssl_mode(), PgSslMode::VerifyFull);
        if !is_local_host(&host) && !verified && !options.allow_insecure {
            return Err(cannot(format!(
                "the server {host} is not on this machine and the URL does not verify it; \
                 add sslmode=verify-full to store.url (with sslrootcert=<ca file> for a \
                 private CA), or set store.allowInsecure: true to send the data unverified"
            )));
        }
        if let Some(t) = options.statement_timeout {
            connect = connect.options([("statement_timeout", format!("{}ms", t.as_millis()))]);
        }
        connect = connect.application_name("beige");
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(options.acquire_timeout)
            .connect_lazy_with(connect);
        Ok(Self { pool, name })
    }

    /// The schema version of the database without changing it (`beige doctor`): `None`
    /// for a database no beige has migrated yet.
    pub async fn schema_version(&self) -> Result<Option<i64>, StoreError> {
        let exists: Option<String> = sqlx::query_scalar("SELECT to_regclass('beige_schema')::text")
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.fail(e))?;
        if exists.is_none() {
            return Ok(None);
        }
        sqlx::query_scalar("SELECT version FROM beige_schema LIMIT 1")
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.fail(e))
    }

    /// The URL of the database, without its password.
    pub fn name(&self) -> &Path {
        &self.name
    }

    /// The pool, for tools and tests that need their own statements.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn fail(&self, e: sqlx::Error) -> StoreError {
        classify(e, &self.name)
    }
}

/// How many times [`retrying!`] runs an aborted transaction again.
const TRANSIENT_RETRIES: u32 = 4;

/// Did the server abort the transaction in a way that running it again may cure
/// (`serialization_failure` or `deadlock_detected`)?
fn is_transient(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("40001" | "40P01")))
}

/// The pause before retry `n` (1-based): 2, 4, 8, 16 ms, each plus up to as much again
/// at random.
fn transient_pause(n: u32) -> std::time::Duration {
    let base = 1u64 << n.min(6);
    std::time::Duration::from_millis(base + rand::random::<u64>() % (base + 1))
}

/// Turn a sqlx error into the [`StoreError`] that tells the user what to do.
pub(super) fn classify(err: sqlx::Error, name: &Path) -> StoreError {
    let path = name.to_path_buf();
    if let sqlx::Error::Database(db) = &err {
        match db.code().as_deref() {
            // disk_full, insufficient_resources
            Some("53100") => return StoreError::DiskFull { path },
            // lock_not_available, serialization_failure, deadlock_detected
            Some("55P03" | "40001" | "40P01") => return StoreError::Locked { path },
            // invalid_authorization_specification, invalid_password, insufficient_privilege
            Some("28000" | "28P01" | "42501") => {
                return StoreError::CannotOpen {
                    path,
                    detail: db.message().to_string(),
                }
            }
            _ => {}
        }
    }
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Configuration(_) => StoreError::CannotOpen {
            path,
            detail: format!(
                "{err}; check store.url, that the server runs and that it accepts this user"
            ),
        },
        other => StoreError::Backend {
            path,
            source: Box::new(other),
        },
    }
}

/// Apply the missing migrations, each in its own transaction with the version bump, under
/// an advisory lock: replicas that start together migrate once.
async fn migrate(conn: &mut sqlx::PgConnection, name: &Path) -> Result<(), StoreError> {
    let sql = |e: sqlx::Error| classify(e, name);
    conn.execute(
        "CREATE TABLE IF NOT EXISTS beige_schema (
             version        BIGINT NOT NULL,
             min_compatible BIGINT NOT NULL
         )",
    )
    .await
    .map_err(sql)?;
    loop {
        let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(sql)?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *tx)
            .await
            .map_err(sql)?;
        let row: Option<(i64, i64)> =
            sqlx::query_as("SELECT version, min_compatible FROM beige_schema LIMIT 1")
                .fetch_optional(&mut *tx)
                .await
                .map_err(sql)?;
        let (version, min_compatible) = row.unwrap_or((0, 0));
        if version > PG_SCHEMA_VERSION && min_compatible > PG_SCHEMA_VERSION {
            return Err(StoreError::TooNew {
                path: name.to_path_buf(),
                found: version,
                supported: PG_SCHEMA_VERSION,
            });
        }
        let Some(step) = usize::try_from(version)
            .ok()
            .and_then(|v| schema::MIGRATIONS.get(v))
        else {
            return Ok(());
        };
        let next = version + 1;
        let failed = |e: sqlx::Error| StoreError::Migration {
            path: name.to_path_buf(),
            version: next,
            detail: e.to_string(),
        };
        tx.execute(*step).await.map_err(failed)?;
        tx.execute("DELETE FROM beige_schema")
            .await
            .map_err(failed)?;
        // Every migration so far only adds: any older binary that knows version 1 can
        // still read and write what this one writes.
        sqlx::query("INSERT INTO beige_schema (version, min_compatible) VALUES ($1, 1)")
            .bind(next)
            .execute(&mut *tx)
            .await
            .map_err(failed)?;
        tx.commit().await.map_err(failed)?;
        tracing::info!(database = %name.display(), version = next, "database schema migrated");
    }
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn not_found(id: &str) -> StoreError {
    StoreError::NotFound {
        what: "session",
        id: id.to_string(),
    }
}

fn corrupt(name: &Path, detail: String) -> StoreError {
    StoreError::Corrupt {
        path: name.to_path_buf(),
        detail,
    }
}

/// A session with its totals, as `append_turn` keeps them.
const SESSION_SELECT: &str = "
    SELECT s.id, s.agent, s.key, s.parent_id, s.title, s.model, s.created, s.updated,
           s.message_count, s.input_tokens, s.output_tokens, s.cache_read_tokens,
           s.cache_write_tokens
    FROM sessions s";

fn session_from_row(row: &PgRow) -> Result<SessionRecord, sqlx::Error> {
    Ok(SessionRecord {
        id: row.try_get(0)?,
        agent: row.try_get(1)?,
        key: row.try_get(2)?,
        parent_id: row.try_get(3)?,
        title: row.try_get(4)?,
        model: row.try_get(5)?,
        created: row.try_get(6)?,
        updated: row.try_get(7)?,
        message_count: to_u64(row.try_get(8)?),
        usage: Usage {
            input_tokens: to_u64(row.try_get(9)?),
            output_tokens: to_u64(row.try_get(10)?),
            cache_read_tokens: to_u64(row.try_get(11)?),
            cache_write_tokens: to_u64(row.try_get(12)?),
        },
    })
}

async fn load_session<'c, E>(conn: E, id: &str) -> Result<Option<SessionRecord>, sqlx::Error>
where
    E: sqlx::PgExecutor<'c>,
{
    let sql = format!("{SESSION_SELECT} WHERE s.id = $1");
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .fetch_optional(conn)
        .await?
        .map(|r| session_from_row(&r))
        .transpose()
}

fn new_session_id() -> String {
    format!("s_{:016x}", rand::random::<u64>())
}

/// Errors of a method body: sqlx's, or a store error decided inside the transaction.
enum Fail {
    Sql(sqlx::Error),
    Store(StoreError),
}

impl From<sqlx::Error> for Fail {
    fn from(e: sqlx::Error) -> Self {
        Fail::Sql(e)
    }
}

impl From<StoreError> for Fail {
    fn from(e: StoreError) -> Self {
        Fail::Store(e)
    }
}

impl PostgresStore {
    fn finish<T>(&self, r: Result<T, Fail>) -> Result<T, StoreError> {
        r.map_err(|f| match f {
            Fail::Sql(e) => self.fail(e),
            Fail::Store(e) => e,
        })
    }

    async fn insert_session(
        &self,
        new: NewSession,
        lineage: Option<Lineage>,
    ) -> Result<SessionRecord, Fail> {
        let mut tx = self.pool.begin().await?;
        if let Some(parent) = &new.parent_id {
            let exists = sqlx::query("SELECT 1 FROM sessions WHERE id = $1")
                .bind(parent)
                .fetch_optional(&mut *tx)
                .await?;
            if exists.is_none() {
                return Err(not_found(parent).into());
            }
        }
        let now = now_ms();
        let id = new_session_id();
        sqlx::query(
            "INSERT INTO sessions (id, agent, key, parent_id, title, model, created, updated)
             VALUES ($1, $2, $3, $4, NULL, $5, $6, $6)",
        )
        .bind(&id)
        .bind(&new.agent)
        .bind(&new.key)
        .bind(&new.parent_id)
        .bind(&new.model)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if let Some(l) = &lineage {
            sqlx::query(
                "INSERT INTO session_lineage
                     (session_id, parent_session_id, depth, invoked_by_exec, rights, created)
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(&id)
            .bind(&l.parent_session_id)
            .bind(i64::from(l.depth))
            .bind(&l.invoked_by_exec)
            .bind(l.rights.to_string())
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        set_current(&mut tx, &new.key, &id, now).await?;
        tx.commit().await?;
        Ok(SessionRecord {
            id,
            agent: new.agent,
            key: new.key,
            parent_id: new.parent_id,
            title: None,
            model: new.model,
            created: now,
            updated: now,
            message_count: 0,
            usage: Usage::default(),
        })
    }

    /// One turn appended, under `fence` when given (checked in the same transaction).
    async fn append(
        &self,
        session_id: &str,
        messages: Vec<NewMessage>,
        fence: Option<&Fence>,
        answer: Option<&PromptAnswer>,
    ) -> Result<Vec<i64>, StoreError> {
        // Encode everything before the transaction starts: a message that cannot be
        // encoded fails the turn before anything is written.
        let mut contents = Vec::with_capacity(messages.len());
        let mut models = Vec::with_capacity(messages.len());
        let mut tokens: [Vec<Option<i64>>; 4] = Default::default();
        let mut first_title = None;
        let mut added = Usage::default();
        for (i, m) in messages.into_iter().enumerate() {
            let content = serde_json::to_string(&m.message).map_err(|e| StoreError::Invalid {
                message: format!("message {i} of the turn cannot be encoded as JSON: {e}"),
            })?;
            if first_title.is_none() && m.message.role == Role::User {
                first_title = title_from(&m.message.text());
            }
            if let Some(u) = &m.usage {
                added.add(u);
            }
            contents.push(content);
            models.push(m.model);
            tokens[0].push(m.usage.map(|u| to_i64(u.input_tokens)));
            tokens[1].push(m.usage.map(|u| to_i64(u.output_tokens)));
            tokens[2].push(m.usage.map(|u| to_i64(u.cache_read_tokens)));
            tokens[3].push(m.usage.map(|u| to_i64(u.cache_write_tokens)));
        }
        retrying!(self, {
            let mut tx = self.pool.begin().await?;
            if let Some(fence) = fence {
                // FOR SHARE: a takeover's UPDATE of the lease waits for this commit.
                let held = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "SELECT 1 FROM leases WHERE name = $1 AND holder = $2 AND epoch = $3
                       AND expires_at > {DB_NOW} FOR SHARE"
                )))
                .bind(&fence.lease)
                .bind(&fence.holder)
                .bind(fence.epoch)
                .fetch_optional(&mut *tx)
                .await?;
                if held.is_none() {
                    return Err(StoreError::Fenced {
                        lease: fence.lease.clone(),
                        epoch: fence.epoch,
                    }
                    .into());
                }
            }
            // The row lock serialises appends to one session, whichever gateway makes them.
            let locked = sqlx::query("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE")
                .bind(session_id)
                .fetch_optional(&mut *tx)
                .await?;
            if locked.is_none() {
                return Err(not_found(session_id).into());
            }
            if contents.is_empty() {
                return Ok(Vec::new());
            }
            let now = now_ms();
            let count = to_i64(contents.len() as u64);
            let [input, output, cache_read, cache_write] = &tokens;
            let mut rows: Vec<(i64, i64)> = sqlx::query_as(
                "WITH base AS (
                     SELECT coalesce(max(seq), 0) AS seq FROM messages WHERE session_id = $1
                 )
                 INSERT INTO messages (session_id, seq, sub, content, model, input_tokens,
                                       output_tokens, cache_read_tokens, cache_write_tokens,
                                       summary, compacted, created)
                 SELECT $1, base.seq + m.ord, 0, m.content, m.model, m.i, m.o, m.cr, m.cw,
                        false, false, $8
                 FROM base, UNNEST($2::text[], $3::text[], $4::bigint[], $5::bigint[],
                                   $6::bigint[], $7::bigint[])
                      WITH ORDINALITY AS m(content, model, i, o, cr, cw, ord)
                 RETURNING id, seq",
            )
            .bind(session_id)
            .bind(&contents)
            .bind(&models)
            .bind(input)
            .bind(output)
            .bind(cache_read)
            .bind(cache_write)
            .bind(now)
            .fetch_all(&mut *tx)
            .await?;
            rows.sort_by_key(|(_, seq)| *seq);
            sqlx::query(
                "UPDATE sessions SET updated = $2, title = coalesce(title, $3),
                                     revision = revision + 1,
                                     message_count = message_count + $4,
                                     input_tokens = input_tokens + $5,
                                     output_tokens = output_tokens + $6,
                                     cache_read_tokens = cache_read_tokens + $7,
                                     cache_write_tokens = cache_write_tokens + $8
                 WHERE id = $1",
            )
            .bind(session_id)
            .bind(now)
            .bind(&first_title)
            .bind(count)
            .bind(to_i64(added.input_tokens))
            .bind(to_i64(added.output_tokens))
            .bind(to_i64(added.cache_read_tokens))
            .bind(to_i64(added.cache_write_tokens))
            .execute(&mut *tx)
            .await?;
            if let Some(a) = answer {
                sqlx::query("DELETE FROM prompt_answers WHERE created < $1")
                    .bind(now - PROMPT_ANSWER_RETENTION_MS)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(
                    "INSERT INTO prompt_answers (agent, session_key, idem_key, request_sha256,
                         session_id, response, input_tokens, output_tokens, cache_read_tokens,
                         cache_write_tokens, created)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
                     ON CONFLICT (agent, session_key, idem_key) DO NOTHING",
                )
                .bind(&a.agent)
                .bind(&a.session_key)
                .bind(&a.key)
                .bind(&a.request_sha256)
                .bind(&a.session_id)
                .bind(&a.response)
                .bind(to_i64(a.usage.input_tokens))
                .bind(to_i64(a.usage.output_tokens))
                .bind(to_i64(a.usage.cache_read_tokens))
                .bind(to_i64(a.usage.cache_write_tokens))
                .bind(now)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok(rows.into_iter().map(|(id, _)| id).collect())
        })
    }

    /// `UPDATE sessions SET <set> WHERE id = $1` with `$2` bound; not found when no row.
    async fn update_session(&self, id: &str, set: &'static str, value: &str) -> Result<(), Fail> {
        let sql = format!("UPDATE sessions SET {set} WHERE id = $1");
        let n = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(value)
            .bind(now_ms())
            .execute(&self.pool)
            .await?
            .rows_affected();
        if n == 0 {
            return Err(not_found(id).into());
        }
        Ok(())
    }
}

async fn set_current(
    tx: &mut sqlx::PgConnection,
    key: &str,
    session_id: &str,
    now: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO session_keys (key, current_session, updated) VALUES ($1, $2, $3)
         ON CONFLICT (key) DO UPDATE SET current_session = EXCLUDED.current_session,
                                         updated = EXCLUDED.updated",
    )
    .bind(key)
    .bind(session_id)
    .bind(now)
    .execute(tx)
    .await?;
    Ok(())
}

async fn ensure_key_row(
    tx: &mut sqlx::PgConnection,
    key: &str,
    now: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO session_keys (key, updated) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
    )
    .bind(key)
    .bind(now)
    .execute(tx)
    .await?;
    Ok(())
}

async fn read_settings<'c, E>(conn: E, key: &str) -> Result<SessionSettings, sqlx::Error>
where
    E: sqlx::PgExecutor<'c>,
{
    let row: Option<(Option<bool>, Option<bool>, Option<String>)> = sqlx::query_as(
        "SELECT \"verbose\", streaming, model_override FROM session_keys WHERE key = $1",
    )
    .bind(key)
    .fetch_optional(conn)
    .await?;
    Ok(row
        .map(|(verbose, streaming, model_override)| SessionSettings {
            verbose,
            streaming,
            model_override,
        })
        .unwrap_or_default())
}

fn parse_metadata(name: &Path, key: &str, text: Option<String>) -> Result<serde_json::Value, Fail> {
    let Some(text) = text else {
        return Ok(serde_json::Value::Object(Default::default()));
    };
    serde_json::from_str(&text).map_err(|e| {
        Fail::Store(corrupt(
            name,
            format!("the metadata of session key {key} is not valid JSON: {e}"),
        ))
    })
}

#[async_trait]
impl SessionStore for PostgresStore {
    async fn create_session(&self, new: NewSession) -> Result<SessionRecord, StoreError> {
        retrying!(self, { self.insert_session(new.clone(), None).await })
    }

    async fn create_child_session(
        &self,
        mut new: NewSession,
        lineage: Lineage,
    ) -> Result<SessionRecord, StoreError> {
        new.parent_id = Some(lineage.parent_session_id.clone());
        retrying!(self, {
            self.insert_session(new.clone(), Some(lineage.clone()))
                .await
        })
    }

    async fn session_lineage(&self, id: &str) -> Result<Option<Lineage>, StoreError> {
        let row: Option<(String, i64, Option<String>, String)> = sqlx::query_as(
            "SELECT parent_session_id, depth, invoked_by_exec, rights
             FROM session_lineage WHERE session_id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| self.fail(e))?;
        let Some((parent, depth, exec, rights)) = row else {
            return Ok(None);
        };
        let rights = serde_json::from_str(&rights).map_err(|e| {
            corrupt(
                &self.name,
                format!("the rights of session {id} are not valid JSON: {e}"),
            )
        })?;
        Ok(Some(Lineage {
            parent_session_id: parent,
            depth: u32::try_from(depth).unwrap_or(u32::MAX),
            invoked_by_exec: exec,
            rights,
        }))
    }

    async fn current_session(&self, key: &str) -> Result<Option<SessionRecord>, StoreError> {
        let sql = format!(
            "{SESSION_SELECT} JOIN session_keys k ON k.current_session = s.id WHERE k.key = $1"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.fail(e))?;
        row.map(|r| session_from_row(&r))
            .transpose()
            .map_err(|e| self.fail(e))
    }

    async fn set_current_session(
        &self,
        key: &str,
        session_id: &str,
    ) -> Result<SessionRecord, StoreError> {
        retrying!(self, {
            let mut tx = self.pool.begin().await?;
            let Some(record) = load_session(&mut *tx, session_id).await? else {
                return Err(not_found(session_id).into());
            };
            set_current(&mut tx, key, session_id, now_ms()).await?;
            tx.commit().await?;
            Ok(record)
        })
    }

    async fn get_session(&self, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        load_session(&self.pool, id).await.map_err(|e| self.fail(e))
    }

    async fn list_sessions(&self, agent: &str) -> Result<Vec<SessionRecord>, StoreError> {
        let sql =
            format!("{SESSION_SELECT} WHERE s.agent = $1 ORDER BY s.created DESC, s.rowid DESC");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(agent)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.fail(e))?;
        rows.iter()
            .map(session_from_row)
            .collect::<Result<_, _>>()
            .map_err(|e| self.fail(e))
    }

    async fn set_session_title(&self, id: &str, title: &str) -> Result<(), StoreError> {
        let r = self
            .update_session(id, "title = $2, updated = $3", title)
            .await;
        self.finish(r)
    }

    async fn set_session_model(&self, id: &str, model: &str) -> Result<(), StoreError> {
        let r = self
            .update_session(id, "model = $2, updated = $3", model)
            .await;
        self.finish(r)
    }

    async fn touch(&self, id: &str) -> Result<(), StoreError> {
        let r = async {
            let n = sqlx::query("UPDATE sessions SET updated = $2 WHERE id = $1")
                .bind(id)
                .bind(now_ms())
                .execute(&self.pool)
                .await?
                .rows_affected();
            if n == 0 {
                return Err(not_found(id).into());
            }
            Ok(())
        }
        .await;
        self.finish(r)
    }

    async fn append_turn(
        &self,
        session_id: &str,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<i64>, StoreError> {
        self.append(session_id, messages, None, None).await
    }

    async fn append_turn_fenced(
        &self,
        session_id: &str,
        messages: Vec<NewMessage>,
        fence: &Fence,
    ) -> Result<Vec<i64>, StoreError> {
        self.append(session_id, messages, Some(fence), None).await
    }

    async fn append_answered_turn(
        &self,
        session_id: &str,
        messages: Vec<NewMessage>,
        fence: Option<&Fence>,
        answer: PromptAnswer,
    ) -> Result<Vec<i64>, StoreError> {
        self.append(session_id, messages, fence, Some(&answer))
            .await
    }

    async fn prompt_answer(
        &self,
        agent: &str,
        session_key: &str,
        key: &str,
    ) -> Result<Option<PromptAnswer>, StoreError> {
        type Raw = (String, String, String, i64, i64, i64, i64, i64);
        let row: Option<Raw> = sqlx::query_as(
            "SELECT request_sha256, session_id, response, input_tokens, output_tokens,
                    cache_read_tokens, cache_write_tokens, created
             FROM prompt_answers
             WHERE agent = $1 AND session_key = $2 AND idem_key = $3 AND created >= $4",
        )
        .bind(agent)
        .bind(session_key)
        .bind(key)
        .bind(now_ms() - PROMPT_ANSWER_RETENTION_MS)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| self.fail(e))?;
        Ok(row.map(
            |(request_sha256, session_id, response, i, o, cr, cw, created)| PromptAnswer {
                agent: agent.to_string(),
                session_key: session_key.to_string(),
                key: key.to_string(),
                request_sha256,
                session_id,
                response,
                usage: Usage {
                    input_tokens: to_u64(i),
                    output_tokens: to_u64(o),
                    cache_read_tokens: to_u64(cr),
                    cache_write_tokens: to_u64(cw),
                },
                created,
            },
        ))
    }

    async fn messages(
        &self,
        session_id: &str,
        include_compacted: bool,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        type Raw = (
            i64,
            i64,
            String,
            Option<String>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            bool,
            bool,
            i64,
        );
        let r = async {
            // One snapshot, so the existence check and the rows agree.
            let mut tx = self.pool.begin().await?;
            tx.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                .await?;
            let exists = sqlx::query("SELECT 1 FROM sessions WHERE id = $1")
                .bind(session_id)
                .fetch_optional(&mut *tx)
                .await?;
            if exists.is_none() {
                return Err(not_found(session_id).into());
            }
            let rows: Vec<Raw> = sqlx::query_as(
                "SELECT id, seq, content, model, input_tokens, output_tokens,
                        cache_read_tokens, cache_write_tokens, summary, compacted, created
                 FROM messages
                 WHERE session_id = $1 AND ($2 OR NOT compacted)
                 ORDER BY seq, sub",
            )
            .bind(session_id)
            .bind(include_compacted)
            .fetch_all(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(rows)
        }
        .await;
        let rows = self.finish(r)?;
        rows.into_iter()
            .map(
                |(id, seq, content, model, i, o, cr, cw, summary, compacted, created)| {
                    let message: Message =
                        serde_json::from_str(&content).map_err(|e| {
                            corrupt(
                        &self.name,
                        format!("message {id} of session {session_id} is not a valid message: {e}"),
                    )
                        })?;
                    let usage = match [i, o, cr, cw] {
                        [None, None, None, None] => None,
                        [i, o, cr, cw] => Some(Usage {
                            input_tokens: to_u64(i.unwrap_or(0)),
                            output_tokens: to_u64(o.unwrap_or(0)),
                            cache_read_tokens: to_u64(cr.unwrap_or(0)),
                            cache_write_tokens: to_u64(cw.unwrap_or(0)),
                        }),
                    };
                    Ok(StoredMessage {
                        id,
                        seq,
                        message,
                        model,
                        usage,
                        compacted,
                        summary,
                        created,
                    })
                },
            )
            .collect()
    }

    async fn compact(
        &self,
        session_id: &str,
        upto_seq: i64,
        summary: Message,
    ) -> Result<(), StoreError> {
        let content = serde_json::to_string(&summary).map_err(|e| StoreError::Invalid {
            message: format!("the summary cannot be encoded as JSON: {e}"),
        })?;
        retrying!(self, {
            let mut tx = self.pool.begin().await?;
            let locked = sqlx::query("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE")
                .bind(session_id)
                .fetch_optional(&mut *tx)
                .await?;
            if locked.is_none() {
                return Err(not_found(session_id).into());
            }
            let now = now_ms();
            let marked = sqlx::query(
                "UPDATE messages SET compacted = true
                 WHERE session_id = $1 AND seq <= $2 AND NOT compacted AND NOT summary",
            )
            .bind(session_id)
            .bind(upto_seq)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if marked == 0 {
                return Err(StoreError::Invalid {
                    message: format!(
                        "session {session_id} has no uncompacted message up to seq {upto_seq}"
                    ),
                }
                .into());
            }
            // Earlier summaries inside the range are replaced by the new one.
            sqlx::query(
                "UPDATE messages SET compacted = true
                 WHERE session_id = $1 AND seq <= $2 AND summary",
            )
            .bind(session_id)
            .bind(upto_seq)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO messages (session_id, seq, sub, content, summary, compacted, created)
                 SELECT $1, $2, coalesce(max(sub), 0) + 1, $3, true, false, $4
                 FROM messages WHERE session_id = $1 AND seq = $2",
            )
            .bind(session_id)
            .bind(upto_seq)
            .bind(&content)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            sqlx::query("UPDATE sessions SET updated = $2, revision = revision + 1 WHERE id = $1")
                .bind(session_id)
                .bind(now)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(())
        })
    }

    async fn message_revision(&self, session_id: &str) -> Result<Option<u64>, StoreError> {
        let revision: Option<i64> =
            sqlx::query_scalar("SELECT revision FROM sessions WHERE id = $1")
                .bind(session_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| self.fail(e))?;
        match revision {
            Some(r) => Ok(Some(to_u64(r))),
            None => Err(not_found(session_id)),
        }
    }

    async fn get_settings(&self, key: &str) -> Result<SessionSettings, StoreError> {
        read_settings(&self.pool, key)
            .await
            .map_err(|e| self.fail(e))
    }

    async fn update_settings(
        &self,
        key: &str,
        patch: SettingsPatch,
    ) -> Result<SessionSettings, StoreError> {
        retrying!(self, {
            let mut tx = self.pool.begin().await?;
            let now = now_ms();
            ensure_key_row(&mut tx, key, now).await?;
            sqlx::query("SELECT 1 FROM session_keys WHERE key = $1 FOR UPDATE")
                .bind(key)
                .execute(&mut *tx)
                .await?;
            let mut settings = read_settings(&mut *tx, key).await?;
            if let Some(v) = patch.verbose {
                settings.verbose = v;
            }
            if let Some(v) = patch.streaming {
                settings.streaming = v;
            }
            if let Some(v) = &patch.model_override {
                settings.model_override = v.clone();
            }
            sqlx::query(
                "UPDATE session_keys SET \"verbose\" = $2, streaming = $3, model_override = $4,
                                         updated = $5
                 WHERE key = $1",
            )
            .bind(key)
            .bind(settings.verbose)
            .bind(settings.streaming)
            .bind(&settings.model_override)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(settings)
        })
    }

    async fn get_metadata(&self, key: &str) -> Result<serde_json::Value, StoreError> {
        let r = async {
            let text: Option<String> =
                sqlx::query_scalar("SELECT metadata::text FROM session_keys WHERE key = $1")
                    .bind(key)
                    .fetch_optional(&self.pool)
                    .await?;
            parse_metadata(&self.name, key, text)
        }
        .await;
        self.finish(r)
    }

    async fn set_metadata(
        &self,
        key: &str,
        field: &str,
        value: serde_json::Value,
    ) -> Result<(), StoreError> {
        retrying!(self, {
            let mut tx = self.pool.begin().await?;
            let now = now_ms();
            ensure_key_row(&mut tx, key, now).await?;
            let text: Option<String> = sqlx::query_scalar(
                "SELECT metadata::text FROM session_keys WHERE key = $1 FOR UPDATE",
            )
            .bind(key)
            .fetch_optional(&mut *tx)
            .await?;
            let mut metadata = match parse_metadata(&self.name, key, text)? {
                serde_json::Value::Object(map) => map,
                _ => serde_json::Map::new(),
            };
            if value.is_null() {
                metadata.remove(field);
            } else {
                metadata.insert(field.to_string(), value.clone());
            }
            let text = serde_json::Value::Object(metadata).to_string();
            sqlx::query(
                "UPDATE session_keys SET metadata = $2::jsonb, updated = $3 WHERE key = $1",
            )
            .bind(key)
            .bind(text)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(())
        })
    }
}

/// The sums every ledger query selects, in [`totals_row`]'s order.
const LEDGER_SUMS: &str =
    "count(*), coalesce(sum(input_tokens), 0)::bigint, coalesce(sum(output_tokens), 0)::bigint,
     coalesce(sum(cache_read_tokens), 0)::bigint, coalesce(sum(cache_write_tokens), 0)::bigint,
     coalesce(sum(cost_micros), 0)::bigint, count(*) FILTER (WHERE unpriced)";

/// [`LEDGER_SUMS`] from column `at` on.
fn totals_row(r: &PgRow, at: usize) -> Result<UsageTotals, sqlx::Error> {
    Ok(UsageTotals {
        calls: to_u64(r.try_get(at)?),
        input_tokens: to_u64(r.try_get(at + 1)?),
        output_tokens: to_u64(r.try_get(at + 2)?),
        cache_read_tokens: to_u64(r.try_get(at + 3)?),
        cache_write_tokens: to_u64(r.try_get(at + 4)?),
        cost_micros: r.try_get(at + 5)?,
        unpriced_calls: to_u64(r.try_get(at + 6)?),
    })
}

#[async_trait]
impl UsageLedger for PostgresStore {
    async fn record_usage(&self, e: LedgerEntry) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO usage (ts, agent, session_id, session_key, turn_id, model,
                 input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
                 cost_micros, unpriced, parent_session_id)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
        )
        .bind(e.ts)
        .bind(&e.agent)
        .bind(&e.session_id)
        .bind(&e.session_key)
        .bind(&e.turn_id)
        .bind(&e.model)
        .bind(to_i64(e.usage.input_tokens))
        .bind(to_i64(e.usage.output_tokens))
        .bind(to_i64(e.usage.cache_read_tokens))
        .bind(to_i64(e.usage.cache_write_tokens))
        .bind(e.cost_micros)
        .bind(e.unpriced)
        .bind(&e.parent_session_id)
        .execute(&self.pool)
        .await
        .map_err(|e| self.fail(e))?;
        Ok(())
    }

    async fn usage_totals(&self, f: LedgerFilter) -> Result<UsageTotals, StoreError> {
        let row = if let (Some(root), true) = (&f.session_id, f.with_children) {
            // The session and every session below it, linked by the rows' parents.
            let sql = format!(
                "WITH RECURSIVE tree(id) AS (
                     SELECT $2::text
                     UNION
                     SELECT u.session_id FROM usage u JOIN tree t ON u.parent_session_id = t.id
                     WHERE u.session_id IS NOT NULL
                 )
                 SELECT {LEDGER_SUMS} FROM usage
                 WHERE ($1::text IS NULL OR agent = $1) AND session_id IN (SELECT id FROM tree)
                   AND ($3::bigint IS NULL OR ts >= $3)"
            );
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(&f.agent)
                .bind(root)
                .bind(f.since_ms)
                .fetch_one(&self.pool)
                .await
        } else {
            let sql = format!(
                "SELECT {LEDGER_SUMS} FROM usage
                 WHERE ($1::text IS NULL OR agent = $1) AND ($2::text IS NULL OR session_id = $2)
                   AND ($3::bigint IS NULL OR ts >= $3)"
            );
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(&f.agent)
                .bind(&f.session_id)
                .bind(f.since_ms)
                .fetch_one(&self.pool)
                .await
        };
        let row = row.map_err(|e| self.fail(e))?;
        totals_row(&row, 0).map_err(|e| self.fail(e))
    }

    async fn usage_report(&self, q: UsageQuery) -> Result<UsageReport, StoreError> {
        let key = match q.by {
            UsageGroupBy::Agent => "agent",
            UsageGroupBy::Session => "coalesce(session_id, '')",
            UsageGroupBy::Model => "model",
            UsageGroupBy::Day => {
                "to_char(to_timestamp(ts / 1000) AT TIME ZONE 'UTC', 'YYYY-MM-DD')"
            }
        };
        let sql = format!(
            "SELECT {key} COLLATE \"C\" AS k, {LEDGER_SUMS} FROM usage
             WHERE ($1::text IS NULL OR agent = $1) AND ($2::bigint IS NULL OR ts >= $2)
             GROUP BY k ORDER BY k"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&q.agent)
            .bind(q.since_ms)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.fail(e))?;
        let rows = rows
            .iter()
            .map(|r| {
                Ok(UsageRow {
                    key: r.try_get(0)?,
                    totals: totals_row(r, 1)?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(|e| self.fail(e))?;
        Ok(UsageReport::new(q.by, rows))
    }
}

#[async_trait]
impl HealthStore for PostgresStore {
    async fn load_health(&self) -> Result<Vec<HealthRecord>, StoreError> {
        let rows: Vec<(String, Option<i64>, i64, Option<String>)> = sqlx::query_as(
            "SELECT model_key, cooldown_until, consecutive_failures, last_error
             FROM provider_health ORDER BY model_key COLLATE \"C\"",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.fail(e))?;
        Ok(rows
            .into_iter()
            .map(
                |(model_key, cooldown_until, failures, last_error)| HealthRecord {
                    model_key,
                    cooldown_until,
                    consecutive_failures: u32::try_from(failures).unwrap_or(u32::MAX),
                    last_error,
                },
            )
            .collect())
    }

    async fn save_health(&self, record: HealthRecord) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO provider_health
                 (model_key, cooldown_until, consecutive_failures, last_error, updated)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (model_key) DO UPDATE SET
                 cooldown_until = EXCLUDED.cooldown_until,
                 consecutive_failures = EXCLUDED.consecutive_failures,
                 last_error = EXCLUDED.last_error,
                 updated = EXCLUDED.updated",
        )
        .bind(&record.model_key)
        .bind(record.cooldown_until)
        .bind(i64::from(record.consecutive_failures))
        .bind(&record.last_error)
        .bind(now_ms())
        .execute(&self.pool)
        .await
        .map_err(|e| self.fail(e))?;
        Ok(())
    }

    async fn clear_health(&self, model_key: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM provider_health WHERE model_key = $1")
            .bind(model_key)
            .execute(&self.pool)
            .await
            .map_err(|e| self.fail(e))?;
        Ok(())
    }
}

#[async_trait]
impl ChannelState for PostgresStore {
    async fn get_offset(&self, channel: &str) -> Result<Option<i64>, StoreError> {
        sqlx::query_scalar("SELECT value FROM channel_offsets WHERE channel = $1")
            .bind(channel)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.fail(e))
    }

    async fn set_offset(&self, channel: &str, value: i64) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO channel_offsets (channel, value, updated) VALUES ($1, $2, $3)
             ON CONFLICT (channel) DO UPDATE SET value = EXCLUDED.value,
                                                 updated = EXCLUDED.updated",
        )
        .bind(channel)
        .bind(value)
        .bind(now_ms())
        .execute(&self.pool)
        .await
        .map_err(|e| self.fail(e))?;
        Ok(())
    }

    async fn mark_seen(&self, channel: &str, update_id: i64) -> Result<bool, StoreError> {
        retrying!(self, {
            let mut tx = self.pool.begin().await?;
            let inserted = sqlx::query(
                "INSERT INTO channel_seen (channel, update_id, seen_at) VALUES ($1, $2, $3)
                 ON CONFLICT (channel, update_id) DO NOTHING",
            )
            .bind(channel)
            .bind(update_id)
            .bind(now_ms())
            .execute(&mut *tx)
            .await?
            .rows_affected()
                == 1;
            if inserted {
                let window = i64::try_from(SEEN_WINDOW).unwrap_or(i64::MAX);
                sqlx::query(
                    "DELETE FROM channel_seen WHERE channel = $1 AND id <= (
                         SELECT id FROM channel_seen WHERE channel = $1
                         ORDER BY id DESC LIMIT 1 OFFSET $2)",
                )
                .bind(channel)
                .bind(window)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok(inserted)
        })
    }

    async fn enqueue_outbox(
        &self,
        channel: &str,
        payload: serde_json::Value,
    ) -> Result<i64, StoreError> {
        enqueue(&self.pool, channel, &payload.to_string(), now_ms())
            .await
            .map_err(|e| self.fail(e))
    }

    async fn due_outbox(
        &self,
        channel: &str,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<OutboxItem>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows: Vec<(i64, String, i64, i64, Option<String>, i64)> = sqlx::query_as(
            "SELECT id, payload, attempts, next_attempt_at, last_error, created
             FROM outbox WHERE channel = $1 AND next_attempt_at <= $2
             ORDER BY id LIMIT $3",
        )
        .bind(channel)
        .bind(now_ms)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.fail(e))?;
        rows.into_iter()
            .map(
                |(id, payload, attempts, next_attempt_at, last_error, created)| {
                    let payload = serde_json::from_str(&payload).map_err(|e| {
                        corrupt(
                            &self.name,
                            format!("outbox item {id} is not valid JSON: {e}"),
                        )
                    })?;
                    Ok(OutboxItem {
                        id,
                        channel: channel.to_string(),
                        payload,
                        attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
                        next_attempt_at,
                        last_error,
                        created,
                    })
                },
            )
            .collect()
    }

    async fn outbox_done(&self, id: i64) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM outbox WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await
            .map_err(|e| self.fail(e))?;
        Ok(())
    }

    async fn outbox_retry(
        &self,
        id: i64,
        next_attempt_at: i64,
        error: &str,
    ) -> Result<(), StoreError> {
        let n = sqlx::query(
            "UPDATE outbox SET attempts = attempts + 1, next_attempt_at = $2, last_error = $3
             WHERE id = $1",
        )
        .bind(id)
        .bind(next_attempt_at)
        .bind(error)
        .execute(&self.pool)
        .await
        .map_err(|e| self.fail(e))?
        .rows_affected();
        if n == 0 {
            return Err(StoreError::NotFound {
                what: "outbox item",
                id: id.to_string(),
            });
        }
        Ok(())
    }
}

/// Queue one outbound message; its id.
async fn enqueue<'c, E>(conn: E, channel: &str, payload: &str, now: i64) -> Result<i64, sqlx::Error>
where
    E: sqlx::PgExecutor<'c>,
{
    sqlx::query_scalar(
        "INSERT INTO outbox (channel, payload, attempts, next_attempt_at, created)
         VALUES ($1, $2, 0, $3, $3) RETURNING id",
    )
    .bind(channel)
    .bind(payload)
    .bind(now)
    .fetch_one(conn)
    .await
}

/// Entries and bytes `plugin` holds in `scope`, or in all its scopes.
async fn read_usage<'c, E>(
    conn: E,
    plugin: &str,
    scope: Option<&str>,
) -> Result<KvUsage, sqlx::Error>
where
    E: sqlx::PgExecutor<'c>,
{
    let (entries, bytes): (i64, i64) = sqlx::query_as(
        "SELECT coalesce(sum(entries), 0)::bigint, coalesce(sum(bytes), 0)::bigint
         FROM plugin_kv_usage WHERE plugin = $1 AND ($2::text IS NULL OR scope = $2)",
    )
    .bind(plugin)
    .bind(scope)
    .fetch_one(conn)
    .await?;
    Ok(KvUsage {
        entries: to_u64(entries),
        bytes: to_u64(bytes),
    })
}

const KV_UPSERT: &str = "INSERT INTO plugin_kv (plugin, scope, key, value, updated)
     VALUES ($1, $2, $3, $4, $5)
     ON CONFLICT (plugin, scope, key) DO UPDATE SET value = EXCLUDED.value,
                                                    updated = EXCLUDED.updated";

#[async_trait]
impl PluginData for PostgresStore {
    async fn kv_get(
        &self,
        plugin: &str,
        scope: &str,
        key: &str,
    ) -> Result<Option<String>, StoreError> {
        sqlx::query_scalar(
            "SELECT value FROM plugin_kv WHERE plugin = $1 AND scope = $2 AND key = $3",
        )
        .bind(plugin)
        .bind(scope)
        .bind(key)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| self.fail(e))
    }

    async fn kv_set(
        &self,
        plugin: &str,
        scope: &str,
        key: &str,
        value: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(KV_UPSERT)
            .bind(plugin)
            .bind(scope)
            .bind(key)
            .bind(value)
            .bind(now_ms())
            .execute(&self.pool)
            .await
            .map_err(|e| self.fail(e))?;
        Ok(())
    }

    async fn kv_set_within(
        &self,
        plugin: &str,
        scope: &str,
        key: &str,
        value: &str,
        limits: KvLimits,
    ) -> Result<KvWrite, StoreError> {
        retrying!(self, {
            let mut tx = self.pool.begin().await?;
            // One lock per plugin for the check and the write: concurrent sets, from this
            // gateway or another, cannot together overshoot a limit.
            sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('beige.kv:' || $1, 0))")
                .bind(plugin)
                .execute(&mut *tx)
                .await?;
            let old: Option<i64> = sqlx::query_scalar(
                "SELECT (octet_length(key) + octet_length(value))::bigint FROM plugin_kv
                 WHERE plugin = $1 AND scope = $2 AND key = $3",
            )
            .bind(plugin)
            .bind(scope)
            .bind(key)
            .fetch_optional(&mut *tx)
            .await?;
            let usage =
                read_usage(&mut *tx, plugin, (!limits.whole_plugin).then_some(scope)).await?;
            if let Some(refusal) = super::kv_limit_check(limits, usage, old.map(to_u64), key, value)
            {
                return Ok(refusal);
            }
            sqlx::query(KV_UPSERT)
                .bind(plugin)
                .bind(scope)
                .bind(key)
                .bind(value)
                .bind(now_ms())
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(KvWrite::Stored)
        })
    }

    async fn kv_usage(&self, plugin: &str, scope: Option<&str>) -> Result<KvUsage, StoreError> {
        read_usage(&self.pool, plugin, scope)
            .await
            .map_err(|e| self.fail(e))
    }

    async fn kv_del(&self, plugin: &str, scope: &str, key: &str) -> Result<bool, StoreError> {
        let n = sqlx::query("DELETE FROM plugin_kv WHERE plugin = $1 AND scope = $2 AND key = $3")
            .bind(plugin)
            .bind(scope)
            .bind(key)
            .execute(&self.pool)
            .await
            .map_err(|e| self.fail(e))?
            .rows_affected();
        Ok(n > 0)
    }

    async fn kv_list(
        &self,
        plugin: &str,
        scope: &str,
        prefix: &str,
    ) -> Result<Vec<String>, StoreError> {
        // starts_with compares characters, not LIKE patterns: `%` and `_` are literal.
        sqlx::query_scalar(
            "SELECT key FROM plugin_kv
             WHERE plugin = $1 AND scope = $2 AND starts_with(key, $3)
             ORDER BY key",
        )
        .bind(plugin)
        .bind(scope)
        .bind(prefix)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.fail(e))
    }
}

/// A hash of the migrations' text (FNV-1a): the tests' template database is rebuilt when
/// it changes, even without a new version number.
#[cfg(test)]
pub(super) fn migrations_fingerprint() -> u64 {
    schema::MIGRATIONS
        .iter()
        .flat_map(|m| m.bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

#[cfg(test)]
mod retry_tests {
    use sqlx::Executor as _;

    use super::*;

    /// A transaction that fails with `code` (raised by the real server) in its first
    /// `failing` attempts and commits after; returns the result and the attempts made.
    async fn run(
        store: &PostgresStore,
        code: &str,
        failing: u32,
    ) -> (Result<u32, StoreError>, u32) {
        let mut attempts = 0;
        let raise = format!("DO $$ BEGIN RAISE EXCEPTION 'test' USING ERRCODE = '{code}'; END $$");
        let r = retrying!(store, {
            attempts += 1;
            let mut tx = store.pool.begin().await?;
            if attempts <= failing {
                tx.execute(sqlx::AssertSqlSafe(raise.clone())).await?;
            }
            tx.commit().await?;
            Ok(attempts)
        });
        (r, attempts)
    }

    #[tokio::test]
    async fn aborted_transactions_run_again_and_other_failures_do_not() {
        let Some(url) = beige_testkit::postgres::url() else {
            return;
        };
        let store = PostgresStore::connect_lazy(&PostgresOptions::new(&url)).expect("store");
        // A deadlock's victim and a serialization failure: run again until they commit.
        for code in ["40P01", "40001"] {
            let (r, attempts) = run(&store, code, 2).await;
            assert_eq!(r.expect("committed after retries"), 3, "{code}");
            assert_eq!(attempts, 3);
        }
        // One that keeps failing is reported as `Locked` after the last retry.
        let (r, attempts) = run(&store, "40001", u32::MAX).await;
        assert!(matches!(r, Err(StoreError::Locked { .. })), "{r:?}");
        assert_eq!(attempts, 1 + TRANSIENT_RETRIES);
        // Any other failure is returned at once (here a unique violation).
        let (r, attempts) = run(&store, "23505", 1).await;
        assert!(matches!(r, Err(StoreError::Backend { .. })), "{r:?}");
        assert_eq!(attempts, 1);
    }
}
