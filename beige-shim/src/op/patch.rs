//! `patch`: replaces the single occurrence of `oldText` with `newText`.
//!
//! The file is handled as bytes, so content that is not valid UTF-8 survives untouched
//! outside the replaced span. `oldText` must occur exactly once (overlapping
//! occurrences count); otherwise the error says how often it occurs, or — when it does
//! not occur — where a whitespace-insensitive match starts, if there is one. The
//! replacement is literal and written atomically, keeping the file's mode.

use std::fs;

use beige_protocol::op::{OpError, OpErrorKind, PatchReply, PatchRequest};

use super::{fs_error, op_error, write::existing_mode, Context};
use crate::fsutil;

/// Performs a `patch` request.
pub fn patch(ctx: &Context, req: &PatchRequest) -> Result<PatchReply, OpError> {
    if req.old_text.is_empty() {
        return Err(op_error(
            OpErrorKind::BadRequest,
            "oldText must not be empty: give the exact text to replace.",
        ));
    }
    let path = ctx.resolve(&req.path)?;
    let target =
        fsutil::resolve_final_symlinks(&path).map_err(|e| fs_error(&e, &req.path, "patch"))?;
    let mode = existing_mode(&target, &req.path)?.ok_or_else(|| {
        op_error(
            OpErrorKind::NotFound,
            format!("File not found: {}", req.path),
        )
    })?;
    let data = fs::read(&target).map_err(|e| fs_error(&e, &req.path, "read"))?;

    let old = req.old_text.as_bytes();
    let (count, first) = occurrences(&data, old);
    let start = match (count, first) {
        (1, Some(start)) => start,
        (0, _) | (_, None) => return Err(no_match(&req.path, &data, old)),
        (n, _) => {
            return Err(op_error(
                OpErrorKind::AmbiguousMatch,
                format!(
                    "The specified oldText occurs {n} times in {}; it must occur exactly once. \
                     Add more surrounding context to oldText so it matches only one place.",
                    req.path
                ),
            ))
        }
    };

    let new = req.new_text.as_bytes();
    let mut out = Vec::with_capacity(data.len() - old.len() + new.len());
    out.extend_from_slice(&data[..start]);
    out.extend_from_slice(new);
    out.extend_from_slice(&data[start + old.len()..]);
    fsutil::atomic_write(&target, &out, Some(mode))
        .map_err(|e| fs_error(&e, &req.path, "write"))?;
    Ok(PatchReply {
        bytes: u64::try_from(out.len()).unwrap_or(u64::MAX),
    })
}

fn no_match(path: &str, data: &[u8], old: &[u8]) -> OpError {
    let mut message = format!(
        "The specified oldText was not found in {path}. Make sure it matches exactly \
         (including whitespace and indentation)."
    );
    if let Some(line) = whitespace_insensitive_line(data, old) {
        message.push_str(&format!(
            " A similar text that differs only in whitespace starts at line {line}."
        ));
    }
    op_error(OpErrorKind::NoMatch, message)
}

/// Counts (possibly overlapping) occurrences of `needle` in `hay` and returns the
/// position of the first one. Knuth–Morris–Pratt: linear in both lengths.
fn occurrences(hay: &[u8], needle: &[u8]) -> (usize, Option<usize>) {
    let m = needle.len();
    if m == 0 || m > hay.len() {
        return (0, None);
    }
    // fail[i]: length of the longest proper border of needle[..=i].
    let mut fail = vec![0usize; m];
    let mut k = 0;
    for i in 1..m {
        while k > 0 && needle[i] != needle[k] {
            k = fail[k - 1];
        }
        if needle[i] == needle[k] {
            k += 1;
        }
        fail[i] = k;
    }
    let (mut count, mut first, mut q) = (0usize, None, 0usize);
    for (i, &b) in hay.iter().enumerate() {
        while q > 0 && b != needle[q] {
            q = fail[q - 1];
        }
        if b == needle[q] {
            q += 1;
        }
        if q == m {
            count += 1;
            first.get_or_insert(i + 1 - m);
            q = fail[q - 1];
        }
    }
    (count, first)
}

/// `bytes` with every run of ASCII whitespace collapsed to one space.
fn collapse_whitespace(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut in_space = false;
    for &b in bytes {
        if b.is_ascii_whitespace() {
            if !in_space {
                out.push(b' ');
            }
            in_space = true;
        } else {
            out.push(b);
            in_space = false;
        }
    }
    out
}

/// The 1-based line where `old` starts when runs of whitespace are ignored (collapsed,
/// and trimmed from `old`'s ends), if it occurs that way.
fn whitespace_insensitive_line(data: &[u8], old: &[u8]) -> Option<u64> {
    let needle = collapse_whitespace(old.trim_ascii());
    if needle.is_empty() {
        return None;
    }
    let hay = collapse_whitespace(data);
    let (_, first) = occurrences(&hay, &needle);
    let offset = original_offset(data, first?)?;
    let newlines = data[..offset].iter().filter(|&&b| b == b'\n').count();
    u64::try_from(newlines).ok().map(|n| n + 1)
}

