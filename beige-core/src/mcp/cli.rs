//! The command-line grammar of an MCP tool (placeholder; see `spec/mcp.md` §1.3).
