//! [`SqliteStore`]: the whole [`Store`](super::Store) on one SQLite file (WAL mode,
//! foreign keys on, schema migrations versioned in code with `PRAGMA user_version`).
//!
//! rusqlite is blocking, so every call runs on `tokio::task::spawn_blocking` with the one
//! connection behind a mutex: one writer at a time, which is all a single gateway needs.
//! A call whose future is dropped still finishes its transaction, so it either commits
//! whole or not at all.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior};

use super::{
    now_ms, title_from, ChannelState, Fence, HealthRecord, HealthStore, KvLimits, KvUsage, KvWrite,
    Lineage, NewMessage, NewSession, OutboxItem, PluginData, PromptAnswer, SessionRecord,
    SessionSettings, SessionStore, SettingsPatch, StoreError, StoredMessage,
    PROMPT_ANSWER_RETENTION_MS, SEEN_WINDOW,
};
use super::{
    LedgerEntry, LedgerFilter, UsageGroupBy, UsageLedger, UsageQuery, UsageReport, UsageRow,
    UsageTotals,
};
use crate::llm::{Message, Role, Usage};

// The `ScheduleStore` half, in its own file; a child module so it shares `run`.
#[path = "sqlite_schedules.rs"]
mod schedules;

// The `CredentialStore` half (personal API tokens).
#[path = "sqlite_credentials.rs"]
mod credentials;

// The `Coordination` half (leases).
#[path = "sqlite_coordination.rs"]
mod coordination;

