//! Per-exec identity: which `exec` a process calling an agent's tool socket belongs to,
//! decided by the kernel's view of the process, never by what the request says
//! (design: `spec/governance.md` §5; user docs: `docs/socket-protocol.md`, "Who is
//! calling").
//!
//! This module owns the per-agent [`ExecRegistry`] — every exec the gateway started:
//! its session, its root process as PID 1 reported it (`(pid, starttime)` in the
//! container's pid namespace), and whether it has ended (ended execs are kept, up to
//! [`MAX_ENDED`] per agent, so that processes they left behind are told
//! `exec_finished`) — and [`ExecRegistry::attribute`], which reads the host's `/proc` for
//! a socket peer's pid (`SO_PEERCRED`) and finds its exec by session leader, else by
//! ancestry. The result is a plain value, [`Attribution`]. It never decides what a call
//! may do (the gateway does, with the attribution) and never talks to the sandbox; the
//! link fills in root processes ([`ExecRegistry::started`]) and the gateway registers and
//! ends execs.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use beige_protocol::procfs::{ns_ids, parse_stat, ProcStat};
use serde::{Deserialize, Serialize};

/// Ended execs kept per agent for late callers (the oldest are forgotten beyond; their
/// leftover processes then count as unbound).
pub const MAX_ENDED: usize = 1024;
/// Ancestors looked at above a caller before it counts as unbound.
pub const MAX_ANCESTRY: usize = 64;
/// How long a caller that matches no exec waits for an exec of its agent that was
/// started but whose root PID 1 has not reported yet (the report and the command's
/// first call race on two connections).
pub const START_WAIT: Duration = Duration::from_millis(500);
/// An exec not reported by PID 1 within this long is not waited for (it took the
/// `docker exec` path, which reports nothing).
const REPORT_EXPECTED_WITHIN: Duration = Duration::from_secs(5);
/// Attributions cached per agent; the cache is emptied when full.
const MAX_CACHE: usize = 4096;
/// Longest command kept in an exec's record.
const MAX_COMMAND: usize = 200;

/// The gateway's id of one `exec` (`BEIGE_EXEC_ID` in its environment — a label, not a
/// secret: processes of the same uid can read each other's environment).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ExecId(String);

impl ExecId {
    /// A fresh random id (`x` and 32 hex digits: 128 bits).
    pub fn mint() -> Self {
        Self(format!("x{:032x}", rand::random::<u128>()))
    }

    /// An id as text (as the shim reported it, or a test's).
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The id as text, as it appears in `BEIGE_EXEC_ID` and audit records.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ExecId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a caller was bound to its exec (`attribution` in audit records).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttributionMethod {
    /// Its kernel session leader is the exec's root process.
    SessionId,
    /// It left the exec's session, but one of its ancestors is the exec's root.
    Ancestry,
    /// No exec found: an operator's `docker exec`, a daemon that left the session and
    /// was re-parented, a process of an exec the registry has forgotten, or no `/proc`
    /// view of the peer.
    Unbound,
}

impl AttributionMethod {
    /// The name in audit records: `session-id`, `ancestry`, `unbound`.
    pub fn as_str(self) -> &'static str {
        match self {
            AttributionMethod::SessionId => "session-id",
            AttributionMethod::Ancestry => "ancestry",
            AttributionMethod::Unbound => "unbound",
        }
    }
}

/// Who is calling: the exec the kernel's view of the caller leads to, and how it was
/// found. `exec` is `None` exactly when `method` is [`AttributionMethod::Unbound`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribution {
    /// The caller's exec, when one was found.
    pub exec: Option<ExecId>,
    /// How it was found.
    pub method: AttributionMethod,
}

impl Attribution {
    /// No exec found.
    pub fn unbound() -> Self {
        Self {
            exec: None,
            method: AttributionMethod::Unbound,
        }
    }

    fn bound(exec: ExecId, method: AttributionMethod) -> Self {
        Self {
            exec: Some(exec),
            method,
        }
    }
}

/// What happens to a tool call from an unbound caller (`policy.unboundCalls`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum UnboundCalls {
    /// Refused (`unbound_call`).
    Deny,
    /// Run in the session the request names if it is a known session of the agent,
    /// else in `socket:<agent>` (the behaviour before per-exec identity).
    #[default]
    Session,
}

/// The session an exec runs in, from the context of the tool call that started it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecSession {
    /// The session key (`telegram:42`, …); `None` for a call without a session.
    pub key: Option<String>,
    /// The channel it came from.
    pub channel: Option<String>,
    /// The channel's chat.
    pub chat_id: Option<String>,
    /// The chat's thread.
    pub thread_id: Option<String>,
}

