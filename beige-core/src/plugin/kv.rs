//! The built-in `kv` plugin: a small key-value store per agent, and the worked example
//! for plugin authors (`docs/plugins.md` quotes it).
//!
//! Owns the `kv` tool (`kv get|set|del|list`) and its limits (`maxKeys`, `maxBytes` per
//! agent, checked by the store in the transaction that writes). The pairs live in the
//! gateway's store (`<BEIGE_HOME>/beige.db`, the table of plugin data) under plugin `kv`,
//! scoped by agent; no file of them exists for agents to see. An agent only ever reaches
//! its own pairs, because the agent comes from the socket the call arrived on, never from
//! the arguments. The plugin also ships the docs agents read at `/tools/packages/kv/`
//! ([`SKILL_MD`], [`README_MD`], [`write_package_dir`]). It does not decide who may call
//! it (policy), record calls (audit) or own the database (the store does).

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;

use super::{Plugin, PluginContext, PluginError, Registrar, Tool, ToolCall, ToolError, ToolResult};
use crate::config::is_valid_agent_name;
use crate::disk::fmt_bytes;
use crate::store::{KvLimits, KvWrite, PluginData, StoreError};

/// The plugin name the pairs are stored under.
const PLUGIN: &str = "kv";

/// How an agent uses `kv` from a shell; mounted at `/tools/packages/kv/SKILL.md`.
pub const SKILL_MD: &str = include_str!("kv/SKILL.md");
/// What `kv` is and how to configure it; mounted at `/tools/packages/kv/README.md`.
pub const README_MD: &str = include_str!("kv/README.md");

