//! `beige config validate` and `beige config schema`.
//!
//! Validation is exactly the gateway's load ([`Config::load`]); this module only picks
//! the file (running first-time setup when the default one is missing) and reports.

use std::path::Path;

use anyhow::Result;
use beige_core::config::{self, Config};
use beige_core::home::BeigeHome;

use super::setup;

/// Check `explicit`, else `<BEIGE_HOME>/config.json5` (set up first if missing).
pub fn validate(home: &BeigeHome, explicit: Option<&Path>) -> Result<()> {
    let path = match explicit {
        Some(path) => path.to_path_buf(),
        None => {
            ensure_setup(home)?;
            home.config_path()
        }
    };
    let loaded = Config::load(&path, home)?;
    for warning in &loaded.warnings {
        eprintln!("warning: {}: {warning}", loaded.path.display());
    }
    let agents: Vec<&str> = loaded.config.agents.keys().map(String::as_str).collect();
    let providers = loaded.config.llm.providers.len();
    println!(
        "✓ {} is valid: {} ({}), {}",
        loaded.path.display(),
        plural(agents.len(), "agent"),
        agents.join(", "),
        plural(providers, "provider"),
    );
    Ok(())
}

pub fn schema() -> Result<()> {
    println!("{}", serde_json::to_string_pretty(&config::json_schema())?);
    Ok(())
}

/// Commands that need a config run setup first when there is none, and say so (on
/// stderr, so their own output stays clean).
pub fn ensure_setup(home: &BeigeHome) -> Result<()> {
    if home.config_path().exists() {
        return Ok(());
    }
    eprintln!("First run — setting up {}…", home.root().display());
    let report = setup::setup(home)?;
    eprint!("{}", setup::render(home, &report));
    eprintln!();
    Ok(())
}

fn plural(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}
