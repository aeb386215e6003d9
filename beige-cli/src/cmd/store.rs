//! `beige store copy`: move a stopped home's state (`<BEIGE_HOME>/beige.db`) into an empty
//! PostgreSQL database, then point the config's `store.url` at it (`docs/scaling.md`).

use std::path::PathBuf;

use anyhow::Result;
use beige_core::config::store::StoreConfig;
use beige_core::home::BeigeHome;
use beige_core::store::{copy_sqlite_to_postgres, PostgresOptions, PostgresStore};

use crate::daemon::{PidFile, PidState};
use crate::Exit;

/// `beige store …`.
#[derive(Debug, clap::Subcommand)]
pub enum StoreCommand {
    /// Copy this home's state (beige.db) into an empty PostgreSQL database
    #[command(
        after_help = "Example:\n  beige gateway stop\n  beige store copy --to 'postgres://beige@db.internal/beige?sslmode=verify-full' --password-file /run/secrets/beige-pg\n\nEverything is copied in one transaction, or nothing is. beige.db is left as it was.\nThen set store.url (and store.passwordFile) in the config and start the gateway."
    )]
    Copy(CopyArgs),
}

/// `beige store copy`.
#[derive(Debug, clap::Args)]
pub struct CopyArgs {
    /// The PostgreSQL database: postgres://user@host/database?sslmode=verify-full
    #[arg(long, value_name = "URL")]
    pub to: String,
    /// A file holding the database password
    #[arg(long, value_name = "FILE")]
    pub password_file: Option<PathBuf>,
    /// Allow a server off this machine that the URL does not verify
    #[arg(long)]
    pub allow_insecure: bool,
}

/// Copy `beige.db` into the database `args.to` names.
pub async fn copy(home: &BeigeHome, args: &CopyArgs) -> Result<()> {
    if let PidState::Running(pid) = PidFile::new(home).state() {
        return Err(Exit::new(
            1,
            format!("the gateway of this home is running (PID {pid}); stop it first (`beige gateway stop`) so that nothing it writes afterwards is left behind"),
        )
        .into());
    }
    let db = home.db_path();
    if !db.is_file() {
        return Err(Exit::new(
            1,
            format!(
                "no database at {}: this home has no state to copy",
                db.display()
            ),
        )
        .into());
    }
    let config = StoreConfig {
        url: args.to.clone(),
        password_file: args.password_file.clone(),
        pool: None,
        allow_insecure: args.allow_insecure,
    };
    if let Some((_, message)) = config.problem() {
        return Err(Exit::new(2, format!("error: --to: {message}")).into());
    }
    let target = async {
        let options = PostgresOptions::from_config(&config)?;
        PostgresStore::connect(&options).await
    }
    .await
    .map_err(|e| Exit::new(1, e.to_string()))?;
    println!("Copying {} to {}", db.display(), target.name().display());
    let copied = copy_sqlite_to_postgres(&db, &target, |t| {
        println!("  {:<16} {:>8} row(s)", t.table, t.rows);
    })
    .await
    .map_err(|e| Exit::new(1, e.to_string()))?;
    let total: u64 = copied.iter().map(|t| t.rows).sum();
    println!(
        "Done: {total} row(s) in {} tables. To use it, set in the config:\n  store: {{ url: {:?} }}",
        copied.len(),
        target.name().display().to_string()
    );
    Ok(())
}
