//! The command-line grammar (clap derive): global options and the command tree.
//!
//! Owns names, flags and help texts only; what a command does lives in [`crate::cmd`].

use std::path::PathBuf;

use clap::{ArgAction, Parser, Subcommand};

/// Where commands that talk to a running gateway find it by default.
pub const DEFAULT_GATEWAY_URL: &str = "http://127.0.0.1:7433";

/// beige: a secure self-hosted gateway that runs AI agents in Docker sandboxes.
#[derive(Debug, Parser)]
#[command(
    name = "beige",
    version,
    disable_version_flag = true,
    after_help = "Environment:\n  BEIGE_HOME  where beige keeps its config, token, data and logs [default: ~/.beige]\n  RUST_LOG    log filter when --log-level is not given"
)]
pub struct Cli {
    /// Config file [default: <BEIGE_HOME>/config.json5]
    #[arg(short, long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// URL of the running gateway
    #[arg(short, long, global = true, value_name = "URL", default_value = DEFAULT_GATEWAY_URL)]
    pub gateway: String,

    /// Log filter, e.g. info or beige_core=debug [default: $RUST_LOG, else warn]
    #[arg(long, global = true, value_name = "LEVEL")]
    pub log_level: Option<String>,

    /// Print the version
    #[arg(short = 'v', long, action = ArgAction::Version)]
    version: Option<bool>,

    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create BEIGE_HOME, a commented default config.json5 and the API token (never
    /// overwrites anything)
    Setup,
    /// Check a config file or print its JSON Schema
    Config {
        #[command(subcommand)]
        command: Option<ConfigCommand>,
    },
    // Next: Gateway, Run, Exec, Tui, Plugins, Sessions, Audit, Doctor, Completions, Demo
    // (see the CLI table in the surfaces spec).
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Load and validate a config file; prints warnings and a summary
    Validate {
        /// The file to check [default: --config, else <BEIGE_HOME>/config.json5]
        path: Option<PathBuf>,
    },
    /// Print the JSON Schema of config.json5
    Schema,
}
