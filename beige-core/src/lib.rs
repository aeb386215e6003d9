//! # beige-core
//!
//! The beige SDK: a secure, self-hosted gateway that lets AI agents do real work in
//! Docker sandboxes without ever getting the host.
//!
//! Each agent lives in its own container with a persistent `/workspace`. The model gets
//! four core tools — `read`, `write`, `patch`, `exec` — that act inside the sandbox; the
//! gateway on the host is the only thing that holds secrets and reaches host resources.
//!
//! The client side of the gateway — the `Gateway`, `Sessions` and `Admin` traits,
//! prompts and their events, the message vocabulary, session records, `GatewayError`,
//! `Principal`, `BeigeHome` and `RemoteGateway` — is the crate [`beige_client`] (what
//! beige-tui uses, without this crate). Its items are re-exported here at the root or
//! where they belong ([`Gateway`], `llm::Message`, `store::SessionRecord`, …) and the
//! whole crate as [`api`].
//!
//! ## Quick start
//!
//! A gateway in a few lines, with the in-memory stand-ins of `testing` (feature
//! `test-util`) and a **scripted model** — no Docker, no network, no API key. For a real
//! gateway leave out `provider`, `sandbox` and `store`: the config's provider, the
//! Docker backend and `<home>/beige.db` are the defaults. `docs/embedding.md` goes on
//! from here.
//!
//! ```rust
//! # #[cfg(feature = "test-util")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use beige_core::testing::{MemorySandbox, MemoryStore, ScriptedProvider};
//! use beige_core::{AgentEvent, BeigeHome, Config, Gateway, GatewayBuilder, PromptRequest};
//! use serde_json::json;
//!
//! let home = tempfile::tempdir()?;
//! let config: Config = serde_json::from_value(json!({
//!     "llm": { "providers": { "scripted": {} } },
//!     "agents": { "assistant": {
//!         "model": { "provider": "scripted", "model": "demo" }, "tools": []
//!     } }
//! }))?;
//! let model = ScriptedProvider::new("scripted") // clearly not an LLM
//!     .then_tool("t1", "exec", json!({ "command": "echo hello" }))
//!     .then_text("[scripted model] done");
//! let sandbox = Arc::new(MemorySandbox::new());
//! let gateway = GatewayBuilder::new(config, BeigeHome::new(home.path()))
//!     .provider(Arc::new(model))
//!     .sandbox(sandbox.clone())
//!     .store(Arc::new(MemoryStore::new()))
//!     .build()
//!     .await?;
//! let events = gateway
//!     .prompt(PromptRequest::new("assistant", "api:assistant:default", "say hello"))
//!     .await?
//!     .collect_all()
//!     .await;
//! assert!(matches!(events.last(), Some(AgentEvent::Done { .. })));
//! assert_eq!(sandbox.executed("assistant"), ["echo hello"]);
//! gateway.shutdown().await?;
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "test-util"))]
//! # fn main() {}
//! ```
//!
//! ## Modules
//!
//! Public, each a part of the contract:
//!
//! | module | owns |
//! |---|---|
//! | [`api`] | beige-client: the traits, requests, events and records every gateway shares |
//! | [`config`] | loading, interpolating and validating `config.json5` |
//! | [`home`] | the layout of `BEIGE_HOME` |
//! | [`sandbox`] | the portable `SandboxSpec`, the `Sandbox` and `SandboxHost` traits, the operation a core tool call becomes, and the Docker backend (feature `docker`) |
//! | [`approvals`] | approval requests bound to the exact call: the broker, who may decide, expiry, live grants, the `approvals` config |
//! | [`policy`] | whether a tool call may run (allow, deny or ask, with its reason), which tools an agent sees, who is calling (`Principal`), approvers |
//! | [`audit`] | the audit log (`audit.jsonl`), bounded per agent |
//! | [`hooks`] | the nine hooks and how they chain |
//! | [`plugin`] | the `Plugin` and `Tool` traits, the registry, external plugins and command tools, the built-in `kv`, safe access to agent-writable trees (`Beneath`) |
//! | [`channel`] | the `Channel` trait and `ChannelContext`; the HTTP API (feature `http-api`) and Telegram (feature `telegram`) |
//! | [`llm`] | the `LlmProvider` trait, the provider clients (one feature each), the model catalogue |
//! | [`store`] | the store traits by owner (`SessionStore`, `HealthStore`, `ChannelState`, `PluginData`) and `SqliteStore` (feature `sqlite`) |
//! | [`disk`] | free space of the host filesystems, and the guard that pauses agents |
//! | [`egress`] | governed network access: the rules, the address classifier, the resolver and dialer seams, the engine that decides and carries a sandbox's outbound streams (feature `egress`) |
//! | [`mcp`] | MCP both ways: MCP servers' tools as sandbox CLIs, and an agent's tools served to MCP clients (feature `mcp`) |
//! | `testing` | in-memory stand-ins for tests and examples (feature `test-util`) |
//!
//! Private, their public items re-exported at the root or in a public module:
//!
//! | module | owns |
//! |---|---|
//! | `gateway` | [`GatewayBuilder`], the reloadable [`LocalGateway`] and its `serve` (channels, signals, reload), the guarded path every call takes |
//! | `agent` | the agent loop: the model router and its health, the system prompt ([`system_prompt`]) |
//! | `tools` | the four core tools, the operations they become ([`sandbox::to_request`]) and their result texts |
//! | `skills` | skill folders: manifests, requirements ([`SkillSet`]) |
//! | `socket` | the per-agent tool socket the Docker backend serves, and its limits (`sandbox::docker::SocketLimits`) |
//! | `fsutil` | host-side access to agent-writable trees (openat2 beneath a handle, no links; [`plugin::Beneath`]) and caller path checks |
//!
//! ## Cargo features
//!
//! | feature | default | gates |
//! |---|---|---|
//! | `docker` | yes | the Docker sandbox backend, `sandbox::docker` (bollard, tar) |
//! | `http-api` | yes | the HTTP API channel, `channel::http` (axum) |
//! | `sqlite` | yes | the default store, `store::SqliteStore` (rusqlite, SQLite bundled) |
//! | `anthropic` | yes | the `anthropic-messages` client, `llm::anthropic` |
//! | `openai` | yes | the `openai-completions` and `openai-responses` clients, `llm::openai_completions`, `llm::openai_responses` |
//! | `google` | yes | the `google-generative-ai` client, `llm::google` |
//! | `telegram` | yes, for now | the built-in Telegram channel and plugin, `channel::telegram` |
//! | `egress` | yes | governed network access for agents, [`egress`] (rules, the address classifier, hickory DNS) |
//! | `metrics` | no (the `beige` binary turns it on) | the Prometheus registry behind [`metrics::Metrics`] and `GET /metrics` (prometheus-client); without it the counters are no-ops |
//! | `otel` | no (the `beige` binary turns it on) | OpenTelemetry traces exported over OTLP/HTTP by [`telemetry::Traces`] (opentelemetry_sdk, opentelemetry-otlp); without it spans are no-ops and a config with `telemetry.otlp.traces` is refused |
//! | `mcp` | no (the `beige` binary turns it on) | MCP both ways, [`mcp`] (rmcp, jsonschema) |
//! | `test-util` | no | the test seams in `testing` (stand-ins for Docker, the store, a model) |
//!
//! With none of them the crate still has the gateway traits, [`RemoteGateway`],
//! config, policy, audit, hooks, plugins and the core tools. A missing piece is an error
//! of [`GatewayBuilder::build`], never a panic: a configured provider whose client is left
//! out is [`GatewayError::NotCompiledIn`], `plugins.telegram` without `telegram` a plugin
//! error, no [`GatewayBuilder::store`] without `sqlite` [`GatewayError::NoStore`], no
//! [`GatewayBuilder::sandbox`] without `docker` [`GatewayError::NoSandbox`].

