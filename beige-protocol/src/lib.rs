//! Wire types shared by the beige gateway and the in-sandbox shim.
//!
//! This crate owns the *shape* of every message that crosses the sandbox boundary and
//! nothing else: it depends only on serde, has no async runtime and no C code, so the
//! static shim can link it. Behaviour (what a request means, who may send it) lives in
//! `beige-core` and `beige-shim`.
//!
//! - [`op`]: the core-tool operations (`read`, `write`, `patch`, `exec`) the gateway asks
//!   `beige-shim op <name>` to perform inside a container — one JSON request on stdin,
//!   one JSON reply on stdout.
//! - [`link`]: the frames of the persistent link between the gateway and the shim
//!   running as PID 1, which carries those operations without `docker exec`.
//! - [`socket`]: plugin-tool calls from scripts in the sandbox to the gateway over the
//!   agent's Unix socket (newline-delimited JSON, compatible with the original).
//! - [`spawn`]: long-lived processes in the sandbox (MCP servers) whose stdin and stdout
//!   are a connection of their own to the gateway.
//! - [`procfs`]: the `/proc/<pid>/stat` and `NS*:` status fields both sides read to name
//!   a process (which exec a caller of the socket belongs to).

pub mod link;
pub mod op;
pub mod procfs;
pub mod socket;
pub mod spawn;
