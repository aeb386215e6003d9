//! Test support shared by beige's crates: fake servers that speak the real wire formats
//! of LLM providers (and later Telegram) on `127.0.0.1:0`, recording what clients send.
//!
//! Everything here is for tests and benchmarks only (`publish = false`). Servers bind to
//! loopback only.

pub mod anthropic;
pub mod google;
pub mod llm;
pub mod openai_completions;
pub mod openai_responses;
pub mod postgres;
pub mod telegram;
