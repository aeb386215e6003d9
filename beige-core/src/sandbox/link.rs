//! The gateway side of the shim link: one authenticated, persistent connection to the
//! shim running as PID 1 in each sandbox, carrying core-tool operations without
//! `docker exec` (design: `spec/link.md`; frames: [`beige_protocol::link`]).
//!
//! This module owns the conversation over *any* carrier (a byte stream in each
//! direction): the hello exchange, op ids, waiting for results across reconnects,
//! acknowledging and de-duplicating results replayed after a gateway restart, keepalive,
//! the per-agent health figures, and passing PID 1's `exec_started` reports on to the
//! host's [`crate::ident::ExecRegistry`]. It also owns the Unix carrier's listener at
//! `run/<agent>/ctl.sock`, which accepts only the peer whose `SO_PEERCRED` pid is the
//! container's PID 1 (asked of a [`PeerVerifier`]) and uid is root, and reports every
//! other peer to the [`SandboxHost`] (audited as `security.link_reject`) — except PID 1
//! of one of the agent's spare containers (its warm pool, [`PeerVerifier::spare`]), whose
//! connection is held without a hello until the spare becomes the agent's container
//! ([`LinkHub::unpark`]). It never decides whether an op may run (the
//! gateway's guarded path did) and never talks to Docker itself: the Docker backend
//! supplies the verifier and the attach streams.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use beige_protocol::link::{
    encode, Carrier, Frame, FrameDecoder, LinkMessage, Role, CTL_SOCKET_NAME, PING_INTERVAL_SECS,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};

#[path = "link_spawn.rs"]
mod spawn;
pub(crate) use spawn::exit_message as spawn_exit_message;
pub use spawn::{SpawnError, SpawnedProcess};

use super::{
    EgressStream, LinkEvent, OutputChunk, OutputSink, OutputStream, SandboxHost, SecurityEvent,
};

/// How long the shim has to answer the gateway's hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// After a connection drops under a running op, how long to wait for PID 1 to dial again.
const RECONNECT_GRACE: Duration = Duration::from_secs(3);
/// Ops in flight per agent over the link (each is a process in the sandbox; the
/// container's pids limit must not be exhausted by the gateway alone).
const MAX_IN_FLIGHT: usize = 64;
/// Results nobody waited for (replayed after a restart) kept for [`LinkHub::take_recovered`].
const MAX_RECOVERED: usize = 64;
/// Result ids remembered for de-duplication.
const MAX_DELIVERED: usize = 4096;
/// Bytes read from a carrier per step.
const READ_CHUNK: usize = 64 * 1024;

/// Why an op could not be completed over the link.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LinkError {
    /// No link is up for the agent: take the fallback path.
    #[error("no link to the sandbox")]
    NotConnected,
    /// The link dropped while the op ran and did not come back with its result (the
    /// container may have died).
    #[error("the link to the sandbox dropped while the operation ran{}", if *rebooted { " and the sandbox restarted" } else { "" })]
    Lost {
        /// The shim came back with a different boot id: the sandbox restarted.
        rebooted: bool,
    },
    /// No result within the op's time limit.
    #[error("no result within the time limit")]
    Timeout,
}

pub use beige_client::status::LinkStatus;

/// Tells the Unix listener which host pid PID 1 of an agent's container has.
#[async_trait]
pub trait PeerVerifier: Send + Sync + std::fmt::Debug {
    /// The host pid of the agent's PID 1, or `None` when its container is not running.
    async fn init_pid(&self, agent: &str) -> Option<u32>;

    /// When `pid` is PID 1 of one of the agent's spare containers (its warm pool), that
    /// container's name. Such a peer is held, not greeted, until [`LinkHub::unpark`]
    /// (the spare has become the agent's container). Default: no spares.
    async fn spare(&self, _agent: &str, _pid: u32) -> Option<String> {
        None
    }
}

#[derive(Debug)]
struct Conn {
    gen: u64,
    boot_id: String,
    carrier: Carrier,
    tx: mpsc::UnboundedSender<Vec<u8>>,
    since: Instant,
    /// Ids the shim reported as running or unacknowledged in its hello.
    pending: HashSet<String>,
    /// Ends the connection's tasks when it is replaced.
    close: Option<oneshot::Sender<()>>,
}

#[derive(Debug, Default)]
struct State {
    conn: Option<Conn>,
    waiters: HashMap<String, oneshot::Sender<Vec<u8>>>,
    /// Where live output of a running op goes, with the last `seq` passed on.
    sinks: HashMap<String, (OutputSink, Option<u64>)>,
    recovered: VecDeque<(String, Vec<u8>)>,
    delivered: VecDeque<String>,
    delivered_set: HashSet<String>,
    next_gen: u64,
    status: LinkStatus,
    /// Pings in flight: when sent, and who waits for the pong.
    pings: HashMap<u64, (Instant, Option<oneshot::Sender<()>>)>,
    next_ping: u64,
}

impl State {
    fn mark_delivered(&mut self, id: &str) -> bool {
        if !self.delivered_set.insert(id.to_string()) {
            return false;
        }
        self.delivered.push_back(id.to_string());
        if self.delivered.len() > MAX_DELIVERED {
            if let Some(old) = self.delivered.pop_front() {
                self.delivered_set.remove(&old);
            }
        }
        true
    }
}

/// One agent's link.
#[derive(Debug)]
struct AgentLink {
    agent: String,
    state: Mutex<State>,
    /// `(generation, boot id)` of the current connection; generation 0 = none.
    current: watch::Sender<(u64, String)>,
    slots: Semaphore,
}

