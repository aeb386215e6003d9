//! The built-in `kv` plugin: a small key-value store per agent, and the worked example
//! for plugin authors (`docs/plugins.md` quotes it).
//!
//! Owns the `kv` tool (`kv get|set|del|list`), its limits, and the files under its data
//! folder: `<data_dir>/<agent>.json`, one JSON object per agent, replaced atomically on
//! every change. An agent only ever reaches its own file, because the agent comes from the
//! socket the call arrived on, never from the arguments. The plugin also ships the docs
//! agents read at `/tools/packages/kv/` ([`SKILL_MD`], [`README_MD`],
//! [`write_package_dir`]). It does not decide who may call it (policy) or record calls
//! (audit).

use std::collections::btree_map::BTreeMap;
use std::collections::hash_map::{Entry, HashMap};
use std::io::Write;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Mutex;

use super::{Plugin, PluginContext, PluginError, Registrar, Tool, ToolCall, ToolError, ToolResult};
use crate::config::is_valid_agent_name;

/// How an agent uses `kv` from a shell; mounted at `/tools/packages/kv/SKILL.md`.
pub const SKILL_MD: &str = include_str!("kv/SKILL.md");
/// What `kv` is and how to configure it; mounted at `/tools/packages/kv/README.md`.
pub const README_MD: &str = include_str!("kv/README.md");

/// Keys an agent may hold unless `maxKeys` says otherwise.
pub const DEFAULT_MAX_KEYS: u64 = 10_000;
/// Longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 512;
/// Longest value, in bytes (1 MiB).
pub const MAX_VALUE_BYTES: usize = 1024 * 1024;

const USAGE: &str = "Usage:
  kv get <key>             print the value of <key>
  kv set <key> <value...>  store a value (the words joined by spaces, or stdin if none)
  kv del <key>             delete <key>
  kv list [prefix]         print the keys (starting with prefix), sorted, one per line
  kv help                  show this help";

/// The built-in `kv` plugin. Enable it with `plugins: { kv: {} }` and give agents the
/// tool with `tools: ["kv"]`.
#[derive(Debug, Default)]
pub struct KvPlugin;

impl KvPlugin {
    pub fn new() -> Self {
        Self
    }
}

#[async_trait]
impl Plugin for KvPlugin {
    fn name(&self) -> &str {
        "kv"
    }

    async fn register(&self, ctx: &PluginContext, reg: &mut Registrar) -> Result<(), PluginError> {
        reg.tool(Arc::new(KvTool {
            store: Store::new(ctx.data_dir.clone()),
        }))
    }
}

/// Write `SKILL.md` and `README.md` into `dir` (created if needed). The gateway calls it
/// with `<BEIGE_HOME>/builtin/kv/` and mounts that folder read-only at
/// `/tools/packages/kv/`. Files that are already current are left untouched.
pub fn write_package_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, text) in [("SKILL.md", SKILL_MD), ("README.md", README_MD)] {
        let path = dir.join(name);
        if std::fs::read(&path).ok().as_deref() != Some(text.as_bytes()) {
            write_atomic(&path, text.as_bytes())?;
        }
    }
    Ok(())
}

/// The `kv` tool: parses the command line, applies the limits, and asks the store.
#[derive(Debug)]
struct KvTool {
    store: Store,
}

#[async_trait]
impl Tool for KvTool {
    fn name(&self) -> &str {
        "kv"
    }

    fn description(&self) -> &str {
        "Key-value store for this agent: get, set, del and list text values by key."
    }

    fn commands(&self) -> Vec<String> {
        [
            "kv get <key>",
            "kv set <key> <value...>",
            "kv del <key>",
            "kv list [prefix]",
        ]
        .map(String::from)
        .to_vec()
    }

    async fn call(&self, call: ToolCall) -> Result<ToolResult, ToolError> {
        let command = match Command::parse(&call.args, call.stdin.as_deref()) {
            Ok(command) => command,
            Err(usage_error) => return Ok(ToolResult::fail(usage_error, 2)),
        };
        let agent = call.session.agent.as_str();
        let result = match command {
            Command::Help => ToolResult::ok(format!("kv — {}\n\n{USAGE}\n", self.description())),
            Command::Get(key) => match self.store.get(agent, &key).await? {
                Some(value) => ToolResult::ok(format!("{value}\n")),
                None => not_found(&key),
            },
            Command::Set(key, value) => {
                let max_keys = max_keys(&call.config)?;
                if self.store.set(agent, key, value, max_keys).await? {
                    ToolResult::ok("")
                } else {
                    ToolResult::fail(
                        format!(
                            "kv: limit of {max_keys} keys reached for agent '{agent}'; \
                             delete keys or raise plugins.kv.config.maxKeys\n"
                        ),
                        1,
                    )
                }
            }
            Command::Del(key) => {
                if self.store.del(agent, &key).await? {
                    ToolResult::ok("")
                } else {
                    not_found(&key)
                }
            }
            Command::List(prefix) => {
                let keys = self.store.list(agent, &prefix).await?;
                ToolResult::ok(keys.into_iter().map(|k| k + "\n").collect::<String>())
            }
        };
        Ok(result)
    }
}