#![cfg_attr(not(test), deny(clippy::print_stdout, clippy::print_stderr))]
#![warn(unreachable_pub)]
#![warn(missing_docs)]

mod agent;
mod alloc;
pub mod approvals;
pub mod audit;
pub mod budget;
pub mod channel;
pub mod config;
pub mod disk;
pub mod egress;
mod fsutil;
mod gateway;
pub mod home;
pub mod hooks;
pub mod ident;
pub mod llm;
#[cfg(feature = "mcp")]
pub mod mcp;
pub mod metrics;
mod platform;
pub mod plugin;
pub mod policy;
mod principal;
pub mod sandbox;
pub mod schedule;
mod skills;
#[cfg(feature = "docker")]
mod socket;
pub mod store;
pub mod telemetry;
#[cfg(feature = "test-util")]
pub mod testing;
mod tools;
mod vocab;

pub use beige_client as api;
pub use beige_client::{
    Admin, AgentEvent, AgentEventStream, AgentInfo, AllowedModel, BoxError, Gateway, GatewayError,
    GatewayFull, PromptRequest, RemoteGateway, Sessions,
};
pub use config::Config;
pub use gateway::{
    ConfigFile, ConfigSource, GatewayBuilder, LocalGateway, ReloadOutcome, ServeError, Shutdown,
    Snapshot, DEFAULT_DRAIN,
};
pub use home::BeigeHome;

pub use agent::prompt::{system_prompt, PromptSession, PromptSkill, PromptTool};
pub use alloc::return_large_allocations;
pub use channel::{Channel, ChannelContext};
pub use llm::LlmProvider;
pub use plugin::{Plugin, Tool};
pub use policy::{Approver, Decision, Policy, Principal};
pub use sandbox::{Sandbox, SandboxHost, SandboxSpec};
pub use skills::{SkillError, SkillSet};
pub use store::{Store, Stores};
