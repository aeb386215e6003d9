//! # beige-client
//!
//! The beige gateway as its clients see it: the [`Gateway`], [`Sessions`] and [`Admin`]
//! traits (together [`GatewayFull`]), a prompt and the [`AgentEvent`]s it streams, the
//! records the traits return, [`GatewayError`], [`Principal`], the layout of
//! `BEIGE_HOME` ([`BeigeHome`]) and [`RemoteGateway`], the HTTP/SSE client of a running
//! gateway.
//!
//! It is what a terminal client, `beige run` or an out-of-process channel needs, and no
//! more: no Docker, no SQLite, no HTTP server, no LLM client, and never `beige-core`.
//! The engine, `beige-core`, implements the traits in process (`LocalGateway`) and
//! re-exports every item here at its old path (`beige_core::gateway::Gateway`,
//! `beige_core::llm::Message`, `beige_core::store::SessionRecord`, …) and as a whole
//! as `beige_core::api`.
//!
//! | module | owns |
//! |---|---|
//! | [`auth`] | [`Role`](auth::Role), [`Action`](auth::Action), [`Caller`](auth::Caller), [`Refusal`](auth::Refusal), token records |
//! | [`approvals`] | [`Approval`](approvals::Approval), [`ApprovalDecision`](approvals::ApprovalDecision), [`ApprovalEvent`](approvals::ApprovalEvent), button codes |
//! | [`gateway`] | the traits, their `Arc`/`Box` forwarding, [`AgentEventStream`], [`AgentInfo`], [`AllowedModel`] |
//! | [`prompt`] | [`PromptRequest`] |
//! | [`schedules`] | [`ScheduleSpec`](schedules::ScheduleSpec), [`ScheduleView`](schedules::ScheduleView), [`ScheduleRun`](schedules::ScheduleRun) and their vocabulary |
//! | [`events`] | [`AgentEvent`], [`OutputStream`], [`hint_for`] |
//! | [`llm`] | the message vocabulary: [`Message`], [`Block`], [`Role`], [`ToolResultPart`], [`Usage`], [`ErrorKind`], [`ModelInfo`], [`ThinkingLevel`] |
//! | [`session`] | [`SessionRecord`], [`SessionSettings`], [`SettingsPatch`] |
//! | [`tools`] | [`CoreToolCall`] and its parameters, [`InvalidCall`], [`ToolOutput`] and its [`ToolOutcome`], [`ContentBlock`], [`Transport`], [`ToolContext`] |
//! | [`status`] | what [`Admin`] reports: [`ModelHealth`], [`SandboxStatus`], [`LinkMode`], [`LinkStatus`], [`DiskStatus`] |
//! | [`hooks`] | [`HookName`] |
//! | [`error`] | [`GatewayError`], [`BoxError`] |
//! | [`principal`] | [`Principal`] |
//! | [`home`] | [`BeigeHome`]: every path in `BEIGE_HOME`, the installation id |
//! | `remote` | [`RemoteGateway`] (feature `remote`) |
//! | `testing` | `FakeGateway`, an in-memory gateway for tests (feature `test-util`) |
//!
//! ## Cargo features
//!
//! | feature | default | gates |
//! |---|---|---|
//! | `remote` | yes | [`RemoteGateway`] (reqwest, eventsource-stream, json5) |
//! | `schemars` | no | `JsonSchema` for [`ThinkingLevel`] and [`LinkMode`] (beige-core's config schema) |
//! | `test-util` | no | `testing::FakeGateway` |
//!
//! ```
//! use std::sync::Arc;
//! use beige_client::{Gateway, GatewayFull, PromptRequest};
//!
//! async fn ask(gateway: Arc<dyn GatewayFull>) -> Result<(), beige_client::GatewayError> {
//!     let events = gateway
//!         .prompt(PromptRequest::new("assistant", "api:assistant:default", "hello"))
//!         .await?
//!         .collect_all()
//!         .await;
//!     println!("{} events", events.len());
//!     Ok(())
//! }
//! ```

#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::print_stdout, clippy::print_stderr))]

pub mod approvals;
pub mod auth;
pub mod error;
pub mod events;
pub mod gateway;
pub mod home;
pub mod hooks;
pub mod llm;
pub mod principal;
pub mod prompt;
#[cfg(feature = "remote")]
pub mod remote;
pub mod schedules;
pub mod session;
pub mod status;
#[cfg(feature = "test-util")]
pub mod testing;
pub mod tools;
pub mod usage;

pub use error::{BoxError, GatewayError};
pub use events::{hint_for, AgentEvent, OutputStream};
pub use gateway::{
    Admin, AgentEventStream, AgentInfo, AgentTool, AllowedModel, ApprovalEventStream, Gateway,
    GatewayFull, McpServerView, McpToolView, Sessions,
};
pub use home::{BeigeHome, HomeError, InstallationId};
pub use hooks::HookName;
pub use llm::{Block, ErrorKind, Message, ModelInfo, Role, ThinkingLevel, ToolResultPart, Usage};
pub use principal::Principal;
pub use prompt::PromptRequest;
#[cfg(feature = "remote")]
pub use remote::{RemoteGateway, DEFAULT_GATEWAY_URL};
pub use session::{SessionRecord, SessionSettings, SettingsPatch};
pub use status::{DiskStatus, FsSpace, FsStatus, LinkMode, LinkStatus, ModelHealth, SandboxStatus};
pub use tools::{
    AgentToolCall, ContentBlock, CoreToolCall, ExecParams, InvalidCall, PatchParams, ReadParams,
    ToolContext, ToolOutcome, ToolOutput, Transport, WriteParams,
};
