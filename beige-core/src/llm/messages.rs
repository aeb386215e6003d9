//! [`Messages`]: the conversation of a [`ModelRequest`](super::ModelRequest) — an
//! append-only list of messages in shared chunks, so that a request for a long session
//! is built by adding this turn's few messages to what the last request held, never by
//! copying the whole history.
//!
//! Owns only the list's shape (chunks behind `Arc`s, each pointing at the one before);
//! what goes into it — alternation of roles, compaction — is the agent loop's business.

use std::sync::Arc;

use serde::{Serialize, Serializer};

use super::Message;

/// The messages of one model call, oldest first; the model continues after the last one.
///
/// Cloning is O(1) and clones share the messages: a list is a chain of chunks behind
/// `Arc`s, and [`push`](Self::push) adds to the last chunk when this list alone holds it,
/// else starts a new chunk after the shared ones (which stay as they are). So the agent
/// loop keeps a session's history once and gives each request that history plus the
/// turn's new messages, at a cost that does not depend on the history's length.
/// Iterating visits every message in order, as a `Vec` would; [`len`](Self::len),
/// [`last`](Self::last) and [`last_mut`](Self::last_mut) are O(1).
///
/// Build one from a `Vec` (`vec![..].into()`), from an iterator (`collect()`), or by
/// pushing:
///
/// ```
/// use beige_core::llm::{Message, Messages};
///
/// let history: Messages = vec![Message::user_text("hi"), Message::assistant_text("hello")].into();
/// let mut request = history.clone(); // shares the two messages
/// request.push(Message::user_text("and now?"));
/// assert_eq!((history.len(), request.len()), (2, 3));
/// assert_eq!(request.iter().map(Message::text).collect::<Vec<_>>(), ["hi", "hello", "and now?"]);
/// ```
#[derive(Clone, Default)]
pub struct Messages {
    last: Option<Arc<Chunk>>,
}

/// One chunk: its messages and the chunk before it.
#[derive(Clone)]
struct Chunk {
    before: Option<Arc<Chunk>>,
    /// Messages in all the chunks before this one.
    offset: usize,
    messages: Vec<Message>,
}

impl Messages {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many messages the list holds.
    pub fn len(&self) -> usize {
        self.last
            .as_ref()
            .map_or(0, |c| c.offset + c.messages.len())
    }

    /// Whether the list holds no message.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The newest message.
    pub fn last(&self) -> Option<&Message> {
        // The last chunk is never empty.
        self.last.as_ref().and_then(|c| c.messages.last())
    }

    /// The newest message, to change it in place (the agent loop merges a message into
    /// the one before when both have the same role). Copies the last chunk first when it
    /// is shared, so other lists never see the change.
    pub fn last_mut(&mut self) -> Option<&mut Message> {
        self.last
            .as_mut()
            .and_then(|c| Arc::make_mut(c).messages.last_mut())
    }

    /// The message at `index` (0 is the oldest); O(chunks).
    pub fn get(&self, index: usize) -> Option<&Message> {
        let mut chunk = self.last.as_deref();
        while let Some(c) = chunk {
            if index >= c.offset {
                return c.messages.get(index - c.offset);
            }
            chunk = c.before.as_deref();
        }
        None
    }

    /// Add a message after the last one.
    pub fn push(&mut self, message: Message) {
        if let Some(c) = self.last.as_mut().and_then(Arc::get_mut) {
            c.messages.push(message);
            return;
        }
        let offset = self.len();
        self.last = Some(Arc::new(Chunk {
            before: self.last.take(),
            offset,
            messages: vec![message],
        }));
    }

    /// Every message, oldest first.
    pub fn iter(&self) -> Iter<'_> {
        let mut chunks = Vec::new();
        let mut chunk = self.last.as_deref();
        while let Some(c) = chunk {
            chunks.push(c.messages.as_slice());
            chunk = c.before.as_deref();
        }
        chunks.reverse();
        Iter {
            inner: chunks.into_iter().flatten(),
            left: self.len(),
        }
    }

    /// Whether both lists start with the same shared chunk (tests of the agent loop
    /// check that a request shares the history instead of copying it).
    #[cfg(test)]
    pub(crate) fn shares_oldest_chunk_with(&self, other: &Messages) -> bool {
        fn oldest(m: &Messages) -> Option<&Arc<Chunk>> {
            let mut chunk = m.last.as_ref()?;
            while let Some(before) = chunk.before.as_ref() {
                chunk = before;
            }
            Some(chunk)
        }
        match (oldest(self), oldest(other)) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// The messages copied into a `Vec`.
    pub fn to_vec(&self) -> Vec<Message> {
        self.iter().cloned().collect()
    }
}

