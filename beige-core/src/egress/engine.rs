//! [`EgressEngine`]: what happens to one egress stream, start to end. It reads the
//! client's proxy request, decides it with the agent's [`RuleSet`] (the one matcher),
//! resolves the name with the [`Resolver`], refuses the stream if *any* address is not
//! public (the one classifier, [`classify::permitted`]), records `started` before a
//! byte goes upstream, dials only the pinned, checked address with the [`Dialer`],
//! checks that a TLS client names the host it asked for (SNI) and splices the bytes
//! without reading them (tunnel mode). A CONNECT whose host must be inspected (request
//! rules, or a bound credential) is handed, after the same steps, to the engine's
//! [`Inspector`] (inspect mode, [`super::inspect`]). Every refusal is one `403` to the
//! client and one record. The rules a stream was decided with are the snapshot it keeps
//! to its end.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use beige_protocol::link::{EgressEntry, EGRESS_HEAD_TIMEOUT_SECS};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::classify;
use super::http::{self, ProxyRequest};
use super::inspect::{Inspector, RequestRecord, Session};
use super::rules::{DenyReason, Request, RuleSet, Verdict};
use super::target::{normalize_host, parse_authority, Host, Target};
use super::tls::{self, Hello};
use super::upstream::{Dialer, Resolver};
use crate::sandbox::EgressStream;

/// Most streams one agent may have open at once, unless its config says otherwise.
pub const DEFAULT_MAX_STREAMS: usize = 256;
/// Bytes buffered per direction while splicing.
const SPLICE_BUFFER: usize = 256 * 1024;
/// How long resolving a name may take in all (the resolver's own attempts included).
const RESOLVE_BUDGET: Duration = Duration::from_secs(5);

/// How a stream was carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mode {
    /// Bytes spliced, never decrypted.
    Tunnel,
    /// Plain HTTP, its first request checked and forwarded in origin form.
    Http,
    /// TLS terminated in the gateway, each request checked (and brokered).
    Inspect,
}

impl Mode {
    /// The name in audit records: `tunnel`, `http`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Tunnel => "tunnel",
            Mode::Http => "http",
            Mode::Inspect => "inspect",
        }
    }
}

/// Where a connection record stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectionPhase {
    /// Decided and about to dial: written before the first upstream byte.
    Started,
    /// Ended, with its byte counts; or refused (then it is the only record).
    Finished,
}

/// One record of an egress connection, for the audit log (`tool: egress.connect`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionRecord {
    /// The stream's id (also in a refusal's `X-Beige-Egress` header).
    pub id: String,
    /// The agent whose sandbox opened it.
    pub agent: String,
    /// Which of PID 1's listeners took it in.
    pub entry: EgressEntry,
    /// The target host as normalised, or the raw text when it did not normalise.
    pub host: String,
    /// The target port (0 when the request did not get that far).
    pub port: u16,
    /// The pinned address dialled.
    pub ip: Option<IpAddr>,
    /// How it was carried, once decided.
    pub mode: Option<Mode>,
    /// The rule that allowed or refused it.
    pub rule: Option<String>,
    /// The version of the rules it was decided with.
    pub policy_version: u64,
    /// Bytes from the client to the upstream.
    pub bytes_up: u64,
    /// Bytes from the upstream to the client.
    pub bytes_down: u64,
    /// `started` or `finished`.
    pub phase: ConnectionPhase,
    /// Why it was refused; `None` when it was allowed.
    pub reason: Option<DenyReason>,
    /// The approval request a refusal waits for (`approval_pending`) or was refused by
    /// (`approval_denied`).
    pub approval: Option<String>,
    /// What went wrong upstream or on the way, in words.
    pub error: Option<String>,
    /// How long it lasted (on `finished`).
    pub duration: Option<Duration>,
}

/// Where the engine writes its records. A `started` record that cannot be written
/// refuses the connection (`audit_unavailable`): no byte goes out unrecorded.
#[async_trait]
pub trait EgressAudit: Send + Sync {
    /// Write one record.
    async fn record(&self, record: &ConnectionRecord) -> Result<(), String>;

    /// Write the record of one inspected request (`tool: egress.request`), after its
    /// response. By default it is not kept.
    async fn record_request(&self, record: &RequestRecord) -> Result<(), String> {
        let _ = record;
        Ok(())
    }
}

