//! [`MemorySandbox`]: a [`Sandbox`] that keeps each agent's files in memory and runs
//! nothing — no Docker, no shim, no host path. `exec` is recorded and answered by a
//! scripted hook (default: `fake: <command>`, exit 0); `read`, `write` and `patch` act
//! on the in-memory files; plugin tool calls are replayed through the [`SandboxHost`]
//! the gateway reconciled it with, exactly as a backend's tool endpoint passes them on,
//! so that tests see policy, hooks and audit on that path.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use beige_protocol::op::{
    ExecReply, KillReply, OpError, OpErrorKind, OpReply, OpRequest, PatchReply, PatchRequest,
    ReadReply, ReadRequest, WriteReply,
};
use beige_protocol::socket::{ToolRequest, ToolResponse};

use crate::ident::Attribution;
use crate::sandbox::spec::WORKSPACE;
use crate::sandbox::{
    OpOutcome, ReconcileReport, Sandbox, SandboxError, SandboxHost, SandboxSpec, SandboxStatus,
    SecurityEvent, Transport,
};

/// Answers an `exec`: `(agent, command)` → the reply, or `None` for the default.
type ExecHook = Arc<dyn Fn(&str, &str) -> Option<ExecReply> + Send + Sync>;

/// An in-memory sandbox for tests and examples (see the module docs).
#[derive(Default)]
pub struct MemorySandbox {
    state: Mutex<State>,
    exec: Option<ExecHook>,
}

#[derive(Default)]
struct State {
    specs: BTreeMap<String, SandboxSpec>,
    host: Option<Arc<dyn SandboxHost>>,
    /// `(agent, absolute path)` → contents.
    files: HashMap<(String, String), Vec<u8>>,
    executed: HashMap<String, Vec<String>>,
    statuses: HashMap<String, SandboxStatus>,
}

impl std::fmt::Debug for MemorySandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state();
        f.debug_struct("MemorySandbox")
            .field("agents", &st.specs.keys().collect::<Vec<_>>())
            .field("files", &st.files.len())
            .field("serving", &st.host.is_some())
            .finish()
    }
}

impl MemorySandbox {
    /// An empty sandbox: no agents, no files, and every `exec` answered with
    /// `fake: <command>`, exit 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Answer `exec`s with `hook(agent, command)`; where it returns `None`, the default
    /// answer (`fake: <command>`, exit 0).
    pub fn on_exec(
        mut self,
        hook: impl Fn(&str, &str) -> Option<ExecReply> + Send + Sync + 'static,
    ) -> Self {
        self.exec = Some(Arc::new(hook));
        self
    }

    /// An `exec` reply with this stdout and exit code, for [`MemorySandbox::on_exec`].
    pub fn exec_reply(stdout: impl Into<String>, exit_code: i32) -> ExecReply {
        ExecReply {
            exit_code: Some(exit_code),
            signal: None,
            stdout: stdout.into(),
            stderr: String::new(),
            stdout_omitted: 0,
            stderr_omitted: 0,
            timed_out: false,
            duration_ms: 0,
            survivors: Vec::new(),
            output_file: None,
        }
    }

    /// The commands `exec` ran in the agent's sandbox, in order.
    pub fn executed(&self, agent: &str) -> Vec<String> {
        self.state()
            .executed
            .get(agent)
            .cloned()
            .unwrap_or_default()
    }

    /// A file of the agent's sandbox (relative paths are under `/workspace`).
    pub fn file(&self, agent: &str, path: &str) -> Option<Vec<u8>> {
        self.state()
            .files
            .get(&(agent.to_string(), absolute(path)))
            .cloned()
    }

    /// Put a file into the agent's sandbox (relative paths are under `/workspace`).
    pub fn write_file(&self, agent: &str, path: &str, contents: impl Into<Vec<u8>>) {
        self.state()
            .files
            .insert((agent.to_string(), absolute(path)), contents.into());
    }

    /// The specs of the last [`Sandbox::reconcile`].
    pub fn specs(&self) -> Vec<SandboxSpec> {
        self.state().specs.values().cloned().collect()
    }

