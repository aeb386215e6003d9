//! The loading pipeline: file → JSON5 → interpolation → typed config → validation →
//! path resolution.
//!
//! Owns [`Config::load`] and [`Config::from_str_with_env`] and the translation of parser
//! and serde errors into [`ConfigError`]s with config paths. Unknown keys do not fail a
//! load: they come back as [`ConfigWarning`]s, with a suggestion when they look like a
//! typo of a known key.

use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::home::{normalize, user_home, BeigeHome};

use super::error::ConfigError;
use super::interpolate::interpolate_tree;
use super::keypath::{KeyPath, Seg};
use super::resolve::{resolve_paths, Resolver};
use super::types::Config;
use super::validate::{check_raw, did_you_mean, validate};

/// A validated config, with where it came from and what was odd about it.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    /// The config, interpolated, validated and with its paths resolved.
    pub config: Config,
    /// The absolute path of the file.
    pub path: PathBuf,
    /// Problems that did not stop the load (unknown keys).
    pub warnings: Vec<ConfigWarning>,
}

/// Something in the file that was ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigWarning {
    /// Where in the config, e.g. `agents.bot.modle`.
    pub path: String,
    /// What was ignored and why, with a suggestion when the key looks like a typo.
    pub message: String,
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

impl Config {
    /// Load, interpolate (from the process environment), validate and resolve the
    /// config file at `path`.
    pub fn load(path: &Path, home: &BeigeHome) -> Result<LoadedConfig, ConfigError> {
        let file = absolute(path);
        let text = std::fs::read_to_string(&file).map_err(|error| {
            if error.kind() == std::io::ErrorKind::NotFound {
                ConfigError::NotFound { file: file.clone() }
            } else {
                ConfigError::Read {
                    file: file.clone(),
                    error,
                }
            }
        })?;
        Self::from_str_with_env(&text, &file, home, |name| {
            std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
        })
    }

    /// The same pipeline on `text`, as if read from `file` (used for relative paths and
    /// in messages), with `env` as the environment (`HOME` from it also gives `~`).
    pub fn from_str_with_env(
        text: &str,
        file: &Path,
        home: &BeigeHome,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<LoadedConfig, ConfigError> {
        let file = absolute(file);
        if text.trim().is_empty() {
            return Err(ConfigError::Invalid {
                file,
                path: String::new(),
                message: "the file is empty — a config needs at least llm.providers and \
                          agents; docs/configuration.md has an example"
                    .to_string(),
            });
        }
        let mut value: Value = json5::from_str(text).map_err(|e| syntax_error(&file, text, e))?;
        if !value.is_object() {
            return Err(ConfigError::Invalid {
                file,
                path: String::new(),
                message: "the file must hold one JSON5 object, e.g. { llm: { … }, agents: { … } }"
                    .to_string(),
            });
        }
        interpolate_tree(&mut value, &env).map_err(|(path, unset)| ConfigError::UnsetVariable {
            file: file.clone(),
            path: path.to_string(),
            variable: unset.name,
        })?;
        check_raw(&value, &file)?;

        let mut ignored: Vec<KeyPath> = Vec::new();
        let mut on_ignored = |p: serde_ignored::Path<'_>| ignored.push(ignored_path(&p));
        let config: Config = serde_path_to_error::deserialize(serde_ignored::Deserializer::new(
            value,
            &mut on_ignored,
        ))
        .map_err(|e| type_error(&file, e))?;
        let mut warnings = unknown_key_warnings(&ignored);
        warnings.extend(ineffective_cap_add(&config));

        let resolver = Resolver {
            base: file
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| "/".into()),
            user_home: env("HOME")
                .filter(|h| !h.is_empty())
                .map(PathBuf::from)
                .unwrap_or_else(user_home),
        };
        validate(&config, &file, home, &resolver)?;
        let mut config = config;
        resolve_paths(&mut config, &resolver);
        Ok(LoadedConfig {
            config,
            path: file,
            warnings,
        })
    }

    /// The host folder mounted at `/workspace` for `agent`: `workspaceDir` when set,
    /// else `<BEIGE_HOME>/agents/<agent>/workspace`.
    pub fn agent_workspace(&self, home: &BeigeHome, agent: &str) -> PathBuf {
        self.agents
            .get(agent)
            .and_then(|a| a.workspace_dir.clone())
            .unwrap_or_else(|| home.default_workspace(agent))
    }
}

