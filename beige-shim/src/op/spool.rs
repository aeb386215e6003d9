//! The output file of an `exec` whose output outgrew its cap: all of the output, stdout
//! and stderr in the order they came, kept in the workspace at
//! `.beige/out/<exec id>.log` so the model can read on where the capped reply stops.
//!
//! Nothing is written for output that fits the cap, so the common `exec` costs nothing
//! here. Until the cap is reached the spool only notes which stream each run of bytes
//! came from (a small journal; the bytes themselves are in the [`Capture`], which drops
//! nothing before the cap). The first chunk that would make the capture drop bytes
//! opens the file, replays the journal against the capture's still-complete streams,
//! and from then on every chunk is appended as it comes. A journal that grows past
//! [`MAX_JOURNAL`] runs (a command alternating tiny writes between the streams) starts
//! the file early, and a file that turns out unneeded is removed at the end.
//!
//! The file is made by the op process, which runs as the agent with no privileges, with
//! `O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600, in directories that must not be symbolic
//! links; it belongs to the agent like any file it writes. It holds at most
//! [`EXEC_OUTPUT_FILE_MAX_BYTES`]; making one removes the oldest output files beyond
//! [`EXEC_OUTPUT_FILES_KEPT`]. A failure to write it never fails the `exec`: the reply
//! says why instead.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use beige_protocol::op::{
    exec_output_file, OutputFile, EXEC_OUTPUT_DIR, EXEC_OUTPUT_FILES_KEPT,
    EXEC_OUTPUT_FILE_MAX_BYTES,
};

use super::capture::{Capture, Stream};

/// Most journal entries (runs of one stream) kept before the file is started early.
pub const MAX_JOURNAL: usize = 4096;

/// Longest error text put in the reply.
const MAX_ERROR_LEN: usize = 300;

/// Where the spool is.
#[derive(Debug)]
enum State {
    /// Below the cap: only the journal.
    Watching,
    /// The file is open and every chunk goes to it.
    Writing(File),
    /// The file holds [`EXEC_OUTPUT_FILE_MAX_BYTES`]; later bytes are counted only.
    Full,
    /// The file could not be made or written.
    Failed(String),
}

/// One exec's output spool.
#[derive(Debug)]
pub struct Spool {
    /// The workspace the file is made in.
    workspace: PathBuf,
    /// The file's path, absolute.
    path: PathBuf,
    /// The output cap of the capture.
    cap: u64,
    /// Bytes seen so far, both streams.
    seen: u64,
    /// Runs of bytes by stream, in order, while [`State::Watching`].
    journal: Vec<(Stream, u64)>,
    /// Bytes written to the file.
    written: u64,
    /// Most bytes the file takes ([`EXEC_OUTPUT_FILE_MAX_BYTES`]).
    limit: u64,
    /// The file was made (and must be removed if it turns out unneeded).
    made: bool,
    state: State,
}

impl Spool {
    /// A spool for exec `exec_id` (already validated) in `workspace`, started once more
    /// than `cap` bytes came.
    pub fn new(workspace: &Path, exec_id: &str, cap: u64) -> Self {
        Self {
            workspace: workspace.to_path_buf(),
            path: workspace.join(exec_output_file(exec_id)),
            cap,
            seen: 0,
            journal: Vec::new(),
            written: 0,
            limit: EXEC_OUTPUT_FILE_MAX_BYTES,
            made: false,
            state: State::Watching,
        }
    }

    /// The same spool with a smaller file limit (tests).
    #[cfg(test)]
    pub fn with_limit(mut self, limit: u64) -> Self {
        self.limit = limit;
        self
    }

    /// Takes a chunk of `stream`, before it is pushed into `capture` (so the capture
    /// still holds everything that came before it).
    pub fn push(&mut self, stream: Stream, data: &[u8], capture: &Capture) {
        if data.is_empty() {
            return;
        }
        if let State::Watching = self.state {
            let over = self.seen + data.len() as u64 > self.cap;
            if !over && self.note(stream, data.len() as u64) {
                self.seen += data.len() as u64;
                return;
            }
            self.start(capture);
        }
        self.seen += data.len() as u64;
        self.append(data);
    }