/// Keys an agent may hold unless `maxKeys` says otherwise.
pub const DEFAULT_MAX_KEYS: u64 = 10_000;
/// Bytes (keys plus values) an agent may hold unless `maxBytes` says otherwise (64 MiB).
pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024;
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
    /// The plugin; it has no state of its own (the values live in the gateway's store).
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
            store: KvStore::new(ctx.store.clone()),
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
    store: KvStore,
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
                let limits = KvLimits {
                    max_entries: Some(max_keys(&call.config)?),
                    max_bytes: Some(max_bytes(&call.config)?),
                    ..KvLimits::default()
                };
                match self.store.set(agent, &key, &value, limits).await? {
                    KvWrite::Stored => ToolResult::ok(""),
                    KvWrite::TooManyEntries { max, .. } => ToolResult::fail(
                        format!(
                            "kv: limit of {max} keys reached for agent '{agent}'; \
                             delete keys or raise plugins.kv.config.maxKeys\n"
                        ),
                        1,
                    ),
                    KvWrite::TooManyBytes { used, after, max } => ToolResult::fail(
                        format!(
                            "kv: agent '{agent}' uses {} of {} (keys and values); storing this \
                             value would take it to {}; nothing was stored — delete keys or raise \
                             plugins.kv.config.maxBytes\n",
                            fmt_bytes(used),
                            fmt_bytes(max),
                            fmt_bytes(after)
                        ),
                        1,
                    ),
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

/// `maxBytes` from the call's config: a whole number of bytes, or a size such as `"64m"`.
fn max_bytes(config: &serde_json::Value) -> Result<u64, ToolError> {
    let bad = |v: &serde_json::Value| {
        ToolError::Failed(format!(
            "maxBytes (plugins.kv.config, or the agent's pluginConfigs.kv) must be a whole number of bytes ≥ 0 or a size such as \"64m\", not {v}"
        ))
    };
    match config.get("maxBytes") {
        None | Some(serde_json::Value::Null) => Ok(DEFAULT_MAX_BYTES),
        Some(serde_json::Value::String(s)) => crate::config::parse_memory_limit(s)
            .ok_or_else(|| bad(&serde_json::Value::String(s.clone()))),
        Some(v) => v.as_u64().ok_or_else(|| bad(v)),
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

/// The tool's view of the gateway's store: the rows of plugin `kv` whose scope is the
/// calling agent (the `plugin_kv` table of `beige.db`). The tool knows storage only
/// through these four methods.
#[derive(Debug)]
struct KvStore {
    store: Arc<dyn PluginData>,
}

impl KvStore {
    fn new(store: Arc<dyn PluginData>) -> Self {
        Self { store }
    }

    async fn get(&self, agent: &str, key: &str) -> Result<Option<String>, ToolError> {
        let scope = scope(agent)?;
        self.store.kv_get(PLUGIN, scope, key).await.map_err(failed)
    }

    /// Store `value` unless that takes the agent's pairs over `limits`: the store checks
    /// and writes in one transaction, so concurrent sets cannot together overshoot.
    async fn set(
        &self,
        agent: &str,
        key: &str,
        value: &str,
        limits: KvLimits,
    ) -> Result<KvWrite, ToolError> {
        let scope = scope(agent)?;
        self.store
            .kv_set_within(PLUGIN, scope, key, value, limits)
            .await
            .map_err(failed)
    }

    /// Delete `key`; `false` when it did not exist.
    async fn del(&self, agent: &str, key: &str) -> Result<bool, ToolError> {
        let scope = scope(agent)?;
        self.store.kv_del(PLUGIN, scope, key).await.map_err(failed)
    }

    /// Keys starting with `prefix`, sorted.
    async fn list(&self, agent: &str, prefix: &str) -> Result<Vec<String>, ToolError> {
        let scope = scope(agent)?;
        self.store
            .kv_list(PLUGIN, scope, prefix)
            .await
            .map_err(failed)
    }
}

/// The store scope of `agent`'s pairs: its name. The gateway validated the name already;
/// the scope is what keeps agents apart, so check it again.
fn scope(agent: &str) -> Result<&str, ToolError> {
    if is_valid_agent_name(agent) {
        Ok(agent)
    } else {
        Err(ToolError::Failed(format!("invalid agent name {agent:?}")))
    }
}

fn failed(e: StoreError) -> ToolError {
    ToolError::Failed(e.to_string())
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
#[cfg(feature = "sqlite")]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::plugin::{PluginRegistry, SessionInfo};
    use crate::store::{SqliteStore, Store};
    use serde_json::json;
    use std::collections::HashMap;
    use std::path::PathBuf;

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

    /// Opens (or reopens) the database `<root>/beige.db`.
    fn open_store(root: &Path) -> Arc<dyn Store> {
        Arc::new(SqliteStore::open(root.join("beige.db")).unwrap())
    }

    /// Registers a fresh `KvPlugin` on `store` the way the gateway does.
    async fn registry(root: &Path, config: &Config, store: Arc<dyn Store>) -> PluginRegistry {
        PluginRegistry::build(
            vec![Arc::new(KvPlugin::new())],
            config,
            root,
            &HashMap::new(),
            store,
        )
        .await
        .unwrap()
    }

    struct Kv {
        registry: PluginRegistry,
        config: Config,
    }

    impl Kv {
        /// A fresh `KvPlugin` on the database `<root>/beige.db` (opened anew).
        async fn new(root: &Path) -> Self {
            Self::on(root, open_store(root)).await
        }

        /// A fresh `KvPlugin` on `store`.
        async fn on(root: &Path, store: Arc<dyn Store>) -> Self {
            let config = config(json!({}), json!({}));
            Self {
                registry: registry(root, &config, store).await,
                config,
            }
        }

        async fn with_config(root: &Path, config: Config) -> Self {
            Self {
                registry: registry(root, &config, open_store(root)).await,
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
                exec: None,
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
        let store = open_store(dir.path());
        {
            let kv = Kv::on(dir.path(), store.clone()).await;
            kv.run("a", &["set", "k", "v1"]).await;
            kv.run("a", &["set", "gone", "x"]).await;
            kv.run("a", &["del", "gone"]).await;
        }
        // The pairs are rows of plugin `kv`, scoped by agent.
        assert_eq!(store.kv_list("kv", "a", "").await.unwrap(), ["k"]);
        assert_eq!(
            store.kv_get("kv", "a", "k").await.unwrap().as_deref(),
            Some("v1")
        );
        let kv = Kv::on(dir.path(), store).await;
        assert_eq!(kv.run("a", &["get", "k"]).await, ok("v1\n"));
        assert_eq!(kv.run("a", &["list"]).await, ok("k\n"));
    }

    #[tokio::test]
    async fn survives_reopening_the_database() {
        let dir = tempfile::tempdir().unwrap();
        {
            let kv = Kv::new(dir.path()).await;
            kv.run("a", &["set", "k", "v1"]).await;
            kv.run("b", &["set", "k", "v2"]).await;
        }
        let store = open_store(dir.path());
        // Another plugin's pairs under the same scope and key are separate.
        store.kv_set("other", "a", "k", "not kv's").await.unwrap();
        let kv = Kv::on(dir.path(), store).await;
        assert_eq!(kv.run("a", &["get", "k"]).await, ok("v1\n"));
        assert_eq!(kv.run("b", &["get", "k"]).await, ok("v2\n"));
        assert_eq!(kv.run("a", &["list"]).await, ok("k\n"));
        // Nothing lands in the plugin's data folder.
        assert_eq!(std::fs::read_dir(dir.path().join("kv")).unwrap().count(), 0);
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
        // A name that is not a valid agent name never becomes a scope.
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
            exec: None,
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
                exec: None,
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
    async fn max_bytes_bounds_an_agents_keys_and_values() {
        let dir = tempfile::tempdir().unwrap();
        let kv = Kv::with_config(
            dir.path(),
            config(json!({"maxBytes": 100}), json!({"maxBytes": "1k"})),
        )
        .await;
        let v60 = "v".repeat(58); // key "k1" + 58 = 60 bytes
        assert_eq!(kv.run("a", &["set", "k1", &v60]).await, ok(""));
        let full = kv.run("a", &["set", "k2", &v60]).await;
        assert_eq!(
            full,
            ToolResult::fail(
                "kv: agent 'a' uses 60 B of 100 B (keys and values); storing this value would take it to 120 B; nothing was stored — delete keys or raise plugins.kv.config.maxBytes\n",
                1
            )
        );
        // What was stored before survives; overwriting within the limit and deleting work.
        assert_eq!(kv.run("a", &["get", "k1"]).await, ok(&format!("{v60}\n")));
        assert_eq!(kv.run("a", &["get", "k2"]).await.exit_code, 1);
        assert_eq!(kv.run("a", &["set", "k1", "short"]).await, ok(""));
        assert_eq!(kv.run("a", &["set", "k2", &v60]).await, ok(""));
        kv.run("a", &["del", "k1"]).await;
        assert_eq!(kv.run("a", &["set", "k3", "x"]).await, ok(""));
        // Agent b's override ("1k") and its own count.
        for i in 10..26 {
            assert_eq!(kv.run("b", &["set", &format!("k{i}"), &v60]).await, ok(""));
        }
        let r = kv.run("b", &["set", "k99", &v60]).await;
        assert_eq!(r.exit_code, 1);
        assert!(r.output.contains("uses 976 B of 1.0 KiB"), "{}", r.output);

        let bad = Kv::with_config(dir.path(), config(json!({"maxBytes": "lots"}), json!({}))).await;
        let err = bad
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
                config: json!({"maxBytes": -1}),
                exec: None,
            })
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("maxBytes (plugins.kv.config, or the agent's pluginConfigs.kv) must be a whole number of bytes ≥ 0 or a size such as \"64m\", not -1"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn the_default_byte_limit_is_64_mib() {
        let dir = tempfile::tempdir().unwrap();
        let kv = Kv::new(dir.path()).await;
        let mib = "v".repeat(MAX_VALUE_BYTES);
        // 63 values of 1 MiB plus their keys fit; the 64th does not.
        for i in 0..63 {
            assert_eq!(
                kv.run("a", &["set", &format!("{i:02}"), &mib]).await,
                ok("")
            );
        }
        let r = kv.run("a", &["set", "63", &mib]).await;
        assert_eq!(r.exit_code, 1, "{}", r.output);
        assert!(r.output.contains("of 64.0 MiB"), "{}", r.output);
        // Another agent has its own allowance.
        assert_eq!(kv.run("b", &["set", "k", &mib]).await, ok(""));
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
