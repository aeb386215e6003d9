//! The shared vocabulary of the engine: the few plain types that policy, audit, hooks,
//! plugins and the core tools all speak, kept in one leaf module that uses nothing else
//! of the crate so that none of those modules has to import another to name them.
//! Each is re-exported where it is documented for users: [`ToolKind`] in `policy`,
//! [`CORE_TOOLS`] in `tools`, [`ToolResult`] in `plugin`.

use serde::{Deserialize, Serialize};

/// Names of the core tools, in the order the model sees them.
pub(crate) const CORE_TOOLS: [&str; 4] = ["read", "write", "patch", "exec"];

/// Core tool or plugin tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// `read`, `write`, `patch`, `exec` (audit `type: "core_tool"`).
    Core,
    /// A plugin tool (audit `type: "tool"`).
    Plugin,
}

/// What a tool returns: stdout for the caller and an exit code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolResult {
    /// What the tool printed.
    pub output: String,
    /// 0 for success.
    pub exit_code: i32,
}

impl ToolResult {
    /// Success with this output.
    pub fn ok(output: impl Into<String>) -> Self {
        Self {
            output: output.into(),
            exit_code: 0,
        }
    }

    /// Failure with this output and exit code.
    pub fn fail(output: impl Into<String>, exit_code: i32) -> Self {
        Self {
            output: output.into(),
            exit_code,
        }
    }
}