    /// Adds a run to the journal; false when it is full.
    fn note(&mut self, stream: Stream, len: u64) -> bool {
        if let Some((last, n)) = self.journal.last_mut() {
            if *last == stream {
                *n += len;
                return true;
            }
        }
        if self.journal.len() < MAX_JOURNAL {
            self.journal.push((stream, len));
            return true;
        }
        false
    }

    /// Opens the file and writes what came so far, in order.
    fn start(&mut self, capture: &Capture) {
        let journal = std::mem::take(&mut self.journal);
        let file = match self.open() {
            Ok(file) => file,
            Err(e) => {
                self.fail(format!("cannot create {}: {e}", self.shown()));
                return;
            }
        };
        self.made = true;
        self.state = State::Writing(file);
        let mut cursors = [0u64; 2];
        for (stream, len) in journal {
            let from = cursors[stream as usize];
            cursors[stream as usize] += len;
            for piece in capture.untrimmed(stream, from, len) {
                self.append(piece);
            }
        }
    }

    /// Appends to the file, up to its limit.
    fn append(&mut self, data: &[u8]) {
        let State::Writing(file) = &mut self.state else {
            return;
        };
        let room = self.limit.saturating_sub(self.written);
        let take = data.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        if let Err(e) = file.write_all(&data[..take]) {
            let shown = self.shown();
            self.fail(format!(
                "writing {shown} failed after {} bytes: {e}",
                self.written
            ));
            return;
        }
        self.written += take as u64;
        if take < data.len() {
            self.state = State::Full;
        }
    }

    fn fail(&mut self, why: String) {
        let mut why = why;
        if why.len() > MAX_ERROR_LEN {
            let mut end = MAX_ERROR_LEN;
            while !why.is_char_boundary(end) {
                end -= 1;
            }
            why.truncate(end);
        }
        self.state = State::Failed(why);
    }

    /// The file's path as the agent sees it (under the workspace).
    fn shown(&self) -> String {
        self.path.display().to_string()
    }

    /// Makes the directory (refusing symbolic links on the way), removes the oldest
    /// output files beyond the number kept, and creates the file.
    fn open(&self) -> io::Result<File> {
        let mut at = self.workspace.clone();
        for part in Path::new(EXEC_OUTPUT_DIR).components() {
            at.push(part);
            match fs::DirBuilder::new().mode(0o700).create(&at) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
            let meta = fs::symlink_metadata(&at)?;
            if !meta.is_dir() {
                return Err(io::Error::other(format!(
                    "{} is not a directory (symbolic links are not followed)",
                    at.display()
                )));
            }
        }
        prune(&at, EXEC_OUTPUT_FILES_KEPT.saturating_sub(1));
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&self.path)
    }

    /// What the reply says of the file: `None` when nothing was dropped (an early file
    /// is removed then), else its size and whether it is whole.
    pub fn finish(mut self, dropped: bool) -> Option<OutputFile> {
        let state = std::mem::replace(&mut self.state, State::Watching);
        if !dropped {
            if self.made {
                drop(state);
                let _ = fs::remove_file(&self.path);
            }
            return None;
        }
        Some(match state {
            State::Writing(file) => {
                drop(file);
                OutputFile {
                    bytes: self.written,
                    truncated: false,
                    error: None,
                }
            }
            State::Full => OutputFile {
                bytes: self.written,
                truncated: true,
                error: None,
            },
            State::Failed(why) => OutputFile {
                bytes: self.written,
                truncated: self.written < self.seen,
                error: Some(why),
            },
            // Dropped without ever passing the cap cannot happen; say nothing.
            State::Watching => return None,
        })
    }
}

/// Removes the oldest `*.log` regular files in `dir` beyond `keep`, by modification
/// time. Best effort: anything it cannot read or remove is left.
fn prune(dir: &Path, keep: usize) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut logs: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            meta.is_file()
                .then(|| (meta.modified().unwrap_or(std::time::UNIX_EPOCH), e.path()))
        })
        .collect();
    if logs.len() <= keep {
        return;
    }
    logs.sort();
    let excess = logs.len() - keep;
    for (_, path) in logs.into_iter().take(excess) {
        let _ = fs::remove_file(path);
    }
}

#[cfg(test)]
#[path = "spool_tests.rs"]
mod tests;
