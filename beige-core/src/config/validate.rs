//! Validation of a deserialised config: names, references, limits and mounts.
//!
//! Owns the rules a config must pass before anything starts (agent names, providers,
//! skills, `pluginConfigs`, sandbox limits, the mount refusal rules) and the helpers the
//! rest of beige reuses for the same decisions: [`parse_memory_limit`],
//! [`check_extra_mount`] (with the [`WritableTrees`] no mount may come from inside),
//! [`did_you_mean`], [`validate_tools`]. Every check returns the first problem as a
//! [`ConfigError`] that names the file and the place in it. Reads the file system only
//! to resolve mounted host paths and to check that they and skill folders exist.

use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use crate::home::{normalize, BeigeHome};

use super::error::{ConfigError, NameKind};
use super::keypath::KeyPath;
use super::resolve::Resolver;
use super::types::{AgentConfig, Config, ModelRef};

/// Provider names whose `api` beige knows without being told.
const BUILTIN_PROVIDERS: [&str; 3] = ["anthropic", "openai", "google"];

/// Container paths beige mounts itself; extra mounts may not be or shadow them.
const RESERVED_TARGETS: [&str; 4] = ["/workspace", "/tools", "/skills", "/beige"];

/// Where Docker's socket usually lives (any file named `docker.sock` is refused too).
const DOCKER_SOCKETS: [&str; 2] = ["/var/run/docker.sock", "/run/docker.sock"];

/// `^[a-z0-9][a-z0-9_-]{0,62}$`: safe as a path segment and in a container name.
pub fn is_valid_agent_name(name: &str) -> bool {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    first_ok
        && name.len() <= 63
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

/// A valid name close to `name`, for the error message.
fn suggest_agent_name(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars().flat_map(char::to_lowercase) {
        let c = if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' {
            c
        } else {
            '-'
        };
        let separator = c == '-' || c == '_';
        if separator && (out.is_empty() || out.ends_with('-')) {
            continue;
        }
        out.push(c);
    }
    out.truncate(63);
    let out = out.trim_end_matches(['-', '_']).to_string();
    if out.is_empty() {
        "agent".to_string()
    } else {
        out
    }
}

/// Edit distance counting a swap of two neighbours as one edit (optimal string
/// alignment), so `gti` is one edit from `git`.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// The candidate closest to `name`, if one is close enough to be a likely typo
/// (case-insensitive; at most one edit per three characters, at least one).
pub fn did_you_mean<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let lower = name.to_lowercase();
    let limit = (lower.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .map(|c| (edit_distance(&lower, &c.to_lowercase()), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn unknown_name(
    file: &Path,
    path: KeyPath,
    kind: NameKind,
    name: &str,
    known: &[&str],
) -> ConfigError {
    ConfigError::UnknownName {
        file: file.to_path_buf(),
        path: path.to_string(),
        kind,
        name: name.to_string(),
        suggestion: did_you_mean(name, known.iter().copied()).map(str::to_string),
        known: known.iter().map(|s| s.to_string()).collect(),
    }
}

fn invalid(file: &Path, path: KeyPath, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        file: file.to_path_buf(),
        path: path.to_string(),
        message: message.into(),
    }
}

/// Parse a memory limit the way the original did: optional whitespace, a number
/// (decimals allowed), an optional unit `k`/`m`/`g` (powers of 1024, any case) and an
/// optional `b`. Plain numbers are bytes; the result is floored and must be > 0.
pub fn parse_memory_limit(s: &str) -> Option<u64> {
    let s = s.trim();
    let number_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(number_end);
    let (int, frac) = number.split_once('.').unwrap_or((number, "0"));
    if int.is_empty() || frac.is_empty() || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let unit = unit.trim_start().to_ascii_lowercase();
    let unit = unit.strip_suffix('b').unwrap_or(&unit);
    let factor: f64 = match unit {
        "" => 1.0,
        "k" => 1024.0,
        "m" => 1024.0 * 1024.0,
        "g" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let bytes = (number.parse::<f64>().ok()? * factor).floor();
    // 2^64 is exactly representable; anything at or above it does not fit.
    (1.0..18_446_744_073_709_551_616.0)
        .contains(&bytes)
        .then_some(bytes as u64)
}

/// A checked `extraMounts` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountTarget {
    /// The host path to give Docker: canonical (symlinks resolved) when it exists, else
    /// absolute and lexically normalised.
    pub host: PathBuf,
    /// The absolute container path, without the `:ro`/`:rw` suffix.
    pub container: String,
    /// The target ended in `:ro`; without a suffix (or with `:rw`) the mount is
    /// read-write.
    pub read_only: bool,
}

/// Check one `extraMounts` entry (`host` already resolved) against the refusal rules:
/// an absolute host path that is not `/`, not a Docker socket (or a folder holding one),
/// not `BEIGE_HOME`, not inside it and not an ancestor of it, not inside any agent's
/// workspace (`agent_workspace` and every workspace in `writable`) and not inside any
/// folder an agent mounts read-write — an agent could replace anything in those with a
/// symlink to any host path before the container is next created; and an absolute
/// container path that does not shadow `/workspace`, `/tools`, `/skills` or `/beige`.
/// The path is checked as written and, when it exists, with symlinks resolved; that
/// canonical path is the one returned. That the host path exists is checked when the
/// config loads, not here. The error is the reason, for a sentence like `refusing to
/// mount X at Y: <reason>`.
pub fn check_extra_mount(
    home: &BeigeHome,
    agent_workspace: &Path,
    writable: &WritableTrees,
    host: &Path,
    container: &str,
) -> Result<MountTarget, String> {
    let lexical = absolute_host_path(host)?;
    let forms = with_real(&lexical);
    if let Some(reason) = writable.refusal(&forms) {
        return Err(reason);
    }
    let own = WritableTrees {
        trees: vec![WritableTree {
            agent: String::new(),
            path: normalize(agent_workspace),
            kind: WritableKind::Workspace,
        }],
    };
    if let Some(reason) = own.refusal(&forms) {
        return Err(reason);
    }
    check_host_path(home, None, host)?;
    let (container, read_only) = parse_container_target(container)?;
    Ok(MountTarget {
        host: forms.last().cloned().unwrap_or(lexical),
        container,
        read_only,
    })
}

/// A path lexically normalised, and with symlinks resolved when it exists (the second
/// element, only when it differs).
fn with_real(p: &Path) -> Vec<PathBuf> {
    let mut forms = vec![normalize(p)];
    if let Ok(real) = std::fs::canonicalize(p) {
        if real != forms[0] {
            forms.push(real);
        }
    }
    forms
}

/// What kind of agent-writable folder a [`WritableTree`] is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WritableKind {
    /// The agent's workspace (`/workspace`).
    Workspace,
    /// A read-write `extraMounts` source, mounted at `container`.
    Mount {
        /// Where the agent's sandbox sees it, without the `:rw` suffix.
        container: String,
    },
}

/// A host folder an agent can write from inside its sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WritableTree {
    /// The agent that can write it.
    pub agent: String,
    /// Absolute and lexically normalised.
    pub path: PathBuf,
    /// Whether it is the agent's workspace or a read-write extra mount.
    pub kind: WritableKind,
}

