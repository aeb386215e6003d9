//! `beige store copy`: a home's state moves into an empty PostgreSQL database (the test
//! server of `scripts/setup-postgres`, a database of the test's own), and a second copy
//! into the now full database is refused.

use beige_core::store::{PluginData as _, PostgresOptions, PostgresStore, SqliteStore};
use sqlx::{Connection as _, Executor as _};

use super::TestEnv;

#[test]
fn store_copy_moves_the_homes_state_into_postgresql_once() {
    let Some(admin) = beige_testkit::postgres::url() else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let env = TestEnv::new();
    assert_eq!(env.run(&["setup"]).code, Some(0));
    // Nothing to copy yet: a clear error.
    let run = env.run(&["store", "copy", "--to", &admin]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("no database at"), "{}", run.stderr);

    // A home with plugin data in its database.
    rt.block_on(async {
        let store = SqliteStore::open(env.home().join("beige.db")).unwrap();
        store
            .kv_set("kv", "agent:bot", "greeting", "hej")
            .await
            .unwrap();
    });
    let name = format!("beige_cli_{:016x}", std::process::id() as u64 * 7919);
    let url = rt.block_on(async {
        let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap();
        conn.execute(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name}"
        )))
        .await
        .unwrap();
        conn.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await
            .unwrap();
        beige_testkit::postgres::with_database(&admin, &name)
    });

    let run = env.run(&["store", "copy", "--to", &url]);
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .lines()
            .any(|l| l.trim_start().starts_with("plugin_kv") && l.contains(" 1 row(s)")),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("store: { url:"), "{}", run.stdout);
    let value = rt.block_on(async {
        let pg = PostgresStore::connect(&PostgresOptions::new(&url))
            .await
            .unwrap();
        pg.kv_get("kv", "agent:bot", "greeting").await.unwrap()
    });
    assert_eq!(value.as_deref(), Some("hej"));

    let again = env.run(&["store", "copy", "--to", &url]);
    assert_eq!(again.code, Some(1), "{}", again.stdout);
    assert!(
        again.stderr.contains("already holds beige data"),
        "{}",
        again.stderr
    );

    rt.block_on(async {
        let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap();
        conn.execute(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .await
        .unwrap();
    });
}