impl Drop for Messages {
    /// Unlink the chain one chunk at a time: dropping a long chain recursively could
    /// overflow the stack.
    fn drop(&mut self) {
        let mut next = self.last.take();
        // `into_inner` is `Some` only for the last holder of a chunk; a chunk another list
        // still holds is left to that list.
        while let Some(mut chunk) = next.and_then(Arc::into_inner) {
            next = chunk.before.take();
        }
    }
}

/// Iterator over the messages of a [`Messages`], oldest first.
#[derive(Debug, Clone)]
pub struct Iter<'a> {
    inner: std::iter::Flatten<std::vec::IntoIter<&'a [Message]>>,
    left: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a Message;

    fn next(&mut self) -> Option<&'a Message> {
        let m = self.inner.next()?;
        self.left -= 1;
        Some(m)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        let m = self.inner.next_back()?;
        self.left -= 1;
        Some(m)
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a Messages {
    type Item = &'a Message;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl From<Vec<Message>> for Messages {
    fn from(messages: Vec<Message>) -> Self {
        if messages.is_empty() {
            return Self::new();
        }
        Self {
            last: Some(Arc::new(Chunk {
                before: None,
                offset: 0,
                messages,
            })),
        }
    }
}

impl FromIterator<Message> for Messages {
    fn from_iter<I: IntoIterator<Item = Message>>(iter: I) -> Self {
        iter.into_iter().collect::<Vec<_>>().into()
    }
}

impl Extend<Message> for Messages {
    fn extend<I: IntoIterator<Item = Message>>(&mut self, iter: I) {
        for m in iter {
            self.push(m);
        }
    }
}

impl std::ops::Index<usize> for Messages {
    type Output = Message;

    /// Panics when `index` is out of range, as a slice does.
    fn index(&self, index: usize) -> &Message {
        match self.get(index) {
            Some(m) => m,
            None => panic!("index {index} out of range for {} messages", self.len()),
        }
    }
}

impl PartialEq for Messages {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl std::fmt::Debug for Messages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// As a JSON array of messages, as a `Vec<Message>` is.
impl Serialize for Messages {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(m: &Messages) -> Vec<String> {
        m.iter().map(Message::text).collect()
    }

    #[test]
    fn clones_share_and_pushes_do_not_leak_between_them() {
        let mut a: Messages = vec![Message::user_text("1"), Message::assistant_text("2")].into();
        let b = a.clone();
        a.push(Message::user_text("3"));
        let mut c = a.clone();
        a.push(Message::assistant_text("4a"));
        c.push(Message::assistant_text("4c"));
        assert_eq!(texts(&b), ["1", "2"]);
        assert_eq!(texts(&a), ["1", "2", "3", "4a"]);
        assert_eq!(texts(&c), ["1", "2", "3", "4c"]);
        assert_eq!(
            (a.len(), a[3].text(), a.get(4)),
            (4, "4a".to_string(), None)
        );
        assert_eq!(
            a.iter().next_back().map(Message::text).as_deref(),
            Some("4a")
        );
        assert_eq!(a.iter().len(), 4);
    }

    #[test]
    fn last_mut_copies_a_shared_chunk() {
        let a: Messages = vec![Message::user_text("1")].into();
        let mut b = a.clone();
        if let Some(m) = b.last_mut() {
            m.content.extend(Message::user_text("2").content);
        }
        assert_eq!(a[0].content.len(), 1);
        assert_eq!(b[0].content.len(), 2);
        assert_eq!(a, vec![Message::user_text("1")].into());
        assert_ne!(a, b);
    }

    #[test]
    fn serialises_as_an_array_and_drops_a_long_chain() {
        let mut m = Messages::new();
        assert!(m.is_empty() && m.last().is_none());
        for i in 0..200_000 {
            let keep = m.clone(); // every push starts a chunk
            m.push(Message::user_text(i.to_string()));
            drop(keep);
        }
        assert_eq!(m.len(), 200_000);
        let small: Messages = vec![Message::user_text("x")].into();
        assert_eq!(
            serde_json::to_value(&small).unwrap(),
            serde_json::to_value(vec![Message::user_text("x")]).unwrap()
        );
        drop(m);
    }
}
