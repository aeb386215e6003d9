//! Disk bounds on the host: how much room the filesystems of `BEIGE_HOME` (store, audit
//! log, gateway log) and of the agents' workspaces have left, and the [`DiskGuard`] that
//! pauses agents before the audit log has no room.
//!
//! A sandbox can fill its workspace (a bind mount, usually on the same filesystem as
//! `BEIGE_HOME`); the audit fails closed, so a full disk would stop every agent with
//! errors about the audit log. The guard looks first: below `gateway.minFreeSpace` on a
//! filesystem, the agents that write there (every agent, for the filesystem of the store
//! and the logs) are paused — new prompts and tool calls are refused with a
//! [`DiskLow`] that says where, how much is free and what to do — and the owner is told
//! once per episode (an error line in the gateway log, a `security.disk_low` audit record
//! per paused agent while there is still room for it, and [`DiskStatus`] in the health
//! answer). When space returns, work resumes by itself (`security.disk_ok`, with the
//! number of refused calls).
//!
//! Checking is cheap: one `statvfs` per filesystem, at most once a second
//! ([`CHECK_EVERY`]), plus a background check every few seconds ([`WATCH_EVERY`]) so an
//! idle gateway notices too. It does not decide anything else; quotas inside a
//! filesystem (project quotas, `sandbox.diskLimit`) are the engine's and the kernel's.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::audit::{now_ts, AuditDecision, AuditRecord, AuditSink, AuditType, Phase, Target};
use crate::config::FreeSpace;

/// A cached reading is reused for this long before the filesystems are looked at again.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);
/// How often the background check runs while no work comes in.
pub const WATCH_EVERY: Duration = Duration::from_secs(5);
/// Free inodes below this share of a filesystem's inodes count as low too (when the
/// filesystem counts inodes at all): a workspace full of empty files stops writes as
/// surely as a full disk.
pub const MIN_FREE_INODES_PERCENT: f64 = 1.0;

pub use crate::config::fmt_bytes;

pub use beige_client::status::FsSpace;

/// `statvfs(2)` of the filesystem holding `path`.
#[allow(unsafe_code)]
// The field types of `statvfs` differ between platforms (u32 or u64).
#[allow(clippy::unnecessary_cast)]
pub fn fs_space(path: &Path) -> io::Result<FsSpace> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the path holds a NUL byte"))?;
    // SAFETY: `statvfs` is plain old data, so all zeroes is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is a NUL-terminated string and `st` a writable `statvfs` that
    // outlives the call; the kernel only writes into it.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let block = if st.f_frsize > 0 {
        st.f_frsize as u64
    } else {
        st.f_bsize as u64
    };
    Ok(FsSpace {
        free_bytes: (st.f_bavail as u64).saturating_mul(block),
        total_bytes: (st.f_blocks as u64).saturating_mul(block),
        free_inodes: st.f_favail as u64,
        total_inodes: st.f_files as u64,
    })
}

/// How the guard reads a filesystem: [`fs_space`] ([`Probe::statvfs`]), or a stand-in in
/// tests.
#[derive(Clone)]
pub struct Probe(Arc<ReadSpace>);

type ReadSpace = dyn Fn(&Path) -> io::Result<FsSpace> + Send + Sync;

impl Probe {
    /// A probe that reads a filesystem's space with `read` instead of [`fs_space`].
    pub fn new(read: impl Fn(&Path) -> io::Result<FsSpace> + Send + Sync + 'static) -> Self {
        Self(Arc::new(read))
    }

    /// The real filesystems.
    pub fn statvfs() -> Self {
        Self::new(fs_space)
    }

    fn read(&self, path: &Path) -> io::Result<FsSpace> {
        (self.0)(path)
    }
}

impl fmt::Debug for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Probe")
    }
}

/// One place the guard watches: a path, what lives there, and whose work stops when its
/// filesystem is low (`agent: None` — every agent's: the store, the logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchPath {
    /// A path on the filesystem to watch (the filesystem is what counts, not the path).
    pub path: PathBuf,
    /// What lives there, for messages (`the audit log`, `the workspace of agent 'a'`).
    pub what: String,
    /// The agent paused when it is low; `None`: every agent.
    pub agent: Option<String>,
}

