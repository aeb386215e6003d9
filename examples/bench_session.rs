//! Session figures for the benchmark harness (issue #18, "Sessions"): what the gateway
//! costs for one prompt into a fresh session against one into a session of 1,000 turns,
//! both against a zero-latency **scripted** model (not a real one), with the sessions in
//! a real SQLite store; and the gateway's own time per model turn beside a fake model that
//! speaks the Anthropic Messages wire format over HTTP on `127.0.0.1:0`, timed in the
//! same run.
//!
//! - `prompt_fresh`: one prompt (one model turn, no tool) into a new session each time.
//! - `prompt_history_1000`: the same prompt into one session that already holds 1,000
//!   turns (each a question, an `exec` call, its output and an answer: 4,000 messages,
//!   about 1 MB of JSON), written through the store beforehand.
//! - `scripted_model_1000`: the scripted model's own time for that session's request,
//!   called directly (part of both figures above, not the gateway's).
//! - `prompt_exec_http`, `prompt_exec_parts`, `prompt_exec_overhead`: a prompt whose first
//!   model turn asks for `exec true` and whose second answers, against the same fake HTTP
//!   model; its parts — two direct model calls and one `exec true` through `call_tool`,
//!   timed in the same loop — and the difference: the gateway's own work for a prompt
//!   with one tool call (issue #18 asks ≤ parts + 2 ms).
//! - `prompt_turn_http`, `prompt_turn_model`, `prompt_turn_overhead`: a prompt against
//!   the fake HTTP model, the same model called directly with `reqwest`, and the
//!   difference of each pair — the gateway's own work per model turn (store
//!   transactions, prompt assembly, provider connection, event fan-out).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use beige_core::llm::scripted::ScriptedProvider;
use beige_core::llm::{Block, LlmProvider as _, Message, ModelRequest, Role, ToolResultPart};
use beige_core::sandbox::docker::DockerSandbox;
use beige_core::store::{NewMessage, SessionStore as _, SqliteStore};
use beige_core::{BeigeHome, GatewayBuilder, LocalGateway};
use futures_util::StreamExt as _;

use super::{config, prompt_once, Figure, NoopPlugin};

/// Turns in the long session.
const TURNS: usize = 1000;
/// Prompts timed per figure (after the warm-up).
const SAMPLES: usize = 100;
const WARM: usize = 10;

/// A gateway on the SQLite store at `db` (the handle is returned too, for writing
/// history behind it) with the agent `bench` on `provider`'s model.
async fn session_gateway(
    home: &BeigeHome,
    image: &str,
    shim: &PathBuf,
    providers: serde_json::Value,
    model: serde_json::Value,
    provider: Option<ScriptedProvider>,
) -> anyhow::Result<(LocalGateway, SqliteStore)> {
    let mut cfg = config(image, "unix")?;
    cfg.llm.providers = serde_json::from_value(providers)?;
    if let Some(a) = cfg.agents.get_mut("bench") {
        a.model = serde_json::from_value(model)?;
    }
    std::fs::create_dir_all(home.root())?;
    let store = SqliteStore::open(home.root().join("bench-session.db"))?;
    let (installation, _) = home.ensure_installation_id()?;
    let docker = DockerSandbox::connect(installation.as_str())
        .await?
        .with_legacy_home(home);
    let mut builder = GatewayBuilder::new(cfg, home.clone())
        .shim(shim)
        .sandbox(Arc::new(docker))
        .plugin(Arc::new(NoopPlugin))
        .store(Arc::new(store.clone()));
    if let Some(p) = provider {
        builder = builder.provider(Arc::new(p));
    }
    Ok((builder.build().await?, store))
}

/// One turn of a working session: a question, an `exec` call, its output, an answer.
fn turn(i: usize) -> Vec<NewMessage> {
    let output: String = (0..8)
        .map(|l| {
            format!(
                "-rw-r--r-- 1 agent agent {:>6} src/module_{i}_{l}.rs\n",
                100 * l + i
            )
        })
        .collect();
    vec![
        NewMessage::plain(Message::user_text(format!(
            "Step {i}: list the files of module {i} and tell me which one is the largest."
        ))),
        NewMessage {
            message: Message {
                role: Role::Assistant,
                content: vec![Block::ToolUse {
                    id: format!("toolu_{i:06}"),
                    name: "exec".into(),
                    input: serde_json::json!({"command": format!("ls -l src/module_{i}_*")}),
                }],
            },
            model: Some("scripted/scripted".into()),
            usage: None,
        },
        NewMessage::plain(Message {
            role: Role::User,
            content: vec![Block::ToolResult {
                tool_use_id: format!("toolu_{i:06}"),
                content: vec![ToolResultPart::Text { text: output }],
                is_error: false,
            }],
        }),
        NewMessage {
            message: Message::assistant_text(format!(
                "[scripted] The largest file of module {i} is src/module_{i}_7.rs; the others are smaller. Shall I open it?"
            )),
            model: Some("scripted/scripted".into()),
            usage: None,
        },
    ]
}