/// A destination no rule allows (`no_rule`, or `port_not_allowed` for a host allowed on
/// other ports), that no deny rule refuses and whose every address the classifier let
/// through: what [`UnknownHosts::ask`] is asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Miss<'a> {
    /// The stream's id.
    pub id: &'a str,
    /// The host as normalised (a name: IP literals are never asked about).
    pub host: &'a str,
    /// The port.
    pub port: u16,
    /// Which of PID 1's listeners took the stream in.
    pub entry: EgressEntry,
    /// How it would be carried (`tunnel`, or `http` for plain HTTP).
    pub mode: Mode,
    /// What the rules said.
    pub reason: DenyReason,
}

/// What becomes of a [`Miss`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissAnswer {
    /// Refuse it, with this reason (`approval_pending`, `approval_denied`,
    /// `unattended`, or the rules' own), naming the approval request concerned.
    Refuse {
        /// Why.
        reason: DenyReason,
        /// The approval request it waits for or was refused by.
        approval: Option<String>,
        /// More words for the audit record.
        error: Option<String>,
    },
    /// Decide it again with these rules (an approval was granted meanwhile). They are
    /// the stream's snapshot from then on.
    Retry(Arc<RuleSet>),
}

/// Asked about destinations no rule allows, when the agent's `onUnknown` is `ask`
/// (spec §6). Deny rules and the classifier have answered before it is asked: it can
/// only refuse, or hand back rules that admit the destination.
#[async_trait]
pub trait UnknownHosts: Send + Sync {
    /// What to do with `miss`.
    async fn ask(&self, miss: &Miss<'_>) -> MissAnswer;
}

/// Decides and carries egress streams. One per gateway; cheap to share.
#[derive(Debug)]
pub struct EgressEngine {
    resolver: Arc<dyn Resolver>,
    dialer: Arc<dyn Dialer>,
    open: Mutex<HashMap<String, usize>>,
    inspector: Option<Arc<Inspector>>,
}

/// One agent's stream count, given back when the stream ends.
struct Slot<'a> {
    engine: &'a EgressEngine,
    agent: String,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut open = self
            .engine
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.agent) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.agent);
            }
        }
    }
}

/// What the engine knows of a stream while deciding it.
struct Pending {
    record: ConnectionRecord,
    target_text: String,
}

impl Pending {
    fn refuse(&mut self, reason: DenyReason, rule: Option<String>) {
        self.record.reason = Some(reason);
        if rule.is_some() {
            self.record.rule = rule;
        }
    }
}

impl EgressEngine {
    /// An engine resolving with `resolver` and dialling with `dialer`.
    pub fn new(resolver: Arc<dyn Resolver>, dialer: Arc<dyn Dialer>) -> Self {
        Self {
            resolver,
            dialer,
            open: Mutex::new(HashMap::new()),
            inspector: None,
        }
    }

    /// The same engine inspecting, with `inspector`, the streams that must be. Without
    /// one, such a stream is refused before its `200`.
    pub fn with_inspector(mut self, inspector: Arc<Inspector>) -> Self {
        self.inspector = Some(inspector);
        self
    }