/// Every host folder some agent can write: each agent's workspace (the default one or
/// its `workspaceDir`) and each `extraMounts` source it mounts read-write. Whatever
/// lies inside one can be swapped for a symlink by an agent, so no mount source may
/// come from there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WritableTrees {
    trees: Vec<WritableTree>,
}

impl WritableTrees {
    /// The trees of a loaded config (its paths already resolved).
    pub fn of_config(config: &Config, home: &BeigeHome) -> Self {
        Self::collect(config, home, normalize)
    }

    /// The trees of `config`, its paths resolved through `resolve`.
    pub(crate) fn collect(
        config: &Config,
        home: &BeigeHome,
        resolve: impl Fn(&Path) -> PathBuf,
    ) -> Self {
        let mut trees = Vec::new();
        for (name, agent) in &config.agents {
            let workspace = match &agent.workspace_dir {
                Some(dir) => resolve(dir),
                None => home.default_workspace(name),
            };
            trees.push(WritableTree {
                agent: name.clone(),
                path: normalize(&workspace),
                kind: WritableKind::Workspace,
            });
            for (host, container) in &agent.sandbox.extra_mounts {
                // An unreadable target counts as read-write (it is refused anyway).
                let (target, read_only) = parse_container_target(container)
                    .unwrap_or_else(|_| (container.clone(), false));
                if !read_only {
                    trees.push(WritableTree {
                        agent: name.clone(),
                        path: normalize(&resolve(Path::new(host))),
                        kind: WritableKind::Mount { container: target },
                    });
                }
            }
        }
        Self { trees }
    }

    /// Add a tree (for embedders that build specs without a config).
    pub fn push(&mut self, tree: WritableTree) {
        self.trees.push(tree);
    }

    /// The trees in order: for each agent of the config its workspace, then its
    /// read-write mounts; then those added with [`push`](Self::push).
    pub fn iter(&self) -> impl Iterator<Item = &WritableTree> {
        self.trees.iter()
    }

    /// Why a mount source (`forms`: as written and resolved) may not be used: it is a
    /// workspace or inside one, or strictly inside a read-write mount source (the same
    /// folder mounted read-write by several agents is a shared folder, which is fine).
    fn refusal(&self, forms: &[PathBuf]) -> Option<String> {
        self.refusal_where(forms, None)
    }

    /// Why `agent`'s workspace (`forms`) may not be used: it is strictly inside another
    /// agent's workspace or inside a folder some agent (itself too) mounts read-write.
    /// The same folder as another agent's workspace is a shared workspace, which is fine.
    fn workspace_refusal(&self, agent: &str, forms: &[PathBuf]) -> Option<String> {
        self.refusal_where(forms, Some(agent))
    }