/// The scripted model: answers every call with one line of text at once.
fn answering(calls: usize) -> ScriptedProvider {
    let mut p = ScriptedProvider::new("scripted");
    for _ in 0..calls {
        p = p.then_text("[scripted] done");
    }
    p
}

async fn scripted_figures(
    home: &BeigeHome,
    image: &str,
    shim: &PathBuf,
) -> anyhow::Result<Vec<Figure>> {
    let calls = 2 * (WARM + SAMPLES) + 1;
    // A context window the 1,000-turn session fits in without compaction.
    let providers = serde_json::json!({"scripted": {
        "api": "anthropic-messages",
        "models": {"scripted": {"contextWindow": 2_000_000}}
    }});
    let model = serde_json::json!({"provider": "scripted", "model": "scripted"});
    let (gw, store) =
        session_gateway(home, image, shim, providers, model, Some(answering(calls))).await?;

    for i in 0..WARM {
        prompt_once(&gw, format!("api:bench:fresh-warm{i}")).await?;
    }
    let mut fresh = Vec::new();
    for i in 0..SAMPLES {
        fresh.push(prompt_once(&gw, format!("api:bench:fresh{i}")).await?);
    }

    // The long session: its first prompt creates it, the store fills it behind the
    // gateway's back (a realistic writer: another replica, or a restart in between).
    let key = "api:bench:long".to_string();
    prompt_once(&gw, key.clone()).await?;
    let session = store
        .current_session(&key)
        .await?
        .ok_or_else(|| anyhow::anyhow!("the long session was not created"))?;
    for i in 1..TURNS {
        store.append_turn(&session.id, turn(i)).await?;
    }
    for _ in 0..WARM {
        prompt_once(&gw, key.clone()).await?;
    }
    let mut long = Vec::new();
    for _ in 0..SAMPLES {
        long.push(prompt_once(&gw, key.clone()).await?);
    }
    gw.shutdown().await?;

    // The scripted model's own time for that session's request.
    let history: Vec<Message> = store
        .messages(&session.id, false)
        .await?
        .into_iter()
        .map(|m| m.message)
        .collect();
    let model = answering(SAMPLES);
    let mut own = Vec::new();
    for _ in 0..SAMPLES {
        let request = ModelRequest {
            model: "scripted".into(),
            system: String::new(),
            messages: history.iter().cloned().collect(),
            tools: Vec::new(),
            max_tokens: 1024,
            thinking: beige_core::config::ThinkingLevel::Off,
            reasoning: false,
        };
        let t = Instant::now();
        let mut events = model.stream(request).await?;
        while let Some(e) = events.next().await {
            e?;
        }
        own.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(vec![
        Figure {
            name: "prompt_fresh",
            unit: "ms",
            samples: fresh,
        },
        Figure {
            name: "prompt_history_1000",
            unit: "ms",
            samples: long,
        },
        Figure {
            name: "scripted_model_1000",
            unit: "ms",
            samples: own,
        },
    ])
}

/// The streamed answer of the fake model: one text block, as Anthropic sends it.
const ANSWER: &str = concat!(
    "event: message_start\n",
    "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_bench\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-6\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":120,\"output_tokens\":1}}}\n\n",
    "event: content_block_start\n",
    "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"[fake model] \"}}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"done\"}}\n\n",
    "event: content_block_stop\n",
    "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    "event: message_delta\n",
    "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":4}}\n\n",
    "event: message_stop\n",
    "data: {\"type\":\"message_stop\"}\n\n",
);

/// The streamed answer that asks for one `exec true`, as Anthropic sends a tool call.
const EXEC_TRUE: &str = concat!(
    "event: message_start\n",
    "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_bench_tool\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-6\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":120,\"output_tokens\":1}}}\n\n",
    "event: content_block_start\n",
    "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_bench\",\"name\":\"exec\",\"input\":{}}}\n\n",
    "event: content_block_delta\n",
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"command\\\": \\\"true\\\"}\"}}\n\n",
    "event: content_block_stop\n",
    "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    "event: message_delta\n",
    "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":9}}\n\n",
    "event: message_stop\n",
    "data: {\"type\":\"message_stop\"}\n\n",
);

