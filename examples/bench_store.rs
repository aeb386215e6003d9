//! Store figures for the benchmark harness (issue #19): the same operations on the two
//! backends, each on a database of its own made for the run — SQLite (`synchronous=FULL`,
//! WAL) in a temp dir, and PostgreSQL on the server `BEIGE_BENCH_POSTGRES_URL` names
//! (`scripts/bench` starts one with durability on: fsync and synchronous commit, so the
//! two pay for the same promise). Without that URL the PostgreSQL figures are skipped
//! with a printed reason.
//!
//! - `store_append_turn_{sqlite,pg}`: one turn of four messages (prompt, tool call, tool
//!   result, answer) appended to a session, one writer; ms per turn.
//! - `store_append_turn_16w_{sqlite,pg}`: 16 writers, each on its own session at once;
//!   turns per second over a round of 16 × 25 turns.
//! - `store_context_{sqlite,pg}`: reading a 100-turn session's 400 messages (what a
//!   prompt needs when the gateway has no copy in memory); ms.
//! - `store_kv_set_{sqlite,pg}`: one plugin key-value write within limits; ms.
//! - `lease_renew_{sqlite,pg}`: one renewal of a gateway's 50 leases (one agent each), the
//!   statement every gateway on a shared store runs every 5 s; ms.

use std::sync::Arc;
use std::time::Instant;

use beige_core::llm::{Block, Message, Role, ToolResultPart};
use beige_core::store::{
    KvLimits, NewMessage, NewSession, PluginData as _, PostgresOptions, PostgresStore,
    SessionStore as _, SqliteStore, Store,
};
use beige_core::BeigeHome;
use sqlx::{Connection as _, Executor as _};

use super::Figure;

const SAMPLES: usize = 300;
const WARM: usize = 20;
const WRITERS: usize = 16;
const ROUNDS: usize = 5;
const PER_WRITER: usize = 25;

fn turn(n: usize) -> Vec<NewMessage> {
    let call = format!("call_{n}");
    vec![
        NewMessage::plain(Message::user_text(format!(
            "prompt {n}: what is in the log?"
        ))),
        NewMessage::plain(Message {
            role: Role::Assistant,
            content: vec![Block::ToolUse {
                id: call.clone(),
                name: "exec".into(),
                input: serde_json::json!({"command": "tail -n 20 /workspace/app.log"}),
            }],
        }),
        NewMessage::plain(Message {
            role: Role::User,
            content: vec![Block::ToolResult {
                tool_use_id: call,
                content: vec![ToolResultPart::Text {
                    text: "2026-12-07 ok\n".repeat(20),
                }],
                is_error: false,
            }],
        }),
        NewMessage::plain(Message::assistant_text("The log shows twenty ok lines.")),
    ]
}

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1000.0
}

async fn session<S: Store + ?Sized>(store: &S, key: &str) -> anyhow::Result<String> {
    let new = NewSession {
        agent: "bench".into(),
        key: key.into(),
        parent_id: None,
        model: None,
    };
    Ok(store.create_session(new).await?.id)
}