    fn refusal_where(&self, forms: &[PathBuf], workspace_of: Option<&str>) -> Option<String> {
        for tree in &self.trees {
            let own_workspace =
                tree.kind == WritableKind::Workspace && Some(tree.agent.as_str()) == workspace_of;
            if own_workspace {
                continue;
            }
            for t in with_real(&tree.path) {
                let Some(p) = forms.iter().find(|p| p.starts_with(&t)) else {
                    continue;
                };
                if workspace_of.is_some() && *p == t {
                    continue;
                }
                let whose = if tree.agent.is_empty() {
                    "this agent".to_string()
                } else {
                    format!("agent '{}'", tree.agent)
                };
                let why = "an agent can replace anything in there with a symlink to any host \
                           path before its sandbox is next created";
                match &tree.kind {
                    WritableKind::Workspace => {
                        let at = if *p == t { "that is" } else { "that is inside" };
                        let fix = if workspace_of.is_some() {
                            "Use a folder outside every other agent's workspace"
                        } else {
                            "Mount a folder outside every agent's workspace"
                        };
                        return Some(format!(
                            "{at} the workspace of {whose} ({}): {why}. {fix}",
                            t.display()
                        ));
                    }
                    WritableKind::Mount { container } if *p != t => {
                        return Some(format!(
                            "that is inside {}, which {whose} mounts read-write at {container}: \
                             {why}. Use a folder outside it, or make that mount read-only \
                             (\"{container}:ro\")",
                            t.display()
                        ));
                    }
                    WritableKind::Mount { .. } => {}
                }
            }
        }
        None
    }
}

/// The host side of a mount or workspace: absolute, and nothing that hands the agent
/// the host or beige's own state. `allowed` is the one place inside `BEIGE_HOME` that
/// may be used (the agent's own folder, for `workspaceDir`); extra mounts have none.
/// Checks the path as written and, when it exists, with symlinks resolved; returns it
/// as written, normalised.
pub(crate) fn check_host_path(
    home: &BeigeHome,
    allowed: Option<&Path>,
    host: &Path,
) -> Result<PathBuf, String> {
    let lexical = absolute_host_path(host)?;
    let homes = with_real(home.root());
    let allowed = allowed.map(with_real).unwrap_or_default();
    let what = "the config, the API token, the database and every agent's workspace";
    for p in with_real(&lexical) {
        if p == Path::new("/") {
            return Err("that is the host's whole file system".to_string());
        }
        if p.file_name().is_some_and(|n| n == "docker.sock") {
            return Err(
                "that is a Docker socket — whoever can reach it controls the host".to_string(),
            );
        }
        if DOCKER_SOCKETS.iter().any(|s| Path::new(s).starts_with(&p))
            || p.join("docker.sock").exists()
        {
            return Err(
                "that folder holds a Docker socket — whoever can reach it controls the host"
                    .to_string(),
            );
        }
        for h in &homes {
            if p == *h {
                return Err(format!("that is BEIGE_HOME, which holds {what}"));
            }
            if h.starts_with(&p) {
                return Err(format!(
                    "that folder contains BEIGE_HOME ({}), which holds {what}",
                    h.display()
                ));
            }
            if p.starts_with(h) && !allowed.iter().any(|a| p.starts_with(a)) {
                return Err(match allowed.first() {
                    Some(a) => format!(
                        "that is inside BEIGE_HOME ({}), which holds {what}; only the agent's \
                         own folder ({}) may be used from there",
                        h.display(),
                        a.display()
                    ),
                    None => format!(
                        "that is inside BEIGE_HOME ({}), which holds {what}; mount a folder \
                         outside it",
                        h.display()
                    ),
                });
            }
        }
    }
    Ok(lexical)
}

/// `host` normalised, if it is absolute and does not climb above `/`.
fn absolute_host_path(host: &Path) -> Result<PathBuf, String> {
    if !host.is_absolute() {
        return Err("the host path must be absolute".to_string());
    }
    let lexical = normalize(host);
    if lexical.components().any(|c| c == Component::ParentDir) {
        return Err("the host path must not climb above / with '..'".to_string());
    }
    Ok(lexical)
}

/// `"/data:ro"` → (`/data`, read-only).
fn parse_container_target(container: &str) -> Result<(String, bool), String> {
    let (target, read_only) = match container.strip_suffix(":ro") {
        Some(t) => (t, true),
        None => (container.strip_suffix(":rw").unwrap_or(container), false),
    };
    if target.contains(':') {
        return Err(format!(
            "the container path '{target}' contains ':' — only a ':ro' (read-only) suffix is allowed"
        ));
    }
    let path = Path::new(target);
    if !path.is_absolute() {
        return Err(format!(
            "the container path '{target}' must be absolute, e.g. /data"
        ));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(format!(
            "the container path '{target}' must not contain '..'"
        ));
    }
    let path = normalize(path);
    if path == Path::new("/") {
        return Err("the container path must not be / itself".to_string());
    }
    if let Some(reserved) = RESERVED_TARGETS.iter().find(|r| path.starts_with(r)) {
        return Err(format!(
            "the container path {} would shadow {reserved}, which beige mounts itself — \
             choose another path, e.g. /mnt/data",
            path.display()
        ));
    }
    Ok((path.to_string_lossy().into_owned(), read_only))
}

