//! Configuration: loading `config.json5`, `${VAR}` interpolation, validation, path
//! resolution and the JSON Schema.
//!
//! Owns turning a file into a validated [`Config`]; it never starts anything. The
//! pipeline is parse (JSON5) → interpolate every string at any depth → deserialize into
//! [`types`] (unknown keys are warnings) → validate (agent names, providers, mounts,
//! limits) → resolve paths against the config file's folder.

pub mod types;

pub use types::*;
