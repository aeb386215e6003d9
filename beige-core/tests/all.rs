//! Integration tests of beige-core against real components (the Docker engine, the
//! static shim, real files). See `suite/support.rs` for how Docker tests skip or fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod suite;