    /// Streams `agent` has open now.
    pub fn open_streams(&self, agent: &str) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(agent)
            .copied()
            .unwrap_or(0)
    }

    fn take_slot(&self, agent: &str, max: usize) -> Option<Slot<'_>> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let n = open.entry(agent.to_string()).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Slot {
            engine: self,
            agent: agent.to_string(),
        })
    }

    /// Resolves `target` and checks every address with the classifier (`allow_private`
    /// the ranges the rules let it resolve into). `None` when refused: the refusal is
    /// set on `p`.
    async fn resolve_checked(
        &self,
        target: &Target,
        allow_private: &[ipnet::IpNet],
        p: &mut Pending,
    ) -> Option<Vec<IpAddr>> {
        let addrs = match &target.host {
            Host::Ip(ip) => vec![*ip],
            Host::Name(name) => {
                match tokio::time::timeout(RESOLVE_BUDGET, self.resolver.resolve(name)).await {
                    Ok(Ok(addrs)) if !addrs.is_empty() => addrs,
                    Ok(Ok(_)) => {
                        p.refuse(DenyReason::DnsFailed, None);
                        p.record.error = Some(format!("'{name}' has no addresses"));
                        return None;
                    }
                    Ok(Err(e)) => {
                        p.refuse(DenyReason::DnsFailed, None);
                        p.record.error = Some(e.to_string());
                        return None;
                    }
                    Err(_) => {
                        p.refuse(DenyReason::DnsFailed, None);
                        p.record.error = Some(format!(
                            "resolving '{name}' took longer than {}s",
                            RESOLVE_BUDGET.as_secs()
                        ));
                        return None;
                    }
                }
            }
        };
        for addr in &addrs {
            if let Err(special) = classify::permitted(*addr, allow_private) {
                p.refuse(DenyReason::PrivateAddress, None);
                p.record.ip = Some(*addr);
                p.record.error = Some(format!(
                    "{} resolves to {addr} ({}), which is never dialled",
                    p.target_text,
                    special.as_str()
                ));
                return None;
            }
        }
        Some(addrs)
    }

    /// Serve one stream of `agent` to its end with the rules `rules` (kept for the
    /// stream's life) and at most `max_streams` open for the agent. A miss is refused.
    pub async fn serve(
        &self,
        agent: &str,
        rules: Arc<RuleSet>,
        max_streams: usize,
        stream: EgressStream,
        audit: &dyn EgressAudit,
    ) {
        self.serve_with(agent, rules, max_streams, stream, audit, None)
            .await
    }

    /// [`EgressEngine::serve`], asking `unknown` about a miss (`no_rule`, or
    /// `port_not_allowed`) once deny rules and the classifier have let it through.
    pub async fn serve_with(
        &self,
        agent: &str,
        mut rules: Arc<RuleSet>,
        max_streams: usize,
        mut stream: EgressStream,
        audit: &dyn EgressAudit,
        unknown: Option<&dyn UnknownHosts>,
    ) {
        let started = Instant::now();
        let mut p = Pending {
            record: ConnectionRecord {
                id: http::new_id(),
                agent: agent.to_string(),
                entry: stream.entry,
                host: stream.name.clone().unwrap_or_default(),
                port: stream.port,
                ip: None,
                mode: None,
                rule: None,
                policy_version: rules.version(),
                bytes_up: 0,
                bytes_down: 0,
                phase: ConnectionPhase::Finished,
                reason: None,
                approval: None,
                error: None,
                duration: None,
            },
            target_text: format!("{}:{}", stream.name.as_deref().unwrap_or("?"), stream.port),
        };
        let Some(_slot) = self.take_slot(agent, max_streams) else {
            p.refuse(DenyReason::TooManyStreams, None);
            return finish_refused(&mut p, &mut stream, audit).await;
        };
        // What the client asked for: its proxy request (explicit), or the name behind
        // the synthetic address it dialled (transparent; PID 1 mapped it back).
        let (parsed, target, request, mode) = if stream.entry == EgressEntry::Explicit {
            let parsed = match read_head(&mut stream).await {
                Ok(parsed) => parsed,
                Err(e) => {
                    p.refuse(DenyReason::BadRequest, None);
                    p.record.error = Some(e);
                    return finish_refused(&mut p, &mut stream, audit).await;
                }
            };
            let (target, request, mode) = match &parsed.request {
                ProxyRequest::Connect { authority } => {
                    (parse_authority(authority, 443), None, Mode::Tunnel)
                }
                ProxyRequest::Absolute {
                    method,
                    authority,
                    path,
                    ..
                } => (
                    parse_authority(authority, 80),
                    Some((method.clone(), path_only(path).to_string())),
                    Mode::Http,
                ),
            };
            (Some(parsed), target, request, mode)
        } else {
            let target = match stream.name.as_deref().map(normalize_host) {
                Some(Ok(Host::Name(name))) => Ok(Target {
                    host: Host::Name(name),
                    port: stream.port,
                }),
                Some(Ok(Host::Ip(ip))) => Err(format!("a transparent stream names {ip}")),
                Some(Err(e)) => Err(e.to_string()),
                None => Err("a transparent stream names no host".to_string()),
            };
            let target = match target {
                Ok(t) => t,
                Err(e) => {
                    p.refuse(DenyReason::BadRequest, None);
                    p.record.error = Some(e);
                    return finish_refused(&mut p, &mut stream, audit).await;
                }
            };
            // Plain HTTP on :80: the first request's method, path and Host are read.
            let (request, mode) = if target.port == 80 {
                match read_origin_head(&mut stream).await {
                    Ok(head) => {
                        if head.host.as_deref() != Some(&host_text(&target.host)) {
                            p.record.host = host_text(&target.host);
                            p.record.port = target.port;
                            p.target_text = target.to_string();
                            p.refuse(DenyReason::HostMismatch, None);
                            p.record.error = Some(format!(
                                "the request's Host is {:?}",
                                head.host.unwrap_or_default()
                            ));
                            return finish_refused(&mut p, &mut stream, audit).await;
                        }
                        (
                            Some((head.method, path_only(&head.path).to_string())),
                            Mode::Http,
                        )
                    }
                    Err(e) => {
                        p.refuse(DenyReason::BadRequest, None);
                        p.record.error = Some(e);
                        return finish_refused(&mut p, &mut stream, audit).await;
                    }
                }
            } else {
                (None, Mode::Tunnel)
            };
            (None, Ok(target), request, mode)
        };
        let target = match target {
            Ok(t) => t,
            Err(e) => {
                p.refuse(DenyReason::BadRequest, None);
                p.record.error = Some(e.to_string());
                return finish_refused(&mut p, &mut stream, audit).await;
            }
        };
        p.record.host = host_text(&target.host);
        p.record.port = target.port;
        p.record.mode = Some(mode);
        p.target_text = target.to_string();

        // One matcher.
        let as_request = || {
            request
                .as_ref()
                .map(|(method, path)| Request { method, path })
        };
        let verdict = rules.decide(&target, as_request());
        // Addresses already resolved and checked (a miss that was asked about).
        let mut checked: Option<Vec<IpAddr>> = None;
        let allowed = match verdict {
            Verdict::Allow(a) => a,
            Verdict::Deny(d) => {
                let asked = unknown.filter(|_| {
                    matches!(d.reason, DenyReason::NoRule | DenyReason::PortNotAllowed)
                        && matches!(target.host, Host::Name(_))
                });
                let Some(unknown) = asked else {
                    p.refuse(d.reason, d.rule);
                    return finish_refused(&mut p, &mut stream, audit).await;
                };
                // Deny rules have won already (they come first in `decide`); the
                // classifier answers before anyone is asked, with no private range
                // allowed: an approval never lifts it.
                let Some(addrs) = self.resolve_checked(&target, &[], &mut p).await else {
                    return finish_refused(&mut p, &mut stream, audit).await;
                };
                let host = host_text(&target.host);
                let miss = Miss {
                    id: &p.record.id.clone(),
                    host: &host,
                    port: target.port,
                    entry: stream.entry,
                    mode,
                    reason: d.reason,
                };
                match unknown.ask(&miss).await {
                    MissAnswer::Refuse {
                        reason,
                        approval,
                        error,
                    } => {
                        p.refuse(reason, d.rule);
                        p.record.approval = approval;
                        p.record.error = error;
                        return finish_refused(&mut p, &mut stream, audit).await;
                    }
                    MissAnswer::Retry(fresh) => match fresh.decide(&target, as_request()) {
                        Verdict::Allow(a) => {
                            rules = fresh;
                            p.record.policy_version = rules.version();
                            checked = Some(addrs);
                            a
                        }
                        Verdict::Deny(d) => {
                            p.refuse(d.reason, d.rule);
                            return finish_refused(&mut p, &mut stream, audit).await;
                        }
                    },
                }
            }
        };
        p.record.rule = Some(allowed.rule.clone());
        // Inspect mode (explicit CONNECT streams, when the engine has an inspector): request
        // rules or a bound credential need every request read.
        let inspect = allowed.needs_inspect
            && mode == Mode::Tunnel
            && parsed.is_some()
            && self.inspector.is_some();
        if inspect {
            p.record.mode = Some(Mode::Inspect);
        }
        // A rule that limits methods or paths can only be kept by reading every request.
        // A tunnel cannot (inspect mode does), so such a stream is refused rather than
        // let through whole.
        if allowed.needs_inspect && mode == Mode::Tunnel && !inspect {
            p.refuse(DenyReason::PathNotAllowed, Some(allowed.rule.clone()));
            p.record.error = Some(
                "the rule limits methods or paths, which needs inspect mode; a tunnel would carry any request"
                    .into(),
            );
            return finish_refused(&mut p, &mut stream, audit).await;
        }

        // Resolve, classify every address, pin one.
        let addrs = match checked {
            Some(addrs) => addrs,
            None => match self
                .resolve_checked(&target, &allowed.allow_private, &mut p)
                .await
            {
                Some(addrs) => addrs,
                None => return finish_refused(&mut p, &mut stream, audit).await,
            },
        };
        let pinned = addrs[0];
        p.record.ip = Some(pinned);

        // Dial the pinned address (no byte goes up yet): a failure is still a `502`.
        let upstream = self.dialer.dial(SocketAddr::new(pinned, target.port)).await;
        let mut upstream = match upstream {
            Ok(u) => u,
            Err(e) => {
                let answer = http::upstream_error(502, "connect_failed", &p.target_text, agent);
                let _ = stream.writer.write_all(&answer).await;
                let _ = stream.writer.shutdown().await;
                p.record.error = Some(format!("cannot connect to {pinned}: {e}"));
                return finish(&mut p, started, audit).await;
            }
        };

        // What goes upstream first.
        // (A transparent stream's bytes are all the client's own; a proxy request's
        // head is the gateway's to answer.)
        let head_len = parsed.as_ref().map_or(0, |h| h.head_len);
        let rest = stream.head.split_off(head_len.min(stream.head.len()));
        let first: Vec<u8> = match mode {
            Mode::Tunnel | Mode::Inspect => {
                if parsed.is_some() && stream.writer.write_all(http::CONNECT_OK).await.is_err() {
                    p.record.error = Some("the client went away".into());
                    return finish(&mut p, started, audit).await;
                }
                if target.port == 443 {
                    match read_hello(&mut stream, rest).await {
                        Ok((hello, bytes)) => {
                            if let Some(reason) = sni_verdict(&target.host, &hello) {
                                // The client speaks TLS now: it can only be closed.
                                let _ = stream.writer.shutdown().await;
                                p.refuse(reason, None);
                                p.record.error = Some(match hello {
                                    Hello::Sni(s) => format!("the TLS client named '{s}'"),
                                    Hello::NoSni => "the TLS client named no server".into(),
                                });
                                return finish(&mut p, started, audit).await;
                            }
                            bytes
                        }
                        Err((reason, e)) => {
                            let _ = stream.writer.shutdown().await;
                            p.refuse(reason, None);
                            p.record.error = Some(e);
                            return finish(&mut p, started, audit).await;
                        }
                    }
                } else {
                    rest
                }
            }
            Mode::Http => {
                let mut bytes = match &parsed {
                    Some(parsed) => {
                        let Some(mut head) = http::origin_form_head(parsed) else {
                            p.record.error = Some("not an absolute-form request".into());
                            return finish(&mut p, started, audit).await;
                        };
                        head.extend_from_slice(&rest);
                        head
                    }
                    // Transparent :80: the request is already in origin form.
                    None => rest,
                };
                // Only the first request was checked against the rule's methods and
                // paths: the upstream is told to close after answering it, so no
                // later request on the connection is served unchecked.
                if allowed.needs_inspect {
                    bytes = close_after_first(&bytes);
                }
                bytes
            }
        };

        // Audit before bytes.
        p.record.phase = ConnectionPhase::Started;
        if let Err(e) = audit.record(&p.record).await {
            tracing::error!(agent, "egress: the audit record cannot be written: {e}");
            let _ = stream.writer.shutdown().await;
            p.refuse(DenyReason::AuditUnavailable, None);
            p.record.error = Some(e);
            return finish(&mut p, started, audit).await;
        }
        if let (true, Some(inspector)) = (inspect, &self.inspector) {
            let session = Session {
                agent,
                id: &p.record.id.clone(),
                target: &target,
                rules: rules.clone(),
                audit,
                dialer: self.dialer.clone(),
                pinned: SocketAddr::new(pinned, target.port),
            };
            let outcome = inspector
                .serve(session, stream.reader, stream.writer, first, upstream)
                .await;
            p.record.bytes_up = outcome.bytes_up;
            p.record.bytes_down = outcome.bytes_down;
            p.record.error = outcome.error;
            return finish(&mut p, started, audit).await;
        }
        if upstream.write_all(&first).await.is_err() {
            let _ = stream.writer.shutdown().await;
            p.record.error = Some("the upstream closed before the first bytes".into());
            return finish(&mut p, started, audit).await;
        }
        p.record.bytes_up = first.len() as u64;

        let mut client = tokio::io::join(stream.reader, stream.writer);
        match tokio::io::copy_bidirectional_with_sizes(
            &mut client,
            &mut upstream,
            SPLICE_BUFFER,
            SPLICE_BUFFER,
        )
        .await
        {
            Ok((up, down)) => {
                p.record.bytes_up += up;
                p.record.bytes_down = down;
            }
            Err(e) => p.record.error = Some(format!("the stream broke: {e}")),
        }
        finish(&mut p, started, audit).await;
    }
}

