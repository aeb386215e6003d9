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
//! beige-tui uses, without this crate). Every item of it is re-exported here at its old
//! path (`gateway::Gateway`, `llm::Message`, `store::SessionRecord`, …) and the whole
//! crate as [`api`].
//!
//! | module | owns |
//! |---|---|
//! | [`api`] | beige-client: the traits, requests, events and records every gateway shares |
//! | [`config`] | loading, interpolating and validating `config.json5` |
//! | [`home`] | the layout of `BEIGE_HOME` |
//! | [`sandbox`] | the container spec, the `Sandbox` trait and the Docker backend |
//! | [`tools`] | the four core tools and their result texts |
//! | [`gateway`] | the `Gateway` trait every channel talks to, and `LocalGateway` |
//! | [`policy`] | whether a tool call may run (allow, deny or ask, with its reason), which tools an agent sees, who is calling (`Principal`), approvers |
//! | [`audit`] | the audit log (`audit.jsonl`) |
//! | [`hooks`] | the nine hooks and how they chain |
//! | [`plugin`] | the `Plugin` and `Tool` traits and the registry |
//! | [`skills`] | skill folders: manifests, requirements |
//! | [`fsutil`] | host-side access to agent-writable trees (`Beneath`: openat2 beneath a handle, no links) and caller path checks |
//! | [`store`] | sessions, messages, settings, health, channel offsets/outbox, plugin data |
//! | [`disk`] | free space of the host filesystems, and the guard that pauses agents |
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
//! | `test-util` | no | the test seams in `testing` (stand-ins for Docker, the store, a model) |
//!
//! With none of them the crate still has the gateway traits, [`gateway::RemoteGateway`],
//! config, policy, audit, hooks, plugins and the core tools. A missing piece is an error
//! of [`GatewayBuilder::build`], never a panic: a configured provider whose client is left
//! out is [`GatewayError::NotCompiledIn`], `plugins.telegram` without `telegram` a plugin
//! error, no [`GatewayBuilder::store`] without `sqlite` [`GatewayError::NoStore`], no
//! [`GatewayBuilder::sandbox`] without `docker` [`GatewayError::NoSandbox`].

#![cfg_attr(not(test), deny(clippy::print_stdout, clippy::print_stderr))]

pub mod agent;
pub mod audit;
pub mod channel;
pub mod config;
pub mod disk;
pub mod fsutil;
pub mod gateway;
pub mod home;
pub mod hooks;
pub mod llm;
pub mod plugin;
pub mod policy;
mod principal;
pub mod sandbox;
pub mod skills;
pub mod socket;
pub mod store;
#[cfg(feature = "test-util")]
pub mod testing;
pub mod tools;
mod vocab;

pub use beige_client as api;
pub use config::Config;
pub use gateway::{
    Admin, AgentEventStream, Gateway, GatewayBuilder, GatewayError, GatewayFull, LocalGateway,
    PromptRequest, Sessions,
};
pub use home::BeigeHome;