impl AgentLink {
    fn new(agent: &str) -> Self {
        Self {
            agent: agent.to_string(),
            state: Mutex::new(State {
                status: LinkStatus {
                    agent: agent.to_string(),
                    ..Default::default()
                },
                ..Default::default()
            }),
            current: watch::channel((0, String::new())).0,
            slots: Semaphore::new(MAX_IN_FLIGHT),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// All links of one gateway.
#[derive(Debug, Clone)]
pub struct LinkHub {
    inner: Arc<HubInner>,
}

#[derive(Debug)]
struct HubInner {
    /// Random per gateway start, so op ids never repeat across restarts.
    instance: String,
    next_id: AtomicU64,
    agents: Mutex<HashMap<String, Arc<AgentLink>>>,
    host: HostSlot,
    /// Verified connections of spare containers' PID 1, by container name, not greeted
    /// yet: `(agent, connection)`.
    parked: Mutex<HashMap<String, (String, tokio::net::UnixStream)>>,
    /// Spawns waiting for their process's connection.
    spawns: spawn::PendingSpawns,
}

/// Where a hub reports (a [`SandboxHost`] need not be `Debug`).
#[derive(Default)]
struct HostSlot(std::sync::RwLock<Option<Arc<dyn SandboxHost>>>);

impl std::fmt::Debug for HostSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostSlot")
    }
}

impl Default for LinkHub {
    fn default() -> Self {
        Self::new()
    }
}

impl LinkHub {
    /// A hub with no links yet and no host to report to (see [`LinkHub::set_host`]).
    pub fn new() -> Self {
        Self {
            inner: Arc::new(HubInner {
                instance: format!("g{:08x}", rand::random::<u32>()),
                next_id: AtomicU64::new(1),
                agents: Mutex::default(),
                host: HostSlot::default(),
                parked: Mutex::default(),
                spawns: spawn::PendingSpawns::default(),
            }),
        }
    }

    /// Where rejected peers and recovered results are reported.
    pub fn set_host(&self, host: Arc<dyn SandboxHost>) {
        *self
            .inner
            .host
            .0
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(host);
    }

    fn link(&self, agent: &str) -> Arc<AgentLink> {
        let mut agents = self
            .inner
            .agents
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        agents
            .entry(agent.to_string())
            .or_insert_with(|| Arc::new(AgentLink::new(agent)))
            .clone()
    }

    /// Whether a link to the agent's PID 1 is up.
    pub fn is_connected(&self, agent: &str) -> bool {
        self.link(agent).state().conn.is_some()
    }

    /// The carrier of the agent's current link.
    pub fn carrier(&self, agent: &str) -> Option<Carrier> {
        self.link(agent).state().conn.as_ref().map(|c| c.carrier)
    }