    /// Answer [`Sandbox::status`] for `status.agent` with `status` (default: no link).
    pub fn set_status(&self, status: SandboxStatus) {
        self.state().statuses.insert(status.agent.clone(), status);
    }

    /// A plugin tool call made from inside the agent's sandbox, passed to the host the
    /// gateway reconciled this sandbox with — as a backend's tool endpoint does: the
    /// agent is the sandbox's, whatever the request says.
    /// The caller is unbound (no exec found for it), as for an operator's `docker exec`.
    pub async fn call_tool(&self, agent: &str, request: ToolRequest) -> ToolResponse {
        self.call_tool_from(agent, &Attribution::unbound(), request)
            .await
    }

    /// [`MemorySandbox::call_tool`] from a caller attributed to an exec, as a backend
    /// that found the calling process's exec passes it on.
    pub async fn call_tool_from(
        &self,
        agent: &str,
        caller: &Attribution,
        request: ToolRequest,
    ) -> ToolResponse {
        match self.host_of(agent) {
            Ok(host) => host.tool_call(agent, caller, request).await,
            Err(message) => ToolResponse::error(message, 1),
        }
    }

    /// A request the endpoint refused before parsing it (`raw` what it received),
    /// reported to the host as a backend does.
    pub async fn reject(&self, agent: &str, tool: Option<&str>, error: &str, raw: &[u8]) {
        if let Ok(host) = self.host_of(agent) {
            host.rejected(agent, tool, error, raw).await;
        }
    }

    /// Report a security event to the host, as a backend does.
    pub async fn report(&self, event: SecurityEvent) {
        let host = self.state().host.clone();
        if let Some(host) = host {
            host.security_event(event).await;
        }
    }

    fn host_of(&self, agent: &str) -> Result<Arc<dyn SandboxHost>, String> {
        let st = self.state();
        if !st.specs.contains_key(agent) {
            return Err(format!("no sandbox for agent '{agent}'"));
        }
        st.host
            .clone()
            .ok_or_else(|| format!("the sandbox of agent '{agent}' is not served by a gateway"))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn exec(&self, agent: &str, command: &str) -> ExecReply {
        self.state()
            .executed
            .entry(agent.to_string())
            .or_default()
            .push(command.to_string());
        self.exec
            .as_ref()
            .and_then(|hook| hook(agent, command))
            .unwrap_or_else(|| Self::exec_reply(format!("fake: {command}"), 0))
    }

    fn read(&self, agent: &str, req: &ReadRequest) -> Result<ReadReply, OpError> {
        let data = self
            .file(agent, &req.path)
            .ok_or_else(|| not_found(&req.path))?;
        let Ok(text) = String::from_utf8(data) else {
            let bytes = self.file(agent, &req.path).map_or(0, |d| d.len() as u64);
            return Ok(ReadReply::Binary { bytes });
        };
        let lines: Vec<&str> = text.split_inclusive('\n').collect();
        let total_lines = lines.len() as u64;
        let first = req.offset.filter(|&o| o > 0).unwrap_or(1);
        let last = req
            .limit
            .filter(|&l| l > 0)
            .map_or(total_lines, |l| first.saturating_add(l - 1))
            .min(total_lines);
        let mut content = String::new();
        let mut truncated = false;
        let mut last_line = 0;
        for (i, line) in lines.iter().enumerate() {
            let n = i as u64 + 1;
            if n < first || n > last {
                continue;
            }
            if (content.len() + line.len()) as u64 > req.max_bytes {
                truncated = true;
                break;
            }
            content.push_str(line);
            last_line = n;
        }
        Ok(ReadReply::Text {
            content,
            total_lines,
            first_line: first,
            last_line,
            truncated,
        })
    }

    fn patch(&self, agent: &str, req: &PatchRequest) -> Result<PatchReply, OpError> {
        if req.old_text.is_empty() {
            return Err(op_error(
                OpErrorKind::BadRequest,
                "oldText must not be empty: give the exact text to replace.",
            ));
        }
        let key = (agent.to_string(), absolute(&req.path));
        let mut st = self.state();
        let data = st.files.get_mut(&key).ok_or_else(|| not_found(&req.path))?;
        let text = String::from_utf8_lossy(data).into_owned();
        match text.matches(req.old_text.as_str()).count() {
            1 => {
                let patched = text.replacen(&req.old_text, &req.new_text, 1);
                *data = patched.into_bytes();
                Ok(PatchReply {
                    bytes: data.len() as u64,
                })
            }
            0 => Err(op_error(
                OpErrorKind::NoMatch,
                format!(
                    "The specified oldText was not found in {}. Make sure it matches exactly \
                     (including whitespace and indentation).",
                    req.path
                ),
            )),
            n => Err(op_error(
                OpErrorKind::AmbiguousMatch,
                format!(
                    "The specified oldText occurs {n} times in {}; it must occur exactly once. \
                     Add more surrounding context to oldText so it matches only one place.",
                    req.path
                ),
            )),
        }
    }
}

/// `path` as the sandbox sees it: relative paths are under [`WORKSPACE`].
fn absolute(path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{WORKSPACE}/{}", path.trim_start_matches("./"))
    }
}

