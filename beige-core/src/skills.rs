//! Skills: read-only folders of instructions and reference material an agent reads at
//! `/skills/<name>/`.
//!
//! Owns reading a skill's manifest (`skill.json`), merging the configured (standalone)
//! skills with the skills plugins register — a configured skill wins a name clash — and
//! checking each agent's skills: every skill it names exists, and every skill's
//! `requires.tools` and `requires.skills` are available to that agent. It keeps the
//! manifests for the system prompt. It does not mount folders (the sandbox spec does) or
//! write the prompt.

use std::path::{Component, Path, PathBuf};

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

use crate::config::{did_you_mean, AgentConfig, SkillEntry};
use crate::plugin::SkillDef;
use crate::tools::CORE_TOOLS;

/// The manifest file every skill folder holds.
pub(crate) const MANIFEST_FILE: &str = "skill.json";

/// The context file when a manifest names none.
pub(crate) const DEFAULT_CONTEXT_FILE: &str = "README.md";

/// A skill's `skill.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SkillManifest {
    /// Informative only: the skill's name is its key in the config (or the name a plugin
    /// registered it under).
    pub name: String,
    /// One line, shown in the agent's system prompt.
    pub description: String,
    /// The file an agent should read first, relative to the folder; default `README.md`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_file: Option<String>,
    /// The tools and skills an agent must also have for this skill to work; none when
    /// unset.
    #[serde(default)]
    pub requires: Requires,
}

impl SkillManifest {
    /// [`Self::context_file`], or `README.md` when unset.
    pub fn context_file_or_default(&self) -> &str {
        self.context_file.as_deref().unwrap_or(DEFAULT_CONTEXT_FILE)
    }
}

/// What an agent must have for a skill to work.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Requires {
    /// Tools (plugin or core) the agent must be allowed to use.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Other skills the agent must also list.
    #[serde(default)]
    pub skills: Vec<String>,
}

/// `skill.json` as written, before the required fields are checked.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawManifest {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    context_file: Option<String>,
    #[serde(default)]
    requires: Requires,
}

/// Why a skill could not be loaded or an agent's skills do not fit together.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SkillError {
    /// The skill's folder does not exist.
    #[error("Skill folder not found: {} (skill '{skill}') — create the folder or fix the skill's path (skills.{skill}.path in the config)", path.display())]
    FolderMissing {
        /// The skill's name (its key under `skills`, or the name a plugin registered it
        /// under).
        skill: String,
        /// The folder that was expected.
        path: PathBuf,
    },

    /// The skill folder has no `skill.json`.
    #[error("Skill manifest not found: {} — a skill folder needs a skill.json with \"name\" and \"description\"", path.display())]
    ManifestMissing {
        /// The skill's name (its key under `skills`, or the name a plugin registered it
        /// under).
        skill: String,
        /// Where `skill.json` was looked for.
        path: PathBuf,
    },

    /// `skill.json` could not be read.
    #[error("Cannot read skill manifest {}: {source}", path.display())]
    Io {
        /// The skill's name (its key under `skills`, or the name a plugin registered it
        /// under).
        skill: String,
        /// The `skill.json` that could not be read.
        path: PathBuf,
        /// The I/O error reading it.
        #[source]
        source: std::io::Error,
    },

    /// `skill.json` is not valid JSON.
    #[error("Invalid JSON in skill manifest: {} (line {line}, column {column}): {message}", path.display())]
    InvalidJson {
        /// The skill's name (its key under `skills`, or the name a plugin registered it
        /// under).
        skill: String,
        /// The `skill.json` that failed to parse.
        path: PathBuf,
        /// Line of the error, counted from 1.
        line: usize,
        /// Column of the error, counted from 1.
        column: usize,
        /// The parser's message, without its trailing position.
        message: String,
    },

    /// `skill.json` lacks `name` or `description`.
    #[error("Skill manifest {} requires 'name' and 'description'; {} missing or empty", path.display(), missing_list(.missing))]
    MissingFields {
        /// The skill's name (its key under `skills`, or the name a plugin registered it
        /// under).
        skill: String,
        /// The `skill.json` that lacks them.
        path: PathBuf,
        /// The required fields that are missing or blank: `"name"`, `"description"` or
        /// both.
        missing: Vec<&'static str>,
    },

    /// `contextFile` is not a relative path inside the skill folder.
    #[error("Skill manifest {}: contextFile '{context_file}' must be a relative path inside the skill folder", path.display())]
    InvalidContextFile {
        /// The skill's name (its key under `skills`, or the name a plugin registered it
        /// under).
        skill: String,
        /// The `skill.json` that names it.
        path: PathBuf,
        /// The `contextFile` as written (absolute, empty or climbing out with `..`).
        context_file: String,
    },

    /// An agent names a skill that is not configured.
    #[error("agent '{agent}' uses skill '{skill}', which is not configured; {}. Add it under skills (or install a plugin that provides it) or fix the name in agents.{agent}.skills.", unknown_hint(.suggestion, .configured))]
    UnknownSkill {
        /// The agent whose `skills` names it.
        agent: String,
        /// The skill name that matched nothing.
        skill: String,
        /// The closest existing skill name, when one is near enough to be a likely typo.
        suggestion: Option<String>,
        /// Every skill name that does exist, configured ones first.
        configured: Vec<String>,
    },

    /// A skill needs a tool the agent does not have.
    #[error("Skill '{skill}' requires tool '{tool}' but it's not available to agent '{agent}'. Add '{tool}' to agents.{agent}.tools or remove the skill.")]
    MissingTool {
        /// The skill whose `requires.tools` names the tool.
        skill: String,
        /// The required tool, neither a core tool nor in the agent's `tools`.
        tool: String,
        /// The agent that lists the skill.
        agent: String,
    },

    /// A skill needs a tool the agent's `denyTools` takes away.
    #[error("Skill '{skill}' requires tool '{tool}' but agents.{agent}.denyTools takes it away from agent '{agent}'. Remove '{tool}' from agents.{agent}.denyTools or remove the skill.")]
    DeniedTool {
        /// The skill whose `requires.tools` names the tool.
        skill: String,
        /// The required tool, listed in the agent's `denyTools`.
        tool: String,
        /// The agent that lists the skill.
        agent: String,
    },

    /// A skill needs another skill the agent does not have.
    #[error("Skill '{skill}' requires skill '{required}' but it's not available to agent '{agent}'. Add '{required}' to agents.{agent}.skills or remove the skill.")]
    MissingSkill {
        /// The skill whose `requires.skills` names the other.
        skill: String,
        /// The required skill, not in the agent's `skills`.
        required: String,
        /// The agent that lists the skill.
        agent: String,
    },
}

