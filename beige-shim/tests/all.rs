//! Integration tests of the `beige-shim` binary: each test runs the built binary the
//! way the gateway does (`beige-shim op <name>` with one JSON request on stdin) against
//! a temporary workspace (`BEIGE_WORKSPACE`), or the way a sandbox does (a `kv` symlink,
//! the tool client) against a fake gateway socket, or as PID 1 holding the link
//! (`init --agent-user … --link unix|attach`, not really PID 1) against a fake gateway
//! speaking frames. Tests that switch to uid 1000 need root and are skipped without it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;
