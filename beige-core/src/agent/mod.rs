//! The agent: system prompt, events, model routing (restriction, fallback, health,
//! concurrency) and the loop that runs one prompt on one session.
//!
//! Owns the conversation logic between a channel's message and the final answer. Tool
//! calls go through the gateway's guarded path (policy, hooks, audit) — the loop never
//! runs a tool itself — and history goes through the [`crate::store::SessionStore`].

pub(crate) mod events;
pub(crate) mod prompt;
pub(crate) mod router;