/// A process named the way PID 1 reports an exec's root: its pid in the container's
/// pid namespace and its start time (clock ticks after boot; the same in every
/// namespace).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcKey {
    /// The pid in the container's pid namespace.
    pub pid: u32,
    /// Field 22 of its `/proc/<pid>/stat`.
    pub starttime: u64,
}

/// One exec the gateway started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRecord {
    /// The exec's id.
    pub id: ExecId,
    /// The session of the call that started it.
    pub session: ExecSession,
    /// The command, cut to 200 bytes.
    pub command: String,
    /// When the gateway registered it.
    pub started_at: SystemTime,
    /// Its root process, once PID 1 reported it.
    pub root: Option<ProcKey>,
    /// Its result has arrived (or its call ended without one).
    pub ended: bool,
}

#[derive(Debug, Default)]
struct AgentExecs {
    execs: HashMap<ExecId, (ExecRecord, Instant)>,
    /// Exec ids by root pid, in report order.
    by_pid: HashMap<u32, Vec<ExecId>>,
    /// Ended execs, oldest first.
    ended: VecDeque<ExecId>,
    /// Bound attributions by the caller's host `(pid, starttime)`.
    cache: HashMap<(u32, u64), Attribution>,
    /// Exec roots found alive by their host pid (a caller's session id), with their
    /// start time: later callers of the same session need one `stat` more, no `status`.
    by_host_sid: HashMap<u32, (ExecId, u64)>,
}

impl AgentExecs {
    fn exact(&self, key: ProcKey) -> Option<&ExecId> {
        self.by_pid.get(&key.pid)?.iter().rev().find(|id| {
            self.execs
                .get(*id)
                .is_some_and(|(r, _)| r.root == Some(key))
        })
    }

    /// The latest exec whose root had `pid` and started no later than `before`: the
    /// session a caller is in when its leader has exited (a pid that is still a session
    /// id is never reused, so the latest such root is that leader).
    fn latest_root(&self, pid: u32, before: u64) -> Option<&ExecId> {
        self.by_pid.get(&pid)?.iter().rev().find(|id| {
            self.execs
                .get(*id)
                .and_then(|(r, _)| r.root)
                .is_some_and(|root| root.starttime <= before)
        })
    }

    fn forget(&mut self, id: &ExecId) {
        if let Some((record, _)) = self.execs.remove(id) {
            if let Some(root) = record.root {
                if let Some(ids) = self.by_pid.get_mut(&root.pid) {
                    ids.retain(|i| i != id);
                    if ids.is_empty() {
                        self.by_pid.remove(&root.pid);
                    }
                }
            }
        }
        self.cache.retain(|_, a| a.exec.as_ref() != Some(id));
        self.by_host_sid.retain(|_, (i, _)| i != id);
    }

    fn awaiting_report(&self) -> bool {
        self.execs
            .values()
            .any(|(r, at)| r.root.is_none() && !r.ended && at.elapsed() < REPORT_EXPECTED_WITHIN)
    }
}

/// A process as the host's `/proc` shows it.
#[derive(Debug, Clone)]
struct Proc {
    stat: ProcStat,
    /// `NSpid`, outermost first.
    nspid: Vec<u32>,
    /// `NSsid`, outermost first (kernels since 4.1 have it next to `NSpid`).
    nssid: Option<Vec<u32>>,
}

/// `/proc/<pid>/stat` of `pid` under `root`.
fn read_stat(root: &Path, pid: u32) -> Option<ProcStat> {
    parse_stat(&std::fs::read(root.join(pid.to_string()).join("stat")).ok()?)
}

impl Proc {
    fn read(root: &Path, pid: u32) -> Option<Self> {
        Self::with_stat(root, pid, read_stat(root, pid)?)
    }

    fn with_stat(root: &Path, pid: u32, stat: ProcStat) -> Option<Self> {
        let status = std::fs::read_to_string(root.join(pid.to_string()).join("status")).ok()?;
        Some(Self {
            stat,
            nspid: ns_ids(&status, "NSpid")?,
            nssid: ns_ids(&status, "NSsid"),
        })
    }

    /// Its pid in its own (innermost) namespace.
    fn inner_pid(&self) -> u32 {
        self.nspid.last().copied().unwrap_or(0)
    }

    /// Its session id in its own namespace, when the kernel shows it.
    fn inner_sid(&self) -> Option<u32> {
        self.nssid
            .as_ref()
            .filter(|s| s.len() == self.nspid.len())
            .and_then(|s| s.last().copied())
    }
}

/// Every exec of every agent this gateway started, and who calls for which.
#[derive(Debug)]
pub struct ExecRegistry {
    agents: Mutex<HashMap<String, AgentExecs>>,
    reported: tokio::sync::Notify,
    proc_root: PathBuf,
    /// Depth of the gateway's own pid namespace (`NSpid` entries of `/proc/self`): a
    /// caller must be deeper, i.e. inside a container, to be bound to an exec.
    own_depth: usize,
}