fn op_error(kind: OpErrorKind, message: impl Into<String>) -> OpError {
    OpError {
        kind,
        message: message.into(),
    }
}

fn not_found(path: &str) -> OpError {
    op_error(OpErrorKind::NotFound, format!("File not found: {path}"))
}

#[async_trait]
impl Sandbox for MemorySandbox {
    async fn reconcile(
        &self,
        specs: Vec<SandboxSpec>,
        host: Arc<dyn SandboxHost>,
    ) -> Result<ReconcileReport, SandboxError> {
        let mut st = self.state();
        let mut report = ReconcileReport::default();
        for spec in &specs {
            if st.specs.contains_key(&spec.agent) {
                report.reattached.push(spec.agent.clone());
            } else {
                report.created.push(spec.agent.clone());
            }
        }
        report.removed_orphans = st
            .specs
            .keys()
            .filter(|a| !specs.iter().any(|s| &s.agent == *a))
            .cloned()
            .collect();
        st.specs = specs.into_iter().map(|s| (s.agent.clone(), s)).collect();
        st.host = Some(host);
        Ok(report)
    }

    async fn run_op(&self, agent: &str, request: &OpRequest) -> Result<OpOutcome, SandboxError> {
        if !self.state().specs.contains_key(agent) {
            return Err(SandboxError::UnknownAgent {
                agent: agent.to_string(),
            });
        }
        let reply = match request {
            OpRequest::Exec(e) => OpReply::Exec(self.exec(agent, &e.command)),
            OpRequest::Write(w) => {
                self.write_file(agent, &w.path, w.content.as_bytes());
                OpReply::Write(WriteReply {
                    bytes: w.content.len() as u64,
                })
            }
            OpRequest::Read(r) => self
                .read(agent, r)
                .map_or_else(OpReply::Error, OpReply::Read),
            OpRequest::Patch(p) => self
                .patch(agent, p)
                .map_or_else(OpReply::Error, OpReply::Patch),
            OpRequest::Kill(_) => OpReply::Kill(KillReply { found: 0 }),
        };
        Ok(OpOutcome {
            reply,
            restarted: None,
            transport: Transport::DIRECT,
        })
    }

    async fn remove_all(&self) -> Result<(), SandboxError> {
        let mut st = self.state();
        st.specs.clear();
        st.host = None;
        Ok(())
    }

    async fn detach(&self) {
        self.state().host = None;
    }

