//! The beige terminal UI (a ratatui client of a running gateway).
//!
//! Skeleton: the UI itself is built in a later issue. It will talk to the gateway only
//! through `RemoteGateway`.

/// What `beige-tui` prints until the UI exists.
pub const NOT_YET: &str =
    "beige-tui: the terminal UI is not built yet; use `beige exec` or the HTTP API for now.";
