//! Command tools: host commands declared in a plugin's `plugin.json` and run by the
//! gateway when an agent calls them from its sandbox.
//!
//! ```json
//! {"name": "gh", "tools": {"gh": {"command": "gh", "allow": ["issue *", "pr *"],
//!   "deny": ["auth *"], "env": {"GH_TOKEN": "${GITHUB_TOKEN}"}, "timeout": 60}}}
//! ```
//!
//! Owns what such a call may do: the caller's arguments are matched against `deny` then
//! `allow` rules (deny wins; no allow match is a refusal naming the rules) and passed as
//! argv — never through a shell — after the manifest's fixed `args`; the environment is
//! built from scratch (`PATH` plus the declared entries, nothing else of the gateway's);
//! the working directory is the caller's cwd opened beneath a handle on the agent's
//! workspace ([`crate::fsutil::Beneath`]: no symlink is followed) and entered with
//! `fchdir` in the child, so no path is looked up twice; a time limit kills the whole
//! process group; the
//! output is capped. It does not make a host CLI safe to hand to an agent:
//! `docs/command-tools.md` lists the CLIs that execute files from the workspace (git
//! hooks and config, build tools) and how to configure them safely.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::manifest::{check_schema, Manifest};
use super::process::{base_path, process_env};
use super::{Plugin, PluginContext, PluginError, Registrar, Tool, ToolCall, ToolError, ToolResult};

/// Time limit of a command unless its `timeout` says otherwise.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// Output kept of a command unless its `maxOutput` says otherwise (64 KiB).
pub const DEFAULT_MAX_OUTPUT: usize = 64 * 1024;

pub use super::manifest::CommandToolSpec;

/// One allow or deny pattern: words matched against the caller's arguments one by one.
/// `*` inside a word matches any characters of that argument; a word that is just `*`
/// matches one argument, except as the last word, where it matches any rest (also
/// none); `**` matches any number of arguments (also none) wherever it stands. `"push
/// *"` matches `push` and `push origin main`; `"log --format=* *"` matches `log
/// --format=oneline -3`; `"** --output* **"` matches any command line with an argument
/// starting with `--output`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    text: String,
    words: Vec<String>,
}

impl Pattern {
    /// The pattern written as `text`: its words are split at whitespace.
    pub fn new(text: &str) -> Self {
        Self {
            text: text.to_string(),
            words: text.split_whitespace().map(str::to_string).collect(),
        }
    }

    /// The pattern as written, as refusal messages quote it.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the caller's arguments `args` match the whole pattern.
    pub fn matches(&self, args: &[String]) -> bool {
        match_words(&self.words, args)
    }
}

fn match_words(words: &[String], args: &[String]) -> bool {
    match words.split_first() {
        None => args.is_empty(),
        Some((w, rest)) if w == "**" => (0..=args.len()).any(|k| match_words(rest, &args[k..])),
        Some((w, rest)) if w == "*" && rest.is_empty() => true,
        Some((w, rest)) => match args.split_first() {
            Some((arg, more)) => wildcard(w, arg) && match_words(rest, more),
            None => false,
        },
    }
}

/// `*` in `pattern` matches any run of characters (also none); everything else is literal.
fn wildcard(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// Whether a call may run, and the rule that decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleDecision {
    /// No deny rule matched and an allow rule did.
    Allowed {
        /// The first allow rule that matched, as written.
        rule: String,
    },
    /// A deny rule matched; the call is refused whatever the allow rules say.
    Denied {
        /// The first deny rule that matched, as written.
        rule: String,
    },
    /// No allow rule matched.
    NotAllowed,
}

/// A tool's allow and deny rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    /// The tool's `allow` patterns; a call must match one of them. Empty allows nothing.
    pub allow: Vec<Pattern>,
    /// The tool's `deny` patterns; a call that matches one is refused.
    pub deny: Vec<Pattern>,
}

impl Rules {
    /// The rules of a tool's `allow` and `deny` lists, each pattern as written.
    pub fn new(allow: &[String], deny: &[String]) -> Self {
        Self {
            allow: allow.iter().map(|p| Pattern::new(p)).collect(),
            deny: deny.iter().map(|p| Pattern::new(p)).collect(),
        }
    }