/// Maps a position in `collapse_whitespace(data)` that holds a non-whitespace byte back
/// to its position in `data`.
fn original_offset(data: &[u8], collapsed_pos: usize) -> Option<usize> {
    let mut pos = 0usize;
    let mut in_space = false;
    for (i, &b) in data.iter().enumerate() {
        if b.is_ascii_whitespace() {
            if !in_space {
                pos += 1;
            }
            in_space = true;
        } else {
            if pos == collapsed_pos {
                return Some(i);
            }
            pos += 1;
            in_space = false;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn req(path: &str, old: &str, new: &str) -> PatchRequest {
        PatchRequest {
            path: path.into(),
            old_text: old.into(),
            new_text: new.into(),
        }
    }

    #[test]
    fn counts_overlapping_occurrences() {
        assert_eq!(occurrences(b"aaa", b"aa"), (2, Some(0)));
        assert_eq!(occurrences(b"xabcabc", b"abc"), (2, Some(1)));
        assert_eq!(occurrences(b"abababa", b"aba"), (3, Some(0)));
        assert_eq!(occurrences(b"abc", b"d"), (0, None));
        assert_eq!(occurrences(b"ab", b"abc"), (0, None));
        assert_eq!(occurrences(b"aabaabaaab", b"aaab"), (1, Some(6)));
    }

    #[test]
    fn replaces_once_literally() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = Context::new(dir.path());
        let p = dir.path().join("f.txt");
        fs::write(&p, "let x = 1;\nlet y = 2;\n").unwrap();
        let reply = patch(&ctx, &req("f.txt", "y = 2", "y = $& $1 $$")).unwrap();
        let after = fs::read_to_string(&p).unwrap();
        assert_eq!(after, "let x = 1;\nlet y = $& $1 $$;\n");
        assert_eq!(reply.bytes, after.len() as u64);
    }

    #[test]
    fn zero_and_many_matches() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = Context::new(dir.path());
        fs::write(
            dir.path().join("f"),
            "fn a() {\n    one();\n}\nfn b() {\n    two();\n}\n",
        )
        .unwrap();

        let err = patch(&ctx, &req("f", "nothing", "x")).unwrap_err();
        assert_eq!(err.kind, OpErrorKind::NoMatch);
        assert_eq!(
            err.message,
            "The specified oldText was not found in f. Make sure it matches exactly \
             (including whitespace and indentation)."
        );

        let err = patch(&ctx, &req("f", "fn b() {\n  two();", "x")).unwrap_err();
        assert_eq!(err.kind, OpErrorKind::NoMatch);
        assert!(
            err.message
                .ends_with(" A similar text that differs only in whitespace starts at line 4."),
            "{}",
            err.message
        );

        let err = patch(&ctx, &req("f", "\ttwo();", "x")).unwrap_err();
        assert!(
            err.message.ends_with("starts at line 5."),
            "{}",
            err.message
        );

        let err = patch(&ctx, &req("f", "fn ", "x")).unwrap_err();
        assert_eq!(err.kind, OpErrorKind::AmbiguousMatch);
        assert_eq!(
            err.message,
            "The specified oldText occurs 2 times in f; it must occur exactly once. \
             Add more surrounding context to oldText so it matches only one place."
        );
    }

    #[test]
    fn binary_bytes_outside_span_untouched_and_mode_kept() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = Context::new(dir.path());
        let p = dir.path().join("b");
        let mut data = vec![0xff, 0x00, 0xfe];
        data.extend_from_slice(b"MARK");
        data.extend_from_slice(&[0xc3, 0x28, 0x80]);
        fs::write(&p, &data).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).unwrap();
        patch(&ctx, &req("b", "MARK", "é")).unwrap();
        let mut expected = vec![0xff, 0x00, 0xfe];
        expected.extend_from_slice("é".as_bytes());
        expected.extend_from_slice(&[0xc3, 0x28, 0x80]);
        assert_eq!(fs::read(&p).unwrap(), expected);
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o7777,
            0o640
        );
    }

    #[test]
    fn errors() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = Context::new(dir.path());
        let err = patch(&ctx, &req("missing", "a", "b")).unwrap_err();
        assert_eq!(err.kind, OpErrorKind::NotFound);
        assert_eq!(err.message, "File not found: missing");
        fs::write(dir.path().join("f"), "a").unwrap();
        assert_eq!(
            patch(&ctx, &req("f", "", "b")).unwrap_err().kind,
            OpErrorKind::BadRequest
        );
        fs::create_dir(dir.path().join("d")).unwrap();
        assert_eq!(
            patch(&ctx, &req("d", "a", "b")).unwrap_err().kind,
            OpErrorKind::IsDirectory
        );
    }

    #[test]
    fn whitespace_hint_positions() {
        assert_eq!(whitespace_insensitive_line(b"a\n\tb  c\n", b"b c"), Some(2));
        assert_eq!(whitespace_insensitive_line(b"a\nb\n", b"  \n "), None);
        assert_eq!(whitespace_insensitive_line(b"abc", b"x"), None);
        assert_eq!(original_offset(b"  x", 1), Some(2));
    }
}