/// A connection the gateway opens itself on an agent's behalf (a remote MCP server):
/// what [`EgressEngine::open_outbound`] hands back while it is open.
#[non_exhaustive]
pub struct Outbound {
    /// The dialled connection to the pinned address.
    pub upstream: super::upstream::BoxUpstream,
    /// Its `started` record, to be finished by [`EgressEngine::finish_outbound`].
    pub record: ConnectionRecord,
    /// When it was decided.
    pub started: Instant,
}

impl std::fmt::Debug for Outbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbound")
            .field("record", &self.record)
            .finish_non_exhaustive()
    }
}

impl EgressEngine {
    /// Decides a connection the gateway itself would open for `agent` to `target` (a
    /// remote MCP server): the same matcher as sandbox streams (with `request` as the
    /// request it is for), then the name resolved and *every* address checked by the
    /// same classifier. `Ok` with the addresses (the first is the one pinned), or the
    /// refused record (`reason`, `rule`, `error` set; nothing written).
    pub async fn check_outbound(
        &self,
        agent: &str,
        rules: &RuleSet,
        target: &Target,
        request: Option<Request<'_>>,
    ) -> Result<(Vec<IpAddr>, String), ConnectionRecord> {
        let mut p = Pending {
            record: outbound_record(agent, rules, target),
            target_text: target.to_string(),
        };
        let allowed = match rules.decide(target, request) {
            Verdict::Allow(a) => a,
            Verdict::Deny(d) => {
                p.refuse(d.reason, d.rule);
                return Err(p.record);
            }
        };
        p.record.rule = Some(allowed.rule.clone());
        match self
            .resolve_checked(target, &allowed.allow_private, &mut p)
            .await
        {
            Some(addrs) => Ok((addrs, allowed.rule)),
            None => Err(p.record),
        }
    }

