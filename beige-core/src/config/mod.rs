//! Configuration: loading `config.json5`, `${VAR}` interpolation, validation, path
//! resolution and the JSON Schema.
//!
//! Owns turning a file into a validated [`Config`]; it never starts anything. The
//! pipeline is parse (JSON5) → interpolate every string at any depth → deserialize into
//! [`types`] (unknown keys are warnings) → validate (agent names, providers, mounts,
//! limits) → resolve paths against the config file's folder. Start with
//! [`Config::load`]; `docs/configuration.md` describes every field.

mod error;
mod interpolate;
mod keypath;
mod load;
pub mod mcp;
mod resolve;
mod size;
pub mod store;
pub mod types;
pub mod users;
mod validate;

pub use error::{ConfigError, NameKind};
pub use interpolate::{interpolate, UnsetVariable};
pub use load::{ConfigWarning, LoadedConfig};
pub use size::{fmt_bytes, ByteSize, FreeSpace, DEFAULT_MIN_FREE_SPACE};
pub use types::*;
pub use validate::{
    check_extra_mount, did_you_mean, is_valid_agent_name, parse_memory_limit, validate_skills,
    validate_tools, MountTarget, WritableKind, WritableTree, WritableTrees,
};

/// Deep merge of JSON config values: objects merged recursively; arrays, scalars and
/// `null` in `over` replace (`pluginConfigs` and `mcpConfigs` over their definitions).
pub fn deep_merge(base: &mut serde_json::Value, over: &serde_json::Value) {
    match (base, over) {
        (serde_json::Value::Object(b), serde_json::Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(k) {
                    Some(slot) => deep_merge(slot, v),
                    None => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// The JSON Schema of `config.json5`, generated from [`Config`]. The copy committed as
/// `config.schema.json` at the repository root is checked against it by a test.
pub fn json_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(Config)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::home::BeigeHome;

    #[test]
    fn committed_schema_is_current() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config.schema.json");
        let committed = std::fs::read_to_string(&file).unwrap_or_default();
        let generated = serde_json::to_string_pretty(&json_schema()).unwrap() + "\n";
        assert!(
            committed == generated,
            "{} is stale; regenerate it with `cargo run -p beige-cli -- config schema > config.schema.json`",
            file.display()
        );
    }

    /// The original's configs (copies of the shared reference files, kept as fixtures).
    fn original(name: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/original-configs")
            .join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn env(name: &str) -> Option<String> {
        match name {
            "ANTHROPIC_API_KEY" => Some("sk-test".into()),
            "HOME" => Some("/home/u".into()),
            _ => None,
        }
    }

    #[test]
    fn minimal_original_config_loads() {
        let home = BeigeHome::new("/var/lib/beige-test-home");
        let loaded = Config::from_str_with_env(
            &original("minimal.json5"),
            Path::new("/etc/beige/config.json5"),
            &home,
            env,
        )
        .unwrap();
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let bot = &loaded.config.agents["bot"];
        assert_eq!(bot.model.provider, "anthropic");
        assert_eq!(bot.sandbox.memory_limit, "3g");
        assert_eq!(bot.sandbox.network, NetworkMode::None);
        assert_eq!(
            loaded.config.llm.providers["anthropic"].api_key.as_deref(),
            Some("sk-test")
        );
        assert_eq!(
            loaded.config.agent_workspace(&home, "bot"),
            Path::new("/var/lib/beige-test-home/agents/bot/workspace")
        );
    }

    /// `full.json5` in a temp folder with its skill beside it; `mount` replaces its
    /// `/srv/projects` mount source.
    fn load_full(dir: &Path, mount: &str) -> Result<LoadedConfig, ConfigError> {
        let skill = dir.join("skills/code-review");
        std::fs::create_dir_all(&skill).unwrap();
        std::fs::write(skill.join("skill.json"), r#"{"name":"code-review"}"#).unwrap();
        let text = original("full.json5").replace("\"/srv/projects\"", &format!("{mount:?}"));
        let file = dir.join("config.json5");
        std::fs::write(&file, &text).unwrap();
        let home = BeigeHome::new(dir.join("home"));
        Config::from_str_with_env(&text, &file, &home, env)
    }

    #[test]
    fn full_original_config_loads_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        // The config mounts /srv/projects; create it when we may, else mount a temp folder.
        let mount = match std::fs::create_dir_all("/srv/projects") {
            Ok(()) => PathBuf::from("/srv/projects"),
            Err(e) => {
                eprintln!("cannot create /srv/projects ({e}); mounting a temp folder instead");
                let p = dir.path().join("projects");
                std::fs::create_dir_all(&p).unwrap();
                p
            }
        };
        let loaded = load_full(dir.path(), mount.to_str().unwrap()).unwrap();
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let c = &loaded.config;
        assert_eq!(c.llm.providers.len(), 6);
        assert_eq!(c.llm.providers["openai"].api_key.as_deref(), Some(""));
        assert_eq!(c.llm.providers["google"].api_key.as_deref(), Some("unset"));
        assert_eq!(c.llm.providers["anthropic"].concurrency, 4);
        let telegram = c.plugins["telegram"].config.as_ref().unwrap();
        assert_eq!(
            telegram["allowedUsers"],
            serde_json::json!([123456789, "987654321"])
        );
        let a = &c.agents["assistant"];
        assert_eq!(a.model.thinking_level, ThinkingLevel::Medium);
        assert_eq!(a.fallback_models[1].provider, "zai");
        assert_eq!(
            a.workspace_dir.as_deref(),
            Some(dir.path().join("workspaces/assistant").as_path())
        );
        assert_eq!(
            c.skills["code-review"].path,
            dir.path().join("skills/code-review")
        );
        assert_eq!(
            a.sandbox
                .extra_mounts
                .get(mount.to_str().unwrap())
                .map(String::as_str),
            Some("/projects")
        );
        assert_eq!(
            c.gateway.log_file.as_deref(),
            Some(Path::new("/home/u/.beige/logs/gateway.log"))
        );
        assert_eq!(c.agents["intern"].model.model, "llama3.1:8b");
    }

    #[test]
    fn full_original_config_without_mount_source_names_the_mount() {
        let dir = tempfile::tempdir().unwrap();
        let err = load_full(dir.path(), "/nonexistent/projects").unwrap_err();
        insta::assert_snapshot!(err
            .to_string()
            .replace(&dir.path().display().to_string(), "[DIR]"));
    }

    #[test]
    fn full_original_config_without_skill_names_the_skill() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.json5");
        let home = BeigeHome::new(dir.path().join("home"));
        let err =
            Config::from_str_with_env(&original("full.json5"), &file, &home, env).unwrap_err();
        insta::assert_snapshot!(err
            .to_string()
            .replace(&dir.path().display().to_string(), "[DIR]"));
    }
}