impl WatchPath {
    /// A path every agent depends on (store, audit log, gateway log).
    pub fn shared(path: impl Into<PathBuf>, what: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            what: what.into(),
            agent: None,
        }
    }

    /// The workspace of `agent`.
    pub fn workspace(path: impl Into<PathBuf>, agent: &str) -> Self {
        Self {
            path: path.into(),
            what: format!("the workspace of agent '{agent}'"),
            agent: Some(agent.to_string()),
        }
    }
}

impl Watched {
    /// What lives on the filesystem: the shared things, then the workspaces.
    fn what(&self) -> Vec<String> {
        let mut parts = self.what.clone();
        let quoted: Vec<String> = self.agents.iter().map(|a| format!("'{a}'")).collect();
        match quoted.len() {
            0 => {}
            1 => parts.push(format!("the workspace of agent {}", quoted[0])),
            n if n <= 5 => parts.push(format!("the workspaces of agents {}", quoted.join(", "))),
            n => parts.push(format!(
                "the workspaces of agents {} and {} more",
                quoted[..4].join(", "),
                n - 4
            )),
        }
        parts
    }
}

/// One watched filesystem (paths on the same device are one).
#[derive(Debug, Clone)]
struct Watched {
    /// The first path named on it; what `statvfs` is called on and what messages show.
    path: PathBuf,
    device: Option<u64>,
    /// The shared things that live there (store, logs); workspaces are `agents`.
    what: Vec<String>,
    /// The store or a log lives here: every agent stops when it is low.
    everyone: bool,
    /// Agents whose workspace is here.
    agents: Vec<String>,
}

/// The latest reading of one filesystem.
#[derive(Debug, Clone)]
enum Reading {
    Space(FsSpace),
    Failed(String),
}

#[derive(Debug, Default)]
struct State {
    checked: Option<Instant>,
    readings: Vec<Option<Reading>>,
    /// Indexes of the filesystems below the threshold.
    low: BTreeSet<usize>,
    /// Agents paused now, with when the pause began.
    paused: BTreeMap<String, Instant>,
    /// Prompts and calls refused per agent during its current pause.
    refused: BTreeMap<String, u64>,
    /// Filesystems whose reading failed, already logged.
    failing: BTreeSet<usize>,
}

/// What changed at one check, reported outside the lock.
#[derive(Debug)]
enum Event {
    FsLow(usize, FsSpace),
    FsOk(usize, FsSpace),
    FsUnreadable(usize, String),
    Paused(String, DiskLow),
    Resumed {
        agent: String,
        refused: u64,
        after: Duration,
    },
}

/// An agent's work is refused because a filesystem it needs is nearly full.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.message())]
pub struct DiskLow {
    /// The agent whose work is refused.
    pub agent: String,
    /// A path on the filesystem that is low.
    pub path: PathBuf,
    /// What lives there (`BEIGE_HOME (store, audit log)`, `the workspace of agent 'a'`).
    pub what: String,
    /// The reading of that filesystem that found it low.
    pub space: FsSpace,
    /// The bytes `gateway.minFreeSpace` asks to keep free there.
    pub min_free_bytes: u64,
    /// `gateway.minFreeSpace` as configured (`512.0 MiB`, `2%`).
    pub min_free: String,
}

impl DiskLow {
    /// Low on inodes rather than on bytes.
    fn inodes_low(&self) -> bool {
        self.space.free_bytes >= self.min_free_bytes
    }

    fn message(&self) -> String {
        let shortage = if self.inodes_low() {
            format!(
                "has {} free inodes of {} (below {MIN_FREE_INODES_PERCENT}%)",
                self.space.free_inodes, self.space.total_inodes
            )
        } else {
            format!(
                "has {} free of {}, below gateway.minFreeSpace ({})",
                fmt_bytes(self.space.free_bytes),
                fmt_bytes(self.space.total_bytes),
                self.min_free
            )
        };
        format!(
            "disk space is low: the filesystem of {} ({}) {shortage}. Agent '{}' is paused: \
             prompts and tool calls are refused until there is room again, so that the audit \
             log and the store never run out of space. Free space on that filesystem (files \
             in the agents' workspaces, unused Docker images and containers, old logs) or \
             lower gateway.minFreeSpace; work resumes by itself within seconds, no restart \
             needed.",
            self.path.display(),
            self.what,
            self.agent
        )
    }
}