fn missing_list(missing: &[&str]) -> String {
    let quoted: Vec<String> = missing.iter().map(|m| format!("'{m}'")).collect();
    match quoted.as_slice() {
        [one] => format!("{one} is"),
        _ => format!("{} are", quoted.join(" and ")),
    }
}

fn unknown_hint(suggestion: &Option<String>, configured: &[String]) -> String {
    let list = if configured.is_empty() {
        "(none)".to_string()
    } else {
        configured.join(", ")
    };
    match suggestion {
        Some(s) => format!("did you mean '{s}'? configured skills: {list}"),
        None => format!("configured skills: {list}"),
    }
}

/// Read and check `<dir>/skill.json`.
pub(crate) fn read_manifest(name: &str, dir: &Path) -> Result<SkillManifest, SkillError> {
    if !dir.is_dir() {
        return Err(SkillError::FolderMissing {
            skill: name.to_string(),
            path: dir.to_path_buf(),
        });
    }
    let path = dir.join(MANIFEST_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(SkillError::ManifestMissing {
                skill: name.to_string(),
                path,
            })
        }
        Err(source) => {
            return Err(SkillError::Io {
                skill: name.to_string(),
                path,
                source,
            })
        }
    };
    let raw: RawManifest = serde_json::from_str(&text).map_err(|e| {
        let message = e.to_string();
        let position = format!(" at line {} column {}", e.line(), e.column());
        SkillError::InvalidJson {
            skill: name.to_string(),
            path: path.clone(),
            line: e.line(),
            column: e.column(),
            message: message
                .strip_suffix(&position)
                .unwrap_or(&message)
                .to_string(),
        }
    })?;
    let present = |v: &Option<String>| v.as_deref().is_some_and(|s| !s.trim().is_empty());
    let missing: Vec<&'static str> = [("name", &raw.name), ("description", &raw.description)]
        .into_iter()
        .filter(|(_, v)| !present(v))
        .map(|(field, _)| field)
        .collect();
    if !missing.is_empty() {
        return Err(SkillError::MissingFields {
            skill: name.to_string(),
            path,
            missing,
        });
    }
    if let Some(file) = &raw.context_file {
        if !is_inside(file) {
            return Err(SkillError::InvalidContextFile {
                skill: name.to_string(),
                path,
                context_file: file.clone(),
            });
        }
    }
    Ok(SkillManifest {
        name: raw.name.unwrap_or_default(),
        description: raw.description.unwrap_or_default(),
        context_file: raw.context_file,
        requires: raw.requires,
    })
}

/// A non-empty relative path that never climbs out of its folder.
fn is_inside(file: &str) -> bool {
    let path = Path::new(file);
    !file.is_empty()
        && !file.contains('\0')
        && path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

/// Load the skill `name` (its config key) from `dir`: the folder must exist and hold a
/// valid `skill.json`.
#[cfg(test)]
pub(crate) fn load_skill(name: &str, dir: &Path) -> Result<SkillDef, SkillError> {
    let manifest = read_manifest(name, dir)?;
    Ok(SkillDef {
        name: name.to_string(),
        path: dir.to_path_buf(),
        description: manifest.description,
    })
}

/// Where a skill came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Config,
    Plugin,
}

#[derive(Debug, Clone)]
struct Loaded {
    def: SkillDef,
    manifest: SkillManifest,
    origin: Origin,
}