fn absolute(path: &Path) -> PathBuf {
    if path.is_absolute() {
        normalize(path)
    } else {
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        normalize(&cwd.join(path))
    }
}

fn syntax_error(file: &Path, text: &str, err: json5::Error) -> ConfigError {
    let json5::Error::Message { msg, location } = err;
    // pest's message is a multi-line drawing; its last `= …` line says what was expected.
    let message = msg
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("= "))
        .unwrap_or(&msg)
        .to_string();
    let source_line = location.as_ref().and_then(|l| {
        let line = text.lines().nth(l.line.checked_sub(1)?)?.trim();
        Some(match line.char_indices().nth(80) {
            Some((cut, _)) => format!("{}…", &line[..cut]),
            None => line.to_string(),
        })
    });
    ConfigError::Syntax {
        file: file.to_path_buf(),
        line: location.as_ref().map(|l| l.line),
        column: location.as_ref().map(|l| l.column),
        message,
        source_line,
    }
}

fn type_error(file: &Path, err: serde_path_to_error::Error<serde_json::Error>) -> ConfigError {
    let mut path = KeyPath::root();
    for seg in err.path().iter() {
        match seg {
            serde_path_to_error::Segment::Map { key } => path.push(Seg::Key(key.clone())),
            serde_path_to_error::Segment::Seq { index } => path.push(Seg::Index(*index)),
            serde_path_to_error::Segment::Enum { .. } | serde_path_to_error::Segment::Unknown => {}
        }
    }
    let message = humanize(&err.into_inner().to_string());
    let missing = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.strip_suffix('`'));
    match missing {
        Some(field) => ConfigError::MissingField {
            file: file.to_path_buf(),
            path: path.key(field).to_string(),
            field: field.to_string(),
        },
        None => ConfigError::Invalid {
            file: file.to_path_buf(),
            path: path.to_string(),
            message,
        },
    }
}

/// serde names Rust types ("expected u64"); say what to write instead.
fn humanize(message: &str) -> String {
    const TERMS: [(&str, &str); 8] = [
        ("expected u16", "expected a whole number from 0 to 65535"),
        ("expected u32", "expected a whole number ≥ 0"),
        ("expected u64", "expected a whole number ≥ 0"),
        ("expected i64", "expected a whole number"),
        ("expected f64", "expected a number"),
        ("expected a map", "expected an object"),
        ("expected a sequence", "expected an array"),
        ("expected struct ", "expected an object: "),
    ];
    TERMS
        .iter()
        .fold(message.to_string(), |m, (from, to)| m.replace(from, to))
}

fn ignored_path(path: &serde_ignored::Path<'_>) -> KeyPath {
    fn collect(path: &serde_ignored::Path<'_>, out: &mut Vec<Seg>) {
        use serde_ignored::Path as P;
        match path {
            P::Root => {}
            P::Seq { parent, index } => {
                collect(parent, out);
                out.push(Seg::Index(*index));
            }
            P::Map { parent, key } => {
                collect(parent, out);
                out.push(Seg::Key(key.clone()));
            }
            P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => {
                collect(parent, out)
            }
        }
    }
    let mut segs = Vec::new();
    collect(path, &mut segs);
    KeyPath::from(segs)
}

/// `sandbox.capAdd` on an agent that does not run as root: its processes hold no
/// capability whatever the container has, so the key would only widen PID 1.
fn ineffective_cap_add(config: &Config) -> Vec<ConfigWarning> {
    config
        .agents
        .iter()
        .filter(|(_, a)| !a.sandbox.cap_add.is_empty())
        .filter(|(_, a)| {
            a.sandbox
                .user
                .as_deref()
                .and_then(super::SandboxUser::parse)
                != Some(super::SandboxUser::Root)
        })
        .map(|(name, _)| ConfigWarning {
            path: format!("agents.{name}.sandbox.capAdd"),
            message: "ignored: the agent's processes run as a non-root user with no capabilities; set sandbox.user to \"root\" if the agent needs one".to_string(),
        })
        .collect()
}

fn unknown_key_warnings(ignored: &[KeyPath]) -> Vec<ConfigWarning> {
    if ignored.is_empty() {
        return Vec::new();
    }
    let schema = super::json_schema();
    ignored
        .iter()
        .filter_map(|path| {
            let (last, parent) = path.segments().split_last()?;
            let Seg::Key(key) = last else { return None };
            if parent.is_empty() && key == "$schema" {
                return None;
            }
            let known = known_keys(&schema, parent);
            let mut message = "unknown key, ignored".to_string();
            if let Some(s) = did_you_mean(key, known.iter().map(String::as_str)) {
                message.push_str(&format!(" — did you mean '{s}'?"));
            }
            Some(ConfigWarning {
                path: path.to_string(),
                message,
            })
        })
        .collect()
}

