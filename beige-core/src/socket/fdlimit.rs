//! The process's file-descriptor limit (`RLIMIT_NOFILE`): reading it for `beige doctor`,
//! raising the soft limit to the hard one when the gateway starts, and the share of it
//! the tool sockets may hold ([`DescriptorBudget`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
use serde::Serialize;

/// `RLIMIT_NOFILE` of this process; `None` is "unlimited".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct NofileLimit {
    /// The limit in force (the soft limit).
    pub soft: Option<u64>,
    /// How far the process may raise it (the hard limit).
    pub hard: Option<u64>,
}

impl NofileLimit {
    /// The soft limit as a count, "unlimited" counted as `u32::MAX` descriptors.
    pub(crate) fn effective(&self) -> u64 {
        self.soft.unwrap_or(u64::from(u32::MAX))
    }
}

impl std::fmt::Display for NofileLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |v: Option<u64>| v.map_or_else(|| "unlimited".to_string(), |v| v.to_string());
        write!(f, "soft {}, hard {}", show(self.soft), show(self.hard))
    }
}

/// The current descriptor limit of this process (what `beige doctor` reports).
pub(crate) fn nofile_limit() -> NofileLimit {
    let Rlimit { current, maximum } = getrlimit(Resource::Nofile);
    NofileLimit {
        soft: current,
        hard: maximum,
    }
}

/// Linux refuses a soft limit above `fs.nr_open` even when the hard limit is unlimited.
const NR_OPEN: &str = "/proc/sys/fs/nr_open";

/// Raise the soft descriptor limit to the hard limit (or, when the hard limit is
/// unlimited, to `fs.nr_open`). Returns the limit in force afterwards; an error means
/// the limit stayed as it was.
pub(crate) fn raise_nofile_limit() -> std::io::Result<NofileLimit> {
    let before = nofile_limit();
    let target = match before.hard {
        Some(hard) => Some(hard),
        None => std::fs::read_to_string(NR_OPEN)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok()),
    };
    let Some(target) = target else {
        return Ok(before);
    };
    if before.soft.is_none_or(|soft| soft >= target) {
        return Ok(before);
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(target),
            maximum: before.hard,
        },
    )
    .map_err(std::io::Error::from)?;
    Ok(nofile_limit())
}

/// How many descriptors the tool sockets of this process may hold together (listeners
/// and connections): the process limit minus a reserve, so that the HTTP API, the
/// store, Docker and plugins always have descriptors left whatever sandboxes do.
#[derive(Debug)]
pub(crate) struct DescriptorBudget {
    max: AtomicUsize,
    used: AtomicUsize,
}

impl DescriptorBudget {
    /// A budget of `max` descriptors (for tests and embedders with their own rules).
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: AtomicUsize::new(max),
            used: AtomicUsize::new(0),
        })
    }

    /// The one budget of this process (descriptors are per process, so every gateway
    /// built in it shares it), resized to the current soft limit minus `reserve`.
    /// When the limit is not even twice the reserve, half of it is used.
    pub(crate) fn process(reserve: usize) -> Arc<Self> {
        static PROCESS: OnceLock<Arc<DescriptorBudget>> = OnceLock::new();
        let budget = PROCESS.get_or_init(|| DescriptorBudget::new(0)).clone();
        let limit = usize::try_from(nofile_limit().effective()).unwrap_or(usize::MAX);
        let max = if limit / 2 >= reserve {
            limit - reserve
        } else {
            limit / 2
        };
        budget.set_max(max);
        budget
    }

    /// Change the most descriptors the sockets may hold (connections already open stay).
    pub(crate) fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::SeqCst);
    }

    /// The most descriptors the sockets may hold.
    pub(crate) fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }

    /// Descriptors the sockets hold now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::SeqCst)
    }

    /// Take one descriptor; `None` when the budget is used up.
    pub(crate) fn take(self: &Arc<Self>) -> Option<Descriptor> {
        let max = self.max();
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Descriptor(self.clone()))
    }
}

/// One descriptor of a [`DescriptorBudget`], given back when dropped.
#[derive(Debug)]
pub(crate) struct Descriptor(Arc<DescriptorBudget>);

impl Drop for Descriptor {
    fn drop(&mut self) {
        self.0.used.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_is_read_and_raised_to_the_hard_limit() {
        let before = nofile_limit();
        assert!(before.effective() > 0);
        let after = raise_nofile_limit().unwrap();
        assert_eq!(after.hard, before.hard);
        if let (Some(soft), Some(hard)) = (after.soft, after.hard) {
            assert_eq!(soft, hard, "{after}");
        }
        assert!(after.to_string().starts_with("soft "), "{after}");
    }

    #[test]
    fn budget_is_taken_and_given_back() {
        let b = DescriptorBudget::new(2);
        let one = b.take().unwrap();
        let two = b.take().unwrap();
        assert!(b.take().is_none());
        assert_eq!(b.used(), 2);
        drop(one);
        let three = b.take().unwrap();
        drop((two, three));
        assert_eq!(b.used(), 0);
    }
}
