//! `plugin.json` and the checks that need nothing but it: the manifest's fields, plugin
//! names, the environment a manifest declares, and the `configSchema` check. A leaf of
//! `plugin/`: the loader, external plugins and command tools use it, and it uses none of
//! them (so the three never import each other in a circle).

use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::Value;

/// Plugins built into the `beige` binary, enabled by name without a `path`.
pub const BUILTIN: [&str; 3] = ["kv", "telegram", "sessions"];

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
    /// One line about the plugin, shown by `beige plugins list` and on install.
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
    /// The folder has no `plugin.json`.
    #[error(
        "{path}: not found — a plugin folder needs a plugin.json (see docs/external-plugins.md)"
    )]
    Missing {
        /// Where `plugin.json` was looked for.
        path: PathBuf,
    },
    /// `plugin.json` could not be read.
    #[error("{path}: {error}")]
    Read {
        /// The `plugin.json` that could not be read.
        path: PathBuf,
        /// The I/O error reading it.
        error: std::io::Error,
    },
    /// `plugin.json` is invalid.
    #[error("{path}: {message}")]
    Invalid {
        /// The invalid `plugin.json`.
        path: PathBuf,
        /// What is wrong with it (not JSON, a field of the wrong type with its path, a
        /// bad name, neither or both of `run` and `tools`).
        message: String,
    },
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

/// A value that does not match a schema: where and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub(crate) struct SchemaError {
    pub path: String,
    pub message: String,
}

/// Check `value` against a JSON Schema subset: `type` (a name or a list), `properties`,
/// `required`, `additionalProperties` (`false` or a schema), `enum`, `const`, `items`,
/// `minimum`, `maximum`, `minLength`, `maxLength`, `minItems`, `maxItems`. Other
/// keywords are ignored. `path` names the value in messages.
pub(crate) fn check_schema(schema: &Value, value: &Value, path: &str) -> Result<(), SchemaError> {
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

/// One entry of a manifest's `tools`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandToolSpec {
    /// The program: a name looked up on `PATH`, an absolute path, or a path relative to
    /// the plugin folder (when it contains a `/`).
    pub command: String,
    /// One line for the system prompt; ``Runs `<command>` on the host.`` when unset.
    #[serde(default)]
    pub description: Option<String>,
    /// Arguments always placed before the caller's (not matched by the rules), e.g.
    /// `["-c", "core.hooksPath=/dev/null"]`.
    #[serde(default)]
    pub args: Vec<String>,
    /// Patterns of allowed argument lists; at least one.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Patterns of refused argument lists; checked first.
    #[serde(default)]
    pub deny: Vec<String>,
    /// The only variables besides `PATH` the command gets.
    #[serde(default)]
    pub env: Option<EnvDecl>,
    /// Seconds (default 60).
    #[serde(default)]
    pub timeout: Option<f64>,
    /// Bytes of output kept (default 65536).
    #[serde(default)]
    pub max_output: Option<usize>,
    /// Usage lines for the agent's system prompt.
    #[serde(default)]
    pub commands: Vec<String>,
}