/// How long a call waits for a lock held by another connection before failing with
/// [`StoreError::Locked`].
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The schema, one entry per version: entry `i` takes the database from version `i` to
/// `i + 1`. Append new entries; never edit a released one.
pub(super) const MIGRATIONS: &[&str] = &[
    // 1: the initial schema.
    r#"
    CREATE TABLE sessions (
        id        TEXT PRIMARY KEY NOT NULL,
        agent     TEXT NOT NULL,
        key       TEXT NOT NULL,
        parent_id TEXT REFERENCES sessions(id),
        title     TEXT,
        model     TEXT,
        created   INTEGER NOT NULL,
        updated   INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX sessions_by_agent ON sessions(agent, created);
    CREATE INDEX sessions_by_parent ON sessions(parent_id);

    -- One row per session key: its current session, settings overrides and metadata.
    CREATE TABLE session_keys (
        key             TEXT PRIMARY KEY NOT NULL,
        current_session TEXT REFERENCES sessions(id),
        verbose         INTEGER,
        streaming       INTEGER,
        model_override  TEXT,
        metadata        TEXT NOT NULL DEFAULT '{}',
        updated         INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX session_keys_by_session ON session_keys(current_session);

    -- Order within a session is (seq, sub): messages have sub = 0; a compaction summary
    -- takes the seq of the last message it replaces and sub = 1, 2, … so it sorts after
    -- the compacted messages and before the ones kept.
    CREATE TABLE messages (
        id                 INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id         TEXT NOT NULL REFERENCES sessions(id),
        seq                INTEGER NOT NULL,
        sub                INTEGER NOT NULL DEFAULT 0,
        content            TEXT NOT NULL,
        model              TEXT,
        input_tokens       INTEGER,
        output_tokens      INTEGER,
        cache_read_tokens  INTEGER,
        cache_write_tokens INTEGER,
        summary            INTEGER NOT NULL DEFAULT 0,
        compacted          INTEGER NOT NULL DEFAULT 0,
        created            INTEGER NOT NULL,
        UNIQUE (session_id, seq, sub)
    ) STRICT;

    CREATE TABLE provider_health (
        model_key            TEXT PRIMARY KEY NOT NULL,
        cooldown_until       INTEGER,
        consecutive_failures INTEGER NOT NULL DEFAULT 0,
        last_error           TEXT,
        updated              INTEGER NOT NULL
    ) STRICT;

    CREATE TABLE channel_offsets (
        channel TEXT PRIMARY KEY NOT NULL,
        value   INTEGER NOT NULL,
        updated INTEGER NOT NULL
    ) STRICT;

    CREATE TABLE channel_seen (
        id        INTEGER PRIMARY KEY,
        channel   TEXT NOT NULL,
        update_id INTEGER NOT NULL,
        seen_at   INTEGER NOT NULL,
        UNIQUE (channel, update_id)
    ) STRICT;
    CREATE INDEX channel_seen_by_age ON channel_seen(channel, id);

    CREATE TABLE outbox (
        id              INTEGER PRIMARY KEY AUTOINCREMENT,
        channel         TEXT NOT NULL,
        payload         TEXT NOT NULL,
        attempts        INTEGER NOT NULL DEFAULT 0,
        next_attempt_at INTEGER NOT NULL,
        last_error      TEXT,
        created         INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX outbox_due ON outbox(channel, next_attempt_at, id);

    CREATE TABLE plugin_kv (
        plugin  TEXT NOT NULL,
        scope   TEXT NOT NULL,
        key     TEXT NOT NULL,
        value   TEXT NOT NULL,
        updated INTEGER NOT NULL,
        PRIMARY KEY (plugin, scope, key)
    ) WITHOUT ROWID, STRICT;
    "#,
    // 2: what each plugin holds per scope (entries, and bytes of keys plus values as
    // UTF-8), kept by triggers on every write path, so limits are checked without a scan.
    r#"
    CREATE TABLE plugin_kv_usage (
        plugin  TEXT NOT NULL,
        scope   TEXT NOT NULL,
        entries INTEGER NOT NULL,
        bytes   INTEGER NOT NULL,
        PRIMARY KEY (plugin, scope)
    ) WITHOUT ROWID, STRICT;

    INSERT INTO plugin_kv_usage (plugin, scope, entries, bytes)
        SELECT plugin, scope, count(*),
               sum(length(CAST(key AS BLOB)) + length(CAST(value AS BLOB)))
        FROM plugin_kv GROUP BY plugin, scope;

    CREATE TRIGGER plugin_kv_usage_insert AFTER INSERT ON plugin_kv BEGIN
        INSERT INTO plugin_kv_usage (plugin, scope, entries, bytes)
            SELECT NEW.plugin, NEW.scope, 0, 0
            WHERE NOT EXISTS (SELECT 1 FROM plugin_kv_usage
                              WHERE plugin = NEW.plugin AND scope = NEW.scope);
        UPDATE plugin_kv_usage
            SET entries = entries + 1,
                bytes = bytes + length(CAST(NEW.key AS BLOB)) + length(CAST(NEW.value AS BLOB))
            WHERE plugin = NEW.plugin AND scope = NEW.scope;
    END;

    CREATE TRIGGER plugin_kv_usage_update AFTER UPDATE ON plugin_kv BEGIN
        UPDATE plugin_kv_usage
            SET entries = entries - 1,
                bytes = bytes - length(CAST(OLD.key AS BLOB)) - length(CAST(OLD.value AS BLOB))
            WHERE plugin = OLD.plugin AND scope = OLD.scope;
        INSERT INTO plugin_kv_usage (plugin, scope, entries, bytes)
            SELECT NEW.plugin, NEW.scope, 0, 0
            WHERE NOT EXISTS (SELECT 1 FROM plugin_kv_usage
                              WHERE plugin = NEW.plugin AND scope = NEW.scope);
        UPDATE plugin_kv_usage
            SET entries = entries + 1,
                bytes = bytes + length(CAST(NEW.key AS BLOB)) + length(CAST(NEW.value AS BLOB))
            WHERE plugin = NEW.plugin AND scope = NEW.scope;
        DELETE FROM plugin_kv_usage
            WHERE plugin = OLD.plugin AND scope = OLD.scope AND entries <= 0;
    END;

    CREATE TRIGGER plugin_kv_usage_delete AFTER DELETE ON plugin_kv BEGIN
        UPDATE plugin_kv_usage
            SET entries = entries - 1,
                bytes = bytes - length(CAST(OLD.key AS BLOB)) - length(CAST(OLD.value AS BLOB))
            WHERE plugin = OLD.plugin AND scope = OLD.scope;
        DELETE FROM plugin_kv_usage
            WHERE plugin = OLD.plugin AND scope = OLD.scope AND entries <= 0;
    END;
    "#,
    // 3: the cost ledger, one row per model call. No foreign key to sessions: the ledger
    // outlives whatever happens to them.
    r#"
    CREATE TABLE usage (
        id                 INTEGER PRIMARY KEY AUTOINCREMENT,
        ts                 INTEGER NOT NULL,
        agent              TEXT NOT NULL,
        session_id         TEXT,
        session_key        TEXT,
        turn_id            TEXT,
        model              TEXT NOT NULL,
        input_tokens       INTEGER NOT NULL,
        output_tokens      INTEGER NOT NULL,
        cache_read_tokens  INTEGER NOT NULL,
        cache_write_tokens INTEGER NOT NULL,
        cost_micros        INTEGER NOT NULL,
        unpriced           INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX usage_by_agent ON usage(agent, ts);
    CREATE INDEX usage_by_session ON usage(session_id);
    CREATE INDEX usage_by_ts ON usage(ts);
    "#,
    // 4: sub-agents (`spawn`): the lineage of each child session, written with it, and
    // the parent of the session a ledger row was spent in, so that a parent's totals
    // include its children's. Self-contained: it touches no table of later versions.
    r#"
    CREATE TABLE session_lineage (
        session_id        TEXT PRIMARY KEY NOT NULL REFERENCES sessions(id),
        parent_session_id TEXT NOT NULL REFERENCES sessions(id),
        depth             INTEGER NOT NULL,
        invoked_by_exec   TEXT,
        rights            TEXT NOT NULL,
        created           INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX session_lineage_by_parent ON session_lineage(parent_session_id);
    ALTER TABLE usage ADD COLUMN parent_session_id TEXT;
    CREATE INDEX usage_by_parent ON usage(parent_session_id);
    "#,
    // 5: schedules: the schedules and one run per fire instant. UNIQUE(schedule_id,
    // fire_at) is what makes a second claim of an instant impossible. `spec` is the whole
    // definition (JSON); the columns after it repeat parts of it for queries.
    r#"
    CREATE TABLE schedules (
        id             TEXT PRIMARY KEY NOT NULL,
        agent          TEXT NOT NULL,
        owner          TEXT NOT NULL,
        spec           TEXT NOT NULL,
        tz             TEXT,
        kind           TEXT NOT NULL,
        payload        TEXT NOT NULL,
        session_mode   TEXT NOT NULL,
        deliver        TEXT,
        missed         TEXT NOT NULL,
        overlap        TEXT NOT NULL,
        budget         TEXT,
        tools          TEXT,
        state          TEXT NOT NULL,
        next_fire_at   INTEGER,
        policy_version TEXT,
        created_by     TEXT NOT NULL,
        created        INTEGER NOT NULL,
        updated        INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX schedules_by_agent ON schedules(agent, id);
    CREATE INDEX schedules_due ON schedules(state, next_fire_at);

    CREATE TABLE schedule_runs (
        id           TEXT PRIMARY KEY NOT NULL,
        schedule_id  TEXT NOT NULL REFERENCES schedules(id),
        fire_at      INTEGER NOT NULL,
        missed_count INTEGER NOT NULL DEFAULT 0,
        status       TEXT NOT NULL,
        claimed_by   TEXT NOT NULL,
        started_at   INTEGER,
        finished_at  INTEGER,
        session_id   TEXT,
        exec_id      TEXT,
        cost_micros  INTEGER NOT NULL DEFAULT 0,
        summary      TEXT,
        error        TEXT,
        UNIQUE (schedule_id, fire_at)
    ) STRICT;
    CREATE INDEX schedule_runs_by_status ON schedule_runs(status, fire_at);
    "#,
    // 6: per session, the revision of its messages, raised by every append and
    // compaction in the transaction that writes them (`SessionStore::message_revision`:
    // the gateway checks its in-memory copy of a session's context against it), and the
    // totals a `SessionRecord` reports, kept by the append instead of summed over every
    // message at each read (which made each prompt's session lookup cost grow with the
    // session). Totals of sessions already stored are counted once, here.
    r#"
    ALTER TABLE sessions ADD COLUMN revision INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN message_count INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN input_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN output_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN cache_read_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE sessions ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0;
    UPDATE sessions SET
        message_count = (SELECT COUNT(*) FROM messages m
                         WHERE m.session_id = sessions.id AND m.summary = 0),
        input_tokens = (SELECT COALESCE(SUM(m.input_tokens), 0) FROM messages m
                        WHERE m.session_id = sessions.id),
        output_tokens = (SELECT COALESCE(SUM(m.output_tokens), 0) FROM messages m
                         WHERE m.session_id = sessions.id),
        cache_read_tokens = (SELECT COALESCE(SUM(m.cache_read_tokens), 0) FROM messages m
                             WHERE m.session_id = sessions.id),
        cache_write_tokens = (SELECT COALESCE(SUM(m.cache_write_tokens), 0) FROM messages m
                              WHERE m.session_id = sessions.id);
    "#,
    // 7: personal API tokens of the gateway's users (`spec/people.md` §1.1): the hash of
    // the secret only, looked up by the token's public id.
    r#"
    CREATE TABLE api_tokens (
        id            TEXT PRIMARY KEY NOT NULL,
        user          TEXT NOT NULL,
        name          TEXT NOT NULL,
        scope         TEXT NOT NULL,
        created       INTEGER NOT NULL,
        expires       INTEGER,
        last_used     INTEGER,
        revoked       INTEGER NOT NULL DEFAULT 0,
        secret_sha256 TEXT NOT NULL
    ) STRICT;
    CREATE INDEX api_tokens_by_user ON api_tokens(user, created);
    "#,
    // 8: leases of gateways that share a database (`Coordination`, spec/scale.md §3):
    // one row per lease, kept after release; epochs only grow.
    r#"
    CREATE TABLE leases (
        name       TEXT PRIMARY KEY NOT NULL,
        holder     TEXT,
        epoch      INTEGER NOT NULL DEFAULT 0,
        expires_at INTEGER NOT NULL
    ) STRICT;
    "#,
    // 9: the answers of prompts sent with an idempotency key, written with their turn;
    // kept a day (`PROMPT_ANSWER_RETENTION_MS`), pruned by `created` at each write.
    r#"
    CREATE TABLE prompt_answers (
        agent              TEXT NOT NULL,
        session_key        TEXT NOT NULL,
        idem_key           TEXT NOT NULL,
        request_sha256     TEXT NOT NULL,
        session_id         TEXT NOT NULL,
        response           TEXT NOT NULL,
        input_tokens       INTEGER NOT NULL,
        output_tokens      INTEGER NOT NULL,
        cache_read_tokens  INTEGER NOT NULL,
        cache_write_tokens INTEGER NOT NULL,
        created            INTEGER NOT NULL,
        PRIMARY KEY (agent, session_key, idem_key)
    ) STRICT;
    CREATE INDEX prompt_answers_by_created ON prompt_answers(created);
    "#,
];

/// The schema version this binary writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The [`Store`](super::Store) on a SQLite file, normally `<BEIGE_HOME>/beige.db`.
#[derive(Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    path: Arc<Path>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// Why a call failed, before the database path is attached.
enum Fail {
    Sql(rusqlite::Error),
    Store(StoreError),
}

impl From<rusqlite::Error> for Fail {
    fn from(e: rusqlite::Error) -> Self {
        Fail::Sql(e)
    }
}

impl From<StoreError> for Fail {
    fn from(e: StoreError) -> Self {
        Fail::Store(e)
    }
}

impl Fail {
    fn into_store_error(self, path: &Path) -> StoreError {
        match self {
            Fail::Sql(e) => classify(e, path),
            Fail::Store(e) => e,
        }
    }
}

/// Turn a SQLite error into the [`StoreError`] that tells the user what to do.
pub(super) fn classify(err: rusqlite::Error, path: &Path) -> StoreError {
    let path = path.to_path_buf();
    match err.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreError::Locked { path },
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => StoreError::Corrupt {
            path,
            detail: err.to_string(),
        },
        Some(ErrorCode::DiskFull) => StoreError::DiskFull { path },
        Some(ErrorCode::CannotOpen | ErrorCode::PermissionDenied | ErrorCode::ReadOnly) => {
            StoreError::CannotOpen {
                path,
                detail: err.to_string(),
            }
        }
        _ => StoreError::Backend {
            path,
            source: Box::new(err),
        },
    }
}

fn not_found(id: &str) -> Fail {
    Fail::Store(StoreError::NotFound {
        what: "session",
        id: id.to_string(),
    })
}

fn corrupt(path: &Path, detail: String) -> StoreError {
    StoreError::Corrupt {
        path: path.to_path_buf(),
        detail,
    }
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl SqliteStore {
    /// Open (creating it with mode 0600 if needed) the database at `path` and bring its
    /// schema up to date. Blocking: call it at startup or inside `spawn_blocking`. The
    /// directory must exist.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path: Arc<Path> = Arc::from(path.as_ref());
        create_private_file(&path)?;
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| classify(e, &path))?;
        let mut conn = configure(conn, &path).map_err(|f| f.into_store_error(&path))?;
        migrate(&mut conn, &path)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            path,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Run `f` on the connection in a blocking thread.
    async fn run<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection, &Path) -> Result<T, Fail> + Send + 'static,
    {
        let conn = Arc::clone(&self.conn);
        let path = Arc::clone(&self.path);
        let joined = tokio::task::spawn_blocking(move || {
            // A panic inside a call rolled its transaction back while unwinding, so the
            // connection is still consistent: keep using it.
            let mut guard = conn.lock().unwrap_or_else(PoisonError::into_inner);
            f(&mut guard, &path).map_err(|fail| fail.into_store_error(&path))
        })
        .await;
        match joined {
            Ok(result) => result,
            Err(e) => Err(StoreError::Backend {
                path: self.path.to_path_buf(),
                source: format!("the database worker stopped: {e}").into(),
            }),
        }
    }

    /// Append one turn in one transaction, with `answer` when it has one.
    async fn append(
        &self,
        session_id: &str,
        messages: Vec<NewMessage>,
        answer: Option<PromptAnswer>,
    ) -> Result<Vec<i64>, StoreError> {
        // Serialise everything before the transaction starts: a message that cannot be
        // encoded fails the turn before anything is written.
        let mut rows = Vec::with_capacity(messages.len());
        for (i, m) in messages.into_iter().enumerate() {
            let content = serde_json::to_string(&m.message).map_err(|e| StoreError::Invalid {
                message: format!("message {i} of the turn cannot be encoded as JSON: {e}"),
            })?;
            let title = (m.message.role == Role::User)
                .then(|| title_from(&m.message.text()))
                .flatten();
            rows.push((content, m.model, m.usage, title));
        }
        let session_id = session_id.to_string();
        self.run(move |conn, _| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let title: Option<Option<String>> = tx
                .prepare_cached("SELECT title FROM sessions WHERE id = ?1")?
                .query_row([&session_id], |r| r.get(0))
                .optional()?;
            let Some(title) = title else {
                return Err(not_found(&session_id));
            };
            if rows.is_empty() {
                return Ok(Vec::new());
            }
            let now = now_ms();
            let mut seq: i64 = tx
                .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM messages WHERE session_id = ?1")?
                .query_row([&session_id], |r| r.get(0))?;
            let mut new_title = None;
            let mut ids = Vec::with_capacity(rows.len());
            let count = to_i64(rows.len() as u64);
            let mut added = Usage::default();
            for (_, _, usage, _) in &rows {
                if let Some(u) = usage {
                    added.add(u);
                }
            }
            let mut insert = tx.prepare_cached(
                "INSERT INTO messages (session_id, seq, sub, content, model, input_tokens,
                                       output_tokens, cache_read_tokens, cache_write_tokens,
                                       summary, compacted, created)
                 VALUES (?1, ?2, 0, ?3, ?4, ?5, ?6, ?7, ?8, 0, 0, ?9)",
            )?;
            for (content, model, usage, row_title) in rows {
                seq += 1;
                insert.execute(params![
                    session_id,
                    seq,
                    content,
                    model,
                    usage.map(|u| to_i64(u.input_tokens)),
                    usage.map(|u| to_i64(u.output_tokens)),
                    usage.map(|u| to_i64(u.cache_read_tokens)),
                    usage.map(|u| to_i64(u.cache_write_tokens)),
                    now,
                ])?;
                ids.push(tx.last_insert_rowid());
                // The crash test stops a child process here, inside the open transaction.
                #[cfg(test)]
                super::tests::crash_point(ids.len());
                if title.is_none() && new_title.is_none() {
                    new_title = row_title;
                }
            }
            drop(insert);
            tx.prepare_cached(
                "UPDATE sessions SET updated = ?2, title = COALESCE(title, ?3),
                                     revision = revision + 1,
                                     message_count = message_count + ?4,
                                     input_tokens = input_tokens + ?5,
                                     output_tokens = output_tokens + ?6,
                                     cache_read_tokens = cache_read_tokens + ?7,
                                     cache_write_tokens = cache_write_tokens + ?8
                 WHERE id = ?1",
            )?
            .execute(params![
                session_id,
                now,
                new_title,
                count,
                to_i64(added.input_tokens),
                to_i64(added.output_tokens),
                to_i64(added.cache_read_tokens),
                to_i64(added.cache_write_tokens),
            ])?;
            if let Some(a) = &answer {
                tx.prepare_cached("DELETE FROM prompt_answers WHERE created < ?1")?
                    .execute([now - PROMPT_ANSWER_RETENTION_MS])?;
                tx.prepare_cached(
                    "INSERT INTO prompt_answers (agent, session_key, idem_key, request_sha256,
                         session_id, response, input_tokens, output_tokens, cache_read_tokens,
                         cache_write_tokens, created)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
                     ON CONFLICT (agent, session_key, idem_key) DO NOTHING",
                )?
                .execute(params![
                    a.agent,
                    a.session_key,
                    a.key,
                    a.request_sha256,
                    a.session_id,
                    a.response,
                    to_i64(a.usage.input_tokens),
                    to_i64(a.usage.output_tokens),
                    to_i64(a.usage.cache_read_tokens),
                    to_i64(a.usage.cache_write_tokens),
                    now,
                ])?;
            }
            tx.commit()?;
            Ok(ids)
        })
        .await
    }

    /// [`run`](Self::run) for a write that does not sync the disk itself: its commit
    /// is safe against a crash of the process when it returns, and against power loss
    /// once the next synchronous commit (or checkpoint) has synced the WAL it sits in.
    /// For the writes that a turn's own commit follows within milliseconds — a new
    /// session, a ledger row — so a prompt pays one fsync, not three. The connection is
    /// back to `synchronous=FULL` when this returns, panic or not.
    async fn run_sync_deferred<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection, &Path) -> Result<T, Fail> + Send + 'static,
    {
        self.run(move |conn, path| {
            conn.pragma_update(None, "synchronous", "NORMAL")?;
            let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(conn, path)));
            let restored = conn.pragma_update(None, "synchronous", "FULL");
            let result = done.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            restored?;
            result
        })
        .await
    }
}