/// Every skill of a gateway: the configured ones, then those plugins registered, by name.
#[derive(Debug, Clone, Default)]
pub struct SkillSet {
    skills: IndexMap<String, Loaded>,
}

impl SkillSet {
    /// Load the configured skills (`config.skills`, paths already absolute) and add the
    /// plugins' skills. A configured skill wins over a plugin skill of the same name (a
    /// warning is logged). A plugin skill's folder must exist; its `skill.json` is
    /// optional (without one it has no requirements) but must be valid when present.
    pub fn load(
        standalone: &IndexMap<String, SkillEntry>,
        plugin_skills: impl IntoIterator<Item = SkillDef>,
    ) -> Result<Self, SkillError> {
        let mut skills = IndexMap::new();
        for (name, entry) in standalone {
            let manifest = read_manifest(name, &entry.path)?;
            let def = SkillDef {
                name: name.clone(),
                path: entry.path.clone(),
                description: manifest.description.clone(),
            };
            skills.insert(
                name.clone(),
                Loaded {
                    def,
                    manifest,
                    origin: Origin::Config,
                },
            );
        }
        for def in plugin_skills {
            if let Some(existing) = skills.get(&def.name) {
                if existing.origin == Origin::Config {
                    tracing::warn!(
                        skill = %def.name,
                        configured = %existing.def.path.display(),
                        ignored = %def.path.display(),
                        "skill '{}' is configured under skills and also registered by a plugin; using the configured one",
                        def.name
                    );
                }
                continue;
            }
            let manifest = plugin_manifest(&def)?;
            let def = SkillDef {
                description: if def.description.trim().is_empty() {
                    manifest.description.clone()
                } else {
                    def.description
                },
                ..def
            };
            skills.insert(
                def.name.clone(),
                Loaded {
                    def,
                    manifest,
                    origin: Origin::Plugin,
                },
            );
        }
        Ok(Self { skills })
    }

    /// A skill by name.
    pub fn get(&self, name: &str) -> Option<&SkillDef> {
        self.skills.get(name).map(|l| &l.def)
    }

    /// A skill's manifest by name (for the system prompt's name + description lines).
    pub fn manifest(&self, name: &str) -> Option<&SkillManifest> {
        self.skills.get(name).map(|l| &l.manifest)
    }

    /// Skill names: configured ones in config order, then plugin ones.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.skills.keys().map(String::as_str)
    }

    /// How many skills there are, configured and from plugins.
    pub fn len(&self) -> usize {
        self.skills.len()
    }

    /// Whether there are no skills at all.
    pub fn is_empty(&self) -> bool {
        self.skills.is_empty()
    }

    /// The skills of agent `agent_name`, in the order its `skills` lists them (each
    /// once). Fails when it names a skill that does not exist or when a skill's
    /// `requires` is not met: every required tool must be a core tool or listed in the
    /// agent's `tools`, and not in its `denyTools`; every required skill must be listed
    /// in its `skills`.
    pub fn for_agent(
        &self,
        agent_name: &str,
        agent: &AgentConfig,
    ) -> Result<Vec<SkillDef>, SkillError> {
        let mut out: Vec<SkillDef> = Vec::new();
        for name in &agent.skills {
            let Some(skill) = self.skills.get(name) else {
                return Err(SkillError::UnknownSkill {
                    agent: agent_name.to_string(),
                    skill: name.clone(),
                    suggestion: did_you_mean(name, self.names()).map(str::to_string),
                    configured: self.names().map(str::to_string).collect(),
                });
            };
            for tool in &skill.manifest.requires.tools {
                if agent.deny_tools.contains(tool) {
                    return Err(SkillError::DeniedTool {
                        skill: name.clone(),
                        tool: tool.clone(),
                        agent: agent_name.to_string(),
                    });
                }
                if !CORE_TOOLS.contains(&tool.as_str()) && !agent.tools.contains(tool) {
                    return Err(SkillError::MissingTool {
                        skill: name.clone(),
                        tool: tool.clone(),
                        agent: agent_name.to_string(),
                    });
                }
            }
            for required in &skill.manifest.requires.skills {
                if !agent.skills.contains(required) {
                    return Err(SkillError::MissingSkill {
                        skill: name.clone(),
                        required: required.clone(),
                        agent: agent_name.to_string(),
                    });
                }
            }
            if !out.iter().any(|s| &s.name == name) {
                out.push(skill.def.clone());
            }
        }
        Ok(out)
    }
}

/// A plugin skill's manifest: its `skill.json` when it has one, else one made from what
/// the plugin registered (no requirements).
fn plugin_manifest(def: &SkillDef) -> Result<SkillManifest, SkillError> {
    match read_manifest(&def.name, &def.path) {
        Ok(manifest) => Ok(manifest),
        Err(SkillError::ManifestMissing { .. }) => Ok(SkillManifest {
            name: def.name.clone(),
            description: def.description.clone(),
            context_file: None,
            requires: Requires::default(),
        }),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
#[path = "skills_tests.rs"]
mod tests;
