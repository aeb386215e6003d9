//! Log files the CLI reads and rotates: `gateway.log` (rotated at every daemon start and,
//! while the daemon runs, by size through [`RotatingLog`]) and `audit.jsonl` (rotated by
//! the gateway).
//!
//! Owns rotation by renaming (`x` → `x.1` → … → `x.N`, the oldest dropped), the
//! daemon's log writer [`RotatingLog`], and a [`Follower`] that prints what is appended
//! to a file and carries on across rotation by reopening the path when its inode changes
//! or it shrinks.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
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

/// The daemon's log: `gateway.log` written through `tracing`, rotated when the next
/// line would take it past `max_size` bytes (keeping `keep` old files, as at start).
/// The process's stdout and stderr are pointed at the current file too, so that a
/// panic message or a stray print lands in it rather than in a rotated one.
#[derive(Debug)]
pub struct RotatingLog {
    path: PathBuf,
    max_size: u64,
    keep: u32,
    file: Mutex<(File, u64)>,
}

impl RotatingLog {
    /// Open `path` for appending (creating it) and point stdout and stderr at it.
    /// `max_size` 0 never rotates.
    pub fn open(path: &Path, max_size: u64, keep: u32) -> io::Result<Self> {
        let file = append(path)?;
        let size = file.metadata()?.len();
        redirect_stdio(&file);
        Ok(Self {
            path: path.to_path_buf(),
            max_size,
            keep,
            file: Mutex::new((file, size)),
        })
    }

    /// Append one formatted log event, rotating first when it would not fit.
    fn write_line(&self, buf: &[u8]) -> io::Result<()> {
        let mut guard = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let (file, size) = &mut *guard;
        if self.max_size > 0 && *size > 0 && *size + buf.len() as u64 > self.max_size {
            match rotate(&self.path, self.keep).and_then(|()| append(&self.path)) {
                Ok(fresh) => {
                    redirect_stdio(&fresh);
                    *file = fresh;
                    *size = 0;
                }
                // Keep writing where we are rather than lose the line.
                Err(e) => {
                    let note = format!(
                        "beige: could not rotate {} ({e}); it keeps growing until it can\n",
                        self.path.display()
                    );
                    let _ = file.write_all(note.as_bytes());
                }
            }
        }
        file.write_all(buf)?;
        *size += buf.len() as u64;
        Ok(())
    }
}

fn append(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// Point fds 1 and 2 at `file` (best effort: a failure leaves them where they were).
fn redirect_stdio(file: &File) {
    let _ = rustix::stdio::dup2_stdout(file);
    let _ = rustix::stdio::dup2_stderr(file);
}

/// One `tracing` event's writes into a [`RotatingLog`] (the formatter writes an event
/// in one piece).
#[derive(Debug)]
pub struct RotatingWriter<'a>(&'a RotatingLog);

impl Write for RotatingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write_line(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for RotatingLog {
    type Writer = RotatingWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        RotatingWriter(self)
    }
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
    fn the_daemon_log_rotates_by_size_while_it_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("gateway.log");
        std::fs::write(&log, "from the start\n").unwrap();
        // Only the writer: redirecting the test's own stdio is not wanted here.
        let file = append(&log).unwrap();
        let size = file.metadata().unwrap().len();
        let writer = RotatingLog {
            path: log.clone(),
            max_size: 100,
            keep: 2,
            file: Mutex::new((file, size)),
        };
        let mut w = tracing_subscriber::fmt::MakeWriter::make_writer(&writer);
        for i in 0..30 {
            w.write_all(format!("line {i:02} of the daemon log\n").as_bytes())
                .unwrap();
        }
        for p in [log.clone(), numbered(&log, 1), numbered(&log, 2)] {
            let len = std::fs::metadata(&p).unwrap().len();
            assert!(len <= 100, "{} is {len} bytes", p.display());
        }
        assert!(!numbered(&log, 3).exists());
        let current = std::fs::read_to_string(&log).unwrap();
        assert!(
            current.ends_with("line 29 of the daemon log\n"),
            "{current}"
        );
        // A line never straddles two files.
        let previous = std::fs::read_to_string(numbered(&log, 1)).unwrap();
        assert!(previous.starts_with("line ") && previous.ends_with("log\n"));
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
