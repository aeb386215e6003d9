//! Moving a home's state from SQLite to PostgreSQL (`beige store copy`): every table of
//! `beige.db`, row for row, into a PostgreSQL database that holds no beige data yet, in
//! one PostgreSQL transaction — all of it arrives or none does. Ids are kept (identity
//! columns included, their sequences moved past them), so sessions, messages, outbox
//! items and runs keep their identities; the plugin usage counters are rebuilt by the
//! target's trigger as the plugin data arrives. The source is read in one read
//! transaction, so the copy is one consistent moment of it; stop the gateway first, or
//! what it writes later stays behind.

use std::path::Path;

use sqlx::Executor as _;

use super::postgres::classify;
use super::{PostgresStore, SqliteStore, StoreError};

/// The tables, parents before children (foreign keys), each with how its rows are
/// ordered in SQLite. `plugin_kv_usage` is not copied: the target's trigger keeps it.
const TABLES: &[(&str, &str)] = &[
    ("sessions", "rowid"),
    ("session_keys", "key"),
    ("messages", "id"),
    ("session_lineage", "created, session_id"),
    ("provider_health", "model_key"),
    ("channel_offsets", "channel"),
    ("channel_seen", "id"),
    ("outbox", "id"),
    ("plugin_kv", "plugin, scope, key"),
    ("usage", "id"),
    ("schedules", "id"),
    ("schedule_runs", "rowid"),
    ("api_tokens", "id"),
    ("leases", "name"),
    ("prompt_answers", "agent, session_key, idem_key"),
];

/// What one table's copy did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopiedTable {
    /// The table.
    pub table: &'static str,
    /// Rows copied.
    pub rows: u64,
}

/// One row of SQLite values.
type Row = Vec<rusqlite::types::Value>;

/// One table read from SQLite: its columns and rows.
type Table = (Vec<String>, Vec<Row>);

/// Copy every table of the SQLite database at `sqlite` (migrated first to this beige's
/// schema) into `target`, which must hold no beige data. `progress` is told each table
/// as it is done.
pub async fn copy_sqlite_to_postgres(
    sqlite: &Path,
    target: &PostgresStore,
    mut progress: impl FnMut(&CopiedTable),
) -> Result<Vec<CopiedTable>, StoreError> {
    // Migrates the file to this version's schema; the connection is then dropped.
    drop(SqliteStore::open(sqlite)?);
    let path = sqlite.to_path_buf();
    let source = tokio::task::spawn_blocking(move || read_all(&path))
        .await
        .map_err(|e| StoreError::Backend {
            path: sqlite.to_path_buf(),
            source: format!("reading the database stopped: {e}").into(),
        })??;

    let name = target.name().to_path_buf();
    let sql = |e: sqlx::Error| classify(e, &name);
    let mut tx = target.pool().begin().await.map_err(sql)?;
    for (table, _) in TABLES {
        let any: Option<i32> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT 1 FROM {table} LIMIT 1"
        )))
        .fetch_optional(&mut *tx)
        .await
        .map_err(sql)?;
        if any.is_some() {
            return Err(StoreError::Invalid {
                message: format!(
                    "{} already holds beige data (table {table} is not empty); copy into an empty database",
                    name.display()
                ),
            });
        }
    }
    let mut done = Vec::new();
    for ((table, _), (columns, rows)) in TABLES.iter().zip(source) {
        let types: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT column_name::text, data_type::text, is_identity::text
             FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name = $1",
        )
        .bind(table)
        .fetch_all(&mut *tx)
        .await
        .map_err(sql)?;
        let type_of = |c: &str| {
            types
                .iter()
                .find(|(n, _, _)| n == c)
                .map(|(_, t, _)| t.as_str())
        };
        let mut placeholders = Vec::with_capacity(columns.len());
        for (i, c) in columns.iter().enumerate() {
            let cast = match type_of(c) {
                Some("jsonb") => "::jsonb",
                Some(_) => "",
                None => {
                    return Err(StoreError::Invalid {
                        message: format!("column {table}.{c} of the SQLite database has no counterpart in PostgreSQL; use the beige version that wrote it"),
                    })
                }
            };
            placeholders.push(format!("${}{cast}", i + 1));
        }
        let identity = types.iter().any(|(_, _, id)| id == "YES");
        let quoted: Vec<String> = columns.iter().map(|c| format!("\"{c}\"")).collect();
        let insert = format!(
            "INSERT INTO {table} ({}) {} VALUES ({})",
            quoted.join(", "),
            if identity {
                "OVERRIDING SYSTEM VALUE"
            } else {
                ""
            },
            placeholders.join(", ")
        );
        for row in &rows {
            let mut q = sqlx::query(sqlx::AssertSqlSafe(insert.clone()));
            for (value, column) in row.iter().zip(&columns) {
                q = bind(q, value, type_of(column).unwrap_or("text"));
            }
            q.execute(&mut *tx).await.map_err(sql)?;
        }
        for (column, _, _) in types.iter().filter(|(_, _, id)| id == "YES") {
            // The next id handed out comes after the copied ones.
            tx.execute(sqlx::AssertSqlSafe(format!(
                "SELECT setval(pg_get_serial_sequence('{table}', '{column}'),
                               coalesce((SELECT max({column}) FROM {table}), 0) + 1, false)"
            )))
            .await
            .map_err(sql)?;
        }
        let copied = CopiedTable {
            table,
            rows: rows.len() as u64,
        };
        progress(&copied);
        done.push(copied);
    }
    tx.commit().await.map_err(sql)?;
    Ok(done)
}

