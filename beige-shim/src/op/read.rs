//! `read`: returns a file's text (a line range, capped in bytes), an image, or the fact
//! that it is binary.
//!
//! Text is scanned in chunks, so memory stays near the byte cap whatever the file size:
//! the whole file is validated as UTF-8 and its lines counted, but only the selected
//! lines are kept, cut at a line boundary (or, for a single over-long line, at a
//! character boundary) when they exceed the cap. Valid UTF-8 is text even when it
//! contains NUL bytes. Images are recognised by extension only, as in the original.

use std::fs::{self, File};
use std::io::{self, Read};

use base64::Engine as _;
use beige_protocol::op::{OpError, OpErrorKind, ReadReply, ReadRequest};

use super::{fs_error, is_directory, not_regular, op_error, Context};

/// Bytes read from the file per step.
const CHUNK: usize = 64 * 1024;

/// Image extensions (lower case) and their MIME types.
const IMAGE_TYPES: [(&str, &str); 5] = [
    ("png", "image/png"),
    ("jpg", "image/jpeg"),
    ("jpeg", "image/jpeg"),
    ("gif", "image/gif"),
    ("webp", "image/webp"),
];

/// Performs a `read` request.
pub fn read(ctx: &Context, req: &ReadRequest) -> Result<ReadReply, OpError> {
    let path = ctx.resolve(&req.path)?;
    let meta = fs::metadata(&path).map_err(|e| fs_error(&e, &req.path, "read"))?;
    if meta.is_dir() {
        return Err(is_directory(&req.path));
    }
    if !meta.is_file() {
        return Err(not_regular(&req.path, &meta.file_type()));
    }

    if let Some(mime_type) = image_mime(&req.path) {
        return read_image(&path, req, mime_type, meta.len());
    }

    let file = File::open(&path).map_err(|e| fs_error(&e, &req.path, "read"))?;
    let selection = Selection::new(req.offset, req.limit);
    let max_bytes = usize::try_from(req.max_bytes).unwrap_or(usize::MAX);
    match scan_text(file, selection, max_bytes) {
        Ok(Some(text)) => Ok(text.into_reply(selection)),
        Ok(None) => Ok(ReadReply::Binary { bytes: meta.len() }),
        Err(e) => Err(fs_error(&e, &req.path, "read")),
    }
}

/// The MIME type when `path` has an image extension (case-insensitive).
fn image_mime(path: &str) -> Option<&'static str> {
    let file_name = path.rsplit('/').next()?;
    let (_, ext) = file_name.rsplit_once('.')?;
    let ext = ext.to_ascii_lowercase();
    IMAGE_TYPES
        .iter()
        .find(|(e, _)| *e == ext)
        .map(|(_, mime)| *mime)
}

fn read_image(
    path: &std::path::Path,
    req: &ReadRequest,
    mime_type: &str,
    size: u64,
) -> Result<ReadReply, OpError> {
    if !req.images {
        return Ok(ReadReply::Image {
            mime_type: mime_type.to_owned(),
            bytes: size,
            data: None,
        });
    }
    if size > req.max_image_bytes {
        return Err(op_error(
            OpErrorKind::TooLarge,
            format!(
                "The image {} is {size} bytes, more than the limit of {} bytes. Use exec to \
                 make a smaller copy (e.g. scale it down) and read that.",
                req.path, req.max_image_bytes
            ),
        ));
    }
    let bytes = fs::read(path).map_err(|e| fs_error(&e, &req.path, "read"))?;
    Ok(ReadReply::Image {
        mime_type: mime_type.to_owned(),
        bytes: u64::try_from(bytes.len()).unwrap_or(u64::MAX),
        data: Some(base64::engine::general_purpose::STANDARD.encode(&bytes)),
    })
}

/// The requested line range, 1-based and inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Selection {
    start: u64,
    /// `u64::MAX` when open-ended.
    end: u64,
}

impl Selection {
    /// `offset` 0 or absent means line 1; `limit` 0 or absent means to the end (the
    /// original treated both as "not given").
    fn new(offset: Option<u64>, limit: Option<u64>) -> Self {
        let start = offset.filter(|&o| o > 0).unwrap_or(1);
        let end = limit
            .filter(|&l| l > 0)
            .map_or(u64::MAX, |l| start.saturating_add(l - 1));
        Self { start, end }
    }

    fn contains(self, line: u64) -> bool {
        (self.start..=self.end).contains(&line)
    }
}

