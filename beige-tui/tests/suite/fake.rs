//! The fake gateway of these tests: beige-client's `testing::FakeGateway` (agents and
//! sessions in memory, prompts answered from scripts, every call that matters recorded)
//! and the builders of its records.

pub use beige_client::testing::{agent, model, session, FakeGateway};
