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
//! let loaded = beige_core::plugin::load::load_plugins(&config, &home)?;
//! // loaded.plugins: Vec<Arc<dyn Plugin>>, in config order
//! // loaded.package_dirs: plugin name → its folder (mounted at /tools/packages/<tool>/)
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::Value;

use super::command::{CommandToolPlugin, CommandToolSpec};
use super::external::ExternalPlugin;
use super::{merge_config, Plugin, PluginError};
use crate::config::Config;
use crate::home::BeigeHome;

/// Plugins built into the `beige` binary, enabled by name without a `path`.
pub const BUILTIN: [&str; 2] = ["kv", "telegram"];

/// The manifest file every plugin folder holds.
pub const MANIFEST_FILE: &str = "plugin.json";

/// The source the original's toolkit plugins were installed from; its `telegram` entry
/// is served by the built-in Telegram channel.
pub const TOOLKIT_NPM_SOURCE: &str = "npm:@matthias-hausberger/beige-toolkit";

/// `plugin.json`: the original's fields plus `run` (external plugins) or `tools`
/// (command tools). Unknown fields are ignored, as the original did.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// The plugin's name: the key under `plugins` in the config and the prefix of its
    /// tool names.
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// Informational usage lines (the tools report their own).
    #[serde(default)]
    pub commands: Option<Value>,
    /// Informational: what the plugin provides (`{tools, hooks, skills, channel}`).
    #[serde(default)]
    pub provides: Option<Value>,
    /// A JSON Schema (subset) the plugin's config must match.
    #[serde(default)]
    pub config_schema: Option<Value>,
    /// Written into `plugins.<name>.config` on install.
    #[serde(default)]
    pub default_config: Option<Value>,
    /// How to start an external plugin.
    #[serde(default)]
    pub run: Option<RunSpec>,
    /// Host variables an external plugin may receive.
    #[serde(default)]
    pub env: Option<EnvDecl>,
    /// Default time limit of an external plugin's tool calls, in seconds (120).
    #[serde(default)]
    pub timeout: Option<f64>,
    /// Command tools: host commands run by the gateway.
    #[serde(default)]
    pub tools: Option<IndexMap<String, CommandToolSpec>>,
}

/// `run: {"command": "python3", "args": ["plugin.py"]}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    /// A program on `PATH`, an absolute path, or a path relative to the plugin folder
    /// (when it contains a `/`).
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
}

/// Declared environment: names of host variables passed through when set
/// (`["GITHUB_TOKEN"]`), or values resolved at load (`{"GH_TOKEN": "${GITHUB_TOKEN}"}`,
/// `${VAR:-default}` allowed).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum EnvDecl {
    Names(Vec<String>),
    Values(IndexMap<String, String>),
}

impl EnvDecl {
    /// The declared variables with their values from `env` (the gateway's environment).
    /// A name that is not set is left out; a `${VAR}` without default that is not set is
    /// an error naming it.
    pub fn resolve(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Vec<(String, String)>, String> {
        let mut out = Vec::new();
        match self {
            EnvDecl::Names(names) => {
                for name in names {
                    check_env_name(name)?;
                    if let Some(v) = env(name) {
                        out.push((name.clone(), v));
                    }
                }
            }
            EnvDecl::Values(map) => {
                for (name, template) in map {
                    check_env_name(name)?;
                    let value = crate::config::interpolate(template, env).map_err(|e| {
                        format!("env.{name}: {e} (set it in the gateway's environment or give a default with ${{VAR:-default}})")
                    })?;
                    out.push((name.clone(), value));
                }
            }
        }
        Ok(out)
    }
}

fn check_env_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "env: {name:?} is not a valid variable name (letters, digits and _)"
        ))
    }
}

/// The gateway's own environment, as a lookup.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// `PATH` for plugin processes: the gateway's, else a standard one.
pub fn base_path() -> String {
    process_env("PATH")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".to_string())
}

/// A plugin name: letters, digits, `-` and `_`, not starting with `-`, at most 64
/// characters (it names a folder and prefixes tool names).
pub fn valid_plugin_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
}

/// A manifest that could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    #[error(
        "{path}: not found — a plugin folder needs a plugin.json (see docs/external-plugins.md)"
    )]
    Missing { path: PathBuf },
    #[error("{path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// Read and check `<dir>/plugin.json`.
pub fn read_manifest(dir: &Path) -> Result<Manifest, ManifestError> {
    let path = dir.join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&path).map_err(|error| {
        if error.kind() == std::io::ErrorKind::NotFound {
            ManifestError::Missing { path: path.clone() }
        } else {
            ManifestError::Read {
                path: path.clone(),
                error,
            }
        }
    })?;
    let invalid = |message: String| ManifestError::Invalid {
        path: path.clone(),
        message,
    };
    let raw: Value = serde_json::from_str(&text).map_err(|e| invalid(format!("not JSON: {e}")))?;
    if raw.get("name").and_then(Value::as_str).is_none() {
        return Err(invalid("the manifest has no 'name' field".into()));
    }
    let manifest: Manifest =
        serde_path_to_error::deserialize(raw).map_err(|e| match e.path().to_string() {
            p if p == "." => invalid(e.inner().to_string()),
            p => invalid(format!("{p}: {}", e.inner())),
        })?;
    if !valid_plugin_name(&manifest.name) {
        return Err(invalid(format!(
            "name {:?} is not a valid plugin name (letters, digits, '-' and '_', at most 64 characters)",
            manifest.name
        )));
    }
    match (&manifest.run, &manifest.tools) {
        (Some(_), Some(_)) => Err(invalid(
            "it declares both 'run' (an external plugin) and 'tools' (command tools); put them in two plugins".into(),
        )),
        (None, None) => Err(invalid(
            "it declares neither 'run' (an external plugin) nor 'tools' (command tools). \
             TypeScript plugins of the original (index.ts) cannot run in this build: \
             see docs/external-plugins.md for the external-plugin format"
                .into(),
        )),
        _ => Ok(manifest),
    }
}

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
        if name == "telegram" && toolkit {
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

/// A value that does not match a schema: where and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct SchemaError {
    pub path: String,
    pub message: String,
}

