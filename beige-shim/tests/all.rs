//! Integration tests of the `beige-shim` binary: each test runs the built binary the
//! way the gateway does (`beige-shim op <name>` with one JSON request on stdin) against
//! a temporary workspace (`BEIGE_WORKSPACE`), or the way a sandbox does (a `kv` symlink,
//! the tool client) against a fake gateway socket.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;