    /// Opens a connection of the gateway's own for `agent` to `target`: decided and
    /// classified as [`EgressEngine::check_outbound`] says, pinned to the first address,
    /// recorded `started` in `audit` (a record that cannot be written refuses it), and
    /// dialled with the engine's [`Dialer`] (so the test seams apply). A refusal, or a
    /// failed dial, is written as its one `finished` record and returned as `Err`.
    pub async fn open_outbound(
        &self,
        agent: &str,
        rules: &RuleSet,
        target: &Target,
        request: Option<Request<'_>>,
        audit: &dyn EgressAudit,
    ) -> Result<Outbound, ConnectionRecord> {
        let started = Instant::now();
        let (addrs, rule) = match self.check_outbound(agent, rules, target, request).await {
            Ok(ok) => ok,
            Err(mut refused) => {
                refused.phase = ConnectionPhase::Finished;
                if let Err(e) = audit.record(&refused).await {
                    tracing::error!(agent, "egress: a refusal's record failed: {e}");
                }
                return Err(refused);
            }
        };
        let mut record = outbound_record(agent, rules, target);
        record.rule = Some(rule);
        let pinned = addrs[0];
        record.ip = Some(pinned);
        record.phase = ConnectionPhase::Started;
        if let Err(e) = audit.record(&record).await {
            tracing::error!(agent, "egress: the audit record cannot be written: {e}");
            record.phase = ConnectionPhase::Finished;
            record.reason = Some(DenyReason::AuditUnavailable);
            record.error = Some(e);
            return Err(record);
        }
        match self.dialer.dial(SocketAddr::new(pinned, target.port)).await {
            Ok(upstream) => Ok(Outbound {
                upstream,
                record,
                started,
            }),
            Err(e) => {
                record.phase = ConnectionPhase::Finished;
                record.error = Some(format!("cannot connect to {pinned}: {e}"));
                record.duration = Some(started.elapsed());
                if let Err(e) = audit.record(&record).await {
                    tracing::error!(agent, "egress: the finished record cannot be written: {e}");
                }
                Err(record)
            }
        }
    }

