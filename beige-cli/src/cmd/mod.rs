//! What each command does. One module per command group; [`run`] dispatches.

mod config;
mod setup;

use anyhow::Result;
use beige_core::home::BeigeHome;
use clap::CommandFactory;

use crate::cli::{Cli, Command, ConfigCommand};

pub fn run(cli: Cli) -> Result<()> {
    let home = BeigeHome::from_env();
    match cli.command {
        None => print_help(&[]),
        Some(Command::Setup) => setup::run(&home),
        Some(Command::Config { command: None }) => print_help(&["config"]),
        Some(Command::Config {
            command: Some(ConfigCommand::Validate { path }),
        }) => {
            let explicit = path.or(cli.config);
            config::validate(&home, explicit.as_deref())
        }
        Some(Command::Config {
            command: Some(ConfigCommand::Schema),
        }) => config::schema(),
    }
}

/// Help of the (sub)command at `path`, on stdout, for a group called without a command.
fn print_help(path: &[&str]) -> Result<()> {
    let mut command = Cli::command();
    command.build();
    let mut target = &mut command;
    for name in path {
        target = target
            .find_subcommand_mut(name)
            .ok_or_else(|| anyhow::anyhow!("no command '{name}'"))?;
    }
    target.print_help()?;
    Ok(())
}