/// The property names the JSON Schema allows at `path`.
fn known_keys(schema: &Value, path: &[Seg]) -> Vec<String> {
    let mut node = schema;
    for seg in path {
        node = deref(schema, node);
        let next = match seg {
            Seg::Key(k) => node
                .pointer(&format!(
                    "/properties/{}",
                    k.replace('~', "~0").replace('/', "~1")
                ))
                .or_else(|| node.get("additionalProperties").filter(|v| v.is_object())),
            Seg::Index(_) => node.get("items"),
        };
        match next {
            Some(n) => node = n,
            None => return Vec::new(),
        }
    }
    deref(schema, node)
        .get("properties")
        .and_then(Value::as_object)
        .map(|props| props.keys().cloned().collect())
        .unwrap_or_default()
}

/// Follow `$ref` and the `allOf`/`anyOf` wrappers schemars puts around referenced types.
fn deref<'a>(root: &'a Value, mut node: &'a Value) -> &'a Value {
    for _ in 0..8 {
        if let Some(target) = node
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix('#'))
            .and_then(|r| root.pointer(r))
        {
            node = target;
            continue;
        }
        let wrapped = ["allOf", "anyOf"].iter().find_map(|k| {
            node.get(*k)?
                .as_array()?
                .iter()
                .find(|v| v.get("type").and_then(Value::as_str) != Some("null"))
        });
        match wrapped {
            Some(inner) => node = inner,
            None => break,
        }
    }
    node
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "/etc/beige/config.json5";

    fn env(name: &str) -> Option<String> {
        match name {
            "HOME" => Some("/home/u".into()),
            "KEY" => Some("secret".into()),
            _ => None,
        }
    }

    fn load(text: &str) -> Result<LoadedConfig, ConfigError> {
        Config::from_str_with_env(text, Path::new(FILE), &BeigeHome::new("/var/lib/bh"), env)
    }

    fn err(text: &str) -> String {
        load(text).map(|_| ()).unwrap_err().to_string()
    }

    const MINIMAL: &str = r#"{
      // comments, unquoted keys, single quotes and trailing commas are JSON5
      llm: { providers: { anthropic: { apiKey: '${KEY}', }, }, },
      agents: { bot: { model: { provider: "anthropic", model: "m" }, tools: [] } },
    }"#;

    #[test]
    fn json5_syntax_and_interpolation() {
        let loaded = load(MINIMAL).unwrap();
        assert_eq!(loaded.path, Path::new(FILE));
        assert_eq!(
            loaded.config.llm.providers["anthropic"].api_key.as_deref(),
            Some("secret")
        );
    }

    #[test]
    fn syntax_errors_have_line_and_column() {
        let text = "{\n  llm: {\n    providers: { a: { apiKey: } },\n  },\n}";
        insta::assert_snapshot!(err(text));
        insta::assert_snapshot!(err(""));
        insta::assert_snapshot!(err("[1, 2]"));
    }

    #[test]
    fn unset_variable_names_variable_and_path() {
        let text = MINIMAL.replace("${KEY}", "${ANTHROPIC_API_KEY}");
        insta::assert_snapshot!(err(&text));
    }

    #[test]
    fn type_errors_name_the_path() {
        let text = MINIMAL.replace("tools: []", r#"tools: ["kv", 5]"#);
        insta::assert_snapshot!(err(&text));
        let text = MINIMAL.replace("tools: []", "");
        insta::assert_snapshot!(err(&text));
        let text = MINIMAL.replace("tools: []", "tools: [], maxTurns: -1");
        insta::assert_snapshot!(err(&text));
        let text = MINIMAL.replace("llm:", "gateway: { log: { maxFiles: 'five' } }, llm:");
        insta::assert_snapshot!(err(&text));
    }

    #[test]
    fn unknown_keys_are_warnings_with_suggestions() {
        let text = MINIMAL
            .replace("{\n", "{\n  $schema: 'x', extra: 1,\n")
            .replace(
                "tools: []",
                "tools: [], modle: {}, sandbox: { memoryLimt: '1g' }",
            )
            .replace("model: \"m\"", "model: \"m\", thinkinglevel: 'high'");
        let loaded = load(&text).unwrap();
        let warnings: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
        assert_eq!(
            warnings,
            [
                "extra: unknown key, ignored",
                "agents.bot.model.thinkinglevel: unknown key, ignored — did you mean 'thinkingLevel'?",
                "agents.bot.modle: unknown key, ignored — did you mean 'model'?",
                "agents.bot.sandbox.memoryLimt: unknown key, ignored — did you mean 'memoryLimit'?",
            ]
        );
    }

    #[test]
    fn cap_add_on_a_non_root_agent_is_a_warning() {
        let text = MINIMAL.replace("tools: []", "tools: [], sandbox: { capAdd: ['NET_ADMIN'] }");
        let warnings: Vec<String> = load(&text)
            .unwrap()
            .warnings
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            warnings,
            ["agents.bot.sandbox.capAdd: ignored: the agent's processes run as a non-root user with no capabilities; set sandbox.user to \"root\" if the agent needs one"]
        );
        let root = MINIMAL.replace(
            "tools: []",
            "tools: [], sandbox: { user: 'root', capAdd: ['NET_ADMIN'] }",
        );
        assert!(load(&root).unwrap().warnings.is_empty());
    }

    #[test]
    fn plugin_config_contents_are_not_checked_for_unknown_keys() {
        let text = MINIMAL.replace(
            "agents:",
            "plugins: { kv: { config: { anything: { goes: 1 } } } }, agents:",
        );
        assert!(load(&text).unwrap().warnings.is_empty());
    }

    #[test]
    fn every_path_field_is_resolved() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("skills/s")).unwrap();
        std::fs::write(dir.path().join("skills/s/skill.json"), "{}").unwrap();
        let text = r#"{
          llm: { providers: { anthropic: {} } },
          plugins: { p: { path: "plugins/p" }, q: { path: "/opt/q" }, builtin: {} },
          skills: { s: { path: "./skills/s" } },
          agents: { a: { model: { provider: "anthropic", model: "m" }, tools: [],
                         workspaceDir: "~/ws/../work", sandbox: { extraMounts: { "skills": "/mnt/s:ro" } } } },
          sandbox: { shim: "bin/beige-shim" },
          gateway: { logFile: "~/logs/g.log" },
        }"#;
        let file = dir.path().join("config.json5");
        let home = BeigeHome::new(dir.path().join("home"));
        let loaded = Config::from_str_with_env(text, &file, &home, env).unwrap();
        let c = &loaded.config;
        let d = dir.path();
        assert_eq!(
            c.plugins["p"].path.as_deref(),
            Some(d.join("plugins/p").as_path())
        );
        assert_eq!(c.plugins["q"].path.as_deref(), Some(Path::new("/opt/q")));
        assert_eq!(c.plugins["builtin"].path, None);
        assert_eq!(c.skills["s"].path, d.join("skills/s"));
        assert_eq!(
            c.agents["a"].workspace_dir.as_deref(),
            Some(Path::new("/home/u/work"))
        );
        assert_eq!(c.agent_workspace(&home, "a"), Path::new("/home/u/work"));
        let mounts: Vec<_> = c.agents["a"].sandbox.extra_mounts.keys().cloned().collect();
        assert_eq!(mounts, [d.join("skills").display().to_string()]);
        assert_eq!(
            c.sandbox.shim.as_deref(),
            Some(d.join("bin/beige-shim").as_path())
        );
        assert_eq!(
            c.gateway.log_file.as_deref(),
            Some(Path::new("/home/u/logs/g.log"))
        );
    }

    #[test]
    fn load_reads_the_file_and_reports_missing_ones() {
        let dir = tempfile::tempdir().unwrap();
        let home = BeigeHome::new(dir.path().join("home"));
        let file = dir.path().join("config.json5");
        let e = Config::load(&file, &home).unwrap_err();
        assert!(matches!(e, ConfigError::NotFound { .. }), "{e}");
        assert_eq!(e.file(), file);
        std::fs::write(&file, MINIMAL.replace("${KEY}", "literal")).unwrap();
        let loaded = Config::load(&file, &home).unwrap();
        assert_eq!(loaded.config.agents.len(), 1);
        std::fs::write(&file, [0xff, 0xfe]).unwrap();
        let e = Config::load(&file, &home).unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }), "{e}");
    }
}
