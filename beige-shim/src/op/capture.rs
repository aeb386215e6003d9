//! Bounded capture of a command's stdout and stderr: head and tail of each stream kept,
//! the middle dropped and counted, never more than the cap in memory.
//!
//! The budget is shared by both streams. The first half of the cap holds the *head* —
//! the first bytes produced, whichever stream produced them. Once it is full, each
//! stream keeps a *tail* ring; the tails share the rest of the cap with max-min
//! fairness, so a flood on one stream cannot push out a short message on the other.
//! Output below the cap is kept whole. Where bytes were dropped, the text carries a
//! marker line `[... N bytes omitted ...]` (the gateway relies on the words
//! "bytes omitted" to not add its own note).

use std::collections::VecDeque;

/// Which stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout = 0,
    Stderr = 1,
}

impl Stream {
    fn other(self) -> Self {
        match self {
            Stream::Stdout => Stream::Stderr,
            Stream::Stderr => Stream::Stdout,
        }
    }
}

#[derive(Debug, Default)]
struct Buffer {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
    /// Set once the head budget was exhausted for this stream: all later bytes go to
    /// the tail, so the head stays a prefix of the stream.
    in_tail: bool,
}

/// One captured stream, ready for the reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// Head, omission marker and tail, lossy UTF-8.
    pub text: String,
    /// Bytes dropped (between head and tail).
    pub omitted: u64,
}

/// Head-and-tail capture of two streams within `cap` bytes.
#[derive(Debug)]
pub struct Capture {
    cap: usize,
    head_budget: usize,
    buffers: [Buffer; 2],
}

impl Capture {
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            head_budget: cap / 2,
            buffers: [Buffer::default(), Buffer::default()],
        }
    }

    /// Bytes currently held (at most `cap`).
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.buffers
            .iter()
            .map(|b| b.head.len() + b.tail.len())
            .sum()
    }

    /// Bytes `from..from + len` of everything `stream` produced, as at most three
    /// slices. Only meaningful while nothing was dropped (at most `cap` bytes in all):
    /// the spool replays the first bytes of the output with it ([`super::spool`]).
    pub fn untrimmed(&self, stream: Stream, from: u64, len: u64) -> Vec<&[u8]> {
        let buf = &self.buffers[stream as usize];
        let (a, b) = buf.tail.as_slices();
        let mut skip = usize::try_from(from).unwrap_or(usize::MAX);
        let mut want = usize::try_from(len).unwrap_or(usize::MAX);
        let mut out = Vec::new();
        for part in [buf.head.as_slice(), a, b] {
            if want == 0 {
                break;
            }
            if skip >= part.len() {
                skip -= part.len();
                continue;
            }
            let piece = &part[skip..part.len().min(skip.saturating_add(want))];
            skip = 0;
            want -= piece.len();
            out.push(piece);
        }
        out
    }

    /// Whether any byte was dropped so far.
    pub fn dropped(&self) -> bool {
        self.buffers
            .iter()
            .any(|b| b.total > (b.head.len() + b.tail.len()) as u64)
    }

    /// Records a chunk of `stream`.
    pub fn push(&mut self, stream: Stream, mut data: &[u8]) {
        let room = self.head_budget.saturating_sub(self.head_used());
        let buf = &mut self.buffers[stream as usize];
        buf.total += data.len() as u64;
        if !buf.in_tail {
            let take = data.len().min(room);
            buf.head.extend_from_slice(&data[..take]);
            data = &data[take..];
            if data.is_empty() {
                return;
            }
            buf.in_tail = true;
        }
        // The head budget is spent now, so the tail budget no longer changes.
        let tail_budget = self.cap.saturating_sub(self.head_used());
        if data.len() > tail_budget {
            data = &data[data.len() - tail_budget..];
        }
        self.buffers[stream as usize].tail.extend(data);
        self.rebalance(stream, tail_budget);
    }

    fn head_used(&self) -> usize {
        self.buffers.iter().map(|b| b.head.len()).sum()
    }

    /// Trims the tails to `budget` together: a tail no longer than its fair half keeps
    /// everything, the other gets the rest.
    fn rebalance(&mut self, stream: Stream, budget: usize) {
        let mine = self.buffers[stream as usize].tail.len();
        let theirs = self.buffers[stream.other() as usize].tail.len();
        if mine + theirs <= budget {
            return;
        }
        let half = budget / 2;
        let (keep_mine, keep_theirs) = if theirs <= half {
            (budget - theirs, theirs)
        } else if mine <= budget - half {
            (mine, budget - mine)
        } else {
            (budget - half, half)
        };
        trim_front(&mut self.buffers[stream as usize].tail, keep_mine);
        trim_front(&mut self.buffers[stream.other() as usize].tail, keep_theirs);
    }

    /// Like [`Capture::finish`], but moves the bytes out instead of copying them when
    /// nothing was dropped (the common case, and the one that can be megabytes when
    /// the cap is raised). The stream is empty afterwards.
    pub fn take(&mut self, stream: Stream) -> Captured {
        let buf = &mut self.buffers[stream as usize];
        if buf.total > (buf.head.len() + buf.tail.len()) as u64 {
            return self.finish(stream);
        }
        let mut all = std::mem::take(&mut buf.head);
        let tail = std::mem::take(&mut buf.tail);
        let (a, b) = tail.as_slices();
        all.reserve_exact(a.len() + b.len());
        all.extend_from_slice(a);
        all.extend_from_slice(b);
        buf.total = 0;
        Captured {
            text: String::from_utf8(all)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
            omitted: 0,
        }
    }

    /// The captured text of `stream`. Characters cut by the head/tail boundaries are
    /// dropped (and counted as omitted) instead of being turned into U+FFFD.
    pub fn finish(&self, stream: Stream) -> Captured {
        let buf = &self.buffers[stream as usize];
        let kept = (buf.head.len() + buf.tail.len()) as u64;
        let omitted = buf.total - kept;
        let (a, b) = buf.tail.as_slices();
        if omitted == 0 {
            // One copy: the bytes into the reply's string (validated in place; only
            // output that is not UTF-8 takes the lossy path).
            let mut all = Vec::with_capacity(buf.head.len() + a.len() + b.len());
            all.extend_from_slice(&buf.head);
            all.extend_from_slice(a);
            all.extend_from_slice(b);
            return Captured {
                text: String::from_utf8(all)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
                omitted: 0,
            };
        }
        let mut tail = Vec::with_capacity(a.len() + b.len());
        tail.extend_from_slice(a);
        tail.extend_from_slice(b);
        let head_keep = buf.head.len() - incomplete_suffix_len(&buf.head);
        let tail_skip = tail
            .iter()
            .take(3)
            .take_while(|&&b| is_continuation(b))
            .count();
        let head = String::from_utf8_lossy(&buf.head[..head_keep]);
        let tail = String::from_utf8_lossy(&tail[tail_skip..]);
        let omitted = omitted + (buf.head.len() - head_keep + tail_skip) as u64;
        let newline = if head.is_empty() || head.ends_with('\n') {
            ""
        } else {
            "\n"
        };
        Captured {
            text: format!("{head}{newline}{}{tail}", marker(omitted)),
            omitted,
        }
    }
}

