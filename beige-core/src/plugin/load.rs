//! Turning `config.plugins` entries with a `path` into plugins: the `plugin.json` manifest,
//! the environment a plugin process may receive, and the `configSchema` check.
//!
//! Owns reading and checking manifests ([`Manifest`]), choosing the kind of plugin a
//! folder holds — an [external plugin](super::external) (manifest with `run`) or
//! [command tools](super::command) (manifest with `tools`) — and validating the plugin's
//! config against its `configSchema` (the base config and every agent's merged config)
//! before anything starts, with errors naming the plugin and the field
//! (`plugins.weather.config.units: must be one of "metric", "imperial"`). It does not
//! install anything (the installer is beige-cli's) and does not register or start plugins
//! (the registry and the gateway do).
//!
//! The gateway calls [`load_plugins`] once at start with the loaded config:
//!
//! ```rust,ignore
//! let loaded = beige_core::plugin::load_plugins(&config, &home)?;
//! // loaded.plugins: Vec<Arc<dyn Plugin>>, in config order
//! // loaded.package_dirs: plugin name → its folder (mounted at /tools/packages/<tool>/)
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use super::command::CommandToolPlugin;
use super::external::ExternalPlugin;
use super::{merge_config, Plugin, PluginError};
use crate::config::Config;
use crate::home::BeigeHome;

pub use super::manifest::*;
pub(crate) use super::process::process_env;

/// Plugins made from the config, with their package folders.
#[derive(Debug, Default)]
pub struct LoadedPlugins {
    /// In config order.
    pub plugins: Vec<Arc<dyn Plugin>>,
    /// Plugin name → its folder, mounted read-only at `/tools/packages/<tool>/` for each
    /// of its tools (so agents can read its `SKILL.md` / `README.md`).
    pub package_dirs: HashMap<String, PathBuf>,
}

/// Like [`load_plugins`], without the package folders.
pub fn plugins_from_config(
    config: &Config,
    home: &BeigeHome,
) -> Result<Vec<Arc<dyn Plugin>>, PluginError> {
    Ok(load_plugins(config, home)?.plugins)
}

/// Make a plugin of every `config.plugins` entry that has a `path` (absolute after
/// [`Config::load`]): an external plugin or a command-tool plugin, its config checked
/// against its `configSchema`. Built-in plugins (`kv`, `telegram`) without a path are
/// left to the gateway; any other entry without a path is an error that says how to
/// install it. Nothing is started here: external plugins start when registered.
pub fn load_plugins(config: &Config, home: &BeigeHome) -> Result<LoadedPlugins, PluginError> {
    let mut out = LoadedPlugins::default();
    for (name, entry) in &config.plugins {
        // The original toolkit's Telegram plugin is served by the built-in channel, even
        // where an old install left a `path` to its TypeScript files.
        let toolkit = entry
            .source
            .as_deref()
            .is_some_and(|s| s.starts_with(TOOLKIT_NPM_SOURCE));
        #[cfg(not(feature = "telegram"))]
        if name == "telegram" && (toolkit || entry.path.is_none()) {
            return Err(PluginError::Failed {
                plugin: name.clone(),
                message: "the built-in telegram channel is not compiled in (cargo feature `telegram`); enable it in the dependency on beige-core, or remove plugins.telegram".into(),
            });
        }
        if (name == "telegram" && toolkit) || crate::platform::serves(name, entry) {
            continue;
        }
        let Some(dir) = &entry.path else {
            if BUILTIN.contains(&name.as_str()) {
                continue;
            }
            let message = match &entry.source {
                Some(source) => format!(
                    "has `_source: {source:?}` but no `path`: it is not installed yet; run `beige plugins install {source} --force` (it installs into {}), or start the gateway, which installs it",
                    home.plugins_dir().display()
                ),
                None => format!(
                    "has no `path` and is not a built-in plugin (built-in: {}); give it a `path` to a folder with a plugin.json, or install it with `beige plugins install <source>`",
                    BUILTIN.join(", ")
                ),
            };
            return Err(PluginError::Failed {
                plugin: name.clone(),
                message,
            });
        };
        let plugin = load_plugin_dir(name, dir, config)?;
        out.package_dirs.insert(name.clone(), dir.clone());
        out.plugins.push(plugin);
    }
    Ok(out)
}

/// Make the plugin in `dir` for config entry `name`, checking its config (base and
/// per agent) against the manifest's `configSchema`.
pub fn load_plugin_dir(
    name: &str,
    dir: &Path,
    config: &Config,
) -> Result<Arc<dyn Plugin>, PluginError> {
    let fail = |message: String| PluginError::Failed {
        plugin: name.to_string(),
        message,
    };
    if !dir.is_dir() {
        return Err(fail(format!(
            "plugins.{name}.path: the folder {} does not exist{}",
            dir.display(),
            match config.plugins.get(name).and_then(|e| e.source.as_deref()) {
                Some(s) => format!("; reinstall it with `beige plugins install {s} --force`"),
                None => String::new(),
            }
        )));
    }
    let manifest = read_manifest(dir).map_err(|e| fail(e.to_string()))?;
    if manifest.name != name {
        return Err(fail(format!(
            "the manifest {} names the plugin '{}', but the config lists it as '{name}'; the key under `plugins` must be the manifest's name",
            dir.join(MANIFEST_FILE).display(),
            manifest.name
        )));
    }
    check_plugin_configs(name, manifest.config_schema.as_ref(), config)?;
    if manifest.run.is_some() {
        let mut plugin = ExternalPlugin::new(dir, manifest, &process_env)?;
        if let Some(limit) = config.plugins.get(name).and_then(|e| e.max_store_bytes) {
            plugin = plugin.with_store_limit(limit.bytes());
        }
        Ok(Arc::new(plugin))
    } else {
        let plugin = CommandToolPlugin::new(dir, manifest, &process_env)?;
        Ok(Arc::new(plugin))
    }
}