/// Bind one SQLite value as the PostgreSQL column's type wants it.
fn bind<'q>(
    q: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    value: &rusqlite::types::Value,
    pg_type: &str,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    use rusqlite::types::Value;
    match (pg_type, value) {
        ("boolean", Value::Null) => q.bind(None::<bool>),
        ("boolean", Value::Integer(i)) => q.bind(*i != 0),
        ("bigint" | "integer", Value::Null) => q.bind(None::<i64>),
        ("bigint" | "integer", Value::Integer(i)) => q.bind(*i),
        (_, Value::Null) => q.bind(None::<String>),
        (_, Value::Text(t)) => q.bind(t.clone()),
        (_, Value::Integer(i)) => q.bind(i.to_string()),
        (_, Value::Real(r)) => q.bind(r.to_string()),
        (_, Value::Blob(b)) => q.bind(String::from_utf8_lossy(b).into_owned()),
    }
}

/// Every table's columns and rows, in one read transaction.
fn read_all(path: &Path) -> Result<Vec<Table>, StoreError> {
    let fail = |e: rusqlite::Error| super::sqlite::classify(e, path);
    let mut conn = rusqlite::Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(fail)?;
    let tx = conn.transaction().map_err(fail)?;
    let mut out = Vec::with_capacity(TABLES.len());
    for (table, order) in TABLES {
        let mut columns: Vec<String> = tx
            .prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))
            .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
            .map_err(fail)?;
        // SQLite's implicit rowid orders these rows, and PostgreSQL keeps it as a column.
        let with_rowid = order.starts_with("rowid");
        if with_rowid {
            columns.push("rowid".into());
        }
        let list = columns
            .iter()
            .map(|c| format!("\"{c}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let mut stmt = tx
            .prepare(&format!("SELECT {list} FROM {table} ORDER BY {order}"))
            .map_err(fail)?;
        let width = columns.len();
        let rows = stmt
            .query_map([], |r| {
                (0..width)
                    .map(|i| r.get::<_, rusqlite::types::Value>(i))
                    .collect::<rusqlite::Result<Row>>()
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<Row>>>())
            .map_err(fail)?;
        out.push((columns, rows));
    }
    Ok(out)
}
