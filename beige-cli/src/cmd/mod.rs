//! What each command does. One module per command group; [`run()`] dispatches and starts
//! the async runtime for the commands that need one.

mod audit;
mod audit_export;
pub mod config;
mod demo;
mod doctor;
mod egress;
pub mod gateway;
pub mod mcp;
pub mod plugins;
mod policy;
mod run;
mod schedule;
mod setup;
pub mod store;
pub mod usage;
pub mod users;

use std::future::Future;

use anyhow::Result;
use beige_core::home::BeigeHome;
use clap::CommandFactory;

use crate::cli::{
    AuditCommand, Cli, Command, ConfigCommand, EgressCommand, GatewayCommand, PolicyCommand,
};
use crate::client::Target;
use crate::Exit;

fn block_on<F: Future<Output = Result<()>>>(f: F) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(f)
}

pub fn run(cli: Cli) -> Result<()> {
    let home = BeigeHome::from_env();
    let config = cli.config.as_deref();
    let target = || Target::resolve(&home, config, cli.gateway.as_deref());
    match cli.command {
        None => print_help(&[]),
        Some(Command::Setup) => setup::run(&home),
        Some(Command::Config { command: None }) => print_help(&["config"]),
        Some(Command::Config {
            command: Some(ConfigCommand::Validate { path }),
        }) => {
            let explicit = path.or(cli.config.clone());
            config::validate(&home, explicit.as_deref())
        }
        Some(Command::Config {
            command: Some(ConfigCommand::Schema),
        }) => config::schema(),
        Some(Command::Gateway { command: None }) => print_help(&["gateway"]),
        Some(Command::Gateway {
            command: Some(command),
        }) => match command {
            GatewayCommand::Start {
                foreground: true, ..
            } => {
                let path = gateway::config_path(&home, config)?;
                block_on(crate::daemon::foreground::run(home.clone(), path))
            }
            GatewayCommand::Start {
                foreground: false,
                timeout,
                ..
            } => block_on(gateway::start(
                &home,
                config,
                cli.log_level.as_deref(),
                timeout,
            )),
            GatewayCommand::Stop { timeout } => block_on(gateway::stop(&home, timeout)),
            GatewayCommand::Restart => {
                let t = target();
                block_on(gateway::restart(&home, &t))
            }
            GatewayCommand::Status => {
                let t = target();
                block_on(gateway::status(&home, &t))
            }
            GatewayCommand::Logs { follow } => gateway::logs(&home, config, follow),
        },
        Some(Command::Run(args)) => {
            let t = target();
            block_on(run::run(&t, args))
        }
        Some(Command::Exec(args)) => {
            let t = target();
            block_on(run::exec(&t, args))
        }
        Some(Command::Sessions(args)) => {
            let t = target();
            block_on(run::sessions(&t, args))
        }
        Some(Command::Usage(args)) => {
            let t = target();
            block_on(usage::run(&t, args))
        }
        Some(Command::Schedule { command: None }) => print_help(&["schedule"]),
        Some(Command::Schedule {
            command: Some(command),
        }) => {
            let t = target();
            block_on(schedule::run(&t, command))
        }
        Some(Command::Plugins { command: None }) => print_help(&["plugins"]),
        Some(Command::Plugins {
            command: Some(command),
        }) => plugins::run(&home, config, command),
        Some(Command::Audit { command: None }) => print_help(&["audit"]),
        Some(Command::Audit {
            command:
                Some(AuditCommand::Tail {
                    follow,
                    agent,
                    session,
                    tree,
                    lines,
                    json,
                }),
        }) => audit::tail(
            &home,
            follow,
            agent.as_deref(),
            session.map(|key| audit::SessionFilter::new(key, tree)),
            lines,
            json,
        ),
        Some(Command::Audit {
            command:
                Some(AuditCommand::Verify {
                    files,
                    pubkey,
                    json,
                }),
        }) => audit::verify(&home, &files, pubkey.as_deref(), json),
        Some(Command::Audit {
            command: Some(AuditCommand::Pubkey),
        }) => audit::pubkey(&home),
        Some(Command::Audit {
            command:
                Some(AuditCommand::Export {
                    format,
                    since,
                    agent,
                    endpoint,
                    output,
                }),
        }) => block_on(audit_export::run(
            &home,
            format,
            since.as_deref(),
            agent,
            endpoint.as_deref(),
            output.as_deref(),
        )),
        Some(Command::Doctor(args)) => block_on(doctor::run(&home, config, args.agent.as_deref())),
        Some(Command::Egress { command: None }) => print_help(&["egress"]),
        Some(Command::Egress {
            command: Some(EgressCommand::Test(args)),
        }) => block_on(egress::test(&home, config, args)),
        Some(Command::Policy { command: None }) => print_help(&["policy"]),
        Some(Command::Policy {
            command: Some(PolicyCommand::Check(args)),
        }) => policy::check(&home, config, args),
        Some(Command::Policy {
            command: Some(PolicyCommand::List { agent, json }),
        }) => policy::list(&home, config, &agent, json),
        Some(Command::Users { command: None }) => print_help(&["users"]),
        Some(Command::Users {
            command: Some(users::UsersCommand::List { json }),
        }) => users::list(&home, config, json),
        Some(Command::Users {
            command: Some(users::UsersCommand::Add(args)),
        }) => users::add(&home, config, &args),
        Some(Command::Users {
            command: Some(users::UsersCommand::Remove { name }),
        }) => users::remove(&home, config, &name),
        Some(Command::Users {
            command: Some(users::UsersCommand::Token { command }),
        }) => block_on(users::token(&target(), &command)),
        Some(Command::Store { command: None }) => print_help(&["store"]),
        Some(Command::Store {
            command: Some(store::StoreCommand::Copy(args)),
        }) => block_on(store::copy(&home, &args)),
        Some(Command::Mcp { command: None }) => print_help(&["mcp"]),
        Some(Command::Mcp {
            command: Some(mcp::McpCommand::List(args)),
        }) => block_on(mcp::list(&target(), &args)),
        Some(Command::Mcp {
            command: Some(mcp::McpCommand::Serve(args)),
        }) => {
            let t = target();
            block_on(mcp::serve(
                &t,
                &home,
                &args.agent,
                args.token_file.as_deref(),
            ))
        }
        Some(Command::Demo) => block_on(demo::run()),
        Some(Command::Tui { agent }) => {
            let t = target();
            block_on(async move {
                let code = beige_tui::run(agent, Some(t.url.clone())).await?;
                match u8::try_from(code) {
                    Ok(0) => Ok(()),
                    Ok(c) => Err(Exit::new(c, "").into()),
                    Err(_) => Err(Exit::new(1, "").into()),
                }
            })
        }
        Some(Command::Completions { shell }) => {
            let mut command = Cli::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command, "beige", &mut script);
            use std::io::Write;
            match std::io::stdout().write_all(&script) {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                r => Ok(r?),
            }
        }
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
