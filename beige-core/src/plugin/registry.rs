//! The registrar plugins register through, and the registry built from it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::{Plugin, PluginContext, PluginError, RegisteredHooks, RegisteredTool, SkillDef, Tool};
use crate::config::Config;
use crate::hooks::{HookHandler, HookRunner};

/// Collects what one plugin registers, enforcing the naming rules.
#[derive(Debug)]
pub struct Registrar {
    plugin: String,
    package_dir: Option<PathBuf>,
    tools: Vec<RegisteredTool>,
    hooks: Vec<RegisteredHooks>,
    skills: Vec<SkillDef>,
}

impl Registrar {
    fn new(plugin: &str, package_dir: Option<PathBuf>) -> Self {
        Self {
            plugin: plugin.to_string(),
            package_dir,
            tools: Vec::new(),
            hooks: Vec::new(),
            skills: Vec::new(),
        }
    }

    /// Register a tool named `<plugin>` or `<plugin>.<sub>`.
    pub fn tool(&mut self, tool: Arc<dyn Tool>) -> Result<(), PluginError> {
        let name = tool.name();
        let ok = name == self.plugin
            || name
                .strip_prefix(&self.plugin)
                .and_then(|rest| rest.strip_prefix('.'))
                .is_some_and(|sub| !sub.is_empty());
        if !ok || !valid_tool_name(name) {
            return Err(PluginError::ToolName {
                plugin: self.plugin.clone(),
                tool: name.to_string(),
            });
        }
        if self.tools.iter().any(|t| t.tool.name() == name) {
            return Err(PluginError::DuplicateTool {
                tool: name.to_string(),
                first: self.plugin.clone(),
                second: self.plugin.clone(),
            });
        }
        self.tools.push(RegisteredTool {
            plugin: self.plugin.clone(),
            tool,
            package_dir: self.package_dir.clone(),
        });
        Ok(())
    }

    /// Register a hook handler (its [`HookHandler::hooks`] says which hooks).
    pub fn hooks(&mut self, handler: Arc<dyn HookHandler>) {
        self.hooks.push(RegisteredHooks {
            plugin: self.plugin.clone(),
            handler,
        });
    }

    /// Register a skill.
    pub fn skill(&mut self, skill: SkillDef) {
        self.skills.push(skill);
    }
}

/// A tool name is a file name in `/tools/bin`: letters, digits, `.`, `_`, `-`.
fn valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Every plugin, tool, hook handler and plugin skill of a gateway.
#[derive(Debug, Clone, Default)]
pub struct PluginRegistry {
    plugins: Vec<Arc<dyn Plugin>>,
    tools: HashMap<String, RegisteredTool>,
    tool_order: Vec<String>,
    hooks: HookRunner,
    skills: Vec<(String, SkillDef)>,
}

impl PluginRegistry {
    /// Register `plugins` (already in config order). Every plugin gets the plugin data
    /// of `store`, the gateway's store (one value or [`Stores`](crate::store::Stores)),
    /// for its data, and nothing else of it.
    pub async fn build(
        plugins: Vec<Arc<dyn Plugin>>,
        config: &Config,
        data_root: &std::path::Path,
        package_dirs: &HashMap<String, PathBuf>,
        store: impl Into<crate::store::Stores>,
    ) -> Result<Self, PluginError> {
        let stores: crate::store::Stores = store.into();
        let mut tools: HashMap<String, RegisteredTool> = HashMap::new();
        let mut tool_order = Vec::new();
        let mut hooks = Vec::new();
        let mut skills: Vec<(String, SkillDef)> = Vec::new();
        for plugin in &plugins {
            let name = plugin.name().to_string();
            let data_dir = data_root.join(&name);
            std::fs::create_dir_all(&data_dir).map_err(|e| PluginError::Failed {
                plugin: name.clone(),
                message: format!("cannot create its data folder {}: {e}", data_dir.display()),
            })?;
            let ctx = PluginContext {
                config: config
                    .plugins
                    .get(&name)
                    .and_then(|p| p.config.clone())
                    .unwrap_or_else(|| serde_json::json!({})),
                data_dir,
                package_dir: package_dirs.get(&name).cloned(),
                store: stores.data.clone(),
                channel_state: stores.channels.clone(),
            };
            let mut reg = Registrar::new(&name, ctx.package_dir.clone());
            plugin.register(&ctx, &mut reg).await?;
            for t in reg.tools {
                let tname = t.tool.name().to_string();
                if let Some(first) = tools.get(&tname) {
                    return Err(PluginError::DuplicateTool {
                        tool: tname,
                        first: first.plugin.clone(),
                        second: name.clone(),
                    });
                }
                tool_order.push(tname.clone());
                tools.insert(tname, t);
            }
            hooks.extend(reg.hooks);
            for s in reg.skills {
                if let Some((first, _)) = skills.iter().find(|(_, x)| x.name == s.name) {
                    return Err(PluginError::DuplicateSkill {
                        skill: s.name,
                        first: first.clone(),
                        second: name.clone(),
                    });
                }
                skills.push((name.clone(), s));
            }
        }
        Ok(Self {
            plugins,
            tools,
            tool_order,
            hooks: HookRunner::new(hooks),
            skills,
        })
    }

    /// The registered tool called `name`, with its plugin; `None` when no plugin
    /// registered one.
    pub fn tool(&self, name: &str) -> Option<&RegisteredTool> {
        self.tools.get(name)
    }

