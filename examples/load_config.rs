//! Run with `cargo run -p beige-examples --example load_config -- path/to/config.json5`
//! (defaults to `$BEIGE_HOME/config.json5`).
//!
//! Loads and validates a configuration exactly as the gateway does, prints the warnings,
//! and shows each agent's model, tools, its portable sandbox spec and the container the
//! Docker backend would ask Docker for — without starting anything.

use beige_core::config::{Config, WritableTrees};
use beige_core::home::InstallationId;
use beige_core::sandbox::docker::{BodyInput, ContainerSpec};
use beige_core::sandbox::{SandboxSpec, SandboxUser, SpecInput};
use beige_core::BeigeHome;

fn main() -> anyhow::Result<()> {
    let home = BeigeHome::from_env();
    let path = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| home.config_path());
    let loaded = Config::load(&path, &home)?;
    for w in &loaded.warnings {
        eprintln!("warning: {w}");
    }
    // The gateway makes the installation id at its first start; without one yet, the
    // names and labels below use a placeholder.
    let installation = match home.read_installation_id()? {
        Some(id) => id,
        None => {
            eprintln!(
                "note: {} does not exist yet; container names use a random id",
                home.installation_id_path().display()
            );
            InstallationId::generate()
        }
    };
    let writable = WritableTrees::of_config(&loaded.config, &home);
    for (name, agent) in &loaded.config.agents {
        println!(
            "{name}: {}/{} tools={:?}",
            agent.model.provider, agent.model.model, agent.tools
        );
        let spec = SandboxSpec::for_agent(&SpecInput {
            home: &home,
            installation: &installation,
            writable: &writable,
            agent: name,
            config: agent,
            workspace: loaded.config.agent_workspace(&home, name),
            user: SandboxUser::DEFAULT,
            tools: Vec::new(),
            tool_packages: Vec::new(),
            skills: Vec::new(),
        })?;
        println!("{}", serde_json::to_string_pretty(&spec)?);
        let container = ContainerSpec::from_spec(
            &spec,
            &BodyInput {
                shim: std::path::Path::new("/usr/local/lib/beige/beige-shim"),
                launchers: home.launchers_dir(name),
                run_dir: home.run_dir(name),
                link: agent.sandbox.link,
            },
        );
        println!("{}", serde_json::to_string_pretty(&container)?);
    }
    Ok(())
}