/// The line that stands for `omitted` dropped bytes.
pub fn marker(omitted: u64) -> String {
    format!("[... {omitted} bytes omitted ...]\n")
}

fn trim_front(ring: &mut VecDeque<u8>, keep: usize) {
    if ring.len() > keep {
        ring.drain(..ring.len() - keep);
    }
}

fn is_continuation(b: u8) -> bool {
    (0x80..0xc0).contains(&b)
}

/// Length of an incomplete UTF-8 sequence at the end of `bytes` (0 when it ends on a
/// character boundary).
fn incomplete_suffix_len(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(4) {
        let b = bytes[bytes.len() - back];
        if is_continuation(b) {
            continue;
        }
        let needed = match b {
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf7 => 4,
            _ => return 0,
        };
        return if needed > back { back } else { 0 };
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_output_is_kept_whole() {
        let mut c = Capture::new(100);
        c.push(Stream::Stdout, b"hello ");
        c.push(Stream::Stderr, b"warn");
        c.push(Stream::Stdout, b"world");
        let out = c.finish(Stream::Stdout);
        assert_eq!(out.text, "hello world");
        assert_eq!(out.omitted, 0);
        assert_eq!(c.finish(Stream::Stderr).text, "warn");
    }

    #[test]
    fn take_gives_what_finish_gives() {
        // Whole and capped, one stream and both, head only and head plus tail.
        for cap in [0usize, 7, 64, 1000] {
            for pushes in [1usize, 3, 40] {
                let mut c = Capture::new(cap);
                for i in 0..pushes {
                    let stream = if i % 3 == 2 {
                        Stream::Stderr
                    } else {
                        Stream::Stdout
                    };
                    let data = format!("{i}:{}é\n", "x".repeat(i % 11));
                    c.push(stream, data.as_bytes());
                }
                for stream in [Stream::Stdout, Stream::Stderr] {
                    let want = c.finish(stream);
                    assert_eq!(c.take(stream), want, "cap {cap}, {pushes} pushes");
                }
            }
        }
    }

    #[test]
    fn exactly_at_cap_loses_nothing() {
        let mut c = Capture::new(10);
        for _ in 0..10 {
            c.push(Stream::Stdout, b"x");
        }
        let out = c.finish(Stream::Stdout);
        assert_eq!((out.text.as_str(), out.omitted), ("xxxxxxxxxx", 0));
    }

    #[test]
    fn flood_keeps_head_and_tail_within_cap() {
        let mut c = Capture::new(1000);
        c.push(Stream::Stdout, b"START");
        let chunk = vec![b'a'; 4096];
        for _ in 0..1000 {
            c.push(Stream::Stdout, &chunk);
            assert!(c.held() <= 1000);
        }
        c.push(Stream::Stdout, b"END");
        let out = c.finish(Stream::Stdout);
        assert_eq!(out.omitted, 5 + 4096 * 1000 + 3 - 1000);
        let (head, tail) = out
            .text
            .split_once(&format!("\n{}", marker(out.omitted)))
            .unwrap();
        assert_eq!((head.len(), tail.len()), (500, 500));
        assert!(head.starts_with("START") && tail.ends_with("END"));
    }

    #[test]
    fn quiet_stream_survives_flood_on_the_other() {
        let mut c = Capture::new(1000);
        let chunk = vec![b'a'; 300];
        for _ in 0..10 {
            c.push(Stream::Stdout, &chunk);
        }
        c.push(Stream::Stderr, b"error: something broke");
        for _ in 0..10 {
            c.push(Stream::Stdout, &chunk);
        }
        assert!(c.held() <= 1000);
        let err = c.finish(Stream::Stderr);
        assert_eq!(err.text, "error: something broke");
        assert_eq!(err.omitted, 0);
        let out = c.finish(Stream::Stdout);
        let kept = out.text.len() - marker(out.omitted).len() - 1;
        assert_eq!(kept, 1000 - err.text.len());
    }

    #[test]
    fn two_floods_share_the_tail() {
        let mut c = Capture::new(1000);
        for _ in 0..100 {
            c.push(Stream::Stdout, &[b'#'; 100]);
            c.push(Stream::Stderr, &[b'%'; 100]);
        }
        assert_eq!(c.held(), 1000);
        let out = c.finish(Stream::Stdout);
        let err = c.finish(Stream::Stderr);
        let kept_out = out.text.bytes().filter(|&b| b == b'#').count();
        let kept_err = err.text.bytes().filter(|&b| b == b'%').count();
        assert_eq!(kept_out + kept_err, 1000);
        assert!(kept_err >= 250, "{kept_err}");
        assert_eq!(out.omitted + err.omitted, 20_000 - 1000);
    }

    #[test]
    fn cut_characters_are_dropped_not_mangled() {
        let mut c = Capture::new(8);
        c.push(Stream::Stdout, "ééééééééé".as_bytes()); // 18 bytes
        let out = c.finish(Stream::Stdout);
        assert_eq!(out.text, "éé\n[... 10 bytes omitted ...]\néé");
        assert_eq!(out.omitted, 10);

        let mut c = Capture::new(7);
        c.push(Stream::Stdout, "ééééééééé".as_bytes());
        let out = c.finish(Stream::Stdout);
        assert_eq!(out.text, "é\n[... 12 bytes omitted ...]\néé");
    }

    #[test]
    fn zero_cap_keeps_nothing() {
        let mut c = Capture::new(0);
        c.push(Stream::Stdout, b"abc");
        let out = c.finish(Stream::Stdout);
        assert_eq!(
            (out.text.as_str(), out.omitted),
            ("[... 3 bytes omitted ...]\n", 3)
        );
    }

    #[test]
    fn incomplete_suffix() {
        assert_eq!(incomplete_suffix_len(b"abc"), 0);
        assert_eq!(incomplete_suffix_len("é".as_bytes()), 0);
        assert_eq!(incomplete_suffix_len(&[b'a', 0xc3]), 1);
        assert_eq!(incomplete_suffix_len(&[0xe2, 0x82]), 2);
        assert_eq!(incomplete_suffix_len("€".as_bytes()), 0);
        assert_eq!(incomplete_suffix_len(&[0xf0, 0x9f, 0x98]), 3);
    }
}