    /// Waits up to `timeout` for the agent's link to come up; returns whether it is up.
    pub async fn wait_connected(&self, agent: &str, timeout: Duration) -> bool {
        let link = self.link(agent);
        let mut rx = link.current.subscribe();
        let wait = async {
            loop {
                if rx.borrow_and_update().0 != 0 {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok() && self.is_connected(agent)
    }

    /// Counts an op that took the `docker exec` path.
    pub fn count_fallback(&self, agent: &str) {
        self.link(agent).state().status.ops_fallback += 1;
    }

    /// Health of every link this hub knows.
    pub fn status(&self) -> Vec<LinkStatus> {
        let agents: Vec<Arc<AgentLink>> = self
            .inner
            .agents
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        let mut all: Vec<LinkStatus> = agents.iter().map(|l| status_of(&l.state())).collect();
        all.sort_by(|a, b| a.agent.cmp(&b.agent));
        all
    }

    /// Health of one agent's link.
    pub fn status_of(&self, agent: &str) -> LinkStatus {
        status_of(&self.link(agent).state())
    }

    /// A result that arrived (replayed after a reconnect) with nobody waiting for it.
    pub fn take_recovered(&self, agent: &str, id: &str) -> Option<Vec<u8>> {
        let link = self.link(agent);
        let mut st = link.state();
        let pos = st.recovered.iter().position(|(i, _)| i == id)?;
        st.recovered.remove(pos).map(|(_, p)| p)
    }

    /// Ids of the results recovered so far (oldest first).
    pub fn recovered_ids(&self, agent: &str) -> Vec<String> {
        let link = self.link(agent);
        let st = link.state();
        st.recovered.iter().map(|(i, _)| i.clone()).collect()
    }

    /// Forgets an agent's link state (its connection ends).
    pub fn drop_agent(&self, agent: &str) {
        let removed = self
            .inner
            .agents
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(agent);
        if let Some(link) = removed {
            let mut st = link.state();
            if let Some(mut conn) = st.conn.take() {
                if let Some(close) = conn.close.take() {
                    let _ = close.send(());
                }
            }
        }
    }

    /// Whether the PID 1 of the spare container `name` is connected and waiting.
    pub fn is_parked(&self, name: &str) -> bool {
        self.parked().contains_key(name)
    }

    /// The spare container `name` has become its agent's container: greet its PID 1 on
    /// the connection held for it and serve the link. `false` when none is held (its
    /// PID 1 then dials again and is checked as the agent's PID 1).
    pub fn unpark(&self, name: &str) -> bool {
        let Some((agent, stream)) = self.parked().remove(name) else {
            return false;
        };
        let hub = self.clone();
        tokio::spawn(async move {
            let (r, w) = stream.into_split();
            hub.serve(&agent, Carrier::Unix, r, w).await;
        });
        true
    }

    /// Lets go of the connection held for the spare container `name` (removed).
    pub fn drop_parked(&self, name: &str) {
        self.parked().remove(name);
    }

    fn parked(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, (String, tokio::net::UnixStream)>> {
        self.inner
            .parked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends every link (the gateway lets go of its sandboxes).
    pub fn close_all(&self) {
        self.parked().clear();
        let agents: Vec<String> = self
            .inner
            .agents
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect();
        for agent in agents {
            self.drop_agent(&agent);
        }
    }

    /// A new op id, unique across gateway restarts.
    pub fn new_id(&self) -> String {
        let n = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{}-{n}", self.inner.instance)
    }

    /// Runs one op over the link: sends `payload` (the `OpRequest` JSON) as `name` and
    /// returns the reply's JSON bytes. Waits across a dropped connection as long as PID
    /// 1 comes back with the same boot id and still knows the op. Live output the shim
    /// sends while the op runs goes to `output`, in order, once each.
    pub async fn call(
        &self,
        agent: &str,
        id: &str,
        name: &str,
        payload: &[u8],
        limit: Duration,
        output: Option<OutputSink>,
    ) -> Result<Vec<u8>, LinkError> {
        let link = self.link(agent);
        let deadline = tokio::time::Instant::now() + limit;
        // `kill` never waits for a slot: it must get through when every slot holds a
        // long `exec`, which is exactly when someone wants to stop one.
        let _slot = if name == "kill" {
            None
        } else {
            Some(
                tokio::time::timeout_at(deadline, link.slots.acquire())
                    .await
                    .map_err(|_| LinkError::Timeout)?
                    .map_err(|_| LinkError::NotConnected)?,
            )
        };
        let (tx, mut rx) = oneshot::channel();
        let mut current = link.current.subscribe();
        let (mut gen, boot) = {
            let mut st = link.state();
            let Some(conn) = st.conn.as_ref() else {
                return Err(LinkError::NotConnected);
            };
            let frame = encode(
                &LinkMessage::Op {
                    id: id.to_string(),
                    name: name.to_string(),
                },
                payload,
            );
            if conn.tx.send(frame).is_err() {
                return Err(LinkError::NotConnected);
            }
            let ids = (conn.gen, conn.boot_id.clone());
            st.waiters.insert(id.to_string(), tx);
            if let Some(sink) = output {
                st.sinks.insert(id.to_string(), (sink, None));
            }
            st.status.ops_link += 1;
            ids
        };
        current.borrow_and_update();
        let cleanup = Cleanup {
            link: &link,
            id: id.to_string(),
        };
        let mut grace: Option<tokio::time::Instant> = None;
        let result = loop {
            let grace_sleep = async {
                match grace {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                r = &mut rx => break r.map_err(|_| LinkError::Lost { rebooted: false }),
                changed = current.changed() => {
                    if changed.is_err() {
                        break Err(LinkError::Lost { rebooted: false });
                    }
                    let (now_gen, now_boot) = current.borrow_and_update().clone();
                    if now_gen == 0 {
                        grace = Some(tokio::time::Instant::now() + RECONNECT_GRACE);
                    } else if now_boot != boot {
                        break Err(LinkError::Lost { rebooted: true });
                    } else if now_gen != gen {
                        // Same boot: PID 1 still runs the op or holds its result, unless
                        // its hello says otherwise.
                        let known = link
                            .state()
                            .conn
                            .as_ref()
                            .map(|c| c.pending.contains(id))
                            .unwrap_or(false);
                        if !known {
                            // The replayed result may already be in `rx`.
                            if let Ok(r) = rx.try_recv() {
                                break Ok(r);
                            }
                            break Err(LinkError::Lost { rebooted: false });
                        }
                        gen = now_gen;
                        grace = None;
                    }
                }
                _ = grace_sleep => break Err(LinkError::Lost { rebooted: false }),
                _ = tokio::time::sleep_until(deadline) => break Err(LinkError::Timeout),
            }
        };
        drop(cleanup);
        result
    }

    /// Serves one connection to an agent's PID 1 over any carrier until it ends: the
    /// gateway's hello, the shim's answer, then results, acknowledgements and
    /// keepalives. A newer connection of the same agent replaces an older one.
    pub async fn serve<R, W>(&self, agent: &str, carrier: Carrier, mut reader: R, mut writer: W)
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let link = self.link(agent);
        let hello = encode(
            &LinkMessage::GatewayHello {
                version: env!("CARGO_PKG_VERSION").to_string(),
            },
            b"",
        );
        if writer.write_all(&hello).await.is_err() || writer.flush().await.is_err() {
            return;
        }
        let mut decoder = FrameDecoder::new();
        let shim_hello = first_frame(&mut decoder, &mut reader)
            .await
            .map(|f| f.message);
        if let Some(LinkMessage::ShimHello {
            role: Role::Egress,
            boot_id,
            ..
        }) = shim_hello
        {
            self.accept_egress(agent, carrier, boot_id, decoder, reader, writer)
                .await;
            return;
        }
        if let Some(LinkMessage::ShimHello {
            role: Role::Spawn,
            boot_id,
            ..
        }) = shim_hello
        {
            self.accept_spawn(agent, carrier, boot_id, decoder, reader, writer)
                .await;
            return;
        }
        let Some(LinkMessage::ShimHello {
            role: Role::Control,
            boot_id,
            pending,
            version,
            ..
        }) = shim_hello
        else {
            tracing::warn!(
                agent,
                carrier = carrier.as_str(),
                "the sandbox's PID 1 did not answer the link hello; using docker exec"
            );
            return;
        };

        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let (close_tx, mut close_rx) = oneshot::channel();
        let host = self.host();
        let gen = {
            let mut st = link.state();
            st.next_gen += 1;
            let gen = st.next_gen;
            if let Some(mut old) = st.conn.take() {
                if let Some(close) = old.close.take() {
                    let _ = close.send(());
                }
            }
            st.conn = Some(Conn {
                gen,
                boot_id: boot_id.clone(),
                carrier,
                tx: tx.clone(),
                since: Instant::now(),
                pending: pending.into_iter().collect(),
                close: Some(close_tx),
            });
            st.status.connects += 1;
            st.pings.clear();
            // Told under the state's lock, so that the host hears ups and downs in
            // the order they happened.
            if let Some(host) = &host {
                let reconnect = st.status.connects > 1;
                host.link_event(agent, LinkEvent::Up { reconnect });
            }
            gen
        };
        link.current.send_replace((gen, boot_id.clone()));
        tracing::info!(
            agent,
            carrier = carrier.as_str(),
            boot_id,
            shim = version,
            "sandbox link up"
        );

        let writer_task = tokio::spawn(async move {
            while let Some(frame) = rx.recv().await {
                if writer.write_all(&frame).await.is_err() || writer.flush().await.is_err() {
                    break;
                }
            }
        });
        let mut ping = tokio::time::interval(Duration::from_secs(PING_INTERVAL_SECS));
        ping.tick().await;
        let mut last_heard = Instant::now();
        let silence = Duration::from_secs(PING_INTERVAL_SECS * 3);
        'conn: loop {
            loop {
                match decoder.next_frame() {
                    Ok(Some(frame)) => {
                        last_heard = Instant::now();
                        self.on_frame(&link, &tx, frame.message, frame.payload);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(agent, error = %e, "sandbox link sent a bad frame; dropping it");
                        break 'conn;
                    }
                }
            }
            tokio::select! {
                // Straight into the decoder's buffer: a large result is read in place,
                // not copied through a scratch buffer (cancel-safe: nothing is lost if
                // another branch wins).
                read = reader.read_buf(decoder.read_target(READ_CHUNK)) => match read {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                },
                _ = ping.tick() => {
                    if last_heard.elapsed() > silence {
                        tracing::warn!(agent, "sandbox link silent for {} s; dropping it", silence.as_secs());
                        break;
                    }
                    let mut st = link.state();
                    let seq = st.next_ping;
                    st.next_ping += 1;
                    st.pings.insert(seq, (Instant::now(), None));
                    let _ = tx.send(encode(&LinkMessage::Ping { seq }, b""));
                }
                _ = &mut close_rx => break,
            }
        }
        writer_task.abort();
        let still_current = {
            let mut st = link.state();
            if st.conn.as_ref().map(|c| c.gen) == Some(gen) {
                st.conn = None;
                if let Some(host) = &host {
                    host.link_event(agent, LinkEvent::Down);
                }
                true
            } else {
                false
            }
        };
        if still_current {
            link.current.send_replace((0, String::new()));
            tracing::info!(agent, carrier = carrier.as_str(), "sandbox link down");
        }
    }

    fn on_frame(
        &self,
        link: &AgentLink,
        tx: &mpsc::UnboundedSender<Vec<u8>>,
        message: LinkMessage,
        payload: Vec<u8>,
    ) {
        match message {
            LinkMessage::Result { id } => {
                let _ = tx.send(encode(&LinkMessage::Ack { id: id.clone() }, b""));
                let mut st = link.state();
                if !st.mark_delivered(&id) {
                    st.status.duplicates_dropped += 1;
                    return;
                }
                if let Some(conn) = st.conn.as_mut() {
                    conn.pending.remove(&id);
                }
                match st.waiters.remove(&id) {
                    Some(waiter) => {
                        let _ = waiter.send(payload);
                    }
                    None if id.starts_with(&format!("{}-", self.inner.instance)) => {
                        // Ours, but its caller gave up (timed out or was dropped).
                        tracing::debug!(agent = %link.agent, op = %id, "a result arrived after its caller stopped waiting");
                    }
                    None => {
                        tracing::warn!(agent = %link.agent, op = %id, "a result arrived after a reconnect with nobody waiting for it (its caller was a previous gateway); recorded in the audit log");
                        self.audit_recovered(&link.agent, &id, &payload);
                        st.recovered.push_back((id, payload));
                        if st.recovered.len() > MAX_RECOVERED {
                            st.recovered.pop_front();
                        }
                    }
                }
            }
            LinkMessage::Output { id, stream, seq } => {
                let stream = match stream {
                    1 => OutputStream::Stdout,
                    2 => OutputStream::Stderr,
                    _ => return,
                };
                let mut st = link.state();
                if let Some((sink, last)) = st.sinks.get_mut(&id) {
                    if last.is_some_and(|l| seq <= l) {
                        return;
                    }
                    *last = Some(seq);
                    let _ = sink.send(OutputChunk {
                        stream,
                        bytes: payload,
                    });
                }
            }
            LinkMessage::ExecStarted {
                id,
                exec_id,
                pid,
                starttime,
            } => {
                // Recorded before the op's result can arrive (frames are handled in
                // order), so no caller of a running exec is ever told it has ended.
                let recorded = self
                    .host()
                    .and_then(|h| h.exec_registry())
                    .is_some_and(|r| r.started(&link.agent, &exec_id, pid, starttime));
                if !recorded {
                    tracing::debug!(agent = %link.agent, op = %id, exec = %exec_id, pid, "an exec start this gateway does not know; its callers are unbound");
                }
            }
            LinkMessage::Ping { seq } => {
                let _ = tx.send(encode(&LinkMessage::Pong { seq }, b""));
            }
            LinkMessage::Pong { seq } => {
                let rtt = {
                    let mut st = link.state();
                    st.pings.remove(&seq).map(|(at, done)| {
                        let rtt = at.elapsed();
                        st.status.last_ping_us =
                            Some(u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX));
                        if let Some(done) = done {
                            let _ = done.send(());
                        }
                        rtt
                    })
                };
                if let (Some(rtt), Some(host)) = (rtt, self.host()) {
                    host.link_event(&link.agent, LinkEvent::Ping(rtt));
                }
            }
            other => {
                tracing::debug!(agent = %link.agent, message = ?other, "unexpected frame on the sandbox link; ignored");
            }
        }
    }

    /// Measures one keepalive round trip now (`None`: no link, or no answer in time).
    pub async fn ping(&self, agent: &str, timeout: Duration) -> Option<Duration> {
        let link = self.link(agent);
        let (done_tx, done_rx) = oneshot::channel();
        let started = Instant::now();
        {
            let mut st = link.state();
            let seq = st.next_ping;
            st.next_ping += 1;
            let conn = st.conn.as_ref()?;
            conn.tx.send(encode(&LinkMessage::Ping { seq }, b"")).ok()?;
            st.pings.insert(seq, (started, Some(done_tx)));
        }
        tokio::time::timeout(timeout, done_rx).await.ok()?.ok()?;
        Some(started.elapsed())
    }

    /// Listens on `run_dir/ctl.sock` for the agent's PID 1 (the Unix carrier). Every
    /// connection is checked with `SO_PEERCRED` against `verifier` before a single byte
    /// is read; any other peer is refused and audited.
    pub fn listen_unix(
        &self,
        agent: &str,
        run_dir: &Path,
        verifier: Arc<dyn PeerVerifier>,
    ) -> std::io::Result<UnixListenerHandle> {
        let path = run_dir.join(CTL_SOCKET_NAME);
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path)?;
        // Everyone may connect: the peer check below is the authentication, and an
        // agent's attempt must reach it to be audited.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
        let hub = self.clone();
        let agent = agent.to_string();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let hub = hub.clone();
                let agent = agent.clone();
                let verifier = verifier.clone();
                tokio::spawn(async move { hub.accept_unix(&agent, stream, verifier).await });
            }
        });
        Ok(UnixListenerHandle {
            path,
            task: Some(task),
        })
    }