    /// Writes the `finished` record of a connection [`EgressEngine::open_outbound`]
    /// opened, with what it carried.
    pub async fn finish_outbound(
        &self,
        mut record: ConnectionRecord,
        started: Instant,
        (bytes_up, bytes_down): (u64, u64),
        error: Option<String>,
        audit: &dyn EgressAudit,
    ) {
        record.bytes_up = bytes_up;
        record.bytes_down = bytes_down;
        record.error = error;
        let mut p = Pending {
            target_text: String::new(),
            record,
        };
        finish(&mut p, started, audit).await;
    }
}

/// The record of a gateway-opened connection before it is decided. (Its `entry` is
/// `explicit`: the gateway's own client names its target as a proxy client does; the
/// gateway's audit marks it as the gateway's.)
fn outbound_record(agent: &str, rules: &RuleSet, target: &Target) -> ConnectionRecord {
    ConnectionRecord {
        id: http::new_id(),
        agent: agent.to_string(),
        entry: EgressEntry::Explicit,
        host: host_text(&target.host),
        port: target.port,
        ip: None,
        mode: Some(Mode::Tunnel),
        rule: None,
        policy_version: rules.version(),
        bytes_up: 0,
        bytes_down: 0,
        phase: ConnectionPhase::Finished,
        reason: None,
        approval: None,
        error: None,
        duration: None,
    }
}

