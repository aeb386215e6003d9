//! The PostgreSQL side of the store tests: [`Postgres`], the contract suite's backend — a
//! database of its own per test, cloned from a template migrated once per schema, on the
//! server `BEIGE_TEST_POSTGRES_URL` names (`scripts/setup-postgres` starts one on a Unix
//! socket of its own) — and the tests that only PostgreSQL needs: its schema against
//! SQLite's, and its errors for a server that cannot be used.

use sqlx::{AssertSqlSafe, Connection as _, Executor as _};

use super::*;

/// Is the test server there? (`beige_testkit::postgres::url`: skip, or fail in CI.)
pub(super) fn available() -> bool {
    beige_testkit::postgres::url().is_some()
}

fn admin_url() -> String {
    std::env::var("BEIGE_TEST_POSTGRES_URL").expect("BEIGE_TEST_POSTGRES_URL")
}

use beige_testkit::postgres::with_database;

async fn admin() -> sqlx::PgConnection {
    sqlx::PgConnection::connect(&admin_url())
        .await
        .expect("connect to the test PostgreSQL server (BEIGE_TEST_POSTGRES_URL)")
}

/// A database of its own on the test server, dropped with the value.
pub(super) struct Postgres {
    name: String,
    url: String,
}

impl Postgres {
    /// The migrated template, made once per schema by whichever test process comes first
    /// (under an advisory lock: nextest runs each test in a process of its own).
    async fn template() -> String {
        let name = format!(
            "beige_tpl_{}_{:016x}",
            PG_SCHEMA_VERSION,
            super::super::postgres::migrations_fingerprint()
        );
        let mut conn = admin().await;
        conn.execute("SELECT pg_advisory_lock(424242)")
            .await
            .unwrap();
        let exists = sqlx::query("SELECT 1 FROM pg_database WHERE datname = $1")
            .bind(&name)
            .fetch_optional(&mut conn)
            .await
            .unwrap()
            .is_some();
        if !exists {
            let new = format!("{name}_new");
            conn.execute(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {new}")))
                .await
                .unwrap();
            conn.execute(AssertSqlSafe(format!("CREATE DATABASE {new}")))
                .await
                .unwrap();
            let store =
                PostgresStore::connect(&PostgresOptions::new(with_database(&admin_url(), &new)))
                    .await
                    .expect("migrate the template database");
            store.pool().close().await;
            conn.execute(AssertSqlSafe(format!(
                "ALTER DATABASE {new} RENAME TO {name}"
            )))
            .await
            .unwrap();
        }
        conn.execute("SELECT pg_advisory_unlock(424242)")
            .await
            .unwrap();
        name
    }
}

impl Backend for Postgres {
    type Store = PostgresStore;

    async fn temp_db() -> (tempfile::TempDir, Self) {
        let template = Self::template().await;
        let name = format!("beige_t_{:016x}", rand::random::<u64>());
        admin()
            .await
            .execute(AssertSqlSafe(format!(
                "CREATE DATABASE {name} TEMPLATE {template}"
            )))
            .await
            .unwrap();
        let url = with_database(&admin_url(), &name);
        (tempfile::tempdir().expect("temp dir"), Self { name, url })
    }

    async fn open(&self) -> PostgresStore {
        PostgresStore::connect(&PostgresOptions::new(&self.url))
            .await
            .expect("open store")
    }

    fn raw(&self) -> Option<rusqlite::Connection> {
        None
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // Drop cannot wait, and the test's runtime may be this thread: a thread of its own.
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                admin()
                    .await
                    .execute(AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                    )))
                    .await
                    .ok()
            })
        })
        .join();
    }
}

#[tokio::test]
async fn the_postgres_schema_has_the_tables_and_columns_of_sqlite() {
    if !available() {
        return;
    }
    assert_eq!(
        PG_SCHEMA_VERSION, SCHEMA_VERSION,
        "one migration per version on both"
    );
    let (_dir, db) = Postgres::temp_db().await;
    let store = db.open().await;
    // `rowid` is SQLite's implicit column, explicit in PostgreSQL where rows are ordered
    // by it; `beige_schema` is PostgreSQL's `PRAGMA user_version`.
    let pg: BTreeSet<(String, String)> = sqlx::query_as(
        "SELECT table_name::text, column_name::text FROM information_schema.columns
         WHERE table_schema = 'public' AND table_name <> 'beige_schema'
           AND column_name <> 'rowid'",
    )
    .fetch_all(store.pool())
    .await
    .unwrap()
    .into_iter()
    .collect();
    let (_dir, path) = temp_db();
    drop(open(&path));
    let conn = raw(&path);
    let mut stmt = conn
        .prepare(
            "SELECT m.name, p.name FROM sqlite_master m JOIN pragma_table_info(m.name) p
             WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%'",
        )
        .unwrap();
    let sqlite: BTreeSet<(String, String)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(sqlite.len() > 100, "{sqlite:?}");
    assert_eq!(pg, sqlite);
}

