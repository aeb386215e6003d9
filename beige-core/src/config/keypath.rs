//! Config paths as people read them: `agents.intern.tools[1]`,
//! `agents.a.sandbox.extraMounts["/srv/projects"]`.
//!
//! Owns only the formatting of a location inside the config tree; every error and
//! warning of the config layer names its place with a [`KeyPath`].

use std::fmt;

/// One step into the config tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

/// A location inside the config, from the root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KeyPath(Vec<Seg>);

impl KeyPath {
    pub(crate) fn root() -> Self {
        Self(Vec::new())
    }

    /// This path extended by an object key.
    pub(crate) fn key(&self, key: impl Into<String>) -> Self {
        let mut next = self.clone();
        next.0.push(Seg::Key(key.into()));
        next
    }

    /// This path extended by an array index.
    pub(crate) fn index(&self, index: usize) -> Self {
        let mut next = self.clone();
        next.0.push(Seg::Index(index));
        next
    }

    pub(crate) fn push(&mut self, seg: Seg) {
        self.0.push(seg);
    }

    pub(crate) fn pop(&mut self) {
        self.0.pop();
    }

    pub(crate) fn segments(&self) -> &[Seg] {
        &self.0
    }
}

impl From<Vec<Seg>> for KeyPath {
    fn from(segs: Vec<Seg>) -> Self {
        Self(segs)
    }
}

/// Keys that would be ambiguous after a `.` are written as `["key"]`.
fn needs_brackets(key: &str) -> bool {
    key.is_empty() || key.contains(['.', '[', ']', '"', '/'])
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Index(n) => write!(f, "[{n}]")?,
                Seg::Key(k) if needs_brackets(k) => {
                    let quoted = serde_json::to_string(k).map_err(|_| fmt::Error)?;
                    write!(f, "[{quoted}]")?;
                }
                Seg::Key(k) if i == 0 => f.write_str(k)?,
                Seg::Key(k) => write!(f, ".{k}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_keys_indices_and_odd_keys() {
        let p = KeyPath::root()
            .key("agents")
            .key("intern")
            .key("tools")
            .index(1);
        assert_eq!(p.to_string(), "agents.intern.tools[1]");
        let p = KeyPath::root().key("agents").key("bad name");
        assert_eq!(p.to_string(), "agents.bad name");
        let p = KeyPath::root().key("extraMounts").key("/srv/projects");
        assert_eq!(p.to_string(), r#"extraMounts["/srv/projects"]"#);
        assert_eq!(KeyPath::root().to_string(), "");
    }
}