pub use beige_client::status::{DiskStatus, FsStatus};

/// Pauses agents while a filesystem they need is below `gateway.minFreeSpace`.
pub struct DiskGuard {
    min_free: FreeSpace,
    watched: Vec<Watched>,
    probe: Probe,
    audit: Option<Arc<dyn AuditSink>>,
    state: Mutex<State>,
    stop: CancellationToken,
}

impl fmt::Debug for DiskGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DiskGuard")
            .field("min_free", &self.min_free)
            .field("watched", &self.watched)
            .finish_non_exhaustive()
    }
}

impl Drop for DiskGuard {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl DiskGuard {
    /// A guard over `paths` (grouped by filesystem), reading them with `probe` and
    /// recording pauses in `audit`.
    pub fn new(
        min_free: FreeSpace,
        paths: Vec<WatchPath>,
        probe: Probe,
        audit: Option<Arc<dyn AuditSink>>,
    ) -> Self {
        use std::os::unix::fs::MetadataExt;
        let mut watched: Vec<Watched> = Vec::new();
        for p in paths {
            let device = std::fs::metadata(&p.path).ok().map(|m| m.dev());
            let same = watched
                .iter()
                .position(|w| (device.is_some() && w.device == device) || w.path == p.path);
            let i = match same {
                Some(i) => i,
                None => {
                    watched.push(Watched {
                        path: p.path.clone(),
                        device,
                        what: Vec::new(),
                        everyone: false,
                        agents: Vec::new(),
                    });
                    watched.len() - 1
                }
            };
            let w = &mut watched[i];
            match p.agent {
                None => {
                    w.everyone = true;
                    if !w.what.contains(&p.what) {
                        w.what.push(p.what);
                    }
                }
                Some(a) if !w.agents.contains(&a) => w.agents.push(a),
                Some(_) => {}
            }
        }
        let state = State {
            readings: vec![None; watched.len()],
            ..State::default()
        };
        Self {
            min_free,
            watched,
            probe,
            audit,
            state: Mutex::new(state),
            stop: CancellationToken::new(),
        }
    }