#[tokio::test]
async fn a_database_migrated_by_a_newer_beige_is_refused_and_left_alone() {
    if !available() {
        return;
    }
    let (_dir, db) = Postgres::temp_db().await;
    let store = db.open().await;
    sqlx::query("UPDATE beige_schema SET version = $1, min_compatible = $1")
        .bind(PG_SCHEMA_VERSION + 5)
        .execute(store.pool())
        .await
        .unwrap();
    let err = PostgresStore::connect(&PostgresOptions::new(&db.url))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::TooNew { found, .. } if found == PG_SCHEMA_VERSION + 5),
        "{err:?}"
    );
    assert!(err.to_string().contains("upgrade beige"), "{err}");
    // A newer version that says this one may still use it is accepted.
    sqlx::query("UPDATE beige_schema SET min_compatible = 1")
        .execute(store.pool())
        .await
        .unwrap();
    PostgresStore::connect(&PostgresOptions::new(&db.url))
        .await
        .expect("compatible");
}

#[tokio::test]
async fn a_server_off_this_machine_must_be_verified_and_a_password_never_printed() {
    // Refused before any packet is sent: no server is needed.
    let err = PostgresStore::connect_lazy(&PostgresOptions::new(
        "postgres://beige:hunter2@db.example.internal/beige",
    ))
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("sslmode=verify-full"), "{text}");
    assert!(text.contains("allowInsecure"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(text.contains("beige:***@db.example.internal"), "{text}");
    let ok = PostgresOptions {
        allow_insecure: true,
        ..PostgresOptions::new("postgres://beige@db.example.internal/beige")
    };
    assert!(PostgresStore::connect_lazy(&ok).is_ok());
    let verified =
        PostgresOptions::new("postgres://beige@db.example.internal/beige?sslmode=verify-full");
    assert!(PostgresStore::connect_lazy(&verified).is_ok());
    for local in [
        "postgres://beige@localhost/beige",
        "postgres://beige@127.0.0.1:5999/beige",
        "postgres://beige@[::1]:5999/beige",
        "postgres://beige@localhost/beige?host=/tmp/somewhere",
    ] {
        assert!(
            PostgresStore::connect_lazy(&PostgresOptions::new(local)).is_ok(),
            "{local}"
        );
    }
    assert_eq!(
        redact_url("postgres://u:p%40ss@h:5432/db?password=x&sslmode=require"),
        "postgres://u:***@h:5432/db?password=***&sslmode=require"
    );
}

#[tokio::test]
async fn an_unreachable_server_is_a_clear_error_naming_the_database() {
    // A Unix socket directory with no server in it: nothing leaves the machine.
    let dir = tempfile::tempdir().unwrap();
    let options = PostgresOptions {
        acquire_timeout: std::time::Duration::from_secs(2),
        ..PostgresOptions::new(format!(
            "postgres://beige@localhost/beige?host={}",
            dir.path().display()
        ))
    };
    let err = PostgresStore::connect(&options).await.unwrap_err();
    assert!(matches!(err, StoreError::CannotOpen { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("postgres://beige@localhost/beige"), "{text}");
    assert!(text.contains("check store.url"), "{text}");
}

/// `beige store copy`: a home's SQLite database with something in every table, copied
/// into an empty PostgreSQL database, reads back the same through every trait; the
/// copied ids stay and new ones come after them; a second copy into the now full
/// database is refused and changes nothing.
#[tokio::test]
async fn a_sqlite_home_copied_to_postgresql_reads_back_the_same() {
    if !available() {
        return;
    }
    use super::schedules::{claim, record};
    let (_dir, path) = temp_db();
    let sqlite = open(&path);
    let parent = sqlite
        .create_session(new_session("a", "api:a:one"))
        .await
        .unwrap();
    sqlite.append_turn(&parent.id, turn(1)).await.unwrap();
    sqlite.append_turn(&parent.id, turn(2)).await.unwrap();
    sqlite
        .compact(&parent.id, 4, Message::user_text("summary of turn 1"))
        .await
        .unwrap();
    let child = sqlite
        .create_child_session(
            new_session("a", "spawn:a:1"),
            Lineage {
                parent_session_id: parent.id.clone(),
                depth: 1,
                invoked_by_exec: Some("exec-1".into()),
                rights: serde_json::json!({"tools": ["kv"]}),
            },
        )
        .await
        .unwrap();
    sqlite.append_turn(&child.id, turn(3)).await.unwrap();
    sqlite
        .update_settings(
            "api:a:one",
            SettingsPatch {
                verbose: Some(Some(true)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    sqlite
        .set_metadata("api:a:one", "chat", serde_json::json!({"id": 42}))
        .await
        .unwrap();
    sqlite
        .save_health(HealthRecord {
            model_key: "anthropic/claude".into(),
            cooldown_until: Some(99),
            consecutive_failures: 2,
            last_error: Some("429".into()),
        })
        .await
        .unwrap();
    sqlite.set_offset("telegram", 1234).await.unwrap();
    assert!(sqlite.mark_seen("telegram", 1233).await.unwrap());
    sqlite
        .enqueue_outbox("telegram", serde_json::json!({"chat": 7, "text": "hi"}))
        .await
        .unwrap();
    sqlite.kv_set("kv", "a", "k1", "v1").await.unwrap();
    sqlite.kv_set("kv", "a", "k2", "värde").await.unwrap();
    sqlite
        .record_usage(ledger_row(
            "a",
            &parent.id,
            "anthropic/claude",
            1_000,
            usage(10, 20),
            500,
        ))
        .await
        .unwrap();
    sqlite
        .put_schedule(record("nightly", "a", Some(5_000)))
        .await
        .unwrap();
    sqlite
        .claim_run(claim("nightly", "run-1", 5_000, Some(10_000)))
        .await
        .unwrap()
        .unwrap();
    sqlite
        .insert_token(TokenRecord {
            info: TokenInfo {
                id: "tok1".into(),
                user: "mem".into(),
                name: "laptop".into(),
                scope: TokenScope::default(),
                created_ms: 7,
                expires_ms: None,
                last_used_ms: None,
                revoked: false,
            },
            secret_sha256: "ab".repeat(32),
        })
        .await
        .unwrap();
    drop(sqlite);

    let (_pg_dir, db) = Postgres::temp_db().await;
    let pg = db.open().await;
    let mut seen = Vec::new();
    let copied = copy_sqlite_to_postgres(&path, &pg, |t| seen.push(t.table))
        .await
        .unwrap();
    assert_eq!(seen.len(), copied.len());
    let rows = |table: &str| copied.iter().find(|c| c.table == table).unwrap().rows;
    assert_eq!(rows("sessions"), 2);
    assert_eq!(rows("messages"), 13, "three turns of four and a summary");

    let sqlite = open(&path);
    let same_sessions = |a: Vec<SessionRecord>, b: Vec<SessionRecord>| assert_eq!(a, b);
    same_sessions(
        sqlite.list_sessions("a").await.unwrap(),
        pg.list_sessions("a").await.unwrap(),
    );
    for id in [&parent.id, &child.id] {
        assert_eq!(
            sqlite.messages(id, true).await.unwrap(),
            pg.messages(id, true).await.unwrap()
        );
        assert_eq!(
            sqlite.message_revision(id).await.unwrap(),
            pg.message_revision(id).await.unwrap()
        );
    }
    assert_eq!(
        sqlite.session_lineage(&child.id).await.unwrap(),
        pg.session_lineage(&child.id).await.unwrap()
    );
    assert_eq!(
        sqlite.current_session("spawn:a:1").await.unwrap(),
        pg.current_session("spawn:a:1").await.unwrap()
    );
    assert_eq!(
        pg.get_settings("api:a:one").await.unwrap().verbose,
        Some(true)
    );
    assert_eq!(
        pg.get_metadata("api:a:one").await.unwrap(),
        serde_json::json!({"chat": {"id": 42}})
    );
    assert_eq!(
        sqlite.load_health().await.unwrap(),
        pg.load_health().await.unwrap()
    );
    assert_eq!(pg.get_offset("telegram").await.unwrap(), Some(1234));
    assert!(
        !pg.mark_seen("telegram", 1233).await.unwrap(),
        "seen before"
    );
    assert_eq!(
        sqlite.due_outbox("telegram", i64::MAX, 10).await.unwrap(),
        pg.due_outbox("telegram", i64::MAX, 10).await.unwrap()
    );
    assert_eq!(pg.kv_list("kv", "a", "").await.unwrap(), ["k1", "k2"]);
    assert_eq!(
        sqlite.kv_usage("kv", None).await.unwrap(),
        pg.kv_usage("kv", None).await.unwrap(),
        "the usage counters are rebuilt by the trigger"
    );
    let everything = LedgerFilter::default();
    assert_eq!(
        sqlite.usage_totals(everything.clone()).await.unwrap(),
        pg.usage_totals(everything).await.unwrap()
    );
    assert_eq!(
        sqlite.list_schedules(None).await.unwrap(),
        pg.list_schedules(None).await.unwrap()
    );
    assert_eq!(
        sqlite.schedule_runs("nightly", 10).await.unwrap(),
        pg.schedule_runs("nightly", 10).await.unwrap()
    );
    assert_eq!(
        sqlite.list_tokens(None).await.unwrap(),
        pg.list_tokens(None).await.unwrap()
    );
    // New ids come after the copied ones.
    let before = pg.messages(&parent.id, true).await.unwrap();
    let max_id = before.iter().map(|m| m.id).max().unwrap();
    let new_ids = pg.append_turn(&parent.id, turn(4)).await.unwrap();
    assert!(
        new_ids.iter().all(|id| *id > max_id),
        "{new_ids:?} after {max_id}"
    );
    let outbox = pg
        .enqueue_outbox("telegram", serde_json::json!({"n": 2}))
        .await
        .unwrap();
    assert!(outbox > sqlite.due_outbox("telegram", i64::MAX, 10).await.unwrap()[0].id);

    // A second copy finds data and refuses, leaving it as it was.
    let err = copy_sqlite_to_postgres(&path, &pg, |_| {})
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("already holds beige data"),
        "{err}"
    );
    assert_eq!(pg.list_sessions("a").await.unwrap().len(), 2);
}
