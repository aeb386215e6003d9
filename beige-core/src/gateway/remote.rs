//! [`RemoteGateway`]: the [`Gateway`](super::Gateway) trait over the HTTP API of a
//! running gateway — what the CLI, the TUI and out-of-process channels use. It lives in
//! beige-client (`beige_client::remote`); this is its old path.

pub use beige_client::remote::{RemoteGateway, DEFAULT_GATEWAY_URL};