/// `bytes` (a request head and what follows) with the head's `Connection` headers
/// replaced by `Connection: close`.
fn close_after_first(bytes: &[u8]) -> Vec<u8> {
    let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") else {
        return bytes.to_vec();
    };
    let mut out = Vec::with_capacity(bytes.len() + 19);
    for (i, line) in bytes[..end].split(|b| *b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let is_connection = line.len() >= 11 && line[..11].eq_ignore_ascii_case(b"connection:");
        if i > 0 && is_connection {
            continue;
        }
        out.extend_from_slice(line);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out.extend_from_slice(&bytes[end + 4..]);
    out
}

/// The path of a request target without its query (rules never see the query).
fn path_only(path: &str) -> &str {
    path.split_once('?').map_or(path, |(p, _)| p)
}

fn host_text(host: &Host) -> String {
    match host {
        Host::Name(n) => n.clone(),
        Host::Ip(ip) => ip.to_string(),
    }
}

/// Whether a ClientHello may go to `host`: `None` when it names it.
fn sni_verdict(host: &Host, hello: &Hello) -> Option<DenyReason> {
    match (host, hello) {
        // An address has no name to check.
        (Host::Ip(_), _) => None,
        (Host::Name(name), Hello::Sni(sni)) if sni == name => None,
        (Host::Name(_), Hello::Sni(_)) => Some(DenyReason::SniMismatch),
        (Host::Name(_), Hello::NoSni) => Some(DenyReason::SniMissing),
    }
}

/// Reads until the request head is complete (bounded in size and time).
async fn read_head(stream: &mut EgressStream) -> Result<http::ParsedHead, String> {
    let deadline = Instant::now() + Duration::from_secs(EGRESS_HEAD_TIMEOUT_SECS);
    let mut buf = [0u8; 8192];
    loop {
        match http::parse_proxy_head(&stream.head) {
            Ok(Some(parsed)) => return Ok(parsed),
            Ok(None) => {}
            Err(e) => return Err(e.to_string()),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.reader.read(&mut buf)).await {
            Ok(Ok(0)) => return Err("the client closed before its request was complete".into()),
            Ok(Ok(n)) => stream.head.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => return Err(format!("reading the request failed: {e}")),
            Err(_) => {
                return Err(format!(
                    "no complete request within {EGRESS_HEAD_TIMEOUT_SECS}s"
                ))
            }
        }
    }
}

/// The first request of a transparent plain-HTTP stream, as far as the rules need it.
struct OriginHead {
    method: String,
    path: String,
    /// The `Host` header, lower-cased, without a port.
    host: Option<String>,
}