    async fn status(&self, agent: &str) -> SandboxStatus {
        self.state()
            .statuses
            .get(agent)
            .cloned()
            .unwrap_or_else(|| SandboxStatus::unlinked(agent))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use beige_protocol::op::{ExecRequest, WriteRequest};

    fn exec(command: &str) -> OpRequest {
        OpRequest::Exec(ExecRequest {
            command: command.into(),
            timeout_secs: 10,
            env: Vec::new(),
            cwd: None,
            max_output_bytes: 1 << 20,
            exec_id: None,
            raw_output: false,
        })
    }

    #[tokio::test]
    async fn files_live_in_memory_and_execs_are_recorded() {
        let sb = MemorySandbox::new()
            .on_exec(|agent, cmd| (cmd == "whoami").then(|| MemorySandbox::exec_reply(agent, 0)));
        sb.reconcile(Vec::new(), Arc::new(crate::sandbox::NoHost))
            .await
            .unwrap();
        // No spec: no sandbox.
        assert!(matches!(
            sb.run_op("a", &exec("ls")).await,
            Err(SandboxError::UnknownAgent { .. })
        ));
        sb.state().specs.insert("a".into(), test_spec("a"));
        let write = OpRequest::Write(WriteRequest {
            path: "notes/x.txt".into(),
            content: "one\ntwo\n".into(),
        });
        sb.run_op("a", &write).await.unwrap();
        assert_eq!(
            sb.file("a", "/workspace/notes/x.txt").as_deref(),
            Some(&b"one\ntwo\n"[..])
        );
        let patch = OpRequest::Patch(PatchRequest {
            path: "/workspace/notes/x.txt".into(),
            old_text: "two".into(),
            new_text: "three".into(),
        });
        sb.run_op("a", &patch).await.unwrap();
        let read = |offset| {
            OpRequest::Read(ReadRequest {
                path: "notes/x.txt".into(),
                offset,
                limit: None,
                max_bytes: 1000,
                images: false,
                max_image_bytes: 0,
            })
        };
        let out = sb.run_op("a", &read(Some(2))).await.unwrap();
        assert!(
            matches!(&out.reply, OpReply::Read(ReadReply::Text { content, total_lines: 2, .. }) if content == "three\n"),
            "{out:?}"
        );
        assert_eq!(out.transport, Transport::DIRECT);
        let missing = sb.run_op("a", &read(None)).await.unwrap();
        assert!(matches!(missing.reply, OpReply::Read(_)));
        sb.write_file("a", "notes/x.txt", vec![0xff, 0xfe]);
        let binary = sb.run_op("a", &read(None)).await.unwrap();
        assert!(matches!(
            binary.reply,
            OpReply::Read(ReadReply::Binary { bytes: 2 })
        ));
        let gone = OpRequest::Read(ReadRequest {
            path: "nope".into(),
            offset: None,
            limit: None,
            max_bytes: 10,
            images: false,
            max_image_bytes: 0,
        });
        let OpReply::Error(e) = sb.run_op("a", &gone).await.unwrap().reply else {
            panic!("read a missing file");
        };
        assert_eq!(e.kind, OpErrorKind::NotFound);

        let OpReply::Exec(who) = sb.run_op("a", &exec("whoami")).await.unwrap().reply else {
            panic!("no exec reply");
        };
        assert_eq!(who.stdout, "a");
        let OpReply::Exec(ls) = sb.run_op("a", &exec("ls")).await.unwrap().reply else {
            panic!("no exec reply");
        };
        assert_eq!(ls.stdout, "fake: ls");
        assert_eq!(sb.executed("a"), ["whoami", "ls"]);
        assert!(sb.executed("b").is_empty());
    }

    fn test_spec(agent: &str) -> SandboxSpec {
        let home = crate::home::BeigeHome::new("/nonexistent/beige");
        let config: crate::config::AgentConfig = serde_json::from_value(serde_json::json!({
            "model": {"provider": "p", "model": "m"}, "tools": []
        }))
        .unwrap();
        let installation = crate::home::InstallationId::generate();
        let writable = crate::config::WritableTrees::default();
        SandboxSpec::for_agent(&crate::sandbox::SpecInput {
            home: &home,
            installation: &installation,
            writable: &writable,
            agent,
            config: &config,
            workspace: home.default_workspace(agent),
            user: crate::sandbox::SandboxUser::DEFAULT,
            tools: Vec::new(),
            tool_packages: Vec::new(),
            skills: Vec::new(),
        })
        .unwrap()
    }
}