/// Checks on the raw tree that serde would only answer with a terse message.
pub(crate) fn check_raw(value: &Value, file: &Path) -> Result<(), ConfigError> {
    if let Some(agents) = value.get("agents").and_then(Value::as_object) {
        for (name, agent) in agents {
            if agent.pointer("/sandbox/network").and_then(Value::as_str) == Some("host") {
                let path = KeyPath::root()
                    .key("agents")
                    .key(name)
                    .key("sandbox")
                    .key("network");
                return Err(invalid(
                    file,
                    path,
                    "network \"host\" is refused: it would give the sandbox the host's network \
                     stack, including every service listening on the host's loopback (the \
                     gateway's API too). Use \"none\" (the default: loopback only) or \"bridge\" \
                     (Docker's bridge, open egress).",
                ));
            }
        }
    }
    if let Some(port) = value.pointer("/gateway/port") {
        if !port.as_u64().is_some_and(|p| (1..=65535).contains(&p)) {
            let path = KeyPath::root().key("gateway").key("port");
            return Err(invalid(
                file,
                path,
                format!("invalid port {port} — use a number from 1 to 65535 (default 7433)"),
            ));
        }
    }
    Ok(())
}

/// All load-time checks, in file order; the first problem wins.
pub(crate) fn validate(
    config: &Config,
    file: &Path,
    home: &BeigeHome,
    resolver: &Resolver,
) -> Result<(), ConfigError> {
    let writable = WritableTrees::collect(config, home, |p| resolver.resolve(p));
    let providers = KeyPath::root().key("llm").key("providers");
    for (name, provider) in &config.llm.providers {
        if provider.api.is_none() && !BUILTIN_PROVIDERS.contains(&name.as_str()) {
            return Err(ConfigError::ProviderApiRequired {
                file: file.to_path_buf(),
                path: providers.key(name).to_string(),
                provider: name.clone(),
            });
        }
    }
    for (name, skill) in &config.skills {
        let dir = resolver.resolve(&skill.path);
        if !dir.join("skill.json").is_file() {
            let path = KeyPath::root().key("skills").key(name).key("path");
            return Err(invalid(
                file,
                path,
                format!(
                    "{} has no skill.json — a skill is a folder with a skill.json; fix the path \
                     (relative paths are resolved against the config file's folder)",
                    dir.display()
                ),
            ));
        }
    }
    if let Some(approvals) = &config.approvals {
        if let Some((key, message)) = approvals.problems().into_iter().next() {
            return Err(ConfigError::Invalid {
                file: file.to_path_buf(),
                path: key,
                message,
            });
        }
    }
    if config.agents.is_empty() {
        return Err(ConfigError::NoAgents {
            file: file.to_path_buf(),
        });
    }
    for (name, agent) in &config.agents {
        validate_agent(config, file, home, resolver, &writable, name, agent)?;
    }
    validate_mcp(config, file)?;
    validate_users(config, file)?;
    if let Some((key, message)) = config.store.as_ref().and_then(|s| s.problem()) {
        let mut path = KeyPath::root().key("store");
        for part in key.split('.') {
            path = path.key(part);
        }
        return Err(invalid(file, path, message));
    }
    if let Some((key, message)) = config
        .cluster
        .as_ref()
        .and_then(|c| c.problem(config.store.as_ref()))
    {
        let mut path = KeyPath::root().key("cluster");
        for part in key.split('.') {
            path = path.key(part);
        }
        return Err(invalid(file, path, message));
    }
    validate_budgets(config, file)?;
    validate_schedules(config, file)?;
    if let Some(listen) = config.metrics_listen() {
        if let Err(message) = crate::metrics::listen_address(listen) {
            let path = KeyPath::root()
                .key("telemetry")
                .key("metrics")
                .key("listen");
            return Err(invalid(file, path, message));
        }
    }
    Ok(())
}

/// `users`: valid names, `owner` only on `"*"`, role patterns that are agent names or
/// globs, and each Telegram id mapped to one user at most.
fn validate_users(config: &Config, file: &Path) -> Result<(), ConfigError> {
    use beige_client::auth::Role;
    let mut telegram: std::collections::HashMap<i64, &str> = std::collections::HashMap::new();
    for (name, user) in &config.users {
        let at = KeyPath::root().key("users").key(name);
        if !super::users::is_valid_user_name(name) {
            return Err(invalid(
                file,
                at,
                format!("user name '{name}' is not valid; use a lowercase letter, then lowercase letters, digits, '-' or '_' (not owner, system or sandbox)"),
            ));
        }
        for (pattern, role) in &user.roles {
            let at = at.key("roles").key(pattern);
            if *role == Role::Owner && pattern != "*" {
                return Err(invalid(
                    file,
                    at,
                    format!("'owner' is a role on the whole gateway: write it as roles: {{ \"*\": \"owner\" }}, or give '{pattern}' the role operator"),
                ));
            }
            let literal = !pattern.contains('*');
            if literal && !config.agents.contains_key(pattern) {
                let known: Vec<&str> = config.agents.keys().map(String::as_str).collect();
                return Err(unknown_name(file, at, NameKind::Agent, pattern, &known));
            }
        }
        for id in &user.telegram {
            if let Some(other) = telegram.insert(*id, name) {
                return Err(invalid(
                    file,
                    at.key("telegram"),
                    format!("Telegram id {id} is already user '{other}'s; one id is one user"),
                ));
            }
        }
    }
    Ok(())
}