    async fn accept_unix(
        &self,
        agent: &str,
        mut stream: tokio::net::UnixStream,
        verifier: Arc<dyn PeerVerifier>,
    ) {
        let cred = stream.peer_cred().ok();
        let pid = cred
            .as_ref()
            .and_then(|c| c.pid())
            .and_then(|p| u32::try_from(p).ok());
        let uid = cred.as_ref().map(|c| c.uid());
        let expected = verifier.init_pid(agent).await;
        if let (Some(p), Some(0)) = (pid, uid) {
            if expected != Some(p) {
                if let Some(name) = verifier.spare(agent, p).await {
                    // A spare's PID 1: held until the spare becomes the agent's container.
                    tracing::debug!(agent, container = %name, "spare sandbox's PID 1 connected");
                    self.parked().insert(name, (agent.to_string(), stream));
                    return;
                }
            }
        }
        let reason = match (pid, uid, expected) {
            (Some(p), Some(0), Some(e)) if p == e => None,
            (_, _, None) => Some("the agent's container is not running".to_string()),
            (Some(_), Some(0), Some(_)) => {
                Some("the peer is not the container's PID 1".to_string())
            }
            (_, Some(u), _) if u != 0 => Some(format!("the peer runs as uid {u}, not root")),
            _ => Some("the peer's credentials are unknown".to_string()),
        };
        if let Some(reason) = reason {
            self.reject(agent, pid, uid, &reason).await;
            let refused = encode(&LinkMessage::Refused { reason }, b"");
            let _ = tokio::time::timeout(Duration::from_millis(200), async {
                stream.write_all(&refused).await?;
                stream.shutdown().await?;
                // Discard what the peer sent (never parsed), so closing does not reset
                // the connection before it has read the refusal.
                let mut sink = [0u8; 4096];
                let mut budget: usize = 64 * 1024;
                while budget > 0 {
                    let n = stream.read(&mut sink).await?;
                    if n == 0 {
                        break;
                    }
                    budget = budget.saturating_sub(n);
                }
                Ok::<(), std::io::Error>(())
            })
            .await;
            return;
        }
        let (r, w) = stream.into_split();
        self.serve(agent, Carrier::Unix, r, w).await;
    }

