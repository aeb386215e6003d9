//! `beige setup`: create `BEIGE_HOME` (0700) with its folders, a commented default
//! `config.json5`, the API token and the installation id (both 0600; the id names and
//! labels this installation's containers on a shared Docker engine).
//!
//! Idempotent: nothing that exists is ever overwritten. It only tightens the modes of
//! the home folder and the token when they are looser than they must be, and says so.

use std::fs::{self, DirBuilder, OpenOptions, Permissions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use beige_core::home::BeigeHome;
use rand::RngCore;

/// The config written on first setup.
pub const DEFAULT_CONFIG: &str = include_str!("default-config.json5");

/// What [`setup`] did.
#[derive(Debug, Default)]
pub struct SetupReport {
    pub created: Vec<PathBuf>,
    pub skipped: Vec<PathBuf>,
    /// Paths whose mode was tightened, with the new mode.
    pub fixed: Vec<(PathBuf, u32)>,
}

pub fn run(home: &BeigeHome) -> Result<()> {
    let report = setup(home)?;
    print!("{}", render(home, &report));
    Ok(())
}

/// Create whatever is missing.
pub fn setup(home: &BeigeHome) -> Result<SetupReport> {
    let mut report = SetupReport::default();
    let root = home.root();
    ensure_dir(root, &mut report)?;
    fix_mode(root, 0o700, &mut report)?;
    for dir in [
        home.agents_dir(),
        root.join("run"),
        home.plugins_dir(),
        home.logs_dir(),
    ] {
        ensure_dir(&dir, &mut report)?;
    }
    ensure_file(&home.config_path(), DEFAULT_CONFIG.as_bytes(), &mut report)?;
    let token_path = home.token_path();
    if token_path.exists() {
        fix_mode(&token_path, 0o600, &mut report)?;
    }
    ensure_file(&token_path, new_token().as_bytes(), &mut report)?;
    let id_path = home.installation_id_path();
    if id_path.exists() {
        fix_mode(&id_path, 0o600, &mut report)?;
    }
    let (_, created) = home
        .ensure_installation_id()
        .with_context(|| format!("cannot set up {}", root.display()))?;
    if created {
        report.created.push(id_path);
    } else {
        report.skipped.push(id_path);
    }
    Ok(report)
}

/// The report as printed.
pub fn render(home: &BeigeHome, report: &SetupReport) -> String {
    let mut out = String::new();
    if report.created.is_empty() && report.fixed.is_empty() {
        out.push_str(&format!(
            "Nothing to do — BEIGE_HOME ({}) is already set up.\n",
            home.root().display()
        ));
        return out;
    }
    if !report.created.is_empty() {
        out.push_str("Created:\n");
        for path in &report.created {
            out.push_str(&format!("  + {}\n", path.display()));
        }
    }
    if !report.skipped.is_empty() {
        out.push_str("Already exists (skipped):\n");
        for path in &report.skipped {
            out.push_str(&format!("  ~ {}\n", path.display()));
        }
    }
    if !report.fixed.is_empty() {
        out.push_str("Permissions tightened:\n");
        for (path, mode) in &report.fixed {
            out.push_str(&format!("  ! {} is now {mode:04o}\n", path.display()));
        }
    }
    if report.created.contains(&home.config_path()) {
        out.push_str(&format!(
            "\nNext: set ANTHROPIC_API_KEY (or edit {}), then check it with `beige config validate`.\n",
            home.config_path().display()
        ));
    }
    out
}

fn ensure_dir(path: &Path, report: &mut SetupReport) -> Result<()> {
    if path.is_dir() {
        report.skipped.push(path.to_path_buf());
        return Ok(());
    }
    if path.exists() {
        bail!("{} exists but is not a folder", path.display());
    }
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    // The umask may have removed bits; set the mode exactly.
    set_mode(path, 0o700)?;
    report.created.push(path.to_path_buf());
    Ok(())
}

fn ensure_file(path: &Path, contents: &[u8], report: &mut SetupReport) -> Result<()> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    let mut file = match file {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            report.skipped.push(path.to_path_buf());
            return Ok(());
        }
        Err(e) => return Err(e).with_context(|| format!("cannot create {}", path.display())),
    };
    file.write_all(contents)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))?;
    set_mode(path, 0o600)?;
    report.created.push(path.to_path_buf());
    Ok(())
}

/// Tighten `path` to `mode` if any other permission bit is set.
fn fix_mode(path: &Path, mode: u32, report: &mut SetupReport) -> Result<()> {
    let current = fs::metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .permissions()
        .mode()
        & 0o777;
    if current != mode {
        set_mode(path, mode)?;
        report.fixed.push((path.to_path_buf(), mode));
    }
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    fs::set_permissions(path, Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {} to {mode:04o}", path.display()))
}

/// 32 random bytes from the OS, hex-encoded.
fn new_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_64_hex_digits_and_differ() {
        let (a, b) = (new_token(), new_token());
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