impl Default for ExecRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl ExecRegistry {
    /// A registry reading the host's `/proc`.
    pub fn new() -> Self {
        Self::with_proc_root("/proc")
    }

    /// A registry reading another procfs layout (tests build one in a folder). Its
    /// `self/status` gives the gateway's own namespace depth (1 when unreadable).
    pub fn with_proc_root(root: impl Into<PathBuf>) -> Self {
        let proc_root = root.into();
        let own_depth = std::fs::read_to_string(proc_root.join("self/status"))
            .ok()
            .and_then(|s| ns_ids(&s, "NSpid"))
            .map_or(1, |ids| ids.len());
        Self {
            agents: Mutex::default(),
            reported: tokio::sync::Notify::new(),
            proc_root,
            own_depth,
        }
    }

    fn agents(&self) -> std::sync::MutexGuard<'_, HashMap<String, AgentExecs>> {
        self.agents.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Record an exec about to start in `agent`'s sandbox.
    pub fn register(&self, agent: &str, id: &ExecId, session: ExecSession, command: &str) {
        let record = ExecRecord {
            id: id.clone(),
            session,
            command: cut(command, MAX_COMMAND).to_string(),
            started_at: SystemTime::now(),
            root: None,
            ended: false,
        };
        self.agents()
            .entry(agent.to_string())
            .or_default()
            .execs
            .insert(id.clone(), (record, Instant::now()));
    }

    /// PID 1 reports the root process of `exec_id`. `false` (nothing recorded) for an id
    /// this gateway did not register (an exec a previous gateway started) or one that
    /// already has a root.
    pub fn started(&self, agent: &str, exec_id: &str, pid: u32, starttime: u64) -> bool {
        let id = ExecId::new(exec_id);
        let recorded = {
            let mut agents = self.agents();
            let Some(execs) = agents.get_mut(agent) else {
                return false;
            };
            match execs.execs.get_mut(&id) {
                Some((record, _)) if record.root.is_none() => {
                    record.root = Some(ProcKey { pid, starttime });
                    execs.by_pid.entry(pid).or_default().push(id);
                    true
                }
                _ => false,
            }
        };
        if recorded {
            self.reported.notify_waiters();
        }
        recorded
    }

    /// The exec's result arrived (or its call ended without one): from now on its
    /// callers are told `exec_finished`. The oldest ended execs beyond [`MAX_ENDED`] are
    /// forgotten.
    pub fn ended(&self, agent: &str, id: &ExecId) {
        let mut agents = self.agents();
        let Some(execs) = agents.get_mut(agent) else {
            return;
        };
        let Some((record, _)) = execs.execs.get_mut(id) else {
            return;
        };
        if record.ended {
            return;
        }
        record.ended = true;
        execs.ended.push_back(id.clone());
        while execs.ended.len() > MAX_ENDED {
            if let Some(old) = execs.ended.pop_front() {
                execs.forget(&old);
            }
        }
    }

    /// The execs of `agent` that have not ended, oldest first (egress streams carry no
    /// exec of their own yet: they are attributed by what runs when they open).
    pub fn running(&self, agent: &str) -> Vec<ExecRecord> {
        let agents = self.agents();
        let Some(execs) = agents.get(agent) else {
            return Vec::new();
        };
        let mut out: Vec<(Instant, ExecRecord)> = execs
            .execs
            .values()
            .filter(|(r, _)| !r.ended)
            .map(|(r, at)| (*at, r.clone()))
            .collect();
        out.sort_by_key(|(at, _)| *at);
        out.into_iter().map(|(_, r)| r).collect()
    }

    /// The record of one exec.
    pub fn get(&self, agent: &str, id: &ExecId) -> Option<ExecRecord> {
        self.agents()
            .get(agent)?
            .execs
            .get(id)
            .map(|(r, _)| r.clone())
    }

    /// Who is calling: the exec of the socket peer `host_pid` (its pid on the host, from
    /// `SO_PEERCRED`), by session leader, else by ancestry. A caller that matches no exec
    /// while one of the agent's execs awaits PID 1's report waits for it up to
    /// [`START_WAIT`] and is looked at again.
    pub async fn attribute(&self, agent: &str, host_pid: Option<u32>) -> Attribution {
        let Some(pid) = host_pid else {
            return Attribution::unbound();
        };
        let deadline = tokio::time::Instant::now() + START_WAIT;
        loop {
            let reported = self.reported.notified();
            tokio::pin!(reported);
            reported.as_mut().enable();
            let found = self.attribute_now(agent, pid);
            if found.exec.is_some() || !self.awaiting_report(agent) {
                return found;
            }
            if tokio::time::timeout_at(deadline, reported).await.is_err() {
                return self.attribute_now(agent, pid);
            }
        }
    }