    /// Registered tool names in registration order.
    pub fn tool_names(&self) -> &[String] {
        &self.tool_order
    }

    /// The hooks every plugin registered, ready to run in registration order.
    pub fn hooks(&self) -> &HookRunner {
        &self.hooks
    }

    /// Skills registered by plugins.
    pub fn skills(&self) -> impl Iterator<Item = &SkillDef> {
        self.skills.iter().map(|(_, s)| s)
    }

    /// Start plugins in config order; the first failure aborts.
    pub async fn start_all(&self) -> Result<(), PluginError> {
        for p in &self.plugins {
            p.start().await?;
        }
        Ok(())
    }

    /// Stop plugins in reverse config order; failures are logged.
    pub async fn stop_all(&self) {
        for p in self.plugins.iter().rev() {
            if let Err(e) = p.stop().await {
                tracing::warn!(plugin = p.name(), error = %e, "plugin stop failed");
            }
        }
    }

    /// The config a call of `tool` by `agent` gets: the plugin's `config` deep-merged
    /// with the agent's `pluginConfigs` entry for that plugin.
    pub fn call_config(&self, config: &Config, agent: &str, tool: &str) -> serde_json::Value {
        let plugin = self
            .tools
            .get(tool)
            .map(|t| t.plugin.clone())
            .unwrap_or_else(|| tool.split('.').next().unwrap_or(tool).to_string());
        let base = config.plugins.get(&plugin).and_then(|p| p.config.clone());
        let over = config
            .agents
            .get(agent)
            .and_then(|a| a.plugin_configs.get(&plugin).cloned());
        match (base, over) {
            (None, None) => serde_json::json!({}),
            (Some(b), None) => b,
            (None, Some(o)) => o,
            (Some(mut b), Some(o)) => {
                merge_config(&mut b, &o);
                b
            }
        }
    }
}

/// Deep merge: objects merged recursively; arrays, scalars and `null` in `over` replace
/// (the same merge as [`crate::config::deep_merge`], which `mcpConfigs` uses too).
pub fn merge_config(base: &mut serde_json::Value, over: &serde_json::Value) {
    crate::config::deep_merge(base, over);
}

#[cfg(test)]
#[cfg(feature = "sqlite")]
mod tests {
    use super::*;
    use crate::plugin::{ToolCall, ToolError, ToolResult};
    use async_trait::async_trait;
    use serde_json::json;

    #[derive(Debug)]
    struct Named(&'static str);

    #[async_trait]
    impl Tool for Named {
        fn name(&self) -> &str {
            self.0
        }
        fn description(&self) -> &str {
            "test"
        }
        async fn call(&self, _call: ToolCall) -> Result<ToolResult, ToolError> {
            Ok(ToolResult::ok(self.0))
        }
    }

    #[derive(Debug)]
    struct P(&'static str, Vec<&'static str>);

    #[async_trait]
    impl Plugin for P {
        fn name(&self) -> &str {
            self.0
        }
        async fn register(
            &self,
            _ctx: &PluginContext,
            reg: &mut Registrar,
        ) -> Result<(), PluginError> {
            for t in &self.1 {
                reg.tool(Arc::new(Named(t)))?;
            }
            Ok(())
        }
    }

    fn store(dir: &std::path::Path) -> Arc<dyn crate::store::Store> {
        Arc::new(crate::store::SqliteStore::open(dir.join("beige.db")).unwrap())
    }

    fn config() -> Config {
        serde_json::from_value(json!({
            "llm": {"providers": {"anthropic": {}}},
            "plugins": {"git": {"config": {"a": {"x": 1, "y": [1, 2]}, "b": "base", "secret": "s"}}},
            "agents": {"intern": {"model": {"provider": "anthropic", "model": "m"}, "tools": [],
                "pluginConfigs": {"git": {"a": {"y": [3], "z": null}, "b": "over"}}}}
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn naming_rules_and_uniqueness() {
        let dir = tempfile::tempdir().unwrap();
        let db = store(dir.path());
        let c = config();
        let none = HashMap::new();
        let build = |tools: Vec<&'static str>| {
            PluginRegistry::build(
                vec![Arc::new(P("git", tools))],
                &c,
                dir.path(),
                &none,
                db.clone(),
            )
        };
        let ok = build(vec!["git", "git.log"]).await.unwrap();
        assert_eq!(ok.tool_names(), ["git", "git.log"]);
        for bad in [vec!["gitx"], vec!["git."], vec!["git.a/b"]] {
            let err = build(bad).await.unwrap_err();
            assert!(matches!(err, PluginError::ToolName { .. }), "{err}");
        }
        let err = build(vec!["git", "git"]).await.unwrap_err();
        assert!(err.to_string().contains("registered twice"), "{err}");
    }

    #[tokio::test]
    async fn per_agent_config_is_deep_merged() {
        let dir = tempfile::tempdir().unwrap();
        let db = store(dir.path());
        let c = config();
        let r = PluginRegistry::build(
            vec![Arc::new(P("git", vec!["git", "git.log"]))],
            &c,
            dir.path(),
            &HashMap::new(),
            db.clone(),
        )
        .await
        .unwrap();
        let merged = r.call_config(&c, "intern", "git.log");
        assert_eq!(
            merged,
            json!({"a": {"x": 1, "y": [3], "z": null}, "b": "over", "secret": "s"})
        );
        // An agent without an override gets the base config.
        assert_eq!(r.call_config(&c, "nobody", "git")["b"], "base");
    }
}
