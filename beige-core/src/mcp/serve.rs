//! beige as an MCP server (placeholder; see `spec/mcp.md` §2).