fn not_found(key: &str) -> ToolResult {
    ToolResult::fail(format!("key not found: {key}\n"), 1)
}

/// `maxKeys` from the call's config (the plugin's config merged with the agent's
/// `pluginConfigs.kv`).
fn max_keys(config: &serde_json::Value) -> Result<u64, ToolError> {
    match config.get("maxKeys") {
        None | Some(serde_json::Value::Null) => Ok(DEFAULT_MAX_KEYS),
        Some(v) => v.as_u64().ok_or_else(|| {
            ToolError::Failed(format!(
                "maxKeys (plugins.kv.config, or the agent's pluginConfigs.kv) must be a whole number ≥ 0, not {v}"
            ))
        }),
    }
}

/// One parsed `kv` command line.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Command {
    Help,
    Get(String),
    Set(String, String),
    Del(String),
    List(String),
}

impl Command {
    /// Parse the arguments after `kv`. `Err` is the message of a usage error (exit 2).
    fn parse(args: &[String], stdin: Option<&[u8]>) -> Result<Self, String> {
        let Some((name, rest)) = args.split_first() else {
            return Ok(Command::Help);
        };
        let command = match (name.as_str(), rest) {
            ("help" | "--help" | "-h", []) => Command::Help,
            ("get", [key]) => Command::Get(key.clone()),
            ("set", [key]) => match stdin {
                Some(bytes) => Command::Set(key.clone(), value_from_stdin(bytes)),
                None => {
                    return Err(format!(
                        "kv: 'set' needs a value after the key, or on stdin. {USAGE}\n"
                    ))
                }
            },
            ("set", [key, words @ ..]) => Command::Set(key.clone(), words.join(" ")),
            ("del", [key]) => Command::Del(key.clone()),
            ("list", []) => Command::List(String::new()),
            ("list", [prefix]) => Command::List(prefix.clone()),
            ("help" | "--help" | "-h" | "get" | "set" | "del" | "list", _) => {
                return Err(format!(
                    "kv: wrong number of arguments for '{name}'. {USAGE}\n"
                ))
            }
            _ => return Err(format!("kv: unknown command '{name}'. {USAGE}\n")),
        };
        match &command {
            Command::Get(key) | Command::Del(key) => check_key(key)?,
            Command::Set(key, value) => {
                check_key(key)?;
                if value.len() > MAX_VALUE_BYTES {
                    return Err(format!(
                        "kv: the value is {} bytes; values are limited to {MAX_VALUE_BYTES} bytes (1 MiB)\n",
                        value.len()
                    ));
                }
            }
            Command::Help | Command::List(_) => {}
        }
        Ok(command)
    }
}

/// Stdin as text (invalid UTF-8 replaced), without one trailing newline, so
/// `echo hi | kv set k` stores `hi`.
fn value_from_stdin(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    text.strip_suffix('\n').unwrap_or(&text).to_string()
}

fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        Err("kv: the key is empty; keys are 1 to 512 bytes of text\n".to_string())
    } else if key.len() > MAX_KEY_BYTES {
        Err(format!(
            "kv: the key is {} bytes; keys are limited to {MAX_KEY_BYTES} bytes\n",
            key.len()
        ))
    } else if key.contains(['\n', '\r']) {
        Err("kv: keys cannot contain line breaks\n".to_string())
    } else {
        Ok(())
    }
}

/// Where the pairs live: `<dir>/<agent>.json`, read on an agent's first call, kept in
/// memory, and rewritten atomically on every change. The tool knows storage only through
/// these four methods, so a database can replace this struct without touching the tool.
#[derive(Debug)]
struct Store {
    dir: PathBuf,
    agents: Mutex<HashMap<String, BTreeMap<String, String>>>,
}

