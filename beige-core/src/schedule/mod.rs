//! Schedules: prompts and execs that fire once (`at`) or on a cron expression in a time
//! zone, each fire instant exactly once.
//!
//! Owns the cron evaluation ([`cron`]: next instants in UTC from an expression and an
//! IANA zone, DST gaps and folds handled), the [`Clock`] the engine reads time from, and
//! the test-only failpoints ([`failpoint`]). The durable state and its atomic transitions
//! live in the store ([`crate::store::ScheduleStore`]); the wire types in
//! `beige_client::schedules`.

pub mod cron;
pub(crate) mod engine;
pub(crate) mod narrow;
mod spec;

pub use spec::{check_spec, is_valid_schedule_key, SpecProblem};

use std::sync::OnceLock;

/// The environment variable that names a failpoint to abort at (tests only).
pub const FAILPOINT_ENV: &str = "BEIGE_FAILPOINT";

/// Abort the process at once when `BEIGE_FAILPOINT` names `name`: how the crash tests
/// SIGKILL the gateway at exact moments (`schedule.before_claim_commit`,
/// `schedule.after_claim`, `schedule.after_start`, `schedule.after_finish_before_send`).
/// Inert when the variable is unset, which is always the case outside tests.
pub fn failpoint(name: &str) {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    let armed = ARMED.get_or_init(|| std::env::var(FAILPOINT_ENV).ok().filter(|v| !v.is_empty()));
    if armed.as_deref() == Some(name) {
        tracing::error!(failpoint = name, "failpoint reached: aborting (test only)");
        std::process::abort();
    }
}

/// Where the engine reads the time from: the system clock, or a test's.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now, in Unix ms (UTC).
    fn now_ms(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        crate::store::now_ms()
    }
}

/// A clock a test sets and advances.
#[derive(Debug, Default)]
pub struct ManualClock(std::sync::atomic::AtomicI64);

impl ManualClock {
    /// A clock at `ms`.
    pub fn at(ms: i64) -> Self {
        Self(std::sync::atomic::AtomicI64::new(ms))
    }

    /// Set the time.
    pub fn set(&self, ms: i64) {
        self.0.store(ms, std::sync::atomic::Ordering::SeqCst);
    }

    /// Move the time on by `ms`.
    pub fn advance(&self, ms: i64) {
        self.0.fetch_add(ms, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}