/// Create the file with mode 0600 if it does not exist, and tighten an existing file that
/// others can read: it holds every conversation. SQLite gives the `-wal` and `-shm`
/// files the mode of the database file.
fn create_private_file(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};

    let cannot_open = |e: std::io::Error| StoreError::CannotOpen {
        path: path.to_path_buf(),
        detail: e.to_string(),
    };
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(cannot_open(e)),
    }
    let mode = std::fs::metadata(path)
        .map_err(cannot_open)?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        tracing::warn!(
            path = %path.display(),
            mode = format!("{:o}", mode & 0o777),
            "the database was readable by other users; setting mode 0600"
        );
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(cannot_open)?;
    }
    Ok(())
}

fn configure(conn: Connection, path: &Path) -> Result<Connection, Fail> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // Reading the journal mode is the first access to the file: a file that is not a
    // database fails here with NOTADB.
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Fail::Store(StoreError::CannotOpen {
            path: path.to_path_buf(),
            detail: format!("WAL mode is not available (journal mode is {mode})"),
        }));
    }
    conn.pragma_update(None, "foreign_keys", true)?;
    // FULL, not NORMAL: in WAL mode NORMAL survives a process crash but may lose the last
    // committed transactions on power loss. FULL syncs the WAL at every commit, so a
    // committed turn survives both; a commit happens once per turn, update or queued
    // reply — a few fsyncs per conversation step, which is nothing next to a model call.
    // The two writes that a turn's commit follows (a new session, a ledger row) skip
    // their own sync and ride that one: `run_sync_deferred`.
    conn.pragma_update(None, "synchronous", "FULL")?;
    Ok(conn)
}