/// Reads a transparent stream's first request head (origin form), bounded in size and
/// time; the bytes stay in `stream.head` to be forwarded as they are.
async fn read_origin_head(stream: &mut EgressStream) -> Result<OriginHead, String> {
    let deadline = Instant::now() + Duration::from_secs(EGRESS_HEAD_TIMEOUT_SECS);
    let mut buf = [0u8; 8192];
    loop {
        let mut headers = [httparse::EMPTY_HEADER; http::MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&stream.head) {
            Ok(httparse::Status::Complete(_)) => {
                let host = req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("host"))
                    .and_then(|h| std::str::from_utf8(h.value).ok())
                    .map(|v| {
                        let v = v.trim().to_ascii_lowercase();
                        match v.rsplit_once(':') {
                            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => {
                                h.to_string()
                            }
                            _ => v,
                        }
                    });
                let path = req.path.unwrap_or("/").to_string();
                if !path.starts_with('/') {
                    return Err("a transparent request must be in origin form".into());
                }
                return Ok(OriginHead {
                    method: req.method.unwrap_or("").to_string(),
                    path,
                    host,
                });
            }
            Ok(httparse::Status::Partial) => {}
            Err(e) => return Err(format!("unreadable request: {e}")),
        }
        if stream.head.len() >= beige_protocol::link::MAX_EGRESS_HEAD {
            return Err("the request head is over 16 KiB".into());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.reader.read(&mut buf)).await {
            Ok(Ok(0)) => return Err("the client closed before its request was complete".into()),
            Ok(Ok(n)) => stream.head.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => return Err(format!("reading the request failed: {e}")),
            Err(_) => {
                return Err(format!(
                    "no complete request within {EGRESS_HEAD_TIMEOUT_SECS}s"
                ))
            }
        }
    }
}

/// Reads the client's ClientHello (after the `200`), bounded in size and time; returns
/// it and every byte read, to be sent upstream as they are.
async fn read_hello(
    stream: &mut EgressStream,
    mut bytes: Vec<u8>,
) -> Result<(Hello, Vec<u8>), (DenyReason, String)> {
    let deadline = Instant::now() + Duration::from_secs(EGRESS_HEAD_TIMEOUT_SECS);
    let mut buf = [0u8; 8192];
    loop {
        match tls::client_hello_sni(&bytes) {
            Ok(Some(hello)) => return Ok((hello, bytes)),
            Ok(None) => {}
            Err(tls::HelloError::NotTls) => {
                return Err((DenyReason::NotTls, "the client does not speak TLS".into()))
            }
            Err(e) => return Err((DenyReason::NotTls, e.to_string())),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.reader.read(&mut buf)).await {
            Ok(Ok(0)) => {
                return Err((
                    DenyReason::NotTls,
                    "the client closed before its TLS hello".into(),
                ))
            }
            Ok(Ok(n)) => bytes.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => return Err((DenyReason::NotTls, format!("reading failed: {e}"))),
            Err(_) => {
                return Err((
                    DenyReason::NotTls,
                    format!("no TLS hello within {EGRESS_HEAD_TIMEOUT_SECS}s"),
                ))
            }
        }
    }
}

/// Answers a refused stream with its `403` (a transparent TLS client, which cannot
/// read one, is closed) and writes its one record.
async fn finish_refused(p: &mut Pending, stream: &mut EgressStream, audit: &dyn EgressAudit) {
    let reason = p.record.reason.unwrap_or(DenyReason::BadRequest);
    if stream.entry == EgressEntry::Transparent && stream.port != 80 {
        let _ = stream.writer.shutdown().await;
        p.record.phase = ConnectionPhase::Finished;
        if let Err(e) = audit.record(&p.record).await {
            tracing::error!(
                agent = p.record.agent,
                "egress: a refusal's record failed: {e}"
            );
        }
        return;
    }
    let answer = http::refusal_for_approval(
        reason.as_str(),
        reason.explain(),
        &p.target_text,
        &p.record.agent,
        &p.record.id,
        p.record.approval.as_deref(),
    );
    let _ = stream.writer.write_all(&answer).await;
    let _ = stream.writer.shutdown().await;
    p.record.phase = ConnectionPhase::Finished;
    if let Err(e) = audit.record(&p.record).await {
        tracing::error!(
            agent = p.record.agent,
            "egress: the refusal's audit record cannot be written: {e}"
        );
    }
}

/// Writes the `finished` record of a stream that was started.
async fn finish(p: &mut Pending, started: Instant, audit: &dyn EgressAudit) {
    p.record.phase = ConnectionPhase::Finished;
    p.record.duration = Some(started.elapsed());
    if let Err(e) = audit.record(&p.record).await {
        tracing::error!(
            agent = p.record.agent,
            "egress: the finished record cannot be written: {e}"
        );
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
