//! Log files the CLI reads and rotates: `gateway.log` (rotated once per daemon start)
//! and `audit.jsonl` (rotated by the gateway by size).
//!
//! Owns rotation by renaming (`x` → `x.1` → … → `x.N`, the oldest dropped) and a
//! [`Follower`] that prints what is appended to a file and carries on across rotation by
//! reopening the path when its inode changes or it shrinks.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often a follower looks for new bytes.
pub const POLL: Duration = Duration::from_millis(200);

/// `path` with `.n` appended.
pub fn numbered(path: &Path, n: u32) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

/// Shift `path` to `path.1`, `path.1` to `path.2` … keeping at most `keep` old files.
/// A missing `path` is not an error (nothing to rotate).
pub fn rotate(path: &Path, keep: u32) -> io::Result<()> {
    if !path.exists() {
        return Ok(());
    }
    if keep == 0 {
        return std::fs::remove_file(path);
    }
    let oldest = numbered(path, keep);
    if oldest.exists() {
        std::fs::remove_file(&oldest)?;
    }
    for n in (1..keep).rev() {
        let from = numbered(path, n);
        if from.exists() {
            std::fs::rename(&from, numbered(path, n + 1))?;
        }
    }
    std::fs::rename(path, numbered(path, 1))
}

/// Reads what is appended to a file, surviving rotation and truncation.
#[derive(Debug)]
pub struct Follower {
    path: PathBuf,
    file: Option<File>,
    inode: Option<u64>,
    offset: u64,
    partial: Vec<u8>,
}

impl Follower {
    /// Follow `path` from its current end (or from the start when `from_start`).
    pub fn new(path: &Path, from_start: bool) -> Self {
        let mut f = Self {
            path: path.to_path_buf(),
            file: None,
            inode: None,
            offset: 0,
            partial: Vec::new(),
        };
        f.reopen();
        if !from_start {
            f.offset = f
                .file
                .as_ref()
                .and_then(|file| file.metadata().ok())
                .map(|m| m.len())
                .unwrap_or(0);
        }
        f
    }

    fn reopen(&mut self) {
        self.file = File::open(&self.path).ok();
        self.inode = self
            .file
            .as_ref()
            .and_then(|f| f.metadata().ok())
            .map(|m| m.ino());
        self.offset = 0;
    }

    /// Complete lines appended since the last call (without their newline). When the
    /// file was replaced (rotation) the rest of the old file is read first, then the new
    /// file from its start.
    pub fn poll_lines(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        self.read_new(&mut out);
        let now = std::fs::metadata(&self.path).ok();
        let replaced = match (&now, self.inode) {
            (Some(m), Some(ino)) => m.ino() != ino || m.len() < self.offset,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if replaced {
            if !self.partial.is_empty() {
                out.push(String::from_utf8_lossy(&self.partial).into_owned());
                self.partial.clear();
            }
            self.reopen();
            self.read_new(&mut out);
        }
        out
    }

    fn read_new(&mut self, out: &mut Vec<String>) {
        let Some(file) = self.file.as_mut() else {
            return;
        };
        let mut buf = Vec::new();
        if file.seek(SeekFrom::Start(self.offset)).is_err() || file.read_to_end(&mut buf).is_err() {
            return;
        }
        self.offset += buf.len() as u64;
        self.partial.extend_from_slice(&buf);
        while let Some(i) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=i).collect();
            out.push(String::from_utf8_lossy(&line[..line.len() - 1]).into_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_keeps_n_files() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("gateway.log");
        for i in 0..5 {
            std::fs::write(&log, format!("run {i}\n")).unwrap();
            rotate(&log, 3).unwrap();
        }
        assert!(!log.exists());
        assert_eq!(
            std::fs::read_to_string(numbered(&log, 1)).unwrap(),
            "run 4\n"
        );
        assert_eq!(
            std::fs::read_to_string(numbered(&log, 3)).unwrap(),
            "run 2\n"
        );
        assert!(!numbered(&log, 4).exists());
        rotate(&dir.path().join("missing.log"), 3).unwrap();
    }

    #[test]
    fn follower_survives_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("x.log");
        std::fs::write(&log, "old\n").unwrap();
        let mut f = Follower::new(&log, false);
        assert!(f.poll_lines().is_empty());
        let append = |s: &str| {
            use std::io::Write;
            let mut file = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&log)
                .unwrap();
            file.write_all(s.as_bytes()).unwrap();
        };
        append("one\ntw");
        assert_eq!(f.poll_lines(), vec!["one"]);
        append("o\n");
        assert_eq!(f.poll_lines(), vec!["two"]);
        append("last of old\n");
        rotate(&log, 2).unwrap();
        append("first of new\n");
        assert_eq!(f.poll_lines(), vec!["last of old", "first of new"]);
        // Truncation starts over.
        std::fs::write(&log, "").unwrap();
        append("again\n");
        assert_eq!(f.poll_lines(), vec!["again"]);
    }
}
