//! Run with `cargo run -p beige-examples --example axum_embed` (no Docker, no network,
//! no API key); add `-- --serve` to keep it listening and try it with curl.
//!
//! The gateway inside an existing axum application: the app has its own page at `/`
//! and its own fallback; [`api_router`] adds beige's HTTP API (`/api/...`, with its
//! token, `Host` and `Origin` checks) next to them, on one listener on `127.0.0.1:0`.
//! The gateway runs on the in-memory stand-ins of `beige_core::testing` and a
//! **scripted model** (`ScriptedProvider`, clearly not a real model).

use std::sync::Arc;

use axum::routing::get;
use axum::Router;
use beige_core::channel::http::{api_router, ApiState};
use beige_core::config::Config;
use beige_core::testing::{MemorySandbox, MemoryStore, ScriptedProvider};
use beige_core::{BeigeHome, GatewayBuilder, GatewayFull};
use serde_json::{json, Value};

const TOKEN: &str = "axum-embed-example-token";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let serve = std::env::args().any(|a| a == "--serve");
    let dir = tempfile::tempdir()?;
    let config: Config = serde_json::from_value(json!({
        "llm": {"providers": {"scripted": {}}},
        "agents": {"assistant": {"model": {"provider": "scripted", "model": "demo"}, "tools": []}},
    }))?;
    let gateway = GatewayBuilder::new(config, BeigeHome::new(dir.path()))
        .provider(Arc::new(
            ScriptedProvider::new("scripted").then_text("[scripted model] hello from the app"),
        ))
        .sandbox(Arc::new(MemorySandbox::new()))
        .store(Arc::new(MemoryStore::new()))
        .build()
        .await?;

    // The application's own routes, and beige's API merged in.
    let full: Arc<dyn GatewayFull> = Arc::new(gateway.clone());
    let app = Router::new()
        .route(
            "/",
            get(|| async { "my application, with an agent gateway inside\n" }),
        )
        .merge(api_router(ApiState::new(full, Some(TOKEN.into()))))
        .fallback(|| async { (axum::http::StatusCode::NOT_FOUND, "not a page of my app\n") });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    println!("listening on http://{addr} (API token: {TOKEN})");

    let client = reqwest::Client::new();
    let page = client.get(format!("http://{addr}/")).send().await?;
    assert_eq!(page.status(), 200);
    println!("GET /           → {}", page.text().await?.trim_end());

    let agents: Value = client
        .get(format!("http://{addr}/api/agents"))
        .bearer_auth(TOKEN)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let names: Vec<&str> = agents["agents"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["name"].as_str())
        .collect();
    assert_eq!(names, ["assistant"]);
    println!("GET /api/agents → {names:?}");

    // The API's checks hold inside the app: no token, no answer.
    let refused = client
        .get(format!("http://{addr}/api/agents"))
        .send()
        .await?;
    assert_eq!(refused.status(), 401);
    println!("GET /api/agents without the token → {}", refused.status());
    let other = client
        .get(format!("http://{addr}/elsewhere"))
        .send()
        .await?;
    assert_eq!(other.status(), 404);
    println!(
        "GET /elsewhere  → {} (the app's own fallback)",
        other.status()
    );

    if serve {
        println!("serving until Ctrl-C");
        tokio::signal::ctrl_c().await?;
    }
    server.abort();
    gateway.shutdown().await?;
    Ok(())
}
