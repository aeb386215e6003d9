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
    Mount { container: String },
}

/// A host folder an agent can write from inside its sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WritableTree {
    pub agent: String,
    /// Absolute and lexically normalised.
    pub path: PathBuf,
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
    if config.agents.is_empty() {
        return Err(ConfigError::NoAgents {
            file: file.to_path_buf(),
        });
    }
    for (name, agent) in &config.agents {
        validate_agent(config, file, home, resolver, &writable, name, agent)?;
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
    for (name, agent) in &config.agents {
        let at = KeyPath::root().key("agents").key(name).key("tools");
        for (i, tool) in agent.tools.iter().enumerate() {
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
mod tests {
    use super::*;
    use crate::config::LoadedConfig;

    const FILE: &str = "/etc/beige/config.json5";
    const HOME: &str = "/var/lib/beige-test-home";

    fn env(name: &str) -> Option<String> {
        (name == "HOME").then(|| "/home/u".to_string())
    }

    fn load_in(home: &BeigeHome, text: &str) -> Result<LoadedConfig, ConfigError> {
        Config::from_str_with_env(text, Path::new(FILE), home, env)
    }

    fn load(text: &str) -> Result<LoadedConfig, ConfigError> {
        load_in(&BeigeHome::new(HOME), text)
    }

    /// A config with providers `anthropic` and `openai`, plugin `kv`, and one agent
    /// `name` whose body is the model line plus `extra`.
    fn with_agent(name: &str, extra: &str) -> String {
        format!(
            r#"{{
              llm: {{ providers: {{ anthropic: {{ apiKey: "k" }}, openai: {{}} }} }},
              plugins: {{ kv: {{}} }},
              agents: {{
                "{name}": {{
                  model: {{ provider: "anthropic", model: "claude-sonnet-4-6" }},
                  tools: [],
                  {extra}
                }},
              }},
            }}"#
        )
    }

    fn err(text: &str) -> String {
        match load(text) {
            Ok(_) => panic!("expected an error for:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn agent_name_rule() {
        for ok in ["a", "0", "intern", "my-agent_2", &"a".repeat(63)] {
            assert!(is_valid_agent_name(ok), "{ok}");
        }
        for bad in [
            "",
            "Intern",
            "-a",
            "_a",
            "bad name",
            "a.b",
            "a/b",
            "é",
            &"a".repeat(64),
        ] {
            assert!(!is_valid_agent_name(bad), "{bad}");
        }
        assert_eq!(suggest_agent_name("Intern"), "intern");
        assert_eq!(suggest_agent_name("bad name"), "bad-name");
        assert_eq!(suggest_agent_name("--My  Agent!"), "my-agent");
        assert_eq!(suggest_agent_name("!!!"), "agent");
        insta::assert_snapshot!(err(&with_agent("Intern", "")));
        insta::assert_snapshot!(err(&with_agent("bad name", "")));
    }

    #[test]
    fn agents_must_exist_and_be_non_empty() {
        insta::assert_snapshot!(err(r#"{ llm: { providers: { anthropic: {} } } }"#));
        insta::assert_snapshot!(err(
            r#"{ llm: { providers: { anthropic: {} } }, agents: {} }"#
        ));
    }

    #[test]
    fn did_you_mean_finds_typos_only() {
        let known = ["anthropic", "openai", "git", "kv"];
        assert_eq!(did_you_mean("antropic", known), Some("anthropic"));
        assert_eq!(did_you_mean("Anthropic", known), Some("anthropic"));
        assert_eq!(did_you_mean("gti", known), Some("git"));
        assert_eq!(did_you_mean("opnai", known), Some("openai"));
        assert_eq!(did_you_mean("google", known), None);
        assert_eq!(did_you_mean("x", []), None);
    }

    #[test]
    fn model_providers_must_be_configured() {
        let text = with_agent("a", "").replace("provider: \"anthropic\"", "provider: \"antropic\"");
        insta::assert_snapshot!(err(&text));
        let text = with_agent(
            "a",
            r#"fallbackModels: [{ provider: "openai", model: "gpt-4o" }, { provider: "zai", model: "glm" }],"#,
        );
        insta::assert_snapshot!(err(&text));
    }

    #[test]
    fn model_needs_provider_and_model() {
        let text = with_agent("a", "").replace("model: \"claude-sonnet-4-6\"", "model: \"\"");
        insta::assert_snapshot!(err(&text));
    }

    #[test]
    fn unknown_provider_names_need_an_api() {
        let text = with_agent("a", "").replace("openai: {}", "zai: { baseUrl: \"https://x\" }");
        insta::assert_snapshot!(err(&text));
        let text =
            with_agent("a", "").replace("openai: {}", "zai: { api: \"openai-completions\" }");
        assert!(load(&text).is_ok());
    }

    #[test]
    fn plugin_configs_must_name_configured_plugins() {
        insta::assert_snapshot!(err(&with_agent("a", "pluginConfigs: { kb: { x: 1 } },")));
        assert!(load(&with_agent("a", "pluginConfigs: { kv: { x: 1 } },")).is_ok());
    }

    #[test]
    fn skills_must_be_configured() {
        insta::assert_snapshot!(err(&with_agent("a", r#"skills: ["code-review"],"#)));
        let text = with_agent("a", "").replace(
            "plugins:",
            "skills: { review: { path: \"/nonexistent/skill\" } }, plugins:",
        );
        insta::assert_snapshot!(err(&text));
    }

    #[test]
    fn validate_skills_accepts_plugin_skills() {
        let dir = tempfile::tempdir().unwrap();
        let loaded = load(&with_agent("a", "")).unwrap();
        let mut config = loaded.config;
        config.agents["a"].skills.push("from-plugin".into());
        let file = dir.path().join("c.json5");
        assert!(validate_skills(&config, &file, &["from-plugin"]).is_ok());
        assert!(validate_skills(&config, &file, &[]).is_err());
    }

    #[test]
    fn compaction_threshold_at_least_one() {
        let text = with_agent("a", "").replace(
            "claude-sonnet-4-6\"",
            "claude-sonnet-4-6\", compactionThreshold: 0",
        );
        insta::assert_snapshot!(err(&text));
        let text = with_agent("a", "").replace(
            "claude-sonnet-4-6\"",
            "claude-sonnet-4-6\", compactionThreshold: -5",
        );
        insta::assert_snapshot!(err(&text));
    }

    #[test]
    fn memory_limit_grammar() {
        let gib = 1024 * 1024 * 1024;
        assert_eq!(parse_memory_limit("3g"), Some(3 * gib));
        assert_eq!(parse_memory_limit("3G"), Some(3 * gib));
        assert_eq!(parse_memory_limit("3gb"), Some(3 * gib));
        assert_eq!(parse_memory_limit(" 3 GB "), Some(3 * gib));
        assert_eq!(parse_memory_limit("512m"), Some(512 * 1024 * 1024));
        assert_eq!(parse_memory_limit("1.5k"), Some(1536));
        assert_eq!(parse_memory_limit("1.0001k"), Some(1024));
        assert_eq!(parse_memory_limit("100"), Some(100));
        assert_eq!(parse_memory_limit("100b"), Some(100));
        assert_eq!(parse_memory_limit("100B"), Some(100));
        for bad in [
            "",
            "g",
            "0",
            "0.1",
            "-1g",
            "1.g",
            ".5g",
            "1.2.3",
            "3t",
            "3 gig",
            "1e9",
            "3bb",
            "1b g",
            "99999999999999999999g",
        ] {
            assert_eq!(parse_memory_limit(bad), None, "{bad:?}");
        }
        insta::assert_snapshot!(err(&with_agent(
            "a",
            r#"sandbox: { memoryLimit: "lots" },"#
        )));
    }

    #[test]
    fn sandbox_limits() {
        assert!(err(&with_agent("a", "maxTurns: 0,")).contains("maxTurns must be at least 1"));
        insta::assert_snapshot!(err(&with_agent("a", "sandbox: { pidsLimit: 0 },")));
        insta::assert_snapshot!(err(&with_agent("a", "sandbox: { cpus: 0 },")));
        assert!(err(&with_agent("a", "sandbox: { cpus: -1.5 },"))
            .contains("cpus must be a positive number"));
        assert!(load(&with_agent("a", "sandbox: { cpus: 1.5, pidsLimit: 64 },")).is_ok());
    }

    #[test]
    fn gateway_port_range() {
        let text = with_agent("a", "").replace("plugins:", "gateway: { port: 0 }, plugins:");
        insta::assert_snapshot!(err(&text));
        let text = with_agent("a", "").replace("plugins:", "gateway: { port: 70000 }, plugins:");
        assert!(err(&text).contains("invalid port 70000"));
        let text = with_agent("a", "").replace("plugins:", "gateway: { port: \"7433\" }, plugins:");
        assert!(err(&text).contains(r#"invalid port "7433""#));
    }

    #[test]
    fn network_modes() {
        insta::assert_snapshot!(err(&with_agent("a", r#"sandbox: { network: "host" },"#)));
        insta::assert_snapshot!(err(&with_agent("a", r#"sandbox: { network: "brige" },"#)));
        let loaded = load(&with_agent("a", r#"sandbox: { network: "bridge" },"#)).unwrap();
        assert_eq!(
            loaded.config.agents["a"].sandbox.network,
            crate::config::NetworkMode::Bridge
        );
    }

    #[test]
    fn sandbox_user() {
        for ok in ["root", "1000:1000", "0:0"] {
            assert!(
                load(&with_agent("a", &format!("sandbox: {{ user: \"{ok}\" }},"))).is_ok(),
                "{ok}"
            );
        }
        for bad in [
            "1000",
            "alice",
            "1000:",
            ":1000",
            "+1:2",
            "1:99999999999",
            "root:root",
        ] {
            assert!(
                err(&with_agent(
                    "a",
                    &format!("sandbox: {{ user: \"{bad}\" }},")
                ))
                .contains("invalid user"),
                "{bad}"
            );
        }
        insta::assert_snapshot!(err(&with_agent("a", r#"sandbox: { user: "alice" },"#)));
    }

    #[test]
    fn tools_are_checked_against_registered_ones() {
        let loaded =
            load(&with_agent("a", "").replace("tools: []", r#"tools: ["kv", "gti"]"#)).unwrap();
        let file = Path::new(FILE);
        assert!(validate_tools(&loaded.config, file, &["git", "kv", "gti"]).is_ok());
        let e = validate_tools(&loaded.config, file, &["git", "kv"]).unwrap_err();
        insta::assert_snapshot!(e.to_string());
        let e = validate_tools(&loaded.config, file, &[]).unwrap_err();
        insta::assert_snapshot!(e.to_string());
    }

    fn mount_err(home: &BeigeHome, host: &str, container: &str) -> String {
        let ws = home.default_workspace("a");
        check_extra_mount(
            home,
            &ws,
            &WritableTrees::default(),
            Path::new(host),
            container,
        )
        .unwrap_err()
    }

    #[test]
    fn mount_refusals_host_side() {
        let home = BeigeHome::new(HOME);
        let cases = [
            ("/", "/host"),
            ("/var/run/docker.sock", "/var/run/docker.sock"),
            ("/run/docker.sock", "/d"),
            ("/home/u/.docker/run/docker.sock", "/d"),
            ("/var/run", "/d"),
            ("/run", "/d"),
            ("/var", "/d"),
            (HOME, "/h"),
            ("/var/lib/beige-test-home/gateway.token", "/t"),
            ("/var/lib/beige-test-home/agents/b/workspace", "/b"),
            ("/var/lib/beige-test-home/agents/a", "/a"),
            ("/var/lib", "/lib"),
            ("relative/path", "/r"),
            ("/a/../../etc", "/e"),
        ];
        let out: Vec<String> = cases
            .iter()
            .map(|(host, container)| {
                format!(
                    "{host} -> {container}: {}",
                    mount_err(&home, host, container)
                )
            })
            .collect();
        insta::assert_snapshot!(out.join("\n"));
    }

    #[test]
    fn mount_refusals_container_side() {
        let dir = tempfile::tempdir().unwrap();
        let home = BeigeHome::new(HOME);
        let host = dir.path().to_str().unwrap();
        let cases = [
            "data",
            "/",
            "/workspace",
            "/workspace/sub",
            "/tools/bin",
            "/skills",
            "/beige:ro",
            "/a/../workspace",
            "/x:z",
            "/x:ro:ro",
        ];
        let out: Vec<String> = cases
            .iter()
            .map(|c| format!("{c}: {}", mount_err(&home, host, c)))
            .collect();
        insta::assert_snapshot!(out.join("\n"));
    }

    #[test]
    fn mounts_that_are_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let home = BeigeHome::new(dir.path().join("home"));
        let ws = home.default_workspace("a");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();

        let none = WritableTrees::default();
        let m = check_extra_mount(&home, &ws, &none, &data, "/data:ro").unwrap();
        assert_eq!(
            m,
            MountTarget {
                host: data.clone(),
                container: "/data".into(),
                read_only: true
            }
        );
        let m = check_extra_mount(&home, &ws, &none, &data, "/srv/./data/").unwrap();
        assert_eq!((m.container.as_str(), m.read_only), ("/srv/data", false));
        assert!(
            !check_extra_mount(&home, &ws, &none, &data, "/workspaces:rw")
                .unwrap()
                .read_only
        );
        // A symlink to an allowed folder: Docker gets the folder itself.
        let link = dir.path().join("data-link");
        std::os::unix::fs::symlink(&data, &link).unwrap();
        let m = check_extra_mount(&home, &ws, &none, &link, "/data").unwrap();
        assert_eq!(m.host, data.canonicalize().unwrap());
    }

    #[test]
    fn mounts_from_agent_writable_trees_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let home = BeigeHome::new(dir.path().join("home"));
        let ws = home.default_workspace("a");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        let none = WritableTrees::default();
        // Not even inside the agent's own workspace: it could swap `sub` for a symlink.
        let e = check_extra_mount(&home, &ws, &none, &ws.join("sub"), "/sub").unwrap_err();
        assert!(e.contains("inside the workspace of this agent"), "{e}");
        // A workspace elsewhere (workspaceDir), and a read-write mount of another agent.
        let elsewhere = dir.path().join("projects/b");
        let shared = dir.path().join("shared");
        std::fs::create_dir_all(elsewhere.join("src")).unwrap();
        std::fs::create_dir_all(shared.join("inner")).unwrap();
        let mut trees = WritableTrees::default();
        trees.push(WritableTree {
            agent: "b".into(),
            path: elsewhere.clone(),
            kind: WritableKind::Workspace,
        });
        trees.push(WritableTree {
            agent: "b".into(),
            path: shared.clone(),
            kind: WritableKind::Mount {
                container: "/shared".into(),
            },
        });
        let own = dir.path().join("own-ws");
        std::fs::create_dir_all(own.join("x")).unwrap();
        let cases = [
            (elsewhere.clone(), "that is the workspace of agent 'b'"),
            (
                elsewhere.join("src"),
                "that is inside the workspace of agent 'b'",
            ),
            (
                shared.join("inner"),
                "which agent 'b' mounts read-write at /shared",
            ),
            (own.join("x"), "inside the workspace of this agent"),
        ];
        for (host, expected) in cases {
            let e = check_extra_mount(&home, &own, &trees, &host, "/m:ro").unwrap_err();
            assert!(e.contains(expected), "{}: {e}", host.display());
            assert!(e.contains("symlink"), "{e}");
        }
        // Through a symlink from outside: the resolved path is what counts.
        let link = dir.path().join("innocent");
        std::os::unix::fs::symlink(elsewhere.join("src"), &link).unwrap();
        let e = check_extra_mount(&home, &own, &trees, &link, "/m").unwrap_err();
        assert!(e.contains("workspace of agent 'b'"), "{e}");
        // The shared folder itself may be mounted by several agents.
        assert!(check_extra_mount(&home, &own, &trees, &shared, "/shared").is_ok());
    }

    #[test]
    fn config_refuses_mounts_inside_workspaces_and_writable_mounts() {
        let dir = tempfile::tempdir().unwrap();
        let home = BeigeHome::new(dir.path().join("home"));
        let file = dir.path().join("config.json5");
        std::fs::create_dir_all(dir.path().join("ws-b/data")).unwrap();
        std::fs::create_dir_all(dir.path().join("shared/sub")).unwrap();
        std::fs::create_dir_all(home.default_workspace("a").join("data")).unwrap();
        let load = |a: &str, b: &str| {
            let text = format!(
                r#"{{ llm: {{ providers: {{ anthropic: {{ apiKey: "k" }} }} }},
                agents: {{
                  a: {{ model: {{ provider: "anthropic", model: "m" }}, tools: [], {a} }},
                  b: {{ model: {{ provider: "anthropic", model: "m" }}, tools: [], {b} }},
                }} }}"#
            );
            Config::from_str_with_env(&text, &file, &home, |_| None)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        let ws_b = r#"workspaceDir: "./ws-b""#;
        let cases = [
            // Inside another agent's configured workspace.
            (
                r#"sandbox: { extraMounts: { "./ws-b/data": "/data:ro" } }"#,
                ws_b,
                "workspace of agent 'b'",
            ),
            // Inside its own workspace.
            (
                &*format!(
                    r#"sandbox: {{ extraMounts: {{ "{}": "/data:ro" }} }}"#,
                    home.default_workspace("a").join("data").display()
                ),
                "",
                "inside the workspace of agent 'a'",
            ),
            // Inside a folder another agent mounts read-write.
            (
                r#"sandbox: { extraMounts: { "./shared/sub": "/sub:ro" } }"#,
                r#"sandbox: { extraMounts: { "./shared": "/shared" } }"#,
                "which agent 'b' mounts read-write at /shared",
            ),
            // A workspace inside a folder another agent mounts read-write.
            (
                r#"workspaceDir: "./shared/sub""#,
                r#"sandbox: { extraMounts: { "./shared": "/shared" } }"#,
                "cannot use",
            ),
        ];
        for (a, b, expected) in cases {
            let e = load(a, b).unwrap_err();
            assert!(e.contains(expected), "{a} / {b}: {e}");
        }
        // Sharing: the same read-write folder for both, read-only elsewhere is fine.
        load(
            r#"sandbox: { extraMounts: { "./shared": "/shared" } }"#,
            r#"sandbox: { extraMounts: { "./shared": "/shared" } }"#,
        )
        .unwrap();
        load(
            r#"sandbox: { extraMounts: { "./shared/sub": "/sub:ro" } }"#,
            r#"sandbox: { extraMounts: { "./shared": "/shared:ro" } }"#,
        )
        .unwrap();
    }

    #[test]
    fn mount_refusals_see_through_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let home = BeigeHome::new(dir.path().join("home"));
        std::fs::create_dir_all(home.root()).unwrap();
        let link = dir.path().join("innocent");
        std::os::unix::fs::symlink(home.root(), &link).unwrap();
        let ws = home.default_workspace("a");
        let e = check_extra_mount(&home, &ws, &WritableTrees::default(), &link, "/x").unwrap_err();
        assert!(e.contains("that is BEIGE_HOME"), "{e}");
    }

    #[test]
    fn mounts_in_config_resolve_relative_and_tilde_paths() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("data")).unwrap();
        std::fs::create_dir_all(dir.path().join("user/notes")).unwrap();
        let file = dir.path().join("config.json5");
        let text = with_agent(
            "a",
            r#"sandbox: { extraMounts: { "./data": "/data:ro", "~/notes": "/notes" } },"#,
        );
        let home = BeigeHome::new(dir.path().join("home"));
        let user = dir.path().join("user");
        let env = |n: &str| (n == "HOME").then(|| user.display().to_string());
        let loaded = Config::from_str_with_env(&text, &file, &home, env).unwrap();
        let mounts: Vec<(&String, &String)> = loaded.config.agents["a"]
            .sandbox
            .extra_mounts
            .iter()
            .collect();
        let data = dir.path().join("data").display().to_string();
        let notes = user.join("notes").display().to_string();
        assert_eq!(
            mounts,
            [
                (&data, &"/data:ro".to_string()),
                (&notes, &"/notes".to_string())
            ]
        );
    }

    #[test]
    fn mount_sources_must_exist_at_load() {
        let home = BeigeHome::new(HOME);
        let ws = home.default_workspace("a");
        // The pure check accepts it (the container spec may be computed before the folder
        // exists); loading the config does not.
        assert!(check_extra_mount(
            &home,
            &ws,
            &WritableTrees::default(),
            Path::new("/nonexistent/data"),
            "/data"
        )
        .is_ok());
        insta::assert_snapshot!(err(&with_agent(
            "a",
            r#"sandbox: { extraMounts: { "/nonexistent/data": "/data" } },"#
        )));
    }

    #[test]
    fn mount_errors_in_config_name_the_entry() {
        insta::assert_snapshot!(err(&with_agent(
            "a",
            r#"sandbox: { extraMounts: { "/": "/host" } },"#
        )));
        insta::assert_snapshot!(err(&with_agent(
            "a",
            r#"sandbox: { extraMounts: { "/tmp": "/workspace/tmp" } },"#
        )));
    }

    #[test]
    fn workspace_dir_may_not_expose_the_home() {
        insta::assert_snapshot!(err(&with_agent(
            "a",
            &format!(r#"workspaceDir: "{HOME}","#)
        )));
        assert!(err(&with_agent("a", r#"workspaceDir: "/","#)).contains("whole file system"));
        assert!(load(&with_agent(
            "a",
            &format!(r#"workspaceDir: "{HOME}/agents/a/ws","#)
        ))
        .is_ok());
        assert!(load(&with_agent("a", r#"workspaceDir: "/srv/a","#)).is_ok());
    }
}
