//! Egress: governed network access for agents (spec: `egress.md`).
//!
//! A sandbox has no IP route out. An agent process's outbound connection reaches PID 1's
//! proxy, travels over the shim link as an egress stream, and arrives here, where this
//! module owns everything that decides and carries it: normalising the target
//! ([`target`]), the one rule matcher every entry point uses ([`rules`]), the one
//! classifier of special-purpose addresses ([`classify`]), the config of rules and
//! credentials ([`config`]), reading what the client sent (its proxy request head,
//! [`http`]; its TLS ClientHello, [`tls`]), and the engine that resolves, pins, dials,
//! audits and splices, or terminates TLS with the per-home CA (`ca`) to check each
//! request and broker credentials (`inspect`).

#[cfg(feature = "egress")]
pub mod ask;
#[cfg(feature = "egress")]
pub mod broker;
#[cfg(feature = "egress")]
pub mod ca;
pub mod classify;
pub mod config;
#[cfg(feature = "egress")]
pub mod engine;
pub mod http;
#[cfg(feature = "egress")]
pub mod inspect;
#[cfg(feature = "egress")]
pub mod placeholder;
pub mod rules;
pub mod scan;
pub mod target;
pub mod tls;
#[cfg(feature = "egress")]
pub mod upstream;
