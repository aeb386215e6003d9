//! Integration tests of the `beige` binary: one test binary, modules under `suite/`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;