impl Store {
    fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            agents: Mutex::new(HashMap::new()),
        }
    }

    async fn get(&self, agent: &str, key: &str) -> Result<Option<String>, ToolError> {
        let mut agents = self.agents.lock().await;
        Ok(self.entries(&mut agents, agent).await?.get(key).cloned())
    }

    /// Store `value`; `false` (nothing stored) when `key` is new and the agent already
    /// holds `max_keys` keys.
    async fn set(
        &self,
        agent: &str,
        key: String,
        value: String,
        max_keys: u64,
    ) -> Result<bool, ToolError> {
        let mut agents = self.agents.lock().await;
        let entries = self.entries(&mut agents, agent).await?;
        let held = u64::try_from(entries.len()).unwrap_or(u64::MAX);
        if !entries.contains_key(&key) && held >= max_keys {
            return Ok(false);
        }
        let previous = entries.insert(key.clone(), value);
        if let Err(e) = self.save(agent, entries).await {
            // Keep memory equal to disk.
            match previous {
                Some(old) => entries.insert(key, old),
                None => entries.remove(&key),
            };
            return Err(e);
        }
        Ok(true)
    }

    /// Delete `key`; `false` when it did not exist.
    async fn del(&self, agent: &str, key: &str) -> Result<bool, ToolError> {
        let mut agents = self.agents.lock().await;
        let entries = self.entries(&mut agents, agent).await?;
        let Some(old) = entries.remove(key) else {
            return Ok(false);
        };
        if let Err(e) = self.save(agent, entries).await {
            entries.insert(key.to_string(), old);
            return Err(e);
        }
        Ok(true)
    }

    /// Keys starting with `prefix`, sorted.
    async fn list(&self, agent: &str, prefix: &str) -> Result<Vec<String>, ToolError> {
        let mut agents = self.agents.lock().await;
        let entries = self.entries(&mut agents, agent).await?;
        Ok(entries
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, _)| k.clone())
            .collect())
    }

    /// The agent's pairs, loaded from its file on first use. A file that cannot be read
    /// is reported on every call and never overwritten.
    async fn entries<'a>(
        &self,
        agents: &'a mut HashMap<String, BTreeMap<String, String>>,
        agent: &str,
    ) -> Result<&'a mut BTreeMap<String, String>, ToolError> {
        match agents.entry(agent.to_string()) {
            Entry::Occupied(e) => Ok(e.into_mut()),
            Entry::Vacant(e) => {
                let path = self.path(agent)?;
                let loaded = match tokio::fs::read(&path).await {
                    Ok(bytes) => serde_json::from_slice(&bytes).map_err(|err| {
                        ToolError::Failed(format!(
                            "{} is not a valid kv file ({err}); fix it or move it away",
                            path.display()
                        ))
                    })?,
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
                    Err(err) => {
                        return Err(ToolError::Failed(format!(
                            "cannot read {}: {err}",
                            path.display()
                        )))
                    }
                };
                Ok(e.insert(loaded))
            }
        }
    }

    async fn save(&self, agent: &str, entries: &BTreeMap<String, String>) -> Result<(), ToolError> {
        let path = self.path(agent)?;
        let bytes = serde_json::to_vec_pretty(entries)
            .map_err(|e| ToolError::Failed(format!("cannot encode the store: {e}")))?;
        let target = path.clone();
        tokio::task::spawn_blocking(move || write_atomic(&target, &bytes))
            .await
            .map_err(|e| ToolError::Failed(format!("the write was interrupted: {e}")))?
            .map_err(|e| ToolError::Failed(format!("cannot save {}: {e}", path.display())))
    }

    fn path(&self, agent: &str) -> Result<PathBuf, ToolError> {
        // The gateway validated the name already; the file name depends on it, so check.
        if !is_valid_agent_name(agent) {
            return Err(ToolError::Failed(format!("invalid agent name {agent:?}")));
        }
        Ok(self.dir.join(format!("{agent}.json")))
    }
}

