use super::*;
use serde_json::json;

fn skill_dir(root: &Path, name: &str, manifest: serde_json::Value) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("skill.json"), manifest.to_string()).unwrap();
    dir
}

fn agent(tools: &[&str], skills: &[&str], deny: &[&str]) -> AgentConfig {
    serde_json::from_value(json!({
        "model": {"provider": "anthropic", "model": "m"},
        "tools": tools,
        "skills": skills,
        "denyTools": deny,
    }))
    .unwrap()
}

fn entries(dirs: &[(&str, &Path)]) -> IndexMap<String, SkillEntry> {
    dirs.iter()
        .map(|(n, p)| {
            (
                n.to_string(),
                SkillEntry {
                    path: p.to_path_buf(),
                },
            )
        })
        .collect()
}

#[test]
fn loads_a_skill_under_its_config_key() {
    let root = tempfile::tempdir().unwrap();
    let dir = skill_dir(
        root.path(),
        "review",
        json!({"name": "Code review", "description": "Review code", "contextFile": "guide.md",
               "requires": {"tools": ["git"]}, "extra": 1}),
    );
    let def = load_skill("review", &dir).unwrap();
    assert_eq!(
        def,
        SkillDef {
            name: "review".into(),
            path: dir.clone(),
            description: "Review code".into()
        }
    );
    let m = read_manifest("review", &dir).unwrap();
    assert_eq!(m.name, "Code review");
    assert_eq!(m.context_file_or_default(), "guide.md");
    assert_eq!(m.requires.tools, ["git"]);
    assert!(m.requires.skills.is_empty());
    let plain = skill_dir(
        root.path(),
        "plain",
        json!({"name": "p", "description": "d"}),
    );
    assert_eq!(
        read_manifest("plain", &plain)
            .unwrap()
            .context_file_or_default(),
        "README.md"
    );
}

#[test]
fn manifest_errors_name_the_path_and_the_fix() {
    let root = tempfile::tempdir().unwrap();

    let gone = root.path().join("gone");
    let e = load_skill("gone", &gone).unwrap_err();
    assert!(matches!(e, SkillError::FolderMissing { .. }), "{e}");
    assert!(e.to_string().contains(&gone.display().to_string()), "{e}");
    assert!(e.to_string().contains("skills.gone.path"), "{e}");

    let empty = root.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let e = load_skill("empty", &empty).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "Skill manifest not found: {} — a skill folder needs a skill.json with \"name\" and \"description\"",
            empty.join("skill.json").display()
        )
    );

    let bad = root.path().join("bad");
    std::fs::create_dir(&bad).unwrap();
    std::fs::write(bad.join("skill.json"), "{\n  \"name\": \"x\",\n  oops\n}").unwrap();
    let e = load_skill("bad", &bad).unwrap_err();
    let SkillError::InvalidJson { line, column, .. } = &e else {
        panic!("{e}");
    };
    assert_eq!((*line, *column), (3, 3));
    let text = e.to_string();
    assert!(
        text.starts_with("Invalid JSON in skill manifest: "),
        "{text}"
    );
    assert!(text.contains("(line 3, column 3)"), "{text}");
    assert!(!text.contains(" at line "), "{text}");

    let wrong_type = skill_dir(root.path(), "wt", json!({"name": 5, "description": "d"}));
    let e = load_skill("wt", &wrong_type).unwrap_err();
    assert!(matches!(e, SkillError::InvalidJson { .. }), "{e}");

    let nameless = skill_dir(root.path(), "nameless", json!({"description": "d"}));
    let e = load_skill("nameless", &nameless).unwrap_err();
    assert!(
        e.to_string()
            .ends_with("requires 'name' and 'description'; 'name' is missing or empty"),
        "{e}"
    );
    let bare = skill_dir(root.path(), "bare", json!({"name": " ", "requires": {}}));
    let e = load_skill("bare", &bare).unwrap_err();
    assert!(
        e.to_string()
            .ends_with("'name' and 'description' are missing or empty"),
        "{e}"
    );

    for escape in ["../secret", "/etc/passwd", ""] {
        let dir = skill_dir(
            root.path(),
            "esc",
            json!({"name": "n", "description": "d", "contextFile": escape}),
        );
        let e = load_skill("esc", &dir).unwrap_err();
        assert!(
            matches!(e, SkillError::InvalidContextFile { .. }),
            "{escape}: {e}"
        );
    }
}