    /// Check in the background every `every` until [`stop`](Self::stop) or the guard is
    /// dropped, so pauses and resumptions are noticed and reported without work coming in.
    pub fn watch(self: &Arc<Self>, every: Duration) {
        if self.min_free.is_off() {
            return;
        }
        let weak: Weak<Self> = Arc::downgrade(self);
        let stop = self.stop.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let Some(guard) = weak.upgrade() else { return };
                let events = guard.refresh(true);
                guard.report(events).await;
            }
        });
    }

    /// End the background check.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Before work for `agent`: `Err` (and the refusal counted) while a filesystem it
    /// needs is low. Reads the filesystems at most once per [`CHECK_EVERY`].
    pub async fn check(&self, agent: &str) -> Result<(), DiskLow> {
        if self.min_free.is_off() {
            return Ok(());
        }
        let events = self.refresh(false);
        self.report(events).await;
        let mut st = self.lock();
        match self.low_for(&st, agent) {
            Some(low) => {
                *st.refused.entry(agent.to_string()).or_default() += 1;
                Err(low)
            }
            None => Ok(()),
        }
    }

    /// Whether `agent` is paused, from the last reading (no new one).
    pub fn is_paused(&self, agent: &str) -> bool {
        self.lock().paused.contains_key(agent)
    }

    /// Count a call of `agent` refused elsewhere while it is paused.
    pub fn note_refused(&self, agent: &str) {
        let mut st = self.lock();
        if st.paused.contains_key(agent) {
            *st.refused.entry(agent.to_string()).or_default() += 1;
        }
    }

    /// What the guard sees now (read again if the last reading is older than
    /// [`CHECK_EVERY`]).
    pub async fn status(&self) -> DiskStatus {
        if !self.min_free.is_off() {
            let events = self.refresh(false);
            self.report(events).await;
        }
        self.current()
    }

    /// Read `paths` once and say what a guard with `min_free` would make of them, without
    /// logging or recording anything (`beige doctor`).
    pub fn survey(min_free: FreeSpace, paths: Vec<WatchPath>) -> DiskStatus {
        let guard = Self::new(min_free, paths, Probe::statvfs(), None);
        drop(guard.refresh(true));
        guard.current()
    }

    fn current(&self) -> DiskStatus {
        let st = self.lock();
        let filesystems = self
            .watched
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let (space, error) = match st.readings.get(i).cloned().flatten() {
                    Some(Reading::Space(s)) => (Some(s), None),
                    Some(Reading::Failed(e)) => (None, Some(e)),
                    None => (None, None),
                };
                FsStatus {
                    path: w.path.clone(),
                    what: w.what(),
                    space,
                    min_free_bytes: space
                        .filter(|_| !self.min_free.is_off())
                        .map(|s| self.min_free.bytes_of(s.total_bytes)),
                    low: st.low.contains(&i),
                    error,
                }
            })
            .collect();
        DiskStatus {
            low: !st.low.is_empty(),
            min_free_space: if self.min_free.is_off() {
                "off".to_string()
            } else {
                self.min_free.to_string()
            },
            paused_agents: st.paused.keys().cloned().collect(),
            filesystems,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_low(&self, s: &FsSpace) -> bool {
        if self.min_free.is_off() {
            return false;
        }
        let bytes_low = s.free_bytes < self.min_free.bytes_of(s.total_bytes);
        let inodes_low = s.total_inodes > 0
            && (s.free_inodes as f64) < (s.total_inodes as f64) * MIN_FREE_INODES_PERCENT / 100.0;
        bytes_low || inodes_low
    }

    fn concerns(&self, i: usize, agent: &str) -> bool {
        self.watched
            .get(i)
            .is_some_and(|w| w.everyone || w.agents.iter().any(|a| a == agent))
    }

    /// Every agent named anywhere.
    fn agents(&self) -> BTreeSet<String> {
        self.watched
            .iter()
            .flat_map(|w| w.agents.iter().cloned())
            .collect()
    }

    fn low_for(&self, st: &State, agent: &str) -> Option<DiskLow> {
        let i = *st.low.iter().find(|i| self.concerns(**i, agent))?;
        let Some(Reading::Space(space)) = st.readings.get(i).cloned().flatten() else {
            return None;
        };
        Some(self.disk_low(i, agent, space))
    }

    fn disk_low(&self, i: usize, agent: &str, space: FsSpace) -> DiskLow {
        let w = &self.watched[i];
        DiskLow {
            agent: agent.to_string(),
            path: w.path.clone(),
            what: w.what().join(", "),
            space,
            min_free_bytes: self.min_free.bytes_of(space.total_bytes),
            min_free: self.min_free.to_string(),
        }
    }

    /// Read the filesystems if the last reading is stale (or always, with `force`) and
    /// return what changed.
    fn refresh(&self, force: bool) -> Vec<Event> {
        let mut st = self.lock();
        let now = Instant::now();
        if !force
            && st
                .checked
                .is_some_and(|t| now.duration_since(t) < CHECK_EVERY)
        {
            return Vec::new();
        }
        st.checked = Some(now);
        let mut events = Vec::new();
        for (i, w) in self.watched.iter().enumerate() {
            let reading = match self.probe.read(&w.path) {
                Ok(space) => Reading::Space(space),
                Err(e) => Reading::Failed(e.to_string()),
            };
            match &reading {
                Reading::Space(space) => {
                    st.failing.remove(&i);
                    let low = self.is_low(space);
                    if low && st.low.insert(i) {
                        events.push(Event::FsLow(i, *space));
                    } else if !low && st.low.remove(&i) {
                        events.push(Event::FsOk(i, *space));
                    }
                }
                // A filesystem that cannot be read is not taken as full: the writes
                // themselves fail with their own errors, and the reason is logged once.
                Reading::Failed(e) => {
                    if st.failing.insert(i) {
                        events.push(Event::FsUnreadable(i, e.clone()));
                    }
                    if st.low.remove(&i) {
                        events.push(Event::FsOk(i, FsSpace::default()));
                    }
                }
            }
            st.readings[i] = Some(reading);
        }
        let everyone: BTreeSet<String> = self.agents();
        for agent in everyone {
            let low = self.low_for(&st, &agent);
            match (low, st.paused.contains_key(&agent)) {
                (Some(low), false) => {
                    st.paused.insert(agent.clone(), now);
                    st.refused.insert(agent.clone(), 0);
                    events.push(Event::Paused(agent, low));
                }
                (None, true) => {
                    let since = st.paused.remove(&agent).unwrap_or(now);
                    let refused = st.refused.remove(&agent).unwrap_or(0);
                    events.push(Event::Resumed {
                        agent,
                        refused,
                        after: now.duration_since(since),
                    });
                }
                _ => {}
            }
        }
        events
    }

    /// Tell the owner: log lines, and audit records while there is room for them.
    async fn report(&self, events: Vec<Event>) {
        for event in events {
            match event {
                Event::FsLow(i, space) => {
                    let w = &self.watched[i];
                    let paused = self.paused_by(i);
                    tracing::error!(
                        path = %w.path.display(),
                        free = space.free_bytes,
                        total = space.total_bytes,
                        free_inodes = space.free_inodes,
                        "disk space is low on the filesystem of {} ({}): {} free of {}, {} free inodes; below gateway.minFreeSpace ({}) — pausing {}. Free space there or lower gateway.minFreeSpace; agents resume by themselves",
                        w.path.display(),
                        w.what().join(", "),
                        fmt_bytes(space.free_bytes),
                        fmt_bytes(space.total_bytes),
                        space.free_inodes,
                        self.min_free,
                        paused
                    );
                }
                Event::FsOk(i, space) => {
                    let w = &self.watched[i];
                    tracing::warn!(
                        path = %w.path.display(),
                        free = space.free_bytes,
                        "disk space on the filesystem of {} is above gateway.minFreeSpace again ({} free); resuming {}",
                        w.path.display(),
                        fmt_bytes(space.free_bytes),
                        self.paused_by(i)
                    );
                }
                Event::FsUnreadable(i, error) => {
                    tracing::warn!(
                        path = %self.watched[i].path.display(),
                        %error,
                        "cannot read the free space of the filesystem of {} ({}); it is not watched until it can be read",
                        self.watched[i].path.display(),
                        self.watched[i].what().join(", ")
                    );
                }
                Event::Paused(agent, low) => {
                    let args = vec![
                        format!("path={}", low.path.display()),
                        format!("free={}", low.space.free_bytes),
                        format!("total={}", low.space.total_bytes),
                        format!("freeInodes={}", low.space.free_inodes),
                        format!("minFree={}", low.min_free_bytes),
                    ];
                    self.audit(
                        &agent,
                        "security.disk_low",
                        args,
                        AuditDecision::Denied,
                        Some(low.to_string()),
                    )
                    .await;
                }
                Event::Resumed {
                    agent,
                    refused,
                    after,
                } => {
                    tracing::info!(
                        agent = %agent,
                        refused,
                        "agent '{agent}' resumes: disk space is back above gateway.minFreeSpace after {} s ({refused} prompt(s) and call(s) refused meanwhile)",
                        after.as_secs()
                    );
                    let args = vec![
                        format!("refused={refused}"),
                        format!("pausedMs={}", after.as_millis()),
                    ];
                    self.audit(
                        &agent,
                        "security.disk_ok",
                        args,
                        AuditDecision::Allowed,
                        None,
                    )
                    .await;
                }
            }
        }
    }

    /// `every agent` or `agents a, b` for a filesystem's log line.
    fn paused_by(&self, i: usize) -> String {
        let w = &self.watched[i];
        if w.everyone {
            "every agent".to_string()
        } else {
            format!("agent(s) {}", w.agents.join(", "))
        }
    }

    async fn audit(
        &self,
        agent: &str,
        tool: &str,
        args: Vec<String>,
        decision: AuditDecision,
        error: Option<String>,
    ) {
        let Some(audit) = &self.audit else { return };
        let record = AuditRecord {
            trace_id: None,
            span_id: None,
            ts: now_ts(),
            agent: agent.to_string(),
            session: None,
            model: None,
            channel: None,
            principal: None,
            via: None,
            phase: Phase::Finished,
            kind: AuditType::Security,
            tool: tool.to_string(),
            args,
            args_bytes: None,
            args_sha256: None,
            args_truncated: None,
            egress: None,
            approval: None,
            spawn: None,
            parent_session: None,
            exec: None,
            attribution: None,
            decision,
            target: Some(Target::Gateway),
            duration_ms: None,
            exit_code: None,
            output_bytes: None,
            error,
        };
        if let Err(e) = audit.record(&record).await {
            tracing::error!(agent, error = %e, "could not audit {tool} (the disk may be full)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn bytes_read_like_people_write_them() {
        assert_eq!(fmt_bytes(0), "0 B");
        assert_eq!(fmt_bytes(1023), "1023 B");
        assert_eq!(fmt_bytes(1024), "1.0 KiB");
        assert_eq!(fmt_bytes(1536), "1.5 KiB");
        assert_eq!(fmt_bytes(64 << 20), "64.0 MiB");
        assert_eq!(fmt_bytes(5 << 30), "5.0 GiB");
        assert_eq!(fmt_bytes(u64::MAX), "16384.0 PiB");
    }

    #[test]
    fn statvfs_reads_a_real_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        let s = fs_space(dir.path()).unwrap();
        assert!(s.total_bytes > 0 && s.free_bytes <= s.total_bytes, "{s:?}");
        let err = fs_space(&dir.path().join("missing")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    /// A probe whose free bytes the test sets, per path.
    fn probe(free: Arc<AtomicU64>, ws_free: Arc<AtomicU64>, ws: PathBuf) -> Probe {
        Probe::new(move |p: &Path| {
            let f = if p == ws { &ws_free } else { &free };
            Ok(FsSpace {
                free_bytes: f.load(Ordering::SeqCst),
                total_bytes: 1 << 30,
                free_inodes: 1000,
                total_inodes: 1000,
            })
        })
    }

    #[derive(Debug, Default)]
    struct Records(Mutex<Vec<AuditRecord>>);

    #[async_trait::async_trait]
    impl AuditSink for Records {
        async fn record(&self, r: &AuditRecord) -> Result<(), crate::audit::AuditError> {
            self.0.lock().unwrap().push(r.clone());
            Ok(())
        }
    }

    #[tokio::test]
    async fn agents_pause_below_the_threshold_and_resume_when_space_returns() {
        // Paths that do not exist are told apart by path (real ones by device).
        let home = Path::new("/nonexistent-beige/home");
        let other = Path::new("/nonexistent-beige/ws-b");
        let free = Arc::new(AtomicU64::new(1 << 29));
        let ws_free = Arc::new(AtomicU64::new(1 << 29));
        let records = Arc::new(Records::default());
        let guard = DiskGuard::new(
            FreeSpace::Bytes(100 << 20),
            vec![
                WatchPath::shared(home, "BEIGE_HOME (store, audit log)"),
                WatchPath::workspace(home.join("ws-a"), "a"),
                WatchPath::workspace(other, "b"),
            ],
            probe(free.clone(), ws_free.clone(), other.to_path_buf()),
            Some(records.clone()),
        );
        // home and ws-a (missing, so grouped by path) — two filesystems plus b's.
        assert!(guard.check("a").await.is_ok());
        assert!(guard.check("b").await.is_ok());

        // b's workspace filesystem fills: only b pauses.
        ws_free.store(10 << 20, Ordering::SeqCst);
        guard.lock().checked = None;
        let low = guard.check("b").await.unwrap_err();
        assert!(guard.check("a").await.is_ok());
        let text = low.to_string();
        assert!(
            text.starts_with(&format!(
                "disk space is low: the filesystem of {} (the workspace of agent 'b') has 10.0 MiB free of 1.0 GiB, below gateway.minFreeSpace (100.0 MiB). Agent 'b' is paused",
                other.display()
            )),
            "{text}"
        );
        assert!(text.contains("lower gateway.minFreeSpace"), "{text}");
        // Cached: a second refusal within the second reads nothing new.
        assert!(guard.check("b").await.is_err());
        guard.note_refused("b");
        guard.note_refused("a"); // not paused: not counted
        let status = guard.status().await;
        assert!(status.low);
        assert_eq!(status.paused_agents, ["b"]);
        assert_eq!(status.filesystems.iter().filter(|f| f.low).count(), 1);

        // The home filesystem fills: everyone pauses.
        free.store(1 << 20, Ordering::SeqCst);
        guard.lock().checked = None;
        let low = guard.check("a").await.unwrap_err();
        assert!(
            low.to_string().contains("(BEIGE_HOME (store, audit log))"),
            "{low}"
        );

        // Space returns everywhere: both resume without anything else happening.
        free.store(1 << 29, Ordering::SeqCst);
        ws_free.store(1 << 29, Ordering::SeqCst);
        guard.lock().checked = None;
        assert!(guard.check("a").await.is_ok());
        assert!(guard.check("b").await.is_ok());
        assert!(!guard.status().await.low);

        let r = records.0.lock().unwrap().clone();
        let seen: Vec<(String, String)> = r
            .iter()
            .map(|r| (r.agent.clone(), r.tool.clone()))
            .collect();
        assert_eq!(
            seen,
            [
                ("b".to_string(), "security.disk_low".to_string()),
                ("a".to_string(), "security.disk_low".to_string()),
                ("a".to_string(), "security.disk_ok".to_string()),
                ("b".to_string(), "security.disk_ok".to_string()),
            ]
        );
        assert_eq!(r[0].kind, AuditType::Security);
        assert_eq!(r[0].decision, AuditDecision::Denied);
        assert!(
            r[0].args.contains(&format!("free={}", 10 << 20)),
            "{:?}",
            r[0].args
        );
        // b: two refused checks and one noted refusal; a: one refused check.
        assert_eq!(r[3].args[0], "refused=3");
        assert_eq!(r[2].args[0], "refused=1");
    }

    #[tokio::test]
    async fn percentages_inodes_and_off() {
        let dir = tempfile::tempdir().unwrap();
        let space = Arc::new(Mutex::new(FsSpace {
            free_bytes: 30,
            total_bytes: 1000,
            free_inodes: 500,
            total_inodes: 1000,
        }));
        let s = space.clone();
        let probe = Probe::new(move |_: &Path| Ok(*s.lock().unwrap()));
        let guard = DiskGuard::new(
            FreeSpace::Percent(2.0),
            vec![WatchPath::workspace(dir.path(), "a")],
            probe.clone(),
            None,
        );
        assert!(guard.check("a").await.is_ok()); // 3% free
        space.lock().unwrap().free_inodes = 5; // 0.5% of the inodes
        guard.lock().checked = None;
        let low = guard.check("a").await.unwrap_err();
        assert!(
            low.to_string()
                .contains("has 5 free inodes of 1000 (below 1%)"),
            "{low}"
        );
        space.lock().unwrap().free_inodes = 500;
        space.lock().unwrap().free_bytes = 10; // 1%
        guard.lock().checked = None;
        assert!(guard.check("a").await.is_err());

        let off = DiskGuard::new(
            FreeSpace::Bytes(0),
            vec![WatchPath::workspace(dir.path(), "a")],
            probe,
            None,
        );
        assert!(off.check("a").await.is_ok());
        assert_eq!(off.status().await.min_free_space, "off");
    }

    #[tokio::test]
    async fn an_unreadable_filesystem_is_not_taken_as_full() {
        let guard = DiskGuard::new(
            FreeSpace::Bytes(1),
            vec![WatchPath::workspace("/nonexistent/beige-ws", "a")],
            Probe::statvfs(),
            None,
        );
        assert!(guard.check("a").await.is_ok());
        let status = guard.status().await;
        assert!(!status.low);
        assert!(status.filesystems[0].error.is_some(), "{status:?}");
    }
}