    /// Why a per-stream connection (`kind`: egress or spawn) of PID 1's boot `boot_id` is
    /// not taken, when it is not: such streams need the unix carrier and a control link
    /// of the same boot that is up (a stale or foreign PID 1 is refused).
    fn stream_refusal(
        &self,
        agent: &str,
        carrier: Carrier,
        boot_id: &str,
        kind: &str,
    ) -> Option<String> {
        let current = self
            .link(agent)
            .state()
            .conn
            .as_ref()
            .map(|c| c.boot_id.clone());
        match (carrier, current) {
            (Carrier::Attach, _) => Some(format!("{kind} streams need the unix carrier")),
            (_, None) => Some("no control link is up for this sandbox".to_string()),
            (_, Some(b)) if b != boot_id => Some(format!(
                "the stream's boot id {boot_id} is not the link's ({b})"
            )),
            _ => None,
        }
    }

    /// An egress stream's hello was read: check it belongs to the link that is up, read
    /// its `EgressOpen`, and hand the stream to the [`SandboxHost`]. Only the Unix
    /// carrier has per-stream connections; a stream from a boot whose control link is
    /// not up (a stale or foreign PID 1) is refused and audited.
    async fn accept_egress<R, W>(
        &self,
        agent: &str,
        carrier: Carrier,
        boot_id: String,
        mut decoder: FrameDecoder,
        mut reader: R,
        mut writer: W,
    ) where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let refusal = self.stream_refusal(agent, carrier, &boot_id, "egress");
        if let Some(reason) = refusal {
            self.reject(agent, None, None, &reason).await;
            let _ = writer
                .write_all(&encode(&LinkMessage::Refused { reason }, b""))
                .await;
            return;
        }
        let open = first_frame(&mut decoder, &mut reader).await;
        let Some(Frame {
            message: LinkMessage::EgressOpen { entry, name, port },
            mut payload,
        }) = open
        else {
            tracing::warn!(agent, "an egress stream did not open; closed");
            return;
        };
        // Raw bytes the client sent right behind the frame belong to the stream.
        payload.extend_from_slice(&decoder.into_remaining());
        let Some(host) = self.host() else {
            return;
        };
        let stream = EgressStream::new(
            entry,
            name,
            port,
            payload,
            Box::pin(reader),
            Box::pin(writer),
            boot_id,
        );
        host.egress(agent, stream).await;
    }

    /// Reports the `finished` line a previous gateway could not write: the op's
    /// outcome, marked `recovered`, with the op id.
    fn audit_recovered(&self, agent: &str, id: &str, payload: &[u8]) {
        let Some(host) = self.host() else {
            return;
        };
        let event = SecurityEvent::OpRecovered {
            agent: agent.to_string(),
            op_id: id.to_string(),
            reply: beige_protocol::op::decode_reply(payload.to_vec()).ok(),
        };
        tokio::spawn(async move { host.security_event(event).await });
    }

    fn host(&self) -> Option<Arc<dyn SandboxHost>> {
        self.inner
            .host
            .0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    async fn reject(&self, agent: &str, pid: Option<u32>, uid: Option<u32>, reason: &str) {
        self.link(agent).state().status.rejected_peers += 1;
        tracing::warn!(
            agent,
            ?pid,
            ?uid,
            reason,
            "refused a connection to the sandbox control socket"
        );
        let Some(host) = self.host() else {
            return;
        };
        host.link_event(agent, LinkEvent::RejectedPeer);
        host.security_event(SecurityEvent::LinkRejected {
            agent: agent.to_string(),
            pid,
            uid,
            reason: reason.to_string(),
        })
        .await;
    }
}

fn status_of(st: &State) -> LinkStatus {
    let mut s = st.status.clone();
    match &st.conn {
        Some(c) => {
            s.connected = true;
            s.carrier = Some(c.carrier);
            s.boot_id = Some(c.boot_id.clone());
            s.connected_secs = Some(c.since.elapsed().as_secs());
        }
        None => {
            s.connected = false;
            s.carrier = None;
            s.connected_secs = None;
        }
    }
    s
}