/// The four figures of one backend, named `<figure>_<suffix>`.
async fn backend_figures(
    store: Arc<dyn Store>,
    suffix: &'static str,
) -> anyhow::Result<Vec<Figure>> {
    let name =
        |base: &str| -> &'static str { Box::leak(format!("{base}_{suffix}").into_boxed_str()) };

    let id = session(&*store, "bench:append").await?;
    let mut append = Vec::with_capacity(SAMPLES);
    for i in 0..WARM + SAMPLES {
        let t = Instant::now();
        store.append_turn(&id, turn(i)).await?;
        if i >= WARM {
            append.push(ms(t));
        }
    }

    let mut throughput = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS {
        let mut ids = Vec::new();
        for w in 0..WRITERS {
            ids.push(session(&*store, &format!("bench:w{round}:{w}")).await?);
        }
        let t = Instant::now();
        let tasks: Vec<_> = ids
            .into_iter()
            .map(|id| {
                let store = store.clone();
                tokio::spawn(async move {
                    for n in 0..PER_WRITER {
                        store.append_turn(&id, turn(n)).await?;
                    }
                    anyhow::Ok(())
                })
            })
            .collect();
        for task in tasks {
            task.await??;
        }
        throughput.push((WRITERS * PER_WRITER) as f64 / t.elapsed().as_secs_f64());
    }

    let ctx_id = session(&*store, "bench:context").await?;
    for n in 0..100 {
        store.append_turn(&ctx_id, turn(n)).await?;
    }
    let mut context = Vec::with_capacity(SAMPLES / 3);
    for i in 0..WARM + SAMPLES / 3 {
        let t = Instant::now();
        let messages = store.messages(&ctx_id, false).await?;
        anyhow::ensure!(messages.len() == 400, "{} messages", messages.len());
        if i >= WARM {
            context.push(ms(t));
        }
    }

    let mut kv = Vec::with_capacity(SAMPLES);
    let limits = KvLimits {
        max_entries: Some(100_000),
        max_bytes: Some(64 << 20),
        entry_overhead: 64,
        whole_plugin: false,
    };
    for i in 0..WARM + SAMPLES {
        let t = Instant::now();
        store
            .kv_set_within(
                "bench",
                "global",
                &format!("key-{}", i % 50),
                "a value of some size",
                limits,
            )
            .await?;
        if i >= WARM {
            kv.push(ms(t));
        }
    }

    for agent in 0..50 {
        store
            .acquire_lease(
                &format!("agent:bench{agent}"),
                "bench-holder",
                std::time::Duration::from_secs(600),
            )
            .await?
            .ok_or_else(|| anyhow::anyhow!("lease agent:bench{agent} is taken"))?;
    }
    let mut renew = Vec::with_capacity(SAMPLES);
    for i in 0..WARM + SAMPLES {
        let t = Instant::now();
        let held = store
            .renew_leases("bench-holder", std::time::Duration::from_secs(600))
            .await?;
        anyhow::ensure!(held.len() == 50, "{} leases held", held.len());
        if i >= WARM {
            renew.push(ms(t));
        }
    }

    Ok(vec![
        Figure {
            name: name("lease_renew"),
            unit: "ms",
            samples: renew,
        },
        Figure {
            name: name("store_append_turn"),
            unit: "ms",
            samples: append,
        },
        Figure {
            name: name("store_append_turn_16w"),
            unit: "turns/s",
            samples: throughput,
        },
        Figure {
            name: name("store_context"),
            unit: "ms",
            samples: context,
        },
        Figure {
            name: name("store_kv_set"),
            unit: "ms",
            samples: kv,
        },
    ])
}

pub async fn figures(home: &BeigeHome) -> anyhow::Result<Vec<Figure>> {
    std::fs::create_dir_all(home.root())?;
    let path = home.root().join("bench-store.db");
    let _ = std::fs::remove_file(&path);
    let sqlite: Arc<dyn Store> = Arc::new(SqliteStore::open(&path)?);
    let mut out = backend_figures(sqlite, "sqlite").await?;

    let Some(admin) = std::env::var("BEIGE_BENCH_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        eprintln!("bench: store figures on PostgreSQL skipped: set BEIGE_BENCH_POSTGRES_URL (scripts/bench does)");
        return Ok(out);
    };
    let db = format!("beige_bench_{}", std::process::id());
    let mut conn = sqlx::PgConnection::connect(&admin).await?;
    conn.execute(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {db}")))
        .await?;
    conn.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db}")))
        .await?;
    let url = match admin.split_once('?') {
        Some((base, query)) => format!(
            "{}/{db}?{query}",
            base.rsplit_once('/').map_or(base, |(b, _)| b)
        ),
        None => format!(
            "{}/{db}",
            admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b)
        ),
    };
    let pg = PostgresStore::connect(&PostgresOptions::new(url)).await?;
    let pool = pg.pool().clone();
    out.extend(backend_figures(Arc::new(pg), "pg").await?);
    pool.close().await;
    conn.execute(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {db} WITH (FORCE)"
    )))
    .await?;
    Ok(out)
}
