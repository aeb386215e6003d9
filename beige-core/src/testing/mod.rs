//! Test seams for embedders and for beige's own tests (cargo feature `test-util`):
//! in-process stand-ins for the parts that need Docker, a database or a model provider,
//! each a faithful implementation of its trait rather than a stub.
//!
//! | item | stands in for |
//! |---|---|
//! | [`ScriptedProvider`] | an LLM provider: a **scripted model** that plays back prepared answers, labelled as such |
//! | [`MemoryAudit`] | the JSONL audit log: keeps the records in memory to read back |
//!
//! Nothing here is meant for production: these types keep everything in memory and make
//! no promise about durability or isolation.

mod memory_audit;

pub use crate::llm::scripted::ScriptedProvider;
pub use memory_audit::MemoryAudit;