    /// Deny rules first (the first match refuses), then allow rules.
    pub fn check(&self, args: &[String]) -> RuleDecision {
        if let Some(rule) = self.deny.iter().find(|p| p.matches(args)) {
            return RuleDecision::Denied {
                rule: rule.text.clone(),
            };
        }
        match self.allow.iter().find(|p| p.matches(args)) {
            Some(rule) => RuleDecision::Allowed {
                rule: rule.text.clone(),
            },
            None => RuleDecision::NotAllowed,
        }
    }

    /// The refusal message for `tool` called with `args`, or `None` when allowed.
    pub fn refusal(&self, tool: &str, args: &[String]) -> Option<String> {
        match self.check(args) {
            RuleDecision::Allowed { .. } => None,
            RuleDecision::Denied { rule } => Some(format!(
                "{tool}: \"{}\" refused by rule deny \"{rule}\"",
                args.join(" ")
            )),
            RuleDecision::NotAllowed => Some(format!(
                "{tool}: \"{}\" refused: it matches no allow rule (allow: {})",
                args.join(" "),
                self.allow
                    .iter()
                    .map(|p| format!("\"{}\"", p.text))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
}

/// A plugin whose manifest declares command tools.
#[derive(Debug)]
pub struct CommandToolPlugin {
    name: String,
    tools: Vec<Arc<CommandTool>>,
    config_schema: Option<Value>,
}

impl CommandToolPlugin {
    /// The command tools of `manifest` (from the folder `dir`), their declared
    /// environment resolved from `env` now.
    pub fn new(
        dir: &Path,
        manifest: Manifest,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, PluginError> {
        let fail = |message: String| PluginError::Failed {
            plugin: manifest.name.clone(),
            message,
        };
        let Some(specs) = &manifest.tools else {
            return Err(fail("plugin.json declares no 'tools'".into()));
        };
        if specs.is_empty() {
            return Err(fail("plugin.json: 'tools' is empty".into()));
        }
        let mut tools = Vec::new();
        for (tool, spec) in specs {
            let at = format!("plugin.json: tools.{tool}");
            if spec.command.trim().is_empty() {
                return Err(fail(format!("{at}.command is empty")));
            }
            if spec.allow.is_empty() {
                return Err(fail(format!(
                    "{at}.allow is empty, so nothing could run; list the sub-commands to allow, e.g. [\"status *\"] (or [\"*\"] for everything)"
                )));
            }
            let timeout = match spec.timeout {
                None => DEFAULT_COMMAND_TIMEOUT,
                Some(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Duration::from_secs_f64(s),
                Some(s) => {
                    return Err(fail(format!(
                        "{at}.timeout must be a positive number of seconds, not {s}"
                    )))
                }
            };
            let max_output = match spec.max_output {
                None => DEFAULT_MAX_OUTPUT,
                Some(0) => return Err(fail(format!("{at}.maxOutput must be at least 1"))),
                Some(n) => n,
            };
            let vars = match &spec.env {
                None => Vec::new(),
                Some(decl) => decl.resolve(env).map_err(|e| fail(format!("{at}.{e}")))?,
            };
            let program = if spec.command.contains('/') && !Path::new(&spec.command).is_absolute() {
                dir.join(&spec.command)
            } else {
                PathBuf::from(&spec.command)
            };
            if !program.is_absolute() && find_in_path(&spec.command).is_none() {
                tracing::warn!(
                    plugin = %manifest.name,
                    tool = %tool,
                    "command '{}' is not on PATH; calls of this tool will fail",
                    spec.command
                );
            }
            tools.push(Arc::new(CommandTool {
                name: tool.clone(),
                description: spec
                    .description
                    .clone()
                    .unwrap_or_else(|| format!("Runs `{}` on the host.", spec.command)),
                commands: spec.commands.clone(),
                program,
                fixed_args: spec.args.clone(),
                rules: Rules::new(&spec.allow, &spec.deny),
                env: vars,
                timeout,
                max_output,
            }));
        }
        Ok(Self {
            name: manifest.name.clone(),
            tools,
            config_schema: manifest.config_schema.clone(),
        })
    }

    /// Read `<dir>/plugin.json` and make the plugin, with the gateway's environment.
    pub fn from_dir(dir: &Path) -> Result<Self, PluginError> {
        let manifest = super::manifest::read_manifest(dir).map_err(|e| PluginError::Failed {
            plugin: dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            message: e.to_string(),
        })?;
        Self::new(dir, manifest, &process_env)
    }
}

#[async_trait]
impl Plugin for CommandToolPlugin {
    fn name(&self) -> &str {
        &self.name
    }

    async fn register(&self, ctx: &PluginContext, reg: &mut Registrar) -> Result<(), PluginError> {
        if let Some(schema) = &self.config_schema {
            check_schema(
                schema,
                &ctx.config,
                &format!("plugins.{}.config", self.name),
            )
            .map_err(|e| PluginError::Failed {
                plugin: self.name.clone(),
                message: format!("invalid config: {e}"),
            })?;
        }
        for tool in &self.tools {
            reg.tool(tool.clone())?;
        }
        Ok(())
    }
}

/// One command tool.
#[derive(Debug)]
struct CommandTool {
    name: String,
    description: String,
    commands: Vec<String>,
    program: PathBuf,
    fixed_args: Vec<String>,
    rules: Rules,
    env: Vec<(String, String)>,
    timeout: Duration,
    max_output: usize,
}

#[async_trait]
impl Tool for CommandTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn commands(&self) -> Vec<String> {
        self.commands.clone()
    }

    /// A little longer than the command's own limit, so that it is killed (group and
    /// all) and reported by the tool rather than dropped by the gateway.
    fn timeout(&self) -> Option<Duration> {
        Some(self.timeout + Duration::from_secs(5))
    }

    async fn call(&self, call: ToolCall) -> Result<ToolResult, ToolError> {
        if let Some(refusal) = self.rules.refusal(&self.name, &call.args) {
            return Ok(ToolResult::fail(refusal + "\n", 1));
        }
        let rel = call.cwd.clone().unwrap_or_default();
        let workspace = call.workspace.clone();
        let opened = crate::fsutil::blocking(move || {
            crate::fsutil::Beneath::open(&workspace)?.open_dir(&rel)
        })
        .await;
        let cwd = match opened {
            Ok(fd) => fd,
            Err(e) if e.is_not_found() => {
                return Ok(ToolResult::fail(
                    format!(
                        "{}: the working directory {} does not exist in the workspace\n",
                        self.name,
                        call.cwd.as_deref().unwrap_or(".")
                    ),
                    1,
                ))
            }
            Err(e) => return Ok(ToolResult::fail(format!("{}: {e}\n", self.name), 1)),
        };
        run(self, &call, cwd).await
    }
}

/// Kill the process group on drop unless the command has been reaped.
struct GroupGuard(Option<u32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.take() {
            kill_group(pgid, libc::SIGKILL);
        }
    }
}

async fn run(tool: &CommandTool, call: &ToolCall, cwd: OwnedFd) -> Result<ToolResult, ToolError> {
    let mut cmd = tokio::process::Command::new(&tool.program);
    enter_dir_in_child(&mut cmd, &cwd);
    cmd.args(&tool.fixed_args)
        .args(&call.args)
        .env_clear()
        .env("PATH", base_path())
        .envs(tool.env.iter().map(|(k, v)| (k, v)))
        .stdin(if call.stdin.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return Ok(ToolResult::fail(
                format!(
                    "{}: cannot run '{}': {e}\n",
                    tool.name,
                    tool.program.display()
                ),
                127,
            ))
        }
    };
    // The child has entered the directory; the handle (close-on-exec) is not needed.
    drop(cwd);
    let mut guard = GroupGuard(child.id());
    if let (Some(mut stdin), Some(data)) = (child.stdin.take(), call.stdin.clone()) {
        tokio::spawn(async move {
            let _ = stdin.write_all(&data).await;
        });
    }
    let budget = tool.max_output;
    let out = child
        .stdout
        .take()
        .map(|s| tokio::spawn(read_capped(s, budget)));
    let err = child
        .stderr
        .take()
        .map(|s| tokio::spawn(read_capped(s, budget)));
    let (status, timed_out) = match tokio::time::timeout(tool.timeout, child.wait()).await {
        Ok(status) => (status?, false),
        Err(_) => {
            if let Some(pgid) = guard.0 {
                kill_group(pgid, libc::SIGKILL);
            }
            (child.wait().await?, true)
        }
    };
    // Whatever is left of the group (background children holding the pipes) goes too.
    if let Some(pgid) = guard.0.take() {
        kill_group(pgid, libc::SIGKILL);
    }
    let collect = |h: Option<Capture>| async {
        match h {
            None => (Vec::new(), 0),
            Some(h) => match tokio::time::timeout(Duration::from_secs(2), h).await {
                Ok(Ok(Ok(r))) => r,
                _ => (Vec::new(), 0),
            },
        }
    };
    let (stdout, out_total) = collect(out).await;
    let (stderr, err_total) = collect(err).await;
    let mut bytes = stdout;
    if !stderr.is_empty() {
        if !bytes.is_empty() && !bytes.ends_with(b"\n") {
            bytes.push(b'\n');
        }
        bytes.extend_from_slice(&stderr);
    }
    let total = out_total + err_total;
    let mut output = String::from_utf8_lossy(&bytes).into_owned();
    if output.len() > budget || total > budget {
        let mut cut = budget.min(output.len());
        while !output.is_char_boundary(cut) {
            cut -= 1;
        }
        output.truncate(cut);
        output.push_str(&format!(
            "\n[{}: output truncated: {total} bytes, the first {cut} shown (maxOutput)]\n",
            tool.name
        ));
    }
    if timed_out {
        output.push_str(&format!(
            "\n{}: timed out after {} s; the command and its child processes were killed\n",
            tool.name,
            tool.timeout.as_secs_f64()
        ));
        return Ok(ToolResult::fail(output, 124));
    }
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    Ok(ToolResult {
        output,
        exit_code: code,
    })
}

/// A stream being read by [`read_capped`].
type Capture = tokio::task::JoinHandle<std::io::Result<(Vec<u8>, usize)>>;

/// Read everything, keeping at most `max` bytes; returns the kept bytes and the total.
async fn read_capped<R: tokio::io::AsyncRead + Unpin>(
    mut r: R,
    max: usize,
) -> std::io::Result<(Vec<u8>, usize)> {
    let mut kept = Vec::new();
    let mut total = 0usize;
    let mut buf = [0u8; 8192];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok((kept, total));
        }
        total += n;
        let room = max.saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
}

/// Where `name` is on the gateway's `PATH`.
fn find_in_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&base_path())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Make the child's working directory the directory behind `dir` with `fchdir`, between
/// fork and exec: the directory was opened beneath the workspace handle, so nothing the
/// sandbox renames or links in the meantime changes where the command runs.
#[allow(unsafe_code)]
fn enter_dir_in_child(cmd: &mut tokio::process::Command, dir: &OwnedFd) {
    let raw = dir.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec. It makes one system call
    // (fchdir, async-signal-safe), allocates nothing and takes no lock. `raw` stays open
    // in the child: `dir` outlives `spawn`, and close-on-exec only closes it at exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fchdir(raw) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}

/// Send `signal` to the process group `pgid` (a child started with `process_group(0)`).
#[allow(unsafe_code)]
pub(crate) fn kill_group(pgid: u32, signal: libc::c_int) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return;
    };
    if pgid <= 1 {
        return;
    }
    // SAFETY: killpg only sends a signal to a process group; it touches no memory of
    // this process. The group is one the gateway created for its own child.
    unsafe {
        libc::killpg(pgid, signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn patterns() {
        let p = Pattern::new("push *");
        assert!(p.matches(&args("push")));
        assert!(p.matches(&args("push origin main")));
        assert!(!p.matches(&args("pull")));
        assert!(!p.matches(&args("-c x push")));
        let exact = Pattern::new("status");
        assert!(exact.matches(&args("status")));
        assert!(!exact.matches(&args("status -s")));
        let inner = Pattern::new("log --format=* *");
        assert!(inner.matches(&args("log --format=oneline")));
        assert!(inner.matches(&args("log --format=oneline -3")));
        assert!(!inner.matches(&args("log -3")));
        let one = Pattern::new("remote * show");
        assert!(one.matches(&args("remote -v show")));
        assert!(!one.matches(&args("remote show")));
        let anywhere = Pattern::new("** --output* **");
        assert!(anywhere.matches(&args("diff --output=/etc/x")));
        assert!(anywhere.matches(&args("log -p --stat --output /x")));
        assert!(anywhere.matches(&args("--output")));
        assert!(!anywhere.matches(&args("diff --stat")));
        assert!(!Pattern::new("** --output*").matches(&args("log --output /x")));
        let middle = Pattern::new("diff ** HEAD");
        assert!(middle.matches(&args("diff HEAD")));
        assert!(middle.matches(&args("diff --stat -w HEAD")));
        assert!(!middle.matches(&args("diff HEAD --stat")));
        assert!(Pattern::new("*").matches(&[]));
        assert!(Pattern::new("").matches(&[]));
        assert!(!Pattern::new("").matches(&args("x")));
        assert!(wildcard("a*c", "abbbc"));
        assert!(wildcard("*", ""));
        assert!(!wildcard("a*c", "abd"));
    }

    #[test]
    fn deny_wins_and_refusals_name_the_rule() {
        let rules = Rules::new(
            &["status *".into(), "push *".into(), "log *".into()],
            &["push *".into(), "config *".into()],
        );
        assert_eq!(
            rules.refusal("git", &args("push origin main")).unwrap(),
            "git: \"push origin main\" refused by rule deny \"push *\""
        );
        assert_eq!(
            rules.refusal("git", &args("rebase -i")).unwrap(),
            "git: \"rebase -i\" refused: it matches no allow rule (allow: \"status *\", \"push *\", \"log *\")"
        );
        assert_eq!(rules.refusal("git", &args("status --short")), None);
        assert_eq!(
            rules.check(&args("log -1")),
            RuleDecision::Allowed {
                rule: "log *".into()
            }
        );
    }

    #[tokio::test]
    async fn runs_argv_only_with_declared_env_cap_and_timeout() {
        let ws = tempfile::tempdir().unwrap();
        std::fs::create_dir(ws.path().join("sub")).unwrap();
        let manifest: Manifest = serde_json::from_value(serde_json::json!({
            "name": "sh",
            "tools": {
                "sh": {"command": "sh", "args": ["-c"], "allow": ["*"], "deny": ["exit*"],
                       "env": {"DECLARED": "${DECLARED_SRC}"}, "timeout": 1, "maxOutput": 100},
            },
        }))
        .unwrap();
        let env = |n: &str| (n == "DECLARED_SRC").then(|| "yes".to_string());
        let plugin = CommandToolPlugin::new(ws.path(), manifest, &env).unwrap();
        let tool = plugin.tools[0].clone();
        let call = |a: &[&str], cwd: Option<&str>| ToolCall {
            tool: "sh".into(),
            args: a.iter().map(|s| s.to_string()).collect(),
            stdin: Some(b"piped".to_vec()),
            cwd: cwd.map(str::to_string),
            workspace: ws.path().to_path_buf(),
            session: Default::default(),
            config: serde_json::json!({}),
            exec: None,
        };
        let r = tool
            .call(call(&["env | sort | cut -d= -f1; pwd; cat"], Some("sub")))
            .await
            .unwrap();
        assert_eq!(r.exit_code, 0, "{}", r.output);
        let lines: Vec<&str> = r.output.lines().collect();
        // sh itself adds PWD (and may add SHLVL, _); nothing of the gateway's leaks.
        for name in &lines[..lines.len() - 2] {
            assert!(
                ["DECLARED", "PATH", "PWD", "SHLVL", "_", "OLDPWD"].contains(name),
                "{}",
                r.output
            );
        }
        assert!(lines.contains(&"DECLARED"));
        assert!(lines[lines.len() - 2].ends_with("/sub"), "{}", r.output);
        assert_eq!(lines[lines.len() - 1], "piped");
        let r = tool.call(call(&["exit 3"], None)).await.unwrap();
        assert!(r.output.contains("refused by rule deny \"exit*\""));
        let r = tool
            .call(call(&["echo x >&2; exit 3"], None))
            .await
            .unwrap();
        assert_eq!((r.output.as_str(), r.exit_code), ("x\n", 3));
        let r = tool
            .call(call(&["yes | head -c 1000"], None))
            .await
            .unwrap();
        assert!(r
            .output
            .contains("output truncated: 1000 bytes, the first 100 shown"));
        let started = std::time::Instant::now();
        let r = tool
            .call(call(&["(sleep 30; echo late) & sleep 30"], None))
            .await
            .unwrap();
        assert_eq!(r.exit_code, 124, "{}", r.output);
        assert!(r.output.contains("timed out after 1 s"), "{}", r.output);
        assert!(started.elapsed() < Duration::from_secs(5));
        let r = tool.call(call(&["true"], Some("../.."))).await.unwrap();
        assert_eq!(r.exit_code, 1);
    }
}
