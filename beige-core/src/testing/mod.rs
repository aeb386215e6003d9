//! Test seams for embedders and for beige's own tests (cargo feature `test-util`):
//! in-process stand-ins for the parts that need Docker, a database or a model provider,
//! each a faithful implementation of its trait rather than a stub.
//!
//! | item | stands in for |
//! |---|---|
//! | [`ScriptedProvider`] | an LLM provider: a **scripted model** that plays back prepared answers, labelled as such |
//! | [`MemoryAudit`] | the JSONL audit log: keeps the records in memory to read back |
//! | [`MemorySandbox`] | a sandbox backend (Docker): in-memory files, scripted `exec` answers, plugin tool calls replayed through the gateway's `SandboxHost`; no shim, no host path |
//! | [`MemoryStore`] | the store (`SqliteStore`): sessions, health, channel state and plugin data in memory, same semantics |
//!
//! Nothing here is meant for production: these types keep everything in memory and make
//! no promise about durability or isolation.

mod memory_audit;
mod memory_sandbox;
mod memory_store;

pub use crate::llm::scripted::ScriptedProvider;
pub use memory_audit::MemoryAudit;
pub use memory_sandbox::MemorySandbox;
pub use memory_store::MemoryStore;