/// Check `value` against a JSON Schema subset: `type` (a name or a list), `properties`,
/// `required`, `additionalProperties` (`false` or a schema), `enum`, `const`, `items`,
/// `minimum`, `maximum`, `minLength`, `maxLength`, `minItems`, `maxItems`. Other
/// keywords are ignored. `path` names the value in messages.
pub fn check_schema(schema: &Value, value: &Value, path: &str) -> Result<(), SchemaError> {
    let err = |message: String| SchemaError {
        path: path.to_string(),
        message,
    };
    let Some(schema) = schema.as_object() else {
        // `true` / `{}`-like schemas accept everything; `false` accepts nothing.
        return match schema {
            Value::Bool(false) => Err(err("is not allowed".into())),
            _ => Ok(()),
        };
    };
    if let Some(t) = schema.get("type") {
        let types: Vec<&str> = match t {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if !types.is_empty() && !types.iter().any(|t| type_matches(t, value)) {
            return Err(err(format!(
                "must be {} (found {})",
                types
                    .iter()
                    .map(|t| article(t))
                    .collect::<Vec<_>>()
                    .join(" or "),
                type_name(value)
            )));
        }
    }
    if let Some(Value::Array(allowed)) = schema.get("enum") {
        if !allowed.contains(value) {
            return Err(err(format!(
                "must be one of {} (found {value})",
                allowed
                    .iter()
                    .map(Value::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    if let Some(c) = schema.get("const") {
        if c != value {
            return Err(err(format!("must be {c} (found {value})")));
        }
    }
    if let Some(n) = value.as_f64() {
        if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
            if n < min {
                return Err(err(format!("must be at least {min} (found {value})")));
            }
        }
        if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
            if n > max {
                return Err(err(format!("must be at most {max} (found {value})")));
            }
        }
    }
    if let Some(s) = value.as_str() {
        let len = s.chars().count() as u64;
        if let Some(min) = schema.get("minLength").and_then(Value::as_u64) {
            if len < min {
                return Err(err(format!("must be at least {min} characters long")));
            }
        }
        if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
            if len > max {
                return Err(err(format!("must be at most {max} characters long")));
            }
        }
    }
    if let Some(items) = value.as_array() {
        let len = items.len() as u64;
        if let Some(min) = schema.get("minItems").and_then(Value::as_u64) {
            if len < min {
                return Err(err(format!("must have at least {min} items")));
            }
        }
        if let Some(max) = schema.get("maxItems").and_then(Value::as_u64) {
            if len > max {
                return Err(err(format!("must have at most {max} items")));
            }
        }
        if let Some(item_schema) = schema.get("items") {
            for (i, item) in items.iter().enumerate() {
                check_schema(item_schema, item, &format!("{path}[{i}]"))?;
            }
        }
    }
    if let Some(obj) = value.as_object() {
        let props = schema.get("properties").and_then(Value::as_object);
        if let Some(Value::Array(required)) = schema.get("required") {
            for key in required.iter().filter_map(Value::as_str) {
                if !obj.contains_key(key) {
                    return Err(SchemaError {
                        path: format!("{path}.{key}"),
                        message: "is required".into(),
                    });
                }
            }
        }
        for (key, v) in obj {
            let at = format!("{path}.{key}");
            if let Some(s) = props.and_then(|p| p.get(key)) {
                check_schema(s, v, &at)?;
                continue;
            }
            match schema.get("additionalProperties") {
                Some(Value::Bool(false)) => {
                    let known: Vec<&str> = props
                        .map(|p| p.keys().map(String::as_str).collect())
                        .unwrap_or_default();
                    let hint = match crate::config::did_you_mean(key, known.iter().copied()) {
                        Some(s) => format!(" — did you mean '{s}'?"),
                        None => String::new(),
                    };
                    return Err(SchemaError {
                        path: at,
                        message: format!(
                            "unknown field{hint} (allowed: {})",
                            if known.is_empty() {
                                "none".to_string()
                            } else {
                                known.join(", ")
                            }
                        ),
                    });
                }
                Some(s @ Value::Object(_)) => check_schema(s, v, &at)?,
                _ => {}
            }
        }
    }
    Ok(())
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => {
            v.is_i64()
                || v.is_u64()
                || v.as_f64()
                    .is_some_and(|f| f.fract() == 0.0 && f.is_finite())
        }
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        _ => true,
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn article(t: &str) -> String {
    match t {
        "object" | "array" | "integer" => format!("an {t}"),
        "null" => "null".to_string(),
        _ => format!("a {t}"),
    }
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