    fn awaiting_report(&self, agent: &str) -> bool {
        self.agents()
            .get(agent)
            .is_some_and(AgentExecs::awaiting_report)
    }

    /// [`ExecRegistry::attribute`] without waiting: one look at `/proc`.
    pub fn attribute_now(&self, agent: &str, host_pid: u32) -> Attribution {
        let root = self.proc_root.as_path();
        let Some(stat) = read_stat(root, host_pid) else {
            return Attribution::unbound();
        };
        let cache_key = (host_pid, stat.starttime);
        // Fast paths: this very process was bound before, or its session leader is a
        // root already found alive under this host pid (and still the same process).
        let known_root = {
            let agents = self.agents();
            let Some(execs) = agents.get(agent) else {
                return Attribution::unbound();
            };
            if let Some(hit) = execs.cache.get(&cache_key) {
                return hit.clone();
            }
            execs.by_host_sid.get(&stat.sid).cloned()
        };
        let found = match known_root {
            Some((id, start)) if read_stat(root, stat.sid).map(|s| s.starttime) == Some(start) => {
                Some(Attribution::bound(id, AttributionMethod::SessionId))
            }
            _ => {
                let Some(caller) = Proc::with_stat(root, host_pid, stat) else {
                    return Attribution::unbound();
                };
                // A process of the gateway's own namespace (the host) is never an exec's.
                if caller.nspid.len() <= self.own_depth {
                    return Attribution::unbound();
                }
                self.by_session(agent, &caller)
                    .or_else(|| self.by_ancestry(agent, &caller))
            }
        };
        let Some(found) = found else {
            return Attribution::unbound();
        };
        let mut agents = self.agents();
        if let Some(execs) = agents.get_mut(agent) {
            if execs.cache.len() >= MAX_CACHE {
                execs.cache.clear();
                execs.by_host_sid.clear();
            }
            execs.cache.insert(cache_key, found.clone());
        }
        found
    }

    /// The exec whose root leads the caller's session. The caller's `NSsid` names the
    /// leader in the container and its session id the leader's host pid, which stays
    /// the leader's as long as the session has members: only its start time is read.
    /// When the leader has exited, the latest root with that pid that started no later
    /// than the caller is the one. Kernels without `NSsid` need the leader alive (its
    /// `NSpid` gives its container pid).
    fn by_session(&self, agent: &str, caller: &Proc) -> Option<Attribution> {
        let leader_start = || {
            std::fs::read(
                self.proc_root
                    .join(caller.stat.sid.to_string())
                    .join("stat"),
            )
            .ok()
            .and_then(|s| parse_stat(&s))
            .map(|s| s.starttime)
        };
        let key = match caller.inner_sid() {
            Some(sid) => leader_start().map(|starttime| ProcKey {
                pid: sid,
                starttime,
            }),
            None => {
                let leader = Proc::read(&self.proc_root, caller.stat.sid)
                    .filter(|l| l.nspid.len() == caller.nspid.len())?;
                Some(ProcKey {
                    pid: leader.inner_pid(),
                    starttime: leader.stat.starttime,
                })
            }
        };
        let mut agents = self.agents();
        let execs = agents.get_mut(agent)?;
        let id = match (key, caller.inner_sid()) {
            (Some(key), _) => {
                let id = execs.exact(key)?.clone();
                execs
                    .by_host_sid
                    .insert(caller.stat.sid, (id.clone(), key.starttime));
                id
            }
            (None, Some(sid)) => execs.latest_root(sid, caller.stat.starttime)?.clone(),
            (None, None) => return None,
        };
        Some(Attribution::bound(id, AttributionMethod::SessionId))
    }

    /// The exec whose root is an ancestor of the caller (at most [`MAX_ANCESTRY`] up,
    /// and never leaving the caller's namespace or passing its init).
    fn by_ancestry(&self, agent: &str, caller: &Proc) -> Option<Attribution> {
        let mut pid = caller.stat.ppid;
        for _ in 0..MAX_ANCESTRY {
            if pid <= 1 {
                return None;
            }
            let p = Proc::read(&self.proc_root, pid)?;
            if p.nspid.len() != caller.nspid.len() || p.inner_pid() <= 1 {
                return None;
            }
            let key = ProcKey {
                pid: p.inner_pid(),
                starttime: p.stat.starttime,
            };
            if let Some(id) = self.agents().get(agent).and_then(|e| e.exact(key).cloned()) {
                return Some(Attribution::bound(id, AttributionMethod::Ancestry));
            }
            pid = p.stat.ppid;
        }
        None
    }
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests;