/// Apply the missing migrations, each in its own transaction with the version bump.
fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let sql = |e: rusqlite::Error| classify(e, path);
    loop {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql)?;
        // Read inside the write transaction: another process may have migrated meanwhile.
        let version: i64 = tx
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(sql)?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::TooNew {
                path: path.to_path_buf(),
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        let Some(step) = usize::try_from(version)
            .ok()
            .and_then(|v| MIGRATIONS.get(v))
        else {
            return Ok(());
        };
        let next = version + 1;
        let failed = |e: rusqlite::Error| match classify(e, path) {
            e @ (StoreError::Locked { .. }
            | StoreError::Corrupt { .. }
            | StoreError::DiskFull { .. }
            | StoreError::CannotOpen { .. }) => e,
            other => StoreError::Migration {
                path: path.to_path_buf(),
                version: next,
                detail: other.to_string(),
            },
        };
        tx.execute_batch(step).map_err(failed)?;
        tx.pragma_update(None, "user_version", next)
            .map_err(failed)?;
        tx.commit().map_err(failed)?;
        tracing::info!(path = %path.display(), version = next, "database schema migrated");
    }
}

/// Entries and bytes `plugin` holds in `scope`, or in all its scopes.
fn read_usage(conn: &Connection, plugin: &str, scope: Option<&str>) -> rusqlite::Result<KvUsage> {
    let row = |r: &rusqlite::Row<'_>| -> rusqlite::Result<KvUsage> {
        Ok(KvUsage {
            entries: to_u64(r.get(0)?),
            bytes: to_u64(r.get(1)?),
        })
    };
    match scope {
        Some(scope) => conn
            .prepare_cached(
                "SELECT COALESCE(SUM(entries), 0), COALESCE(SUM(bytes), 0) FROM plugin_kv_usage
                 WHERE plugin = ?1 AND scope = ?2",
            )?
            .query_row(params![plugin, scope], row),
        None => conn
            .prepare_cached(
                "SELECT COALESCE(SUM(entries), 0), COALESCE(SUM(bytes), 0) FROM plugin_kv_usage
                 WHERE plugin = ?1",
            )?
            .query_row(params![plugin], row),
    }
}

/// A session with its totals, as `append_turn` keeps them (one row, whatever the
/// session's length).
const SESSION_SELECT: &str = "
    SELECT s.id, s.agent, s.key, s.parent_id, s.title, s.model, s.created, s.updated,
           s.message_count, s.input_tokens, s.output_tokens, s.cache_read_tokens,
           s.cache_write_tokens
    FROM sessions s";

fn session_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<SessionRecord> {
    Ok(SessionRecord {
        id: row.get(0)?,
        agent: row.get(1)?,
        key: row.get(2)?,
        parent_id: row.get(3)?,
        title: row.get(4)?,
        model: row.get(5)?,
        created: row.get(6)?,
        updated: row.get(7)?,
        message_count: to_u64(row.get(8)?),
        usage: Usage {
            input_tokens: to_u64(row.get(9)?),
            output_tokens: to_u64(row.get(10)?),
            cache_read_tokens: to_u64(row.get(11)?),
            cache_write_tokens: to_u64(row.get(12)?),
        },
    })
}

fn load_session(conn: &Connection, id: &str) -> Result<Option<SessionRecord>, Fail> {
    let sql = format!("{SESSION_SELECT} WHERE s.id = ?1");
    Ok(conn
        .prepare_cached(&sql)?
        .query_row([id], session_from_row)
        .optional()?)
}

/// Insert a session (and its lineage, for a sub-agent's) and make it the current one of
/// its key, in one transaction.
fn insert_session(
    conn: &mut Connection,
    new: NewSession,
    lineage: Option<Lineage>,
) -> Result<SessionRecord, Fail> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    if let Some(parent) = &new.parent_id {
        if !session_exists(&tx, parent)? {
            return Err(not_found(parent));
        }
    }
    let now = now_ms();
    let id = new_session_id();
    tx.prepare_cached(
        "INSERT INTO sessions (id, agent, key, parent_id, title, model, created, updated)
         VALUES (?1, ?2, ?3, ?4, NULL, ?5, ?6, ?6)",
    )?
    .execute(params![
        id,
        new.agent,
        new.key,
        new.parent_id,
        new.model,
        now
    ])?;
    if let Some(l) = &lineage {
        tx.prepare_cached(
            "INSERT INTO session_lineage
                 (session_id, parent_session_id, depth, invoked_by_exec, rights, created)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?
        .execute(params![
            id,
            l.parent_session_id,
            i64::from(l.depth),
            l.invoked_by_exec,
            l.rights.to_string(),
            now
        ])?;
    }
    tx.prepare_cached(
        "INSERT INTO session_keys (key, current_session, updated) VALUES (?1, ?2, ?3)
         ON CONFLICT(key) DO UPDATE SET current_session = excluded.current_session,
                                        updated = excluded.updated",
    )?
    .execute(params![new.key, id, now])?;
    tx.commit()?;
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

fn session_exists(conn: &Connection, id: &str) -> Result<bool, Fail> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM sessions WHERE id = ?1")?
        .exists([id])?)
}

/// Insert the row of `key` if it has none yet.
fn ensure_key_row(conn: &Connection, key: &str, now: i64) -> Result<(), Fail> {
    conn.prepare_cached(
        "INSERT INTO session_keys (key, updated) VALUES (?1, ?2) ON CONFLICT(key) DO NOTHING",
    )?
    .execute(params![key, now])?;
    Ok(())
}

fn read_settings(conn: &Connection, key: &str) -> Result<SessionSettings, Fail> {
    let settings = conn
        .prepare_cached(
            "SELECT verbose, streaming, model_override FROM session_keys WHERE key = ?1",
        )?
        .query_row([key], |r| {
            Ok(SessionSettings {
                verbose: r.get(0)?,
                streaming: r.get(1)?,
                model_override: r.get(2)?,
            })
        })
        .optional()?;
    Ok(settings.unwrap_or_default())
}