#[test]
fn configured_skills_win_over_plugin_skills() {
    let root = tempfile::tempdir().unwrap();
    let review = skill_dir(
        root.path(),
        "review",
        json!({"name": "r", "description": "configured"}),
    );
    let plugin_review = root.path().join("plugin-review");
    std::fs::create_dir(&plugin_review).unwrap();
    let docs = root.path().join("docs");
    std::fs::create_dir(&docs).unwrap();
    let set = SkillSet::load(
        &entries(&[("review", &review)]),
        [
            SkillDef {
                name: "review".into(),
                path: plugin_review,
                description: "from plugin".into(),
            },
            SkillDef {
                name: "docs".into(),
                path: docs.clone(),
                description: "Plugin docs".into(),
            },
        ],
    )
    .unwrap();
    assert_eq!(set.names().collect::<Vec<_>>(), ["review", "docs"]);
    assert_eq!(set.get("review").unwrap().path, review);
    assert_eq!(set.get("review").unwrap().description, "configured");
    // A plugin skill without skill.json gets a manifest from its registration.
    assert_eq!(set.get("docs").unwrap().path, docs);
    assert_eq!(set.manifest("docs").unwrap().description, "Plugin docs");
    assert!(set.manifest("docs").unwrap().requires.tools.is_empty());
    assert_eq!(set.len(), 2);

    // A plugin skill whose folder is missing is an error.
    let e = SkillSet::load(
        &IndexMap::new(),
        [SkillDef {
            name: "ghost".into(),
            path: root.path().join("ghost"),
            description: "d".into(),
        }],
    )
    .unwrap_err();
    assert!(matches!(e, SkillError::FolderMissing { .. }), "{e}");
    // A configured skill with a broken folder fails the whole set.
    let e = SkillSet::load(&entries(&[("x", &root.path().join("nope"))]), []).unwrap_err();
    assert!(matches!(e, SkillError::FolderMissing { .. }), "{e}");
}

#[test]
fn for_agent_returns_skills_in_the_agents_order() {
    let root = tempfile::tempdir().unwrap();
    let basics = skill_dir(
        root.path(),
        "git-basics",
        json!({"name": "b", "description": "Git basics"}),
    );
    let review = skill_dir(
        root.path(),
        "review",
        json!({"name": "r", "description": "Review", "requires": {"tools": ["git", "exec"], "skills": ["git-basics"]}}),
    );
    let set = SkillSet::load(
        &entries(&[("git-basics", &basics), ("review", &review)]),
        [],
    )
    .unwrap();
    let got = set
        .for_agent(
            "senior",
            &agent(&["git"], &["review", "git-basics", "review"], &[]),
        )
        .unwrap();
    let names: Vec<&str> = got.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["review", "git-basics"]);
    assert!(set
        .for_agent("none", &agent(&[], &[], &[]))
        .unwrap()
        .is_empty());
}

#[test]
fn for_agent_errors() {
    let root = tempfile::tempdir().unwrap();
    let basics = skill_dir(
        root.path(),
        "git-basics",
        json!({"name": "b", "description": "Git basics"}),
    );
    let review = skill_dir(
        root.path(),
        "review",
        json!({"name": "r", "description": "Review", "requires": {"tools": ["git", "exec"], "skills": ["git-basics"]}}),
    );
    let set = SkillSet::load(
        &entries(&[("git-basics", &basics), ("review", &review)]),
        [],
    )
    .unwrap();

    let e = set
        .for_agent("intern", &agent(&["git"], &["reveiw"], &[]))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "agent 'intern' uses skill 'reveiw', which is not configured; did you mean 'review'? \
             configured skills: git-basics, review. Add it under skills (or install a plugin \
             that provides it) or fix the name in agents.intern.skills."
    );
    let e = set
        .for_agent("intern", &agent(&[], &["cooking"], &[]))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "agent 'intern' uses skill 'cooking', which is not configured; configured skills: \
             git-basics, review. Add it under skills (or install a plugin that provides it) or \
             fix the name in agents.intern.skills."
    );
    let e = SkillSet::default()
        .for_agent("intern", &agent(&[], &["x"], &[]))
        .unwrap_err();
    assert!(
        e.to_string().contains("configured skills: (none). Add it"),
        "{e}"
    );

    let e = set
        .for_agent("intern", &agent(&[], &["review", "git-basics"], &[]))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "Skill 'review' requires tool 'git' but it's not available to agent 'intern'. \
             Add 'git' to agents.intern.tools or remove the skill."
    );
    let e = set
        .for_agent(
            "intern",
            &agent(&["git"], &["review", "git-basics"], &["exec"]),
        )
        .unwrap_err();
    assert!(matches!(e, SkillError::DeniedTool { .. }), "{e}");
    assert!(e.to_string().contains("agents.intern.denyTools"), "{e}");
    let e = set
        .for_agent("intern", &agent(&["git"], &["review"], &[]))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "Skill 'review' requires skill 'git-basics' but it's not available to agent 'intern'. \
             Add 'git-basics' to agents.intern.skills or remove the skill."
    );
}