/// A fake Anthropic Messages server on `127.0.0.1:0`: every `POST /v1/messages` gets
/// [`ANSWER`] after reading the whole request body — or, with `with_exec`, [`EXEC_TRUE`]
/// while the request holds no tool result yet.
async fn fake_model_with(with_exec: bool) -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
    let app = axum::Router::new().route(
        "/v1/messages",
        axum::routing::post(move |body: axum::body::Bytes| async move {
            let asks = with_exec && !body.windows(11).any(|w| w == b"tool_result");
            (
                [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
                if asks { EXEC_TRUE } else { ANSWER },
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((url, task))
}

/// The fake Anthropic server ([`fake_model_with`]) and a gateway whose agent `bench`
/// uses it: the gateway, the server's URL (for direct calls) and its task.
async fn fake_model_gateway(
    home: &BeigeHome,
    image: &str,
    shim: &PathBuf,
    with_exec: bool,
) -> anyhow::Result<(LocalGateway, String, tokio::task::JoinHandle<()>)> {
    let (url, server) = fake_model_with(with_exec).await?;
    let providers = serde_json::json!({"fake": {
        "api": "anthropic-messages",
        "apiKey": "sk-ant-bench-0123456789",
        "baseUrl": url,
    }});
    let model = serde_json::json!({"provider": "fake", "model": "claude-sonnet-4-6"});
    let (gw, _store) = session_gateway(home, image, shim, providers, model, None).await?;
    Ok((gw, url, server))
}

async fn http_figures(
    home: &BeigeHome,
    image: &str,
    shim: &PathBuf,
) -> anyhow::Result<Vec<Figure>> {
    let (gw, url, server) = fake_model_gateway(home, image, shim, false).await?;
    let client = reqwest::Client::new();
    let direct = || direct_call(&client, &url);
    let key = |i: usize| format!("api:bench:http{i}");
    for i in 0..WARM {
        direct().await?;
        prompt_once(&gw, key(i)).await?;
    }
    let (mut whole, mut own, mut overhead) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..SAMPLES {
        let m = direct().await?;
        let p = prompt_once(&gw, key(WARM + i)).await?;
        whole.push(p);
        own.push(m);
        overhead.push(p - m);
    }
    gw.shutdown().await?;
    server.abort();
    Ok(vec![
        Figure {
            name: "prompt_turn_http",
            unit: "ms",
            samples: whole,
        },
        Figure {
            name: "prompt_turn_model",
            unit: "ms",
            samples: own,
        },
        Figure {
            name: "prompt_turn_overhead",
            unit: "ms",
            samples: overhead,
        },
    ])
}

/// The fake model called directly (no gateway): one streamed answer, in ms.
async fn direct_call(client: &reqwest::Client, url: &str) -> anyhow::Result<f64> {
    let t = Instant::now();
    let body = client
        .post(format!("{url}/v1/messages"))
        .header("x-api-key", "sk-ant-bench-0123456789")
        .header("anthropic-version", "2023-06-01")
        .json(&serde_json::json!({
            "model": "claude-sonnet-4-6",
            "max_tokens": 1024,
            "stream": true,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "go"}]}],
        }))
        .send()
        .await?
        .error_for_status()?
        .bytes()
        .await?;
    anyhow::ensure!(body.ends_with(b"message_stop\"}\n\n"), "a cut answer");
    Ok(t.elapsed().as_secs_f64() * 1000.0)
}

/// A prompt with one `exec true` against the fake HTTP model, beside its parts timed in
/// the same loop: two direct model calls and one `exec true` through `call_tool`.
async fn http_exec_figures(
    home: &BeigeHome,
    image: &str,
    shim: &PathBuf,
) -> anyhow::Result<Vec<Figure>> {
    use beige_core::Gateway as _;
    let (gw, url, server) = fake_model_gateway(home, image, shim, true).await?;
    let client = reqwest::Client::new();
    let direct = || direct_call(&client, &url);
    let exec = || async {
        let call = beige_core::api::tools::CoreToolCall::parse(
            "exec",
            serde_json::json!({"command": "true"}),
        )?;
        let t = Instant::now();
        let out = gw
            .call_tool(
                "bench",
                call,
                beige_core::api::tools::ToolContext::default(),
            )
            .await?;
        anyhow::ensure!(!out.is_error, "exec true failed: {}", out.joined_text());
        Ok::<f64, anyhow::Error>(t.elapsed().as_secs_f64() * 1000.0)
    };
    let key = |i: usize| format!("api:bench:exec{i}");
    for i in 0..WARM {
        direct().await?;
        exec().await?;
        prompt_once(&gw, key(i)).await?;
    }
    let (mut whole, mut parts, mut overhead) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..SAMPLES {
        let part = direct().await? + exec().await? + direct().await?;
        let p = prompt_once(&gw, key(WARM + i)).await?;
        whole.push(p);
        parts.push(part);
        overhead.push(p - part);
    }
    gw.shutdown().await?;
    server.abort();
    Ok(vec![
        Figure {
            name: "prompt_exec_http",
            unit: "ms",
            samples: whole,
        },
        Figure {
            name: "prompt_exec_parts",
            unit: "ms",
            samples: parts,
        },
        Figure {
            name: "prompt_exec_overhead",
            unit: "ms",
            samples: overhead,
        },
    ])
}

/// Every session figure, each part in its own home below `home`.
pub(crate) async fn figures(
    home: &BeigeHome,
    image: &str,
    shim: &PathBuf,
) -> anyhow::Result<Vec<Figure>> {
    let scripted_home = BeigeHome::new(home.root().join("session-scripted"));
    let http_home = BeigeHome::new(home.root().join("session-http"));
    let mut figures = scripted_figures(&scripted_home, image, shim).await?;
    figures.extend(http_figures(&http_home, image, shim).await?);
    let exec_home = BeigeHome::new(home.root().join("session-exec"));
    figures.extend(http_exec_figures(&exec_home, image, shim).await?);
    Ok(figures)
}
