//! MCP both ways (design: `spec/mcp.md`).
//!
//! beige is an MCP *client* for its agents: a server configured under `mcp.servers` runs
//! inside the agent's sandbox (stdio, started by PID 1 over the shim link) or is reached
//! through egress (streamable HTTP), and each of its tools becomes a subcommand of the
//! `/tools/bin/<server>` launcher, so a script can call it in a loop. beige is also an
//! MCP *server*: an agent's core tools and allowed plugin tools are served to outside
//! MCP clients at `/mcp/agents/{name}`. Both directions go through the gateway's one
//! guarded path: policy, approvals, hooks, budgets and audit.
//!
//! | module | owns |
//! |---|---|
//! | [`cli`] | the command-line grammar of an MCP tool: listings and `--help` made from a tool's schema, argv → arguments, schema validation before a call |
//! | [`client`] | the rmcp clients of the agents' stdio servers, started in their sandboxes over the shim link |
//! | [`remote`] | remote servers (`url`): the streamable-HTTP client whose every connection goes through the agent's egress (checked, pinned, audited), and the credential headers only the gateway sends (feature `egress`) |
//! | [`serve`] | the MCP server: the `ServerHandler` over an agent's tools, the streamable-HTTP service mounted on the API router |

pub mod cli;
pub mod client;
#[cfg(feature = "egress")]
pub mod remote;
pub mod serve;