/// Replace `path` with `bytes` so that readers see the old file or the new one, never
/// half of one: write a temporary file in the same folder, flush it to disk, rename it
/// over `path`.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.{:016x}.tmp", rand::random::<u64>()));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::plugin::{PluginRegistry, SessionInfo};
    use serde_json::json;

    fn config(kv: serde_json::Value, b_override: serde_json::Value) -> Config {
        serde_json::from_value(json!({
            "llm": {"providers": {"anthropic": {}}},
            "plugins": {"kv": {"config": kv}},
            "agents": {
                "a": {"model": {"provider": "anthropic", "model": "m"}, "tools": ["kv"]},
                "b": {"model": {"provider": "anthropic", "model": "m"}, "tools": ["kv"],
                      "pluginConfigs": {"kv": b_override}}
            }
        }))
        .unwrap()
    }

    /// Registers a fresh `KvPlugin` the way the gateway does; the store lives in
    /// `<root>/kv/`.
    async fn registry(root: &Path, config: &Config) -> PluginRegistry {
        PluginRegistry::build(
            vec![Arc::new(KvPlugin::new())],
            config,
            root,
            &HashMap::new(),
        )
        .await
        .unwrap()
    }

    struct Kv {
        registry: PluginRegistry,
        config: Config,
    }

    impl Kv {
        async fn new(root: &Path) -> Self {
            let config = config(json!({}), json!({}));
            Self::with_config(root, config).await
        }

        async fn with_config(root: &Path, config: Config) -> Self {
            Self {
                registry: registry(root, &config).await,
                config,
            }
        }

        async fn run_with(&self, agent: &str, args: &[&str], stdin: Option<&[u8]>) -> ToolResult {
            let call = ToolCall {
                tool: "kv".into(),
                args: args.iter().map(|a| a.to_string()).collect(),
                stdin: stdin.map(<[u8]>::to_vec),
                cwd: None,
                workspace: PathBuf::from("/nonexistent"),
                session: SessionInfo {
                    agent: agent.into(),
                    key: format!("socket:{agent}"),
                    channel: "socket".into(),
                    ..SessionInfo::default()
                },
                config: self.registry.call_config(&self.config, agent, "kv"),
            };
            self.registry
                .tool("kv")
                .unwrap()
                .tool
                .call(call)
                .await
                .unwrap()
        }

        async fn run(&self, agent: &str, args: &[&str]) -> ToolResult {
            self.run_with(agent, args, None).await
        }
    }

    fn ok(output: &str) -> ToolResult {
        ToolResult::ok(output)
    }

    #[tokio::test]
    async fn get_set_del_list() {
        let dir = tempfile::tempdir().unwrap();
        let kv = Kv::new(dir.path()).await;
        assert_eq!(
            kv.run("a", &["get", "user:7"]).await,
            ToolResult::fail("key not found: user:7\n", 1)
        );
        assert_eq!(
            kv.run("a", &["set", "user:7", "Ada", "Lovelace"]).await,
            ok("")
        );
        assert_eq!(kv.run("a", &["get", "user:7"]).await, ok("Ada Lovelace\n"));
        assert_eq!(kv.run("a", &["set", "user:7", "Grace"]).await, ok(""));
        assert_eq!(kv.run("a", &["get", "user:7"]).await, ok("Grace\n"));
        assert_eq!(kv.run("a", &["set", "empty", ""]).await, ok(""));
        assert_eq!(kv.run("a", &["get", "empty"]).await, ok("\n"));
        kv.run("a", &["set", "user:10", "x"]).await;
        kv.run("a", &["set", "team:1", "y"]).await;
        assert_eq!(
            kv.run("a", &["list"]).await,
            ok("empty\nteam:1\nuser:10\nuser:7\n")
        );
        assert_eq!(
            kv.run("a", &["list", "user:"]).await,
            ok("user:10\nuser:7\n")
        );
        assert_eq!(kv.run("a", &["list", "zzz"]).await, ok(""));
        assert_eq!(kv.run("a", &["del", "user:7"]).await, ok(""));
        assert_eq!(
            kv.run("a", &["del", "user:7"]).await,
            ToolResult::fail("key not found: user:7\n", 1)
        );
        assert_eq!(kv.run("a", &["list", "user:"]).await, ok("user:10\n"));
    }

    #[tokio::test]
    async fn persists_across_instances() {
        let dir = tempfile::tempdir().unwrap();
        {
            let kv = Kv::new(dir.path()).await;
            kv.run("a", &["set", "k", "v1"]).await;
            kv.run("a", &["set", "gone", "x"]).await;
            kv.run("a", &["del", "gone"]).await;
        }
        let on_disk: BTreeMap<String, String> =
            serde_json::from_slice(&std::fs::read(dir.path().join("kv/a.json")).unwrap()).unwrap();
        assert_eq!(
            on_disk,
            BTreeMap::from([("k".to_string(), "v1".to_string())])
        );
        let kv = Kv::new(dir.path()).await;
        assert_eq!(kv.run("a", &["get", "k"]).await, ok("v1\n"));
        assert_eq!(kv.run("a", &["list"]).await, ok("k\n"));
    }

    #[tokio::test]
    async fn agents_are_isolated() {
        let dir = tempfile::tempdir().unwrap();
        let kv = Kv::new(dir.path()).await;
        kv.run("a", &["set", "secret", "a's"]).await;
        assert_eq!(kv.run("b", &["get", "secret"]).await.exit_code, 1);
        assert_eq!(kv.run("b", &["list"]).await, ok(""));
        assert_eq!(kv.run("b", &["del", "secret"]).await.exit_code, 1);
        kv.run("b", &["set", "secret", "b's"]).await;
        assert_eq!(kv.run("a", &["get", "secret"]).await, ok("a's\n"));
        assert_eq!(kv.run("b", &["get", "secret"]).await, ok("b's\n"));
        // A name that is not a valid agent name never becomes a path.
        let call = ToolCall {
            tool: "kv".into(),
            args: vec!["list".into()],
            stdin: None,
            cwd: None,
            workspace: PathBuf::new(),
            session: SessionInfo {
                agent: "../a".into(),
                ..SessionInfo::default()
            },
            config: json!({}),
        };
        let err = kv
            .registry
            .tool("kv")
            .unwrap()
            .tool
            .call(call)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("invalid agent name"), "{err}");
    }

    #[tokio::test]
    async fn value_from_stdin() {
        let dir = tempfile::tempdir().unwrap();
        let kv = Kv::new(dir.path()).await;
        assert_eq!(
            kv.run_with("a", &["set", "note"], Some(b"line 1\nline 2\n"))
                .await,
            ok("")
        );
        assert_eq!(kv.run("a", &["get", "note"]).await, ok("line 1\nline 2\n"));
        // Only one trailing newline is trimmed; invalid UTF-8 is replaced.
        kv.run_with("a", &["set", "raw"], Some(b"x\xff\n\n")).await;
        assert_eq!(kv.run("a", &["get", "raw"]).await, ok("x\u{fffd}\n\n"));
        // Words on the command line win over stdin.
        kv.run_with("a", &["set", "w", "from", "args"], Some(b"stdin"))
            .await;
        assert_eq!(kv.run("a", &["get", "w"]).await, ok("from args\n"));
        // No value and no stdin is a usage error.
        assert_eq!(kv.run("a", &["set", "k"]).await.exit_code, 2);
    }

    #[tokio::test]
    async fn max_keys_comes_from_the_merged_config() {
        let dir = tempfile::tempdir().unwrap();
        let kv = Kv::with_config(
            dir.path(),
            config(json!({"maxKeys": 3}), json!({"maxKeys": 1})),
        )
        .await;
        for k in ["k1", "k2", "k3"] {
            assert_eq!(kv.run("a", &["set", k, "v"]).await, ok(""));
        }
        let full = kv.run("a", &["set", "k4", "v"]).await;
        assert_eq!(
            full,
            ToolResult::fail(
                "kv: limit of 3 keys reached for agent 'a'; delete keys or raise plugins.kv.config.maxKeys\n",
                1
            )
        );
        // Overwriting an existing key is fine at the limit; deleting makes room.
        assert_eq!(kv.run("a", &["set", "k1", "new"]).await, ok(""));
        kv.run("a", &["del", "k2"]).await;
        assert_eq!(kv.run("a", &["set", "k4", "v"]).await, ok(""));
        // Agent b's pluginConfigs.kv override wins over the plugin config.
        assert_eq!(kv.run("b", &["set", "k1", "v"]).await, ok(""));
        assert_eq!(kv.run("b", &["set", "k2", "v"]).await.exit_code, 1);

        let bad = Kv::with_config(dir.path(), config(json!({"maxKeys": "lots"}), json!({}))).await;
        let call_err = bad
            .registry
            .tool("kv")
            .unwrap()
            .tool
            .call(ToolCall {
                tool: "kv".into(),
                args: vec!["set".into(), "k".into(), "v".into()],
                stdin: None,
                cwd: None,
                workspace: PathBuf::new(),
                session: SessionInfo {
                    agent: "a".into(),
                    ..SessionInfo::default()
                },
                config: json!({"maxKeys": "lots"}),
            })
            .await
            .unwrap_err();
        assert!(
            call_err
                .to_string()
                .contains("must be a whole number ≥ 0, not \"lots\""),
            "{call_err}"
        );
    }

    #[tokio::test]
    async fn atomic_writes_leave_no_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let kv = Kv::new(dir.path()).await;
        for i in 0..20 {
            kv.run("a", &["set", &format!("k{i}"), "v"]).await;
            kv.run("b", &["set", "k", &i.to_string()]).await;
        }
        kv.run("a", &["del", "k0"]).await;
        let mut files: Vec<String> = std::fs::read_dir(dir.path().join("kv"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        assert_eq!(files, ["a.json", "b.json"]);
    }

    #[tokio::test]
    async fn a_broken_file_is_reported_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let kv = Kv::new(dir.path()).await;
        std::fs::write(dir.path().join("kv/a.json"), "{not json").unwrap();
        let call = |args: &[&str]| ToolCall {
            tool: "kv".into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            stdin: None,
            cwd: None,
            workspace: PathBuf::new(),
            session: SessionInfo {
                agent: "a".into(),
                ..SessionInfo::default()
            },
            config: json!({}),
        };
        let tool = kv.registry.tool("kv").unwrap().tool.clone();
        let err = tool.call(call(&["set", "k", "v"])).await.unwrap_err();
        assert!(
            err.to_string().contains("a.json is not a valid kv file"),
            "{err}"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("kv/a.json")).unwrap(),
            "{not json"
        );
    }

    #[tokio::test]
    async fn usage_errors_exit_2() {
        let dir = tempfile::tempdir().unwrap();
        let kv = Kv::new(dir.path()).await;
        for help in [&[][..], &["help"], &["--help"], &["-h"]] {
            let r = kv.run("a", help).await;
            assert_eq!(r.exit_code, 0);
            assert!(r.output.contains("kv get <key>"), "{}", r.output);
        }
        let r = kv.run("a", &["fetch", "x"]).await;
        assert_eq!(r.exit_code, 2);
        assert!(
            r.output
                .starts_with("kv: unknown command 'fetch'. Usage:\n  kv get <key>"),
            "{}",
            r.output
        );
        for wrong in [
            &["get"][..],
            &["get", "a", "b"],
            &["set"],
            &["del"],
            &["del", "a", "b"],
            &["list", "a", "b"],
            &["help", "me"],
        ] {
            let r = kv.run("a", wrong).await;
            assert_eq!(r.exit_code, 2, "{wrong:?}");
            assert!(r.output.contains("Usage:"), "{}", r.output);
        }
        let long_key = "k".repeat(MAX_KEY_BYTES + 1);
        let long_value = "v".repeat(MAX_VALUE_BYTES + 1);
        for (args, message) in [
            (vec!["get", ""], "the key is empty"),
            (
                vec!["set", long_key.as_str(), "v"],
                "keys are limited to 512 bytes",
            ),
            (vec!["set", "a\nb", "v"], "line breaks"),
            (
                vec!["set", "k", long_value.as_str()],
                "values are limited to 1048576 bytes",
            ),
        ] {
            let r = kv.run("a", &args).await;
            assert_eq!(r.exit_code, 2, "{message}");
            assert!(r.output.contains(message), "{}", r.output);
        }
        // Exactly at the limits is fine.
        let key = "k".repeat(MAX_KEY_BYTES);
        let value = "v".repeat(MAX_VALUE_BYTES);
        assert_eq!(kv.run("a", &["set", &key, &value]).await, ok(""));
    }

    #[tokio::test]
    async fn registers_one_documented_tool() {
        let dir = tempfile::tempdir().unwrap();
        let kv = Kv::new(dir.path()).await;
        assert_eq!(kv.registry.tool_names(), ["kv"]);
        let tool = &kv.registry.tool("kv").unwrap().tool;
        assert_eq!(tool.commands().len(), 4);
        assert!(!tool.description().contains('\n'));

        let pkg = dir.path().join("builtin/kv");
        write_package_dir(&pkg).unwrap();
        write_package_dir(&pkg).unwrap();
        assert_eq!(
            std::fs::read_to_string(pkg.join("SKILL.md")).unwrap(),
            SKILL_MD
        );
        assert_eq!(
            std::fs::read_to_string(pkg.join("README.md")).unwrap(),
            README_MD
        );
        assert_eq!(std::fs::read_dir(&pkg).unwrap().count(), 2);
        for cmd in ["kv get", "kv set", "kv del", "kv list"] {
            assert!(SKILL_MD.contains(cmd), "SKILL.md does not show {cmd}");
        }
    }
}