/// The result of scanning a text file.
#[derive(Debug, Default)]
struct TextScan {
    content: Vec<u8>,
    total_lines: u64,
    last_line: u64,
    truncated: bool,
}

impl TextScan {
    fn into_reply(self, selection: Selection) -> ReadReply {
        let content = String::from_utf8(self.content)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        let last_line = if content.is_empty() {
            0
        } else {
            self.last_line
        };
        ReadReply::Text {
            content,
            total_lines: self.total_lines,
            first_line: selection.start,
            last_line,
            truncated: self.truncated,
        }
    }
}

/// Incremental state of [`scan_text`].
struct Scanner {
    selection: Selection,
    max_bytes: usize,
    out: Vec<u8>,
    /// Length of `out` when the current line began.
    line_begin: usize,
    /// The line the next byte belongs to.
    line: u64,
    newlines: u64,
    /// Whether any byte was seen, and whether the last one was a newline.
    any: bool,
    ends_with_newline: bool,
    collecting: bool,
    truncated: bool,
    last_line: u64,
}

impl Scanner {
    fn new(selection: Selection, max_bytes: usize) -> Self {
        Self {
            selection,
            max_bytes,
            out: Vec::new(),
            line_begin: 0,
            line: 1,
            newlines: 0,
            any: false,
            ends_with_newline: false,
            collecting: true,
            truncated: false,
            last_line: 0,
        }
    }

    /// Feeds valid UTF-8 bytes (possibly a partial line).
    fn feed(&mut self, bytes: &[u8]) {
        for piece in bytes.split_inclusive(|&b| b == b'\n') {
            self.any = true;
            let ends_line = piece.last() == Some(&b'\n');
            if self.collecting && self.selection.contains(self.line) {
                self.collect(piece);
            }
            if ends_line {
                self.newlines += 1;
                if self.collecting && self.selection.contains(self.line) {
                    self.last_line = self.line;
                }
                self.line += 1;
                self.line_begin = self.out.len();
                if self.line > self.selection.end {
                    self.collecting = false;
                }
            }
            self.ends_with_newline = ends_line;
        }
    }

    fn collect(&mut self, piece: &[u8]) {
        if self.out.len() + piece.len() <= self.max_bytes {
            self.out.extend_from_slice(piece);
            return;
        }
        self.truncated = true;
        self.collecting = false;
        if self.line_begin > 0 {
            // At least one whole line fits: stop at the line boundary.
            self.out.truncate(self.line_begin);
        } else {
            // The first selected line alone exceeds the cap: cut it at a char boundary.
            let room = self.max_bytes - self.out.len();
            self.out.extend_from_slice(&piece[..room]);
            let keep = utf8_prefix_len(&self.out);
            self.out.truncate(keep);
            self.last_line = self.line;
        }
    }

    fn finish(mut self) -> TextScan {
        let unterminated_last = self.any && !self.ends_with_newline;
        if unterminated_last && self.collecting && self.selection.contains(self.line) {
            self.last_line = self.line;
        }
        TextScan {
            content: self.out,
            total_lines: self.newlines + u64::from(unterminated_last),
            last_line: self.last_line,
            truncated: self.truncated,
        }
    }
}

/// Scans `src` as UTF-8 text. `Ok(None)` when it is not valid UTF-8.
fn scan_text(
    mut src: impl Read,
    selection: Selection,
    max_bytes: usize,
) -> io::Result<Option<TextScan>> {
    let mut scanner = Scanner::new(selection, max_bytes);
    // Room for a chunk plus up to 3 bytes of a character split by the previous chunk.
    let mut buf = vec![0u8; CHUNK + 4];
    let mut carry = 0usize;
    loop {
        let n = match src.read(&mut buf[carry..]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            if carry > 0 {
                return Ok(None); // ends inside a character
            }
            return Ok(Some(scanner.finish()));
        }
        let filled = carry + n;
        let valid = match std::str::from_utf8(&buf[..filled]) {
            Ok(_) => filled,
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => return Ok(None),
        };
        scanner.feed(&buf[..valid]);
        buf.copy_within(valid..filled, 0);
        carry = filled - valid;
    }
}

/// Length of the longest prefix of `bytes` that is valid UTF-8.
fn utf8_prefix_len(bytes: &[u8]) -> usize {
    match std::str::from_utf8(bytes) {
        Ok(_) => bytes.len(),
        Err(e) => e.valid_up_to(),
    }
}

#[cfg(test)]
#[path = "read_tests.rs"]
mod tests;
