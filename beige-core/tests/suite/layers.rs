//! The layering of beige-core's modules (`docs/embedding.md`, sdk spec §8): reads every
//! source file under `src/` and fails on an import edge the rules below forbid, naming
//! the file and the edge. Comments, doc comments and test modules do not count: only code
//! that is compiled into the library does.
//!
//! The rules that hold today:
//! - no circle between the gateway and any channel: `channel::*` never names `gateway`,
//!   and the gateway never names a specific channel (`channel::http`,
//!   `channel::telegram`), only the `Channel` trait and what `channel` itself exports;
//! - no circle inside `plugin/`: `manifest` and `process` are leaves, `command` uses only
//!   them, `external` may use `command`, and only `load` uses `external`;
//! - the leaves `vocab`, `fsutil` and `plugin::process` use nothing of the crate; `hooks` never uses
//!   `plugin`; `sandbox` never uses `audit`, `policy` or `gateway`; `config` never uses
//!   `sandbox`, `plugin` or `gateway`; `audit`, `policy` and `store` never use
//!   `sandbox`, `plugin` or `gateway`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// `(module of the file, module it may never name)`. A module is `a` or `a::b`; a rule
/// on `a` covers `a::b` too.
const FORBIDDEN: &[(&str, &str)] = &[
    ("channel", "gateway"),
    ("channel", "agent"),
    ("channel", "sandbox"),
    ("gateway", "channel::http"),
    ("gateway", "channel::telegram"),
    ("plugin::manifest", "plugin::load"),
    ("plugin::manifest", "plugin::command"),
    ("plugin::manifest", "plugin::external"),
    ("plugin::process", "plugin::load"),
    ("plugin::process", "plugin::command"),
    ("plugin::process", "plugin::external"),
    ("plugin::command", "plugin::load"),
    ("plugin::command", "plugin::external"),
    ("plugin::external", "plugin::load"),
    ("hooks", "plugin"),
    ("sandbox", "audit"),
    ("sandbox", "policy"),
    ("sandbox", "gateway"),
    ("config", "sandbox"),
    ("config", "plugin"),
    ("config", "gateway"),
    ("audit", "sandbox"),
    ("audit", "plugin"),
    ("audit", "gateway"),
    ("policy", "sandbox"),
    ("policy", "plugin"),
    ("policy", "gateway"),
    ("store", "sandbox"),
    ("store", "plugin"),
    ("store", "gateway"),
];

/// Modules that use nothing else of the crate.
const LEAVES: &[&str] = &["vocab", "fsutil", "plugin::process"];

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a file belongs to: `gateway/serve.rs` → `gateway`, `plugin/load.rs` →
/// `plugin::load`, `channel/telegram/poll.rs` → `channel::telegram`.
fn module_of(rel: &Path) -> String {
    let parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    match parts.as_slice() {
        [top, sub, ..] if (top == "channel" || top == "plugin") && sub != "mod" => {
            format!("{top}::{sub}")
        }
        [top, ..] => top.clone(),
        [] => String::new(),
    }
}

/// The code of a file: without comments and without its `#[cfg(test)]` module.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            // A `//` inside a string (a URL) is rare in `use` lines; good enough here.
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules of the crate a piece of code names: `crate::a` and `crate::a::b` (for
/// `channel` and `plugin`), and `super::b` inside `plugin/` and `channel/`.
fn edges(module: &str, code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let top = module.split("::").next().unwrap_or("");
    let bytes = code.as_bytes();
    for prefix in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(prefix) {
            let start = from + i;
            from = start + prefix.len();
            if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
                continue;
            }
            let path: String = code[from..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let names: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
            let target = match (prefix, names.as_slice()) {
                ("crate::", [first, second, ..])
                    if (*first == "channel" || *first == "plugin")
                        && second
                            .chars()
                            .next()
                            .is_some_and(|c| c.is_ascii_lowercase()) =>
                {
                    format!("{first}::{second}")
                }
                ("crate::", [first, ..]) => first.to_string(),
                // `super::x` from a submodule file of `plugin/` or `channel/`.
                ("super::", [first, ..])
                    if module.contains("::")
                        && first.chars().next().is_some_and(|c| c.is_ascii_lowercase()) =>
                {
                    format!("{top}::{first}")
                }
                _ => continue,
            };
            if target != module && !(target == top && module.starts_with(top)) {
                out.insert(target);
            }
        }
    }
    out
}

fn covers(rule: &str, module: &str) -> bool {
    module == rule || module.starts_with(&format!("{rule}::"))
}

#[test]
fn the_library_keeps_its_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(files.len() > 50, "found only {} source files", files.len());
    let mut broken = Vec::new();
    let mut seen_gateway_to_channel = false;
    for file in &files {
        let rel = file.strip_prefix(&root).unwrap();
        let name = rel.to_string_lossy();
        // Test files next to their module are not part of the library.
        if name.ends_with("_tests.rs") || name.starts_with("testing/") || name == "lib.rs" {
            continue;
        }
        let module = module_of(rel);
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        for target in edges(&module, &code) {
            if module == "gateway" && target.starts_with("channel") {
                seen_gateway_to_channel = true;
            }
            if LEAVES.contains(&module.as_str()) {
                broken.push(format!(
                    "{name}: {module} is a leaf but uses crate::{target}"
                ));
            }
            for (from, to) in FORBIDDEN {
                if covers(from, &module) && covers(to, &target) {
                    broken.push(format!("{name}: {module} may not use {target}"));
                }
            }
        }
    }
    // The scan itself works: the gateway does use the channel trait.
    assert!(
        seen_gateway_to_channel,
        "the scan found no gateway → channel edge at all"
    );
    assert!(broken.is_empty(), "layering broken:\n{}", broken.join("\n"));
}

#[test]
fn the_scan_sees_the_edges_it_must_forbid() {
    // A channel file that names the gateway, in the forms code uses.
    let code = code_of(
        "use crate::gateway::GatewayFull;\n// crate::agent in a comment\nfn f() { crate::sandbox::x(); }",
    );
    let found = edges("channel::telegram", &code);
    assert!(
        found.contains("gateway") && found.contains("sandbox"),
        "{found:?}"
    );
    assert!(!found.contains("agent"), "a comment counted: {found:?}");
    let found = edges("plugin::command", "use super::load::Manifest;");
    assert_eq!(found.into_iter().collect::<Vec<_>>(), ["plugin::load"]);
    assert_eq!(
        module_of(Path::new("channel/telegram/poll.rs")),
        "channel::telegram"
    );
    assert_eq!(module_of(Path::new("plugin/mod.rs")), "plugin");
}