fn read_metadata(conn: &Connection, key: &str, path: &Path) -> Result<serde_json::Value, Fail> {
    let text: Option<String> = conn
        .prepare_cached("SELECT metadata FROM session_keys WHERE key = ?1")?
        .query_row([key], |r| r.get(0))
        .optional()?;
    let Some(text) = text else {
        return Ok(serde_json::Value::Object(Default::default()));
    };
    serde_json::from_str(&text).map_err(|e| {
        Fail::Store(corrupt(
            path,
            format!("the metadata of session key {key} is not valid JSON: {e}"),
        ))
    })
}

/// One message row, before its JSON is parsed.
struct MessageRow {
    id: i64,
    seq: i64,
    content: String,
    model: Option<String>,
    usage: [Option<i64>; 4],
    summary: bool,
    compacted: bool,
    created: i64,
}

fn new_session_id() -> String {
    format!("s_{:016x}", rand::random::<u64>())
}

#[async_trait]
impl SessionStore for SqliteStore {
    async fn create_session(&self, new: NewSession) -> Result<SessionRecord, StoreError> {
        self.run_sync_deferred(move |conn, _| insert_session(conn, new, None))
            .await
    }

    async fn create_child_session(
        &self,
        mut new: NewSession,
        lineage: Lineage,
    ) -> Result<SessionRecord, StoreError> {
        new.parent_id = Some(lineage.parent_session_id.clone());
        self.run(move |conn, _| insert_session(conn, new, Some(lineage)))
            .await
    }

