//! `AgentEvent`: what one prompt produces, in order. Every channel — HTTP SSE, TUI,
//! Telegram, `beige run` — renders this same stream. It lives in beige-client
//! (`beige_client::events`); this is its old path.

pub(crate) use beige_client::events::{hint_for, AgentEvent};
