//! `beige plugins install|list|remove|update`: plugins in `config.json5` and
//! `<BEIGE_HOME>/plugins`. The grammar of the group lives here (registered in
//! [`crate::cli`]); the work is done by [`crate::install`], which edits the
//! config file in place, keeping its comments and formatting.

use std::path::Path;

use crate::install::{self, InstallError, Installed, PluginKind};
use anyhow::Result;
use beige_core::home::BeigeHome;
use clap::Subcommand;

use crate::Exit;

#[derive(Debug, Subcommand)]
pub enum PluginsCommand {
    /// Install the plugins of a folder or git repository and add them to the config
    #[command(
        after_help = "Sources:\n  ./path, /path                    a local folder (copied into <BEIGE_HOME>/plugins/<name>)\n  git+https://host/owner/repo[#ref]  a git repository, cloned with git and pinned to the commit\n  git+file:///path/to/repo[#ref]\n  github:owner/repo[/path][#ref]   https://github.com/owner/repo\n\nA source holds one plugin (plugin.json at its root) or several (one per subfolder); all\nare installed. The config file is edited in place: comments and formatting stay.\nnpm packages of the original beige cannot run in this build (see docs/external-plugins.md)."
    )]
    Install {
        /// Where the plugin comes from (see below)
        source: String,
        /// Replace plugins that are already installed (their config is kept)
        #[arg(short, long)]
        force: bool,
    },
    /// List the plugins in the config
    List,
    /// Remove a plugin: its entry in the config and its folder in <BEIGE_HOME>/plugins
    Remove {
        /// The plugin's name (its key under `plugins`)
        name: String,
    },
    /// Fetch plugins again from their _source and reinstall them (their config is kept)
    Update {
        /// Only this plugin [default: every plugin with a _source]
        name: Option<String>,
    },
}

/// Run a `beige plugins` command against the config at `--config` (or the home's).
pub fn run(home: &BeigeHome, config: Option<&Path>, command: PluginsCommand) -> Result<()> {
    let path = super::gateway::config_path(home, config)?;
    let file = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "the config".into());
    match command {
        PluginsCommand::Install { source, force } => {
            println!("Installing from: {source}");
            match install::install(&path, home, &source, force) {
                Ok(report) => {
                    for note in &report.notes {
                        eprintln!("note: {note}");
                    }
                    print_installed(
                        &report.installed,
                        &format!(
                            "Installed {} plugin(s) and added to {file}:",
                            report.installed.len()
                        ),
                    );
                    let tools = report
                        .installed
                        .iter()
                        .map(|p| format!("\"{}\"", p.name))
                        .collect::<Vec<_>>()
                        .join(", ");
                    println!();
                    println!("Next: give agents the tools in their `tools` list (e.g. tools: [{tools}]) and restart the gateway (beige gateway restart).");
                    let key = match report.installed.as_slice() {
                        [one] => one.name.clone(),
                        _ => "<name>".to_string(),
                    };
                    println!(
                        "Settings go under plugins.{key}.config in {}.",
                        path.display()
                    );
                    Ok(())
                }
                Err(e @ InstallError::Conflicts { .. }) => Err(Exit::new(1, e.to_string()).into()),
                Err(e) => Err(Exit::new(1, format!("Failed to install: {e}")).into()),
            }
        }
        PluginsCommand::List => {
            let listed = install::list(&path).map_err(|e| Exit::new(1, format!("error: {e}")))?;
            if listed.is_empty() {
                println!("No plugins in {file}.");
                println!("Install one with: beige plugins install <source>  (beige plugins install --help)");
                return Ok(());
            }
            println!("Plugins in {file}:");
            for p in listed {
                let kind = match &p.kind {
                    PluginKind::BuiltIn => "built in".to_string(),
                    PluginKind::External => "external plugin".to_string(),
                    PluginKind::CommandTools => "command tools".to_string(),
                    PluginKind::NotInstalled => "not installed (no path)".to_string(),
                    PluginKind::Broken(why) => format!("broken: {why}"),
                };
                match &p.description {
                    Some(d) if !d.is_empty() => println!("  {} ({kind}) — {d}", p.name),
                    _ => println!("  {} ({kind})", p.name),
                }
                if let Some(path) = &p.path {
                    println!("    Path:   {}", path.display());
                }
                if let Some(source) = &p.source {
                    println!("    Source: {source}");
                }
                if p.has_config {
                    println!("    Config: ✓ (has config values)");
                }
            }
            Ok(())
        }
        PluginsCommand::Remove { name } => {
            let removal = install::remove(&path, home, &name)
                .map_err(|e| Exit::new(1, format!("Failed to remove: {e}")))?;
            match (removal.removed_entry, &removal.deleted_dir) {
                (true, Some(_)) => println!("Removed plugin '{name}' from {file} and disk."),
                (true, None) => println!("Removed plugin '{name}' from {file}."),
                (false, _) => println!("Removed plugin '{name}' from disk (it was not in {file})."),
            }
            if let Some(dir) = &removal.kept_dir {
                println!(
                    "Its folder {} was left alone (it is not in {}).",
                    dir.display(),
                    home.plugins_dir().display()
                );
            }
            for w in &removal.warnings {
                eprintln!("warning: {w}");
            }
            Ok(())
        }
        PluginsCommand::Update { name: Some(name) } => {
            let report = install::update(&path, home, Some(&name))
                .map_err(|e| Exit::new(1, format!("Failed to update: {e}")))?;
            for (plugin, why) in &report.skipped {
                println!("Skipped {plugin}: {why}");
            }
            if !report.updated.is_empty() {
                print_installed(
                    &report.updated,
                    &format!(
                        "Updated {} plugin(s) from the same source:",
                        report.updated.len()
                    ),
                );
            }
            Ok(())
        }
        PluginsCommand::Update { name: None } => {
            let report = install::update(&path, home, None)
                .map_err(|e| Exit::new(1, format!("Failed to update: {e}")))?;
            if report.updated.is_empty() && report.failed.is_empty() && report.skipped.is_empty() {
                println!("No plugins with a _source in {file}.");
                return Ok(());
            }
            for p in &report.updated {
                println!("Updated {}{}", p.name, commit_note(p));
            }
            for (plugin, why) in &report.skipped {
                println!("Skipped {plugin}: {why}");
            }
            for (source, error) in &report.failed {
                println!("Failed: {source} — {error}");
            }
            println!(
                "Update complete: {} updated, {} failed.",
                report.updated.len(),
                report.failed.len()
            );
            Ok(())
        }
    }
}

fn commit_note(p: &Installed) -> String {
    match &p.commit {
        Some(c) => format!(" (commit {})", &c[..c.len().min(12)]),
        None => String::new(),
    }
}

fn print_installed(installed: &[Installed], heading: &str) {
    println!("{heading}");
    for p in installed {
        if p.description.is_empty() {
            println!("  - {}{}", p.name, commit_note(p));
        } else {
            println!("  - {}: {}{}", p.name, p.description, commit_note(p));
        }
    }
}