    async fn session_lineage(&self, id: &str) -> Result<Option<Lineage>, StoreError> {
        let id = id.to_string();
        self.run(move |conn, path| {
            let row: Option<(String, i64, Option<String>, String)> = conn
                .prepare_cached(
                    "SELECT parent_session_id, depth, invoked_by_exec, rights
                     FROM session_lineage WHERE session_id = ?1",
                )?
                .query_row([&id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                .optional()?;
            let Some((parent, depth, exec, rights)) = row else {
                return Ok(None);
            };
            let rights = serde_json::from_str(&rights).map_err(|e| {
                Fail::Store(corrupt(
                    path,
                    format!("the rights of session {id} are not valid JSON: {e}"),
                ))
            })?;
            Ok(Some(Lineage {
                parent_session_id: parent,
                depth: u32::try_from(depth).unwrap_or(u32::MAX),
                invoked_by_exec: exec,
                rights,
            }))
        })
        .await
    }

    async fn current_session(&self, key: &str) -> Result<Option<SessionRecord>, StoreError> {
        let key = key.to_string();
        self.run(move |conn, _| {
            let id: Option<String> = conn
                .prepare_cached("SELECT current_session FROM session_keys WHERE key = ?1")?
                .query_row([&key], |r| r.get(0))
                .optional()?
                .flatten();
            match id {
                Some(id) => load_session(conn, &id),
                None => Ok(None),
            }
        })
        .await
    }

    async fn set_current_session(
        &self,
        key: &str,
        session_id: &str,
    ) -> Result<SessionRecord, StoreError> {
        let key = key.to_string();
        let session_id = session_id.to_string();
        self.run(move |conn, _| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let Some(record) = load_session(&tx, &session_id)? else {
                return Err(not_found(&session_id));
            };
            tx.prepare_cached(
                "INSERT INTO session_keys (key, current_session, updated) VALUES (?1, ?2, ?3)
                 ON CONFLICT(key) DO UPDATE SET current_session = excluded.current_session,
                                                updated = excluded.updated",
            )?
            .execute(params![key, session_id, now_ms()])?;
            tx.commit()?;
            Ok(record)
        })
        .await
    }

    async fn get_session(&self, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        let id = id.to_string();
        self.run(move |conn, _| load_session(conn, &id)).await
    }

    async fn list_sessions(&self, agent: &str) -> Result<Vec<SessionRecord>, StoreError> {
        let agent = agent.to_string();
        self.run(move |conn, _| {
            let sql = format!(
                "{SESSION_SELECT} WHERE s.agent = ?1 ORDER BY s.created DESC, s.rowid DESC"
            );
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows = stmt.query_map([&agent], session_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    async fn set_session_title(&self, id: &str, title: &str) -> Result<(), StoreError> {
        let id = id.to_string();
        let title = title.to_string();
        self.run(move |conn, _| {
            let n = conn
                .prepare_cached("UPDATE sessions SET title = ?2, updated = ?3 WHERE id = ?1")?
                .execute(params![id, title, now_ms()])?;
            if n == 0 {
                return Err(not_found(&id));
            }
            Ok(())
        })
        .await
    }

    async fn set_session_model(&self, id: &str, model: &str) -> Result<(), StoreError> {
        let id = id.to_string();
        let model = model.to_string();
        self.run(move |conn, _| {
            let n = conn
                .prepare_cached("UPDATE sessions SET model = ?2, updated = ?3 WHERE id = ?1")?
                .execute(params![id, model, now_ms()])?;
            if n == 0 {
                return Err(not_found(&id));
            }
            Ok(())
        })
        .await
    }

    async fn touch(&self, id: &str) -> Result<(), StoreError> {
        let id = id.to_string();
        self.run(move |conn, _| {
            let n = conn
                .prepare_cached("UPDATE sessions SET updated = ?2 WHERE id = ?1")?
                .execute(params![id, now_ms()])?;
            if n == 0 {
                return Err(not_found(&id));
            }
            Ok(())
        })
        .await
    }

    async fn append_turn(
        &self,
        session_id: &str,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<i64>, StoreError> {
        self.append(session_id, messages, None).await
    }

    async fn append_answered_turn(
        &self,
        session_id: &str,
        messages: Vec<NewMessage>,
        fence: Option<&Fence>,
        answer: PromptAnswer,
    ) -> Result<Vec<i64>, StoreError> {
        // One gateway uses a SQLite file: a fence has nothing to check here, as in
        // `append_turn_fenced`'s default.
        let _ = fence;
        self.append(session_id, messages, Some(answer)).await
    }

    async fn prompt_answer(
        &self,
        agent: &str,
        session_key: &str,
        key: &str,
    ) -> Result<Option<PromptAnswer>, StoreError> {
        let (agent, session_key, key) =
            (agent.to_string(), session_key.to_string(), key.to_string());
        self.run(move |conn, _| {
            Ok(conn
                .prepare_cached(
                    "SELECT request_sha256, session_id, response, input_tokens, output_tokens,
                            cache_read_tokens, cache_write_tokens, created
                     FROM prompt_answers
                     WHERE agent = ?1 AND session_key = ?2 AND idem_key = ?3 AND created >= ?4",
                )?
                .query_row(
                    params![
                        agent,
                        session_key,
                        key,
                        now_ms() - PROMPT_ANSWER_RETENTION_MS
                    ],
                    |r| {
                        Ok(PromptAnswer {
                            agent: agent.clone(),
                            session_key: session_key.clone(),
                            key: key.clone(),
                            request_sha256: r.get(0)?,
                            session_id: r.get(1)?,
                            response: r.get(2)?,
                            usage: Usage {
                                input_tokens: to_u64(r.get(3)?),
                                output_tokens: to_u64(r.get(4)?),
                                cache_read_tokens: to_u64(r.get(5)?),
                                cache_write_tokens: to_u64(r.get(6)?),
                            },
                            created: r.get(7)?,
                        })
                    },
                )
                .optional()?)
        })
        .await
    }

    async fn messages(
        &self,
        session_id: &str,
        include_compacted: bool,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        let session_id = session_id.to_string();
        self.run(move |conn, path| {
            // One read transaction, so the existence check and the rows agree.
            let tx = conn.transaction()?;
            if !session_exists(&tx, &session_id)? {
                return Err(not_found(&session_id));
            }
            let raw = {
                let mut stmt = tx.prepare_cached(
                    "SELECT id, seq, content, model, input_tokens, output_tokens,
                            cache_read_tokens, cache_write_tokens, summary, compacted, created
                     FROM messages
                     WHERE session_id = ?1 AND (?2 OR compacted = 0)
                     ORDER BY seq, sub",
                )?;
                let rows = stmt.query_map(params![session_id, include_compacted], |r| {
                    Ok(MessageRow {
                        id: r.get(0)?,
                        seq: r.get(1)?,
                        content: r.get(2)?,
                        model: r.get(3)?,
                        usage: [r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?],
                        summary: r.get(8)?,
                        compacted: r.get(9)?,
                        created: r.get(10)?,
                    })
                })?;
                rows.collect::<rusqlite::Result<Vec<_>>>()?
            };
            tx.commit()?;
            raw.into_iter()
                .map(|row| {
                    let message: Message = serde_json::from_str(&row.content).map_err(|e| {
                        Fail::Store(corrupt(
                            path,
                            format!(
                                "message {} of session {session_id} is not a valid message: {e}",
                                row.id
                            ),
                        ))
                    })?;
                    let usage = match row.usage {
                        [None, None, None, None] => None,
                        [i, o, cr, cw] => Some(Usage {
                            input_tokens: to_u64(i.unwrap_or(0)),
                            output_tokens: to_u64(o.unwrap_or(0)),
                            cache_read_tokens: to_u64(cr.unwrap_or(0)),
                            cache_write_tokens: to_u64(cw.unwrap_or(0)),
                        }),
                    };
                    Ok(StoredMessage {
                        id: row.id,
                        seq: row.seq,
                        message,
                        model: row.model,
                        usage,
                        compacted: row.compacted,
                        summary: row.summary,
                        created: row.created,
                    })
                })
                .collect()
        })
        .await
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
        let session_id = session_id.to_string();
        self.run(move |conn, _| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            if !session_exists(&tx, &session_id)? {
                return Err(not_found(&session_id));
            }
            let now = now_ms();
            let marked = tx
                .prepare_cached(
                    "UPDATE messages SET compacted = 1
                     WHERE session_id = ?1 AND seq <= ?2 AND compacted = 0 AND summary = 0",
                )?
                .execute(params![session_id, upto_seq])?;
            if marked == 0 {
                return Err(Fail::Store(StoreError::Invalid {
                    message: format!(
                        "session {session_id} has no uncompacted message up to seq {upto_seq}"
                    ),
                }));
            }
            // Earlier summaries inside the range are replaced by the new one.
            tx.prepare_cached(
                "UPDATE messages SET compacted = 1
                 WHERE session_id = ?1 AND seq <= ?2 AND summary = 1",
            )?
            .execute(params![session_id, upto_seq])?;
            let sub: i64 = tx
                .prepare_cached(
                    "SELECT COALESCE(MAX(sub), 0) + 1 FROM messages
                     WHERE session_id = ?1 AND seq = ?2",
                )?
                .query_row(params![session_id, upto_seq], |r| r.get(0))?;
            tx.prepare_cached(
                "INSERT INTO messages (session_id, seq, sub, content, summary, compacted, created)
                 VALUES (?1, ?2, ?3, ?4, 1, 0, ?5)",
            )?
            .execute(params![session_id, upto_seq, sub, content, now])?;
            tx.prepare_cached(
                "UPDATE sessions SET updated = ?2, revision = revision + 1 WHERE id = ?1",
            )?
            .execute(params![session_id, now])?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn message_revision(&self, session_id: &str) -> Result<Option<u64>, StoreError> {
        let session_id = session_id.to_string();
        self.run(move |conn, _| {
            let revision: Option<i64> = conn
                .prepare_cached("SELECT revision FROM sessions WHERE id = ?1")?
                .query_row([&session_id], |r| r.get(0))
                .optional()?;
            match revision {
                Some(r) => Ok(Some(to_u64(r))),
                None => Err(not_found(&session_id)),
            }
        })
        .await
    }

    async fn get_settings(&self, key: &str) -> Result<SessionSettings, StoreError> {
        let key = key.to_string();
        self.run(move |conn, _| read_settings(conn, &key)).await
    }

    async fn update_settings(
        &self,
        key: &str,
        patch: SettingsPatch,
    ) -> Result<SessionSettings, StoreError> {
        let key = key.to_string();
        self.run(move |conn, _| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_ms();
            ensure_key_row(&tx, &key, now)?;
            let mut settings = read_settings(&tx, &key)?;
            if let Some(v) = patch.verbose {
                settings.verbose = v;
            }
            if let Some(v) = patch.streaming {
                settings.streaming = v;
            }
            if let Some(v) = patch.model_override {
                settings.model_override = v;
            }
            tx.prepare_cached(
                "UPDATE session_keys SET verbose = ?2, streaming = ?3, model_override = ?4,
                                         updated = ?5
                 WHERE key = ?1",
            )?
            .execute(params![
                key,
                settings.verbose,
                settings.streaming,
                settings.model_override,
                now
            ])?;
            tx.commit()?;
            Ok(settings)
        })
        .await
    }

    async fn get_metadata(&self, key: &str) -> Result<serde_json::Value, StoreError> {
        let key = key.to_string();
        self.run(move |conn, path| read_metadata(conn, &key, path))
            .await
    }

    async fn set_metadata(
        &self,
        key: &str,
        field: &str,
        value: serde_json::Value,
    ) -> Result<(), StoreError> {
        let key = key.to_string();
        let field = field.to_string();
        self.run(move |conn, path| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_ms();
            ensure_key_row(&tx, &key, now)?;
            let mut metadata = match read_metadata(&tx, &key, path)? {
                serde_json::Value::Object(map) => map,
                _ => serde_json::Map::new(),
            };
            if value.is_null() {
                metadata.remove(&field);
            } else {
                metadata.insert(field, value);
            }
            let text = serde_json::Value::Object(metadata).to_string();
            tx.prepare_cached(
                "UPDATE session_keys SET metadata = ?2, updated = ?3 WHERE key = ?1",
            )?
            .execute(params![key, text, now])?;
            tx.commit()?;
            Ok(())
        })
        .await
    }
}

/// The sums every ledger query selects, in [`totals_row`]'s order.
const LEDGER_SUMS: &str =
    "count(*), coalesce(sum(input_tokens), 0), coalesce(sum(output_tokens), 0),
     coalesce(sum(cache_read_tokens), 0), coalesce(sum(cache_write_tokens), 0),
     coalesce(sum(cost_micros), 0), coalesce(sum(unpriced), 0)";

/// [`LEDGER_SUMS`] from column `at` on.
fn totals_row(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<UsageTotals> {
    Ok(UsageTotals {
        calls: to_u64(r.get(at)?),
        input_tokens: to_u64(r.get(at + 1)?),
        output_tokens: to_u64(r.get(at + 2)?),
        cache_read_tokens: to_u64(r.get(at + 3)?),
        cache_write_tokens: to_u64(r.get(at + 4)?),
        cost_micros: r.get(at + 5)?,
        unpriced_calls: to_u64(r.get(at + 6)?),
    })
}

#[async_trait]
impl UsageLedger for SqliteStore {
    async fn record_usage(&self, e: LedgerEntry) -> Result<(), StoreError> {
        self.run_sync_deferred(move |conn, _| {
            conn.prepare_cached(
                "INSERT INTO usage (ts, agent, session_id, session_key, turn_id, model,
                     input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
                     cost_micros, unpriced, parent_session_id)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            )?
            .execute(params![
                e.ts,
                e.agent,
                e.session_id,
                e.session_key,
                e.turn_id,
                e.model,
                to_i64(e.usage.input_tokens),
                to_i64(e.usage.output_tokens),
                to_i64(e.usage.cache_read_tokens),
                to_i64(e.usage.cache_write_tokens),
                e.cost_micros,
                e.unpriced,
                e.parent_session_id
            ])?;
            Ok(())
        })
        .await
    }

    async fn usage_totals(&self, f: LedgerFilter) -> Result<UsageTotals, StoreError> {
        self.run(move |conn, _| {
            if let (Some(root), true) = (&f.session_id, f.with_children) {
                // The session and every session below it, linked by the rows' parents.
                let sql = format!(
                    "WITH RECURSIVE tree(id) AS (
                         SELECT ?2
                         UNION
                         SELECT u.session_id FROM usage u JOIN tree t ON u.parent_session_id = t.id
                         WHERE u.session_id IS NOT NULL
                     )
                     SELECT {LEDGER_SUMS} FROM usage
                     WHERE (?1 IS NULL OR agent = ?1) AND session_id IN (SELECT id FROM tree)
                       AND (?3 IS NULL OR ts >= ?3)"
                );
                return Ok(conn
                    .prepare_cached(&sql)?
                    .query_row(params![f.agent, root, f.since_ms], |r| totals_row(r, 0))?);
            }
            let sql = format!(
                "SELECT {LEDGER_SUMS} FROM usage
                 WHERE (?1 IS NULL OR agent = ?1) AND (?2 IS NULL OR session_id = ?2)
                   AND (?3 IS NULL OR ts >= ?3)"
            );
            Ok(conn
                .prepare_cached(&sql)?
                .query_row(params![f.agent, f.session_id, f.since_ms], |r| {
                    totals_row(r, 0)
                })?)
        })
        .await
    }

    async fn usage_report(&self, q: UsageQuery) -> Result<UsageReport, StoreError> {
        self.run(move |conn, _| {
            let key = match q.by {
                UsageGroupBy::Agent => "agent",
                UsageGroupBy::Session => "coalesce(session_id, '')",
                UsageGroupBy::Model => "model",
                UsageGroupBy::Day => "strftime('%Y-%m-%d', ts / 1000, 'unixepoch')",
            };
            let sql = format!(
                "SELECT {key} AS k, {LEDGER_SUMS} FROM usage
                 WHERE (?1 IS NULL OR agent = ?1) AND (?2 IS NULL OR ts >= ?2)
                 GROUP BY k ORDER BY k"
            );
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows = stmt.query_map(params![q.agent, q.since_ms], |r| {
                Ok(UsageRow {
                    key: r.get(0)?,
                    totals: totals_row(r, 1)?,
                })
            })?;
            let rows = rows.collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(UsageReport::new(q.by, rows))
        })
        .await
    }
}

#[async_trait]
impl HealthStore for SqliteStore {
    async fn load_health(&self) -> Result<Vec<HealthRecord>, StoreError> {
        self.run(|conn, _| {
            let mut stmt = conn.prepare_cached(
                "SELECT model_key, cooldown_until, consecutive_failures, last_error
                 FROM provider_health ORDER BY model_key",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok(HealthRecord {
                    model_key: r.get(0)?,
                    cooldown_until: r.get(1)?,
                    consecutive_failures: r.get(2)?,
                    last_error: r.get(3)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    async fn save_health(&self, record: HealthRecord) -> Result<(), StoreError> {
        self.run(move |conn, _| {
            conn.prepare_cached(
                "INSERT INTO provider_health
                     (model_key, cooldown_until, consecutive_failures, last_error, updated)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(model_key) DO UPDATE SET
                     cooldown_until = excluded.cooldown_until,
                     consecutive_failures = excluded.consecutive_failures,
                     last_error = excluded.last_error,
                     updated = excluded.updated",
            )?
            .execute(params![
                record.model_key,
                record.cooldown_until,
                record.consecutive_failures,
                record.last_error,
                now_ms()
            ])?;
            Ok(())
        })
        .await
    }

    async fn clear_health(&self, model_key: &str) -> Result<(), StoreError> {
        let model_key = model_key.to_string();
        self.run(move |conn, _| {
            conn.prepare_cached("DELETE FROM provider_health WHERE model_key = ?1")?
                .execute([model_key])?;
            Ok(())
        })
        .await
    }
}

#[async_trait]
impl ChannelState for SqliteStore {
    async fn get_offset(&self, channel: &str) -> Result<Option<i64>, StoreError> {
        let channel = channel.to_string();
        self.run(move |conn, _| {
            Ok(conn
                .prepare_cached("SELECT value FROM channel_offsets WHERE channel = ?1")?
                .query_row([channel], |r| r.get(0))
                .optional()?)
        })
        .await
    }

    async fn set_offset(&self, channel: &str, value: i64) -> Result<(), StoreError> {
        let channel = channel.to_string();
        self.run(move |conn, _| {
            conn.prepare_cached(
                "INSERT INTO channel_offsets (channel, value, updated) VALUES (?1, ?2, ?3)
                 ON CONFLICT(channel) DO UPDATE SET value = excluded.value,
                                                    updated = excluded.updated",
            )?
            .execute(params![channel, value, now_ms()])?;
            Ok(())
        })
        .await
    }

    async fn mark_seen(&self, channel: &str, update_id: i64) -> Result<bool, StoreError> {
        let channel = channel.to_string();
        self.run(move |conn, _| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let inserted = tx
                .prepare_cached(
                    "INSERT INTO channel_seen (channel, update_id, seen_at) VALUES (?1, ?2, ?3)
                     ON CONFLICT(channel, update_id) DO NOTHING",
                )?
                .execute(params![channel, update_id, now_ms()])?;
            if inserted == 1 {
                let window = i64::try_from(SEEN_WINDOW).unwrap_or(i64::MAX);
                tx.prepare_cached(
                    "DELETE FROM channel_seen WHERE channel = ?1 AND id <= (
                         SELECT id FROM channel_seen WHERE channel = ?1
                         ORDER BY id DESC LIMIT 1 OFFSET ?2)",
                )?
                .execute(params![channel, window])?;
            }
            tx.commit()?;
            Ok(inserted == 1)
        })
        .await
    }

    async fn enqueue_outbox(
        &self,
        channel: &str,
        payload: serde_json::Value,
    ) -> Result<i64, StoreError> {
        let channel = channel.to_string();
        let payload = payload.to_string();
        self.run(move |conn, _| {
            let now = now_ms();
            conn.prepare_cached(
                "INSERT INTO outbox (channel, payload, attempts, next_attempt_at, created)
                 VALUES (?1, ?2, 0, ?3, ?3)",
            )?
            .execute(params![channel, payload, now])?;
            Ok(conn.last_insert_rowid())
        })
        .await
    }

    async fn due_outbox(
        &self,
        channel: &str,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<OutboxItem>, StoreError> {
        let channel = channel.to_string();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run(move |conn, path| {
            let raw = {
                let mut stmt = conn.prepare_cached(
                    "SELECT id, payload, attempts, next_attempt_at, last_error, created
                     FROM outbox WHERE channel = ?1 AND next_attempt_at <= ?2
                     ORDER BY id LIMIT ?3",
                )?;
                let rows = stmt.query_map(params![channel, now_ms, limit], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, u32>(2)?,
                        r.get::<_, i64>(3)?,
                        r.get::<_, Option<String>>(4)?,
                        r.get::<_, i64>(5)?,
                    ))
                })?;
                rows.collect::<rusqlite::Result<Vec<_>>>()?
            };
            raw.into_iter()
                .map(
                    |(id, payload, attempts, next_attempt_at, last_error, created)| {
                        let payload = serde_json::from_str(&payload).map_err(|e| {
                            Fail::Store(corrupt(
                                path,
                                format!("outbox item {id} is not valid JSON: {e}"),
                            ))
                        })?;
                        Ok(OutboxItem {
                            id,
                            channel: channel.clone(),
                            payload,
                            attempts,
                            next_attempt_at,
                            last_error,
                            created,
                        })
                    },
                )
                .collect()
        })
        .await
    }

    async fn outbox_done(&self, id: i64) -> Result<(), StoreError> {
        self.run(move |conn, _| {
            conn.prepare_cached("DELETE FROM outbox WHERE id = ?1")?
                .execute([id])?;
            Ok(())
        })
        .await
    }

    async fn outbox_retry(
        &self,
        id: i64,
        next_attempt_at: i64,
        error: &str,
    ) -> Result<(), StoreError> {
        let error = error.to_string();
        self.run(move |conn, _| {
            let n = conn
                .prepare_cached(
                    "UPDATE outbox SET attempts = attempts + 1, next_attempt_at = ?2,
                                       last_error = ?3
                     WHERE id = ?1",
                )?
                .execute(params![id, next_attempt_at, error])?;
            if n == 0 {
                return Err(Fail::Store(StoreError::NotFound {
                    what: "outbox item",
                    id: id.to_string(),
                }));
            }
            Ok(())
        })
        .await
    }
}

#[async_trait]
impl PluginData for SqliteStore {
    async fn kv_get(
        &self,
        plugin: &str,
        scope: &str,
        key: &str,
    ) -> Result<Option<String>, StoreError> {
        let (plugin, scope, key) = (plugin.to_string(), scope.to_string(), key.to_string());
        self.run(move |conn, _| {
            Ok(conn
                .prepare_cached(
                    "SELECT value FROM plugin_kv WHERE plugin = ?1 AND scope = ?2 AND key = ?3",
                )?
                .query_row(params![plugin, scope, key], |r| r.get(0))
                .optional()?)
        })
        .await
    }

    async fn kv_set(
        &self,
        plugin: &str,
        scope: &str,
        key: &str,
        value: &str,
    ) -> Result<(), StoreError> {
        let (plugin, scope, key) = (plugin.to_string(), scope.to_string(), key.to_string());
        let value = value.to_string();
        self.run(move |conn, _| {
            conn.prepare_cached(
                "INSERT INTO plugin_kv (plugin, scope, key, value, updated)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(plugin, scope, key) DO UPDATE SET value = excluded.value,
                                                               updated = excluded.updated",
            )?
            .execute(params![plugin, scope, key, value, now_ms()])?;
            Ok(())
        })
        .await
    }

    async fn kv_set_within(
        &self,
        plugin: &str,
        scope: &str,
        key: &str,
        value: &str,
        limits: KvLimits,
    ) -> Result<KvWrite, StoreError> {
        let (plugin, scope, key) = (plugin.to_string(), scope.to_string(), key.to_string());
        let value = value.to_string();
        self.run(move |conn, _| {
            // One write transaction for the check and the write: no other write can come
            // between them, so concurrent sets cannot together overshoot a limit.
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let old: Option<i64> = tx
                .prepare_cached(
                    "SELECT length(CAST(key AS BLOB)) + length(CAST(value AS BLOB)) FROM plugin_kv
                     WHERE plugin = ?1 AND scope = ?2 AND key = ?3",
                )?
                .query_row(params![plugin, scope, key], |r| r.get(0))
                .optional()?;
            let usage = if limits.whole_plugin {
                read_usage(&tx, &plugin, None)?
            } else {
                read_usage(&tx, &plugin, Some(&scope))?
            };
            if let Some(refusal) =
                super::kv_limit_check(limits, usage, old.map(to_u64), &key, &value)
            {
                return Ok(refusal);
            }
            tx.prepare_cached(
                "INSERT INTO plugin_kv (plugin, scope, key, value, updated)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(plugin, scope, key) DO UPDATE SET value = excluded.value,
                                                               updated = excluded.updated",
            )?
            .execute(params![plugin, scope, key, value, now_ms()])?;
            tx.commit()?;
            Ok(KvWrite::Stored)
        })
        .await
    }

    async fn kv_usage(&self, plugin: &str, scope: Option<&str>) -> Result<KvUsage, StoreError> {
        let (plugin, scope) = (plugin.to_string(), scope.map(str::to_string));
        self.run(move |conn, _| Ok(read_usage(conn, &plugin, scope.as_deref())?))
            .await
    }

    async fn kv_del(&self, plugin: &str, scope: &str, key: &str) -> Result<bool, StoreError> {
        let (plugin, scope, key) = (plugin.to_string(), scope.to_string(), key.to_string());
        self.run(move |conn, _| {
            let n = conn
                .prepare_cached(
                    "DELETE FROM plugin_kv WHERE plugin = ?1 AND scope = ?2 AND key = ?3",
                )?
                .execute(params![plugin, scope, key])?;
            Ok(n > 0)
        })
        .await
    }

    async fn kv_list(
        &self,
        plugin: &str,
        scope: &str,
        prefix: &str,
    ) -> Result<Vec<String>, StoreError> {
        let (plugin, scope, prefix) = (plugin.to_string(), scope.to_string(), prefix.to_string());
        self.run(move |conn, _| {
            // Compare bytes, not LIKE patterns: `%` and `_` in a prefix are literal.
            let mut stmt = conn.prepare_cached(
                "SELECT key FROM plugin_kv
                 WHERE plugin = ?1 AND scope = ?2
                   AND substr(CAST(key AS BLOB), 1, length(CAST(?3 AS BLOB))) = CAST(?3 AS BLOB)
                 ORDER BY key",
            )?;
            let rows = stmt.query_map(params![plugin, scope, prefix], |r| r.get(0))?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }
}

#[cfg(test)]
mod sync_tests {
    use super::*;

    /// `PRAGMA synchronous` of the store's connection: 1 is NORMAL, 2 is FULL.
    async fn sync_mode(store: &SqliteStore) -> i64 {
        store
            .run(|conn, _| Ok(conn.pragma_query_value(None, "synchronous", |r| r.get(0))?))
            .await
            .expect("read synchronous")
    }

    #[tokio::test]
    async fn a_deferred_sync_write_leaves_every_other_commit_synced() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(dir.path().join("beige.db")).expect("open");
        assert_eq!(sync_mode(&store).await, 2, "a store opens with FULL");
        let inside = store
            .run_sync_deferred(|conn, _| {
                Ok(conn.pragma_query_value(None, "synchronous", |r| r.get::<_, i64>(0))?)
            })
            .await
            .expect("deferred call");
        assert_eq!(inside, 1, "the deferred write itself commits with NORMAL");

        // The two writes that defer their sync, then a failing and a panicking one.
        let session = store
            .create_session(NewSession {
                agent: "a".into(),
                key: "api:a:default".into(),
                parent_id: None,
                model: None,
            })
            .await
            .expect("create");
        store
            .record_usage(LedgerEntry {
                ts: 1,
                agent: "a".into(),
                session_id: Some(session.id.clone()),
                session_key: Some(session.key.clone()),
                turn_id: None,
                model: "p/m".into(),
                usage: Usage::default(),
                cost_micros: 0,
                unpriced: true,
                parent_session_id: None,
            })
            .await
            .expect("ledger row");
        assert_eq!(sync_mode(&store).await, 2, "back to FULL after the writes");
        let failed = store
            .run_sync_deferred(|conn, _| -> Result<(), Fail> {
                conn.execute_batch("INSERT INTO no_such_table VALUES (1)")?;
                Ok(())
            })
            .await;
        assert!(failed.is_err());
        assert_eq!(sync_mode(&store).await, 2, "back to FULL after a failure");
        let panicked = store
            .run_sync_deferred(|_, _| -> Result<(), Fail> { panic!("a bug in a write") })
            .await;
        assert!(panicked.is_err(), "a panic is reported as an error");
        assert_eq!(sync_mode(&store).await, 2, "back to FULL after a panic");
        // Both rows are there, through a new handle.
        drop(store);
        let again = SqliteStore::open(dir.path().join("beige.db")).expect("reopen");
        assert!(again.get_session(&session.id).await.expect("get").is_some());
        let totals = again
            .usage_totals(LedgerFilter::default())
            .await
            .expect("totals");
        assert_eq!(totals.calls, 1);
    }
}
