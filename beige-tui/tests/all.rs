//! Integration tests of beige-tui: `update` driven with a fake gateway, and snapshots of
//! every screen state on ratatui's `TestBackend`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;
