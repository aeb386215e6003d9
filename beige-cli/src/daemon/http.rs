//! The record of in-place restarts. The HTTP API's restart endpoint answers at once
//! (202) and the gateway reloads in the background; the outcome of each restart is
//! written to [`RestartRecord::path`] so `beige gateway restart` can wait for it and
//! report a config error.

use std::path::PathBuf;

use beige_core::home::BeigeHome;
use serde::{Deserialize, Serialize};

/// The outcome of the last in-place restart, as written for `beige gateway restart`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartRecord {
    /// Counts restarts of this daemon process, from 1.
    pub seq: u64,
    /// The daemon's pid (a new daemon starts counting again).
    pub pid: u32,
    pub ok: bool,
    pub message: String,
}

impl RestartRecord {
    /// `<BEIGE_HOME>/gateway.restart.json`.
    pub fn path(home: &BeigeHome) -> PathBuf {
        home.root().join("gateway.restart.json")
    }

    pub fn read(home: &BeigeHome) -> Option<Self> {
        let text = std::fs::read_to_string(Self::path(home)).ok()?;
        serde_json::from_str(&text).ok()
    }

    pub(super) fn write(&self, home: &BeigeHome) {
        let path = Self::path(home);
        let tmp = path.with_extension("json.tmp");
        let written = serde_json::to_vec(self)
            .map_err(std::io::Error::other)
            .and_then(|b| std::fs::write(&tmp, b))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            tracing::warn!(path = %path.display(), error = %e, "could not record the restart outcome");
        }
    }
}