/// Removes a waiter when its call ends (also when the call's future is dropped).
struct Cleanup<'a> {
    link: &'a AgentLink,
    id: String,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let mut st = self.link.state();
        st.waiters.remove(&self.id);
        st.sinks.remove(&self.id);
    }
}

/// The Unix listener of one agent; dropping it stops listening and removes the socket.
#[derive(Debug)]
pub struct UnixListenerHandle {
    path: PathBuf,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl UnixListenerHandle {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for UnixListenerHandle {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The next frame on a connection being opened, within [`HELLO_TIMEOUT`]; `None` when
/// it ends, sends a bad frame or stays silent.
async fn first_frame<R: AsyncRead + Unpin>(
    decoder: &mut FrameDecoder,
    reader: &mut R,
) -> Option<Frame> {
    let mut buf = vec![0u8; READ_CHUNK];
    tokio::time::timeout(HELLO_TIMEOUT, async {
        loop {
            match decoder.next_frame() {
                Ok(Some(f)) => return Some(f),
                Ok(None) => {}
                Err(_) => return None,
            }
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => decoder.push(&buf[..n]),
            }
        }
    })
    .await
    .ok()
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use beige_protocol::link::Frame;
    use tokio::io::DuplexStream;

    /// The shim's end of a link, driven by the test.
    struct FakeShim {
        io: DuplexStream,
        decoder: FrameDecoder,
    }

    impl FakeShim {
        async fn next(&mut self) -> Frame {
            let mut buf = vec![0u8; 4096];
            loop {
                if let Some(f) = self.decoder.next_frame().unwrap() {
                    return f;
                }
                let n = self.io.read(&mut buf).await.unwrap();
                assert!(n > 0, "the gateway closed the link");
                self.decoder.push(&buf[..n]);
            }
        }

        async fn send(&mut self, m: LinkMessage, payload: &[u8]) {
            self.io.write_all(&encode(&m, payload)).await.unwrap();
        }

        async fn hello(&mut self, boot: &str, pending: &[&str]) {
            let f = self.next().await;
            assert!(
                matches!(f.message, LinkMessage::GatewayHello { .. }),
                "{f:?}"
            );
            self.send(
                LinkMessage::ShimHello {
                    role: Role::Control,
                    boot_id: boot.into(),
                    version: "test".into(),
                    carrier: Carrier::Unix,
                    pending: pending.iter().map(|s| s.to_string()).collect(),
                },
                b"",
            )
            .await;
        }
    }

    fn connect(hub: &LinkHub, agent: &str) -> FakeShim {
        let (gw, shim) = tokio::io::duplex(1 << 20);
        let hub = hub.clone();
        let agent = agent.to_string();
        tokio::spawn(async move {
            let (r, w) = tokio::io::split(gw);
            hub.serve(&agent, Carrier::Unix, r, w).await;
        });
        FakeShim {
            io: shim,
            decoder: FrameDecoder::new(),
        }
    }

    /// Runs `hub.call` for agent `a` in a task.
    fn spawn_call(
        hub: &LinkHub,
        id: &'static str,
        name: &'static str,
        secs: u64,
    ) -> tokio::task::JoinHandle<Result<Vec<u8>, LinkError>> {
        let hub = hub.clone();
        tokio::spawn(async move {
            hub.call("a", id, name, b"{}", Duration::from_secs(secs), None)
                .await
        })
    }

    /// A spawn: the op goes out with a fresh token; a stream presenting another token is
    /// refused; the one presenting the op's token becomes the process's stdin and stdout
    /// (bytes sent right behind its `SpawnOpen` included); the op's result is its end.
    #[tokio::test]
    async fn a_spawn_stream_needs_the_ops_token_and_its_result_is_the_processes_end() {
        use beige_protocol::spawn::{SpawnRequest, SpawnUser};
        let hub = LinkHub::new();
        let mut shim = connect(&hub, "a");
        shim.hello("boot1", &[]).await;
        assert!(hub.wait_connected("a", Duration::from_secs(2)).await);
        let spawning = {
            let hub = hub.clone();
            tokio::spawn(async move {
                let request = SpawnRequest {
                    argv: vec!["srv".into()],
                    env: Vec::new(),
                    cwd: None,
                    user: SpawnUser::Uid(61000),
                    token: "ignored".into(),
                };
                hub.spawn("a", request).await
            })
        };
        let op = shim.next().await;
        let LinkMessage::Op { id, name } = op.message else {
            panic!("{op:?}")
        };
        assert_eq!(name, "spawn");
        let sent: SpawnRequest = serde_json::from_slice(&op.payload).unwrap();
        assert!(
            beige_protocol::spawn::is_valid_token(&sent.token),
            "{sent:?}"
        );
        let open = |token: &str| {
            let (gw, stream) = tokio::io::duplex(1 << 16);
            let hub = hub.clone();
            tokio::spawn(async move {
                let (r, w) = tokio::io::split(gw);
                hub.serve("a", Carrier::Unix, r, w).await;
            });
            let mut s = FakeShim {
                io: stream,
                decoder: FrameDecoder::new(),
            };
            let (id, token) = (id.clone(), token.to_string());
            async move {
                let hello = s.next().await;
                assert!(matches!(hello.message, LinkMessage::GatewayHello { .. }));
                let mut bytes = encode(
                    &LinkMessage::ShimHello {
                        role: Role::Spawn,
                        boot_id: "boot1".into(),
                        version: "test".into(),
                        carrier: Carrier::Unix,
                        pending: Vec::new(),
                    },
                    b"",
                );
                bytes.extend(encode(&LinkMessage::SpawnOpen { id, token }, b""));
                bytes.extend_from_slice(b"early\n");
                s.io.write_all(&bytes).await.unwrap();
                s
            }
        };
        // A forged token: refused, and the spawn still waits.
        let mut forged = open(&"f".repeat(32)).await;
        let refused = forged.next().await;
        assert!(
            matches!(refused.message, LinkMessage::Refused { .. }),
            "{refused:?}"
        );
        assert!(!spawning.is_finished());
        // The op's token: connected.
        let mut real = open(&sent.token).await;
        let mut process = tokio::time::timeout(Duration::from_secs(5), spawning)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let mut line = [0u8; 6];
        process.reader.read_exact(&mut line).await.unwrap();
        assert_eq!(&line, b"early\n");
        process.writer.write_all(b"ping\n").await.unwrap();
        let mut got = [0u8; 5];
        real.io.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping\n");
        // The op's result is the process's end.
        shim.send(
            LinkMessage::Result { id: id.clone() },
            br#"{"exitCode":0,"stderrTail":"bye"}"#,
        )
        .await;
        let exit = tokio::time::timeout(Duration::from_secs(5), process.exit)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(exit.exit_code, Some(0));
        assert_eq!(exit.stderr_tail, "bye");
    }

    #[tokio::test]
    async fn op_round_trip_ack_and_duplicate_dropped() {
        let hub = LinkHub::new();
        assert_eq!(
            hub.call("a", "x-1", "exec", b"{}", Duration::from_secs(1), None)
                .await,
            Err(LinkError::NotConnected)
        );
        let mut shim = connect(&hub, "a");
        shim.hello("boot1", &[]).await;
        assert!(hub.wait_connected("a", Duration::from_secs(2)).await);
        assert_eq!(hub.carrier("a"), Some(Carrier::Unix));

        let call = {
            let hub = hub.clone();
            tokio::spawn(async move {
                hub.call(
                    "a",
                    "x-1",
                    "exec",
                    br#"{"op":"exec"}"#,
                    Duration::from_secs(5),
                    None,
                )
                .await
            })
        };
        let op = shim.next().await;
        assert_eq!(
            op.message,
            LinkMessage::Op {
                id: "x-1".into(),
                name: "exec".into()
            }
        );
        assert_eq!(op.payload, br#"{"op":"exec"}"#);
        shim.send(LinkMessage::Result { id: "x-1".into() }, b"REPLY")
            .await;
        assert_eq!(call.await.unwrap().unwrap(), b"REPLY");
        assert_eq!(
            shim.next().await.message,
            LinkMessage::Ack { id: "x-1".into() }
        );

        // The same result again (as after a reconnect): acknowledged, not delivered.
        shim.send(LinkMessage::Result { id: "x-1".into() }, b"REPLY")
            .await;
        assert_eq!(
            shim.next().await.message,
            LinkMessage::Ack { id: "x-1".into() }
        );
        let status = hub.status_of("a");
        assert_eq!(status.duplicates_dropped, 1);
        assert!(hub.recovered_ids("a").is_empty());
        assert_eq!(status.ops_link, 1);
        assert!(status.connected);

        shim.send(LinkMessage::Ping { seq: 9 }, b"").await;
        assert_eq!(shim.next().await.message, LinkMessage::Pong { seq: 9 });
    }

    /// Hears only the link events.
    #[derive(Default)]
    struct Events(Mutex<Vec<LinkEvent>>);

    #[async_trait]
    impl SandboxHost for Events {
        async fn tool_call(
            &self,
            _agent: &str,
            _caller: &crate::ident::Attribution,
            _request: beige_protocol::socket::ToolRequest,
        ) -> beige_protocol::socket::ToolResponse {
            unreachable!("the link carries no tool calls")
        }

        async fn rejected(&self, _agent: &str, _tool: Option<&str>, _error: &str, _raw: &[u8]) {}

        async fn security_event(&self, _event: SecurityEvent) {}

        fn link_event(&self, agent: &str, event: LinkEvent) {
            assert_eq!(agent, "a");
            self.0.lock().unwrap().push(event);
        }
    }

    #[tokio::test]
    async fn the_host_hears_the_link_go_up_down_and_up_again() {
        let hub = LinkHub::new();
        let host = Arc::new(Events::default());
        hub.set_host(host.clone());
        let mut first = connect(&hub, "a");
        first.hello("boot1", &[]).await;
        assert!(hub.wait_connected("a", Duration::from_secs(2)).await);
        drop(first);
        for _ in 0..200 {
            if !hub.is_connected("a") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!hub.is_connected("a"));
        let mut second = connect(&hub, "a");
        second.hello("boot1", &[]).await;
        assert!(hub.wait_connected("a", Duration::from_secs(2)).await);
        assert_eq!(
            *host.0.lock().unwrap(),
            [
                LinkEvent::Up { reconnect: false },
                LinkEvent::Down,
                LinkEvent::Up { reconnect: true },
            ]
        );
    }

    #[tokio::test]
    async fn result_survives_a_reconnect_of_the_same_boot() {
        let hub = LinkHub::new();
        let mut first = connect(&hub, "a");
        first.hello("boot1", &[]).await;
        assert!(hub.wait_connected("a", Duration::from_secs(2)).await);
        let call = spawn_call(&hub, "x-2", "exec", 10);
        let _op = first.next().await;
        drop(first);
        // PID 1 dials again, still running the op, and then delivers it.
        let mut second = connect(&hub, "a");
        second.hello("boot1", &["x-2"]).await;
        second
            .send(LinkMessage::Result { id: "x-2".into() }, b"LATE")
            .await;
        assert_eq!(call.await.unwrap().unwrap(), b"LATE");
        assert_eq!(hub.status_of("a").connects, 2);
    }

    #[tokio::test]
    async fn a_new_boot_or_a_forgotten_op_is_lost_and_orphans_are_recovered() {
        let hub = LinkHub::new();
        let mut first = connect(&hub, "a");
        first.hello("boot1", &[]).await;
        assert!(hub.wait_connected("a", Duration::from_secs(2)).await);
        let call = spawn_call(&hub, "x-3", "exec", 10);
        let _ = first.next().await;
        drop(first);
        let mut second = connect(&hub, "a");
        second.hello("boot2", &[]).await;
        assert_eq!(call.await.unwrap(), Err(LinkError::Lost { rebooted: true }));

        // A result nobody waits for (sent by a previous gateway) is kept once.
        second
            .send(LinkMessage::Result { id: "old-7".into() }, b"R")
            .await;
        assert_eq!(
            second.next().await.message,
            LinkMessage::Ack { id: "old-7".into() }
        );
        second
            .send(LinkMessage::Result { id: "old-7".into() }, b"R")
            .await;
        assert_eq!(
            second.next().await.message,
            LinkMessage::Ack { id: "old-7".into() }
        );
        assert_eq!(hub.recovered_ids("a"), vec!["old-7".to_string()]);
        assert_eq!(hub.take_recovered("a", "old-7").as_deref(), Some(&b"R"[..]));
        assert_eq!(hub.take_recovered("a", "old-7"), None);

        // A late result of this gateway's own op (its caller gave up) is acknowledged
        // and dropped, not taken for a previous gateway's.
        let own = hub.new_id();
        second
            .send(LinkMessage::Result { id: own.clone() }, b"L")
            .await;
        assert_eq!(second.next().await.message, LinkMessage::Ack { id: own });
        assert!(hub.recovered_ids("a").is_empty());
    }

    #[tokio::test]
    async fn link_drop_without_return_is_lost_after_the_grace() {
        let hub = LinkHub::new();
        let mut shim = connect(&hub, "a");
        shim.hello("boot1", &[]).await;
        assert!(hub.wait_connected("a", Duration::from_secs(2)).await);
        let started = Instant::now();
        let call = spawn_call(&hub, "x-4", "read", 30);
        let _ = shim.next().await;
        drop(shim);
        assert_eq!(
            call.await.unwrap(),
            Err(LinkError::Lost { rebooted: false })
        );
        assert!(started.elapsed() >= RECONNECT_GRACE);
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(!hub.is_connected("a"));
    }

    #[derive(Debug)]
    struct Fixed(Option<u32>);

    #[async_trait]
    impl PeerVerifier for Fixed {
        async fn init_pid(&self, _agent: &str) -> Option<u32> {
            self.0
        }
    }

    #[derive(Debug, Default)]
    struct Recorded(Mutex<Vec<SecurityEvent>>);

    #[async_trait]
    impl SandboxHost for Recorded {
        async fn tool_call(
            &self,
            _agent: &str,
            _caller: &crate::ident::Attribution,
            _request: beige_protocol::socket::ToolRequest,
        ) -> beige_protocol::socket::ToolResponse {
            unreachable!("the link carries no tool calls")
        }

        async fn rejected(&self, _agent: &str, _tool: Option<&str>, _error: &str, _raw: &[u8]) {}

        async fn security_event(&self, event: SecurityEvent) {
            self.0.lock().unwrap().push(event);
        }
    }

    /// Connects to `path`, sends a shim hello, and returns every frame the gateway sent
    /// before closing.
    async fn knock(path: &Path) -> Vec<LinkMessage> {
        let mut s = tokio::net::UnixStream::connect(path).await.unwrap();
        let hello = LinkMessage::ShimHello {
            role: Role::Control,
            boot_id: "intruder".into(),
            version: "x".into(),
            carrier: Carrier::Unix,
            pending: vec![],
        };
        let _ = s.write_all(&encode(&hello, b"")).await;
        let mut got = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut got)).await;
        let mut d = FrameDecoder::new();
        d.push(&got);
        let mut out = Vec::new();
        while let Ok(Some(f)) = d.next_frame() {
            out.push(f.message);
        }
        out
    }

    #[tokio::test]
    async fn unix_listener_refuses_and_audits_any_peer_but_pid_1() {
        let dir = tempfile::tempdir().unwrap();
        let hub = LinkHub::new();
        let host = Arc::new(Recorded::default());
        hub.set_host(host.clone());
        // "PID 1" is some other process: this test process is refused.
        let l = hub
            .listen_unix("a", dir.path(), Arc::new(Fixed(Some(1))))
            .unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(l.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o666);
        let got = knock(l.path()).await;
        assert!(
            matches!(got.as_slice(), [LinkMessage::Refused { .. }]),
            "no hello may reach a refused peer: {got:?}"
        );
        assert!(!hub.is_connected("a"));
        assert_eq!(hub.status_of("a").rejected_peers, 1);
        let events = host.0.lock().unwrap().clone();
        assert_eq!(events.len(), 1);
        let SecurityEvent::LinkRejected {
            agent, pid, uid, ..
        } = &events[0]
        else {
            panic!("not a refused peer: {events:?}");
        };
        assert_eq!(agent, "a");
        assert_eq!(*pid, Some(std::process::id()), "{events:?}");
        assert_eq!(*uid, Some(effective_uid()), "{events:?}");
        drop(l);
        assert!(!dir.path().join(CTL_SOCKET_NAME).exists());
    }

    #[tokio::test]
    async fn unix_listener_accepts_the_verified_pid_as_root() {
        if effective_uid() != 0 {
            return; // the uid check needs root, as PID 1 of a sandbox is
        }
        let dir = tempfile::tempdir().unwrap();
        let hub = LinkHub::new();
        let l = hub
            .listen_unix("a", dir.path(), Arc::new(Fixed(Some(std::process::id()))))
            .unwrap();
        let stream = tokio::net::UnixStream::connect(l.path()).await.unwrap();
        let mut shim = FakeShim {
            io: {
                // Bridge the socket into the duplex-based helper.
                let (a, b) = tokio::io::duplex(1 << 16);
                let (mut sr, mut sw) = stream.into_split();
                let (mut ar, mut aw) = tokio::io::split(a);
                tokio::spawn(async move { tokio::io::copy(&mut sr, &mut aw).await });
                tokio::spawn(async move { tokio::io::copy(&mut ar, &mut sw).await });
                b
            },
            decoder: FrameDecoder::new(),
        };
        shim.hello("boot1", &[]).await;
        assert!(hub.wait_connected("a", Duration::from_secs(2)).await);
        let ping = {
            let hub = hub.clone();
            tokio::spawn(async move { hub.ping("a", Duration::from_secs(2)).await })
        };
        let LinkMessage::Ping { seq } = shim.next().await.message else {
            panic!("expected a ping");
        };
        shim.send(LinkMessage::Pong { seq }, b"").await;
        assert!(ping.await.unwrap().is_some());
        assert!(hub.status_of("a").last_ping_us.is_some());
    }

    fn effective_uid() -> u32 {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("Uid:"))
                    .and_then(|l| l.split_whitespace().nth(2).map(str::to_string))
            })
            .and_then(|u| u.parse().ok())
            .unwrap_or(u32::MAX)
    }
}