/// `mcp.servers` and `agents.<a>.mcpConfigs`: valid names that are no plugin's or core
/// tool's, exactly one of `command` and `url` per resolved server, readable time
/// limits, and `user: "agent"` never with credentials.
fn validate_mcp(config: &Config, file: &Path) -> Result<(), ConfigError> {
    use super::mcp::{is_valid_server_name, McpUser};
    let Some(mcp) = &config.mcp else {
        for (name, agent) in &config.agents {
            if let Some(server) = agent.mcp_configs.keys().next() {
                let path = KeyPath::root()
                    .key("agents")
                    .key(name)
                    .key("mcpConfigs")
                    .key(server);
                return Err(unknown_name(file, path, NameKind::McpServer, server, &[]));
            }
        }
        return Ok(());
    };
    let servers: Vec<&str> = mcp.servers.keys().map(String::as_str).collect();
    for name in mcp.servers.keys() {
        let at = KeyPath::root().key("mcp").key("servers").key(name);
        if !is_valid_server_name(name) {
            return Err(invalid(
                file,
                at,
                format!("MCP server name '{name}' is not valid; use a lowercase letter, then lowercase letters, digits or '-'"),
            ));
        }
        if crate::vocab::CORE_TOOLS.contains(&name.as_str()) || config.plugins.contains_key(name) {
            return Err(invalid(
                file,
                at,
                format!("MCP server name '{name}' is already a core tool's or a plugin's name (it becomes /tools/bin/{name}); rename the server"),
            ));
        }
    }
    for (agent_name, agent) in &config.agents {
        let at = KeyPath::root()
            .key("agents")
            .key(agent_name)
            .key("mcpConfigs");
        for server in agent.mcp_configs.keys() {
            if !mcp.servers.contains_key(server) {
                return Err(unknown_name(
                    file,
                    at.key(server),
                    NameKind::McpServer,
                    server,
                    &servers,
                ));
            }
        }
        for name in mcp.servers.keys() {
            let at = if agent.mcp_configs.contains_key(name) {
                at.key(name)
            } else {
                KeyPath::root().key("mcp").key("servers").key(name)
            };
            let server = match config.mcp_server(agent_name, name) {
                Ok(server) => server,
                Err(message) => return Err(invalid(file, at, message)),
            };
            match (&server.command, &server.url) {
                (Some(_), Some(_)) | (None, None) => {
                    return Err(invalid(
                        file,
                        at,
                        "an MCP server has exactly one of `command` (run in the sandbox) and `url` (a remote server)",
                    ))
                }
                (Some(c), None) if c.trim().is_empty() => {
                    return Err(invalid(file, at.key("command"), "`command` is empty"))
                }
                _ => {}
            }
            let limits = server.timeout.iter().chain(server.tool_timeouts.values());
            if let Some(bad) = limits
                .into_iter()
                .find(|t| t.duration().is_none_or(|d| d.is_zero()))
            {
                return Err(invalid(
                    file,
                    at.key("timeout"),
                    format!("time limit {bad:?} is not valid; write seconds (60) or a number with s, m or h (\"90s\", \"2m\")"),
                ));
            }
            match server.user {
                Some(McpUser::Uid(0)) => {
                    return Err(invalid(file, at.key("user"), "an MCP server may not run as root (uid 0)"))
                }
                Some(McpUser::Named(_)) if !server.credentials.is_empty() => {
                    return Err(invalid(
                        file,
                        at.key("user"),
                        "`user: \"agent\"` runs the server as the agent's own user, which could read the server's brokered credentials; it is refused for servers with `credentials`",
                    ))
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// `schedules.<name>`: valid names, and each spec valid under this config
/// ([`crate::schedule::check_spec`]: the agent exists, `tools` are its own, …).
fn validate_schedules(config: &Config, file: &Path) -> Result<(), ConfigError> {
    for (id, spec) in &config.schedules {
        let at = KeyPath::root().key("schedules").key(id);
        if !crate::schedule::is_valid_schedule_key(id) {
            return Err(invalid(
                file,
                at,
                format!("schedule name '{id}' is not valid; use 1-64 letters, digits, '_', '-' or '.', not starting with 'sch_'"),
            ));
        }
        if let Err(p) = crate::schedule::check_spec(config, spec) {
            let mut path = at;
            for part in p.field.split('.').filter(|s| !s.is_empty()) {
                path = match part.split_once('[') {
                    Some((k, rest)) => {
                        let i = rest.trim_end_matches(']').parse().unwrap_or(0);
                        path.key(k).index(i)
                    }
                    None => path.key(part),
                };
            }
            return Err(invalid(file, path, p.message));
        }
    }
    Ok(())
}

/// `budgets` and `agents.<a>.budgets`: limits are finite and not negative, and no model
/// an agent may use is without a price under a `costUsd` limit (unless
/// `unknownModelPrice: "uncounted"`).
fn validate_budgets(config: &Config, file: &Path) -> Result<(), ConfigError> {
    let check = |at: KeyPath, b: &crate::budget::BudgetsConfig| -> Result<(), ConfigError> {
        let costs = [
            ("session", b.session.and_then(|s| s.cost_usd)),
            ("turn", b.turn.and_then(|t| t.cost_usd)),
        ];
        for (scope, cost) in costs {
            if let Some(c) = cost.filter(|c| !c.is_finite() || *c < 0.0) {
                return Err(invalid(
                    file,
                    at.key(scope).key("costUsd"),
                    format!("costUsd must be a number of US dollars, 0 or more (got {c})"),
                ));
            }
        }
        if let Some(c) = b
            .agent
            .and_then(|a| a.day)
            .and_then(|d| d.cost_usd)
            .filter(|c| !c.is_finite() || *c < 0.0)
        {
            return Err(invalid(
                file,
                at.key("agent").key("day").key("costUsd"),
                format!("costUsd must be a number of US dollars, 0 or more (got {c})"),
            ));
        }
        Ok(())
    };
    if let Some(b) = &config.budgets {
        check(KeyPath::root().key("budgets"), b)?;
    }
    for (name, agent) in &config.agents {
        if let Some(b) = &agent.budgets {
            check(KeyPath::root().key("agents").key(name).key("budgets"), b)?;
        }
        let limits = crate::budget::Limits::for_agent(config, name);
        if !limits.has_cost_limit()
            || limits.unknown_model_price == crate::budget::UnknownModelPrice::Uncounted
        {
            continue;
        }
        for m in std::iter::once(&agent.model).chain(agent.fallback_models.iter()) {
            let overrides = config
                .llm
                .providers
                .get(&m.provider)
                .and_then(|p| p.models.get(&m.model));
            if !crate::llm::catalog::lookup(&m.model, overrides).priced {
                let path = KeyPath::root()
                    .key("llm")
                    .key("providers")
                    .key(&m.provider)
                    .key("models")
                    .key(&m.model)
                    .key("cost");
                return Err(invalid(
                    file,
                    path,
                    format!(
                        "agent '{name}' has a costUsd budget, but model '{}/{}' has no price: \
                         set its cost ({{input, output, cacheRead, cacheWrite}} in US dollars \
                         per million tokens), or set budgets.unknownModelPrice to \
                         \"uncounted\" to count its calls at no cost",
                        m.provider, m.model
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn validate_agent(
    config: &Config,
    file: &Path,
    home: &BeigeHome,
    resolver: &Resolver,
    writable: &WritableTrees,
    name: &str,
    agent: &AgentConfig,
) -> Result<(), ConfigError> {
    let skills: Vec<&str> = config.skills.keys().map(String::as_str).collect();
    let at = KeyPath::root().key("agents").key(name);
    if !is_valid_agent_name(name) {
        return Err(ConfigError::InvalidAgentName {
            file: file.to_path_buf(),
            path: at.to_string(),
            agent: name.to_string(),
            suggestion: suggest_agent_name(name),
        });
    }
    check_model(config, file, at.key("model"), &agent.model)?;
    for (i, model) in agent.fallback_models.iter().enumerate() {
        check_model(config, file, at.key("fallbackModels").index(i), model)?;
    }
    if agent.max_turns == 0 {
        return Err(invalid(
            file,
            at.key("maxTurns"),
            "maxTurns must be at least 1 (model turns per prompt; default 50)",
        ));
    }
    check_agent_skills(file, &at, agent, &skills)?;
    let plugins: Vec<&str> = config.plugins.keys().map(String::as_str).collect();
    for plugin in agent.plugin_configs.keys() {
        if !config.plugins.contains_key(plugin) {
            let path = at.key("pluginConfigs").key(plugin);
            return Err(unknown_name(file, path, NameKind::Plugin, plugin, &plugins));
        }
    }

    let sandbox = &agent.sandbox;
    let at_sandbox = at.key("sandbox");
    if parse_memory_limit(&sandbox.memory_limit).is_none() {
        return Err(invalid(
            file,
            at_sandbox.key("memoryLimit"),
            format!(
                "invalid memoryLimit '{}' — use a number with an optional unit k, m or g \
                 (powers of 1024) and an optional b, e.g. \"512m\" or \"3g\"",
                sandbox.memory_limit
            ),
        ));
    }
    if sandbox.pids_limit <= 0 {
        return Err(invalid(
            file,
            at_sandbox.key("pidsLimit"),
            format!(
                "pidsLimit must be greater than 0 (got {}; default 512)",
                sandbox.pids_limit
            ),
        ));
    }
    if sandbox.warm_pool > super::types::MAX_WARM_POOL {
        return Err(invalid(
            file,
            at_sandbox.key("warmPool"),
            format!(
                "warmPool must be at most {} (got {}; default 0, no spare containers)",
                super::types::MAX_WARM_POOL,
                sandbox.warm_pool
            ),
        ));
    }
    if let Some(cpus) = sandbox.cpus {
        if !(cpus.is_finite() && cpus > 0.0) {
            return Err(invalid(
                file,
                at_sandbox.key("cpus"),
                format!("cpus must be a positive number, e.g. 1.5 (got {cpus})"),
            ));
        }
    }
    if let Some(user) = &sandbox.user {
        if !is_valid_user(user) {
            return Err(invalid(
                file,
                at_sandbox.key("user"),
                format!(
                    "invalid user '{user}' — use \"uid:gid\" with numeric ids (e.g. \"1000:1000\") \
                     or \"root\", or leave it out to run as the owner of the workspace"
                ),
            ));
        }
    }

    let workspace = match &agent.workspace_dir {
        Some(dir) => {
            let dir = resolver.resolve(dir);
            check_host_path(home, Some(&home.agent_dir(name)), &dir)
                .and_then(
                    |_| match writable.workspace_refusal(name, &with_real(&dir)) {
                        Some(reason) => Err(reason),
                        None => Ok(()),
                    },
                )
                .map_err(|reason| {
                    invalid(
                        file,
                        at.key("workspaceDir"),
                        format!("cannot use {} as the workspace: {reason}", dir.display()),
                    )
                })?;
            dir
        }
        None => home.default_workspace(name),
    };
    for (host, container) in &sandbox.extra_mounts {
        let resolved = resolver.resolve(Path::new(host));
        check_extra_mount(home, &workspace, writable, &resolved, container)
            .and_then(|mount| match mount.host.exists() {
                true => Ok(()),
                false => Err("the host path does not exist — create it, or fix the path \
                              (relative paths are resolved against the config file's folder)"
                    .to_string()),
            })
            .map_err(|reason| ConfigError::MountRefused {
                file: file.to_path_buf(),
                path: at_sandbox.key("extraMounts").key(host).to_string(),
                host: resolved.display().to_string(),
                container: container.clone(),
                reason,
            })?;
    }
    check_egress(config, file, &at, name, agent)?;
    check_policy(file, &at, agent)
}

/// `agents.<a>.policy`: the rules' own checks ([`crate::policy::rules::validate`]),
/// examples included, named by their place in the file.
fn check_policy(file: &Path, at: &KeyPath, agent: &AgentConfig) -> Result<(), ConfigError> {
    use crate::policy::rules::{self, KeyStep};
    let Some(policy) = &agent.policy else {
        return Ok(());
    };
    rules::validate(policy, &agent.tools, &agent.deny_tools).map_err(|e| {
        let path = e.at.iter().fold(at.key("policy"), |p, step| match step {
            KeyStep::Key(k) => p.key(*k),
            KeyStep::Index(i) => p.index(*i),
        });
        invalid(file, path, e.message)
    })
}

/// Variables the gateway sets in a sandbox with egress; `extraEnv` may not set them.
const EGRESS_ENV: [&str; 11] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
    "grpc_proxy",
    "NODE_USE_ENV_PROXY",
    "GRPC_PROXY",
];

/// An agent with `egress`: a non-root sandbox with no network of its own and the Unix
/// link (egress streams travel over it), valid rules, and no proxy variables of its own.
fn check_egress(
    config: &Config,
    file: &Path,
    at: &KeyPath,
    name: &str,
    agent: &AgentConfig,
) -> Result<(), ConfigError> {
    let Some(egress) = &agent.egress else {
        return Ok(());
    };
    let sandbox = at.key("sandbox");
    if agent.sandbox.network != super::NetworkMode::None {
        return Err(invalid(
            file,
            sandbox.key("network"),
            "egress needs network \"none\" and the shim link: with \"bridge\" the sandbox \
             has open egress and no rule applies; remove `egress` or set network \"none\"",
        ));
    }
    if agent.sandbox.user.as_deref() == Some("root") {
        return Err(invalid(
            file,
            sandbox.key("user"),
            "egress needs a non-root sandbox user: a root sandbox has no shim link to carry \
             it; remove `egress` or set user to `uid:gid`",
        ));
    }
    if agent.sandbox.link != super::LinkMode::Unix {
        return Err(invalid(
            file,
            sandbox.key("link"),
            "egress needs the shim link over its Unix socket (`link: \"unix\"`, the \
             default); egress over `attach` is not supported yet",
        ));
    }
    if let Some(k) = agent.sandbox.extra_env.keys().find(|k| {
        EGRESS_ENV.contains(&k.as_str())
            || beige_protocol::link::EGRESS_CA_ENV
                .iter()
                .any(|(ca, _)| ca == k)
    }) {
        return Err(invalid(
            file,
            sandbox.key("extraEnv").key(k),
            format!(
                "the gateway sets {k} in a sandbox with egress (the proxy, and the CA \
                 bundle that holds the image's roots and the beige CA); remove it from \
                 extraEnv"
            ),
        ));
    }
    let first = |errors: Vec<crate::egress::config::RuleError>| {
        let e = errors.into_iter().next();
        ConfigError::Invalid {
            file: file.to_path_buf(),
            path: e.as_ref().map(|e| e.path.clone()).unwrap_or_default(),
            message: e.map(|e| e.message).unwrap_or_default(),
        }
    };
    let rules =
        crate::egress::config::rule_set(config.egress.as_ref(), name, egress, 0).map_err(first)?;
    // A placeholder's variable is set per exec; extraEnv would hide or fight it.
    for credential in rules.credentials() {
        if let crate::egress::config::Delivery::Placeholder { env, .. } = &credential.delivery {
            if agent.sandbox.extra_env.contains_key(env) {
                return Err(invalid(
                    file,
                    sandbox.key("extraEnv").key(env),
                    format!(
                        "the gateway sets {env} in every exec (the placeholder of credential \
                         '{}'); remove it from extraEnv",
                        credential.name
                    ),
                ));
            }
        }
    }
    crate::egress::config::settings(config.egress.as_ref(), name, egress).map_err(first)?;
    Ok(())
}

fn check_model(
    config: &Config,
    file: &Path,
    at: KeyPath,
    model: &ModelRef,
) -> Result<(), ConfigError> {
    if model.provider.trim().is_empty() || model.model.trim().is_empty() {
        return Err(invalid(
            file,
            at,
            "requires both provider and model, e.g. { provider: \"anthropic\", model: \"claude-sonnet-4-6\" }",
        ));
    }
    if !config.llm.providers.contains_key(&model.provider) {
        let known: Vec<&str> = config.llm.providers.keys().map(String::as_str).collect();
        return Err(unknown_name(
            file,
            at.key("provider"),
            NameKind::Provider,
            &model.provider,
            &known,
        ));
    }
    if model.compaction_threshold == Some(0) {
        return Err(invalid(
            file,
            at.key("compactionThreshold"),
            "compactionThreshold must be at least 1 (a token count, e.g. 100000)",
        ));
    }
    Ok(())
}

/// `root`, or `uid:gid` with numeric ids.
fn is_valid_user(user: &str) -> bool {
    let numeric = |id: &str| id.bytes().all(|b| b.is_ascii_digit()) && id.parse::<u32>().is_ok();
    user == "root"
        || user
            .split_once(':')
            .is_some_and(|(uid, gid)| numeric(uid) && numeric(gid))
}

fn check_agent_skills(
    file: &Path,
    at: &KeyPath,
    agent: &AgentConfig,
    known: &[&str],
) -> Result<(), ConfigError> {
    for (i, skill) in agent.skills.iter().enumerate() {
        if !known.contains(&skill.as_str()) {
            return Err(unknown_name(
                file,
                at.key("skills").index(i),
                NameKind::Skill,
                skill,
                known,
            ));
        }
    }
    Ok(())
}

/// Check every agent's `skills` against the configured skills plus those registered by
/// plugins. At load only configured skills are known; the gateway calls this again with
/// the plugins' skills once they are loaded.
pub fn validate_skills(
    config: &Config,
    file: &Path,
    plugin_skills: &[&str],
) -> Result<(), ConfigError> {
    let mut known: Vec<&str> = config.skills.keys().map(String::as_str).collect();
    known.extend(
        plugin_skills
            .iter()
            .copied()
            .filter(|s| !config.skills.contains_key(*s)),
    );
    for (name, agent) in &config.agents {
        check_agent_skills(
            file,
            &KeyPath::root().key("agents").key(name),
            agent,
            &known,
        )?;
    }
    Ok(())
}

/// Check every agent's `tools` against the tools the loaded plugins registered
/// (called by the gateway once plugins are loaded; `file` is the config file, for the
/// message).
pub fn validate_tools(
    config: &Config,
    file: &Path,
    registered: &[&str],
) -> Result<(), ConfigError> {
    let servers = config
        .mcp
        .as_ref()
        .map(|m| m.servers.clone())
        .unwrap_or_default();
    for (name, agent) in &config.agents {
        let at = KeyPath::root().key("agents").key(name).key("tools");
        for (i, tool) in agent.tools.iter().enumerate() {
            // `files`, `files.*`, `!github.delete_*`: patterns over an MCP server's tools.
            if super::mcp::pattern_server(tool, &servers).is_some() {
                continue;
            }
            if !registered.contains(&tool.as_str()) {
                return Err(unknown_name(
                    file,
                    at.index(i),
                    NameKind::Tool,
                    tool,
                    registered,
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