/// Check `plugins.<name>.config` and every agent's merged config against `schema`.
pub fn check_plugin_configs(
    name: &str,
    schema: Option<&Value>,
    config: &Config,
) -> Result<(), PluginError> {
    let Some(schema) = schema else {
        return Ok(());
    };
    let base = config
        .plugins
        .get(name)
        .and_then(|e| e.config.clone())
        .unwrap_or_else(|| serde_json::json!({}));
    let fail = |e: SchemaError| PluginError::Failed {
        plugin: name.to_string(),
        message: format!("invalid config: {e}"),
    };
    check_schema(schema, &base, &format!("plugins.{name}.config")).map_err(fail)?;
    for (agent, a) in &config.agents {
        if let Some(over) = a.plugin_configs.get(name) {
            let mut merged = base.clone();
            merge_config(&mut merged, over);
            check_schema(
                schema,
                &merged,
                &format!("agents.{agent}.pluginConfigs.{name}"),
            )
            .map_err(|e| {
                fail(SchemaError {
                    path: e.path,
                    message: format!(
                        "{} (in the agent's config merged over plugins.{name}.config)",
                        e.message
                    ),
                })
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schema_subset() {
        let schema = json!({
            "type": "object",
            "properties": {
                "units": {"enum": ["metric", "imperial"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
                "cities": {"type": "array", "items": {"type": "string"}},
                "apiKey": {"type": "string", "minLength": 1},
            },
            "required": ["apiKey"],
            "additionalProperties": false,
        });
        let check = |v: Value| {
            check_schema(&schema, &v, "plugins.weather.config").map_err(|e| e.to_string())
        };
        assert!(check(json!({"apiKey": "k", "units": "metric", "days": 3})).is_ok());
        assert_eq!(
            check(json!({"apiKey": "k", "units": "kelvin"})).unwrap_err(),
            r#"plugins.weather.config.units: must be one of "metric", "imperial" (found "kelvin")"#
        );
        assert_eq!(
            check(json!({"units": "metric"})).unwrap_err(),
            "plugins.weather.config.apiKey: is required"
        );
        assert_eq!(
            check(json!({"apiKey": "k", "days": 20})).unwrap_err(),
            "plugins.weather.config.days: must be at most 14 (found 20)"
        );
        assert_eq!(
            check(json!({"apiKey": "k", "days": 1.5})).unwrap_err(),
            "plugins.weather.config.days: must be an integer (found a number)"
        );
        assert_eq!(
            check(json!({"apiKey": "k", "cities": ["a", 1]})).unwrap_err(),
            "plugins.weather.config.cities[1]: must be a string (found a number)"
        );
        assert_eq!(
            check(json!({"apiKey": "k", "unit": "metric"})).unwrap_err(),
            "plugins.weather.config.unit: unknown field — did you mean 'units'? (allowed: units, days, cities, apiKey)"
        );
        assert_eq!(
            check(json!([])).unwrap_err(),
            "plugins.weather.config: must be an object (found an array)"
        );
    }

    #[test]
    fn env_declarations() {
        let env = |n: &str| match n {
            "GITHUB_TOKEN" => Some("ghp_x".to_string()),
            _ => None,
        };
        let names = EnvDecl::Names(vec!["GITHUB_TOKEN".into(), "UNSET".into()]);
        assert_eq!(
            names.resolve(&env).unwrap(),
            vec![("GITHUB_TOKEN".to_string(), "ghp_x".to_string())]
        );
        let values: EnvDecl =
            serde_json::from_value(json!({"GH_TOKEN": "${GITHUB_TOKEN}", "MODE": "${MODE:-ro}"}))
                .unwrap();
        assert_eq!(
            values.resolve(&env).unwrap(),
            vec![
                ("GH_TOKEN".to_string(), "ghp_x".to_string()),
                ("MODE".to_string(), "ro".to_string())
            ]
        );
        let missing: EnvDecl = serde_json::from_value(json!({"X": "${NOPE}"})).unwrap();
        assert!(missing.resolve(&env).unwrap_err().contains("'NOPE'"));
        let bad = EnvDecl::Names(vec!["A=B".into()]);
        assert!(bad.resolve(&env).is_err());
    }

    #[test]
    fn manifests_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let write = |text: &str| std::fs::write(dir.path().join(MANIFEST_FILE), text).unwrap();
        assert!(matches!(
            read_manifest(dir.path()),
            Err(ManifestError::Missing { .. })
        ));
        write(r#"{"description": "x"}"#);
        assert!(read_manifest(dir.path())
            .unwrap_err()
            .to_string()
            .contains("no 'name'"));
        write(r#"{"name": "../evil", "run": {"command": "x"}}"#);
        assert!(read_manifest(dir.path())
            .unwrap_err()
            .to_string()
            .contains("not a valid plugin name"));
        write(r#"{"name": "ts"}"#);
        assert!(read_manifest(dir.path())
            .unwrap_err()
            .to_string()
            .contains("TypeScript plugins"));
        write(r#"{"name": "p", "run": {"command": "x", "arg": []}}"#);
        let e = read_manifest(dir.path()).unwrap_err().to_string();
        assert!(e.contains("run.arg: unknown field `arg`"), "{e}");
        write(r#"{"name": "p", "run": {"command": "python3", "args": ["p.py"]}, "extra": 1}"#);
        assert_eq!(read_manifest(dir.path()).unwrap().name, "p");
    }
}
