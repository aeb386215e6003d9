//! Installing plugins: what `beige plugins install|list|remove|update` do, and the
//! install at gateway start of plugins that have a `_source` but no files
//! ([`ensure_installed`]).
//!
//! Owns sources (a local folder; `git+https://…`, `git+file://…`, `github:owner/repo
//! [/path][#ref]`, fetched with the system `git` into a staging folder and pinned to the
//! resolved commit), discovery of `plugin.json` (the source's root, else its immediate
//! subfolders; a package with several plugins installs them all), conflict checks before
//! anything is copied, the plugin folders `<BEIGE_HOME>/plugins/<name>`, and the
//! `plugins` entries of `config.json5`, which it edits **in place**: the entry is inserted
//! or changed and every other byte of the file — comments, formatting, order — stays as
//! it was; the new file replaces the old atomically. npm sources of the original cannot
//! run here and are refused with an explanation (the toolkit's `telegram` entry is left
//! alone: `telegram` is built in). It never loads or starts a plugin.
//!
//! What `_source` records: a local folder as its absolute path; a git source as
//! `git+<url>[?ref=<ref>]#<commit>` or `github:owner/repo[/path][?ref=<ref>]#<commit>`:
//! the fragment is what is checked out (a pinned commit: reinstalling at start gives the
//! same files), `?ref=` is the branch or tag `update` follows (none: the default branch).
//!
//! Everything in a source reaches `git`'s command line, so it is validated before
//! anything runs or is saved, and again when a recorded `_source` is read back: refs
//! are branch, tag or commit names of a conservative character set (never starting with
//! `-`, no `..`), URLs use an allowed scheme and hold no whitespace or control
//! characters. Every `git` runs with `--` before its positional arguments (or
//! `--end-of-options` before a revision), hooks off, no prompts, and only the transports
//! `https`, `http`, `ssh`, `git` and `file` allowed (`GIT_ALLOW_PROTOCOL`: never `ext::`
//! or `fd::`, which run commands).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use beige_core::home::{normalize, user_home, BeigeHome};
use beige_core::plugin::{
    read_manifest, safe_join, valid_plugin_name, Manifest, ManifestError, BUILTIN, MANIFEST_FILE,
    TOOLKIT_NPM_SOURCE,
};

/// What can go wrong while installing, listing, removing or updating plugins.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InstallError {
    #[error("config file not found at {}; run `beige setup` first (or pass --config)", .path.display())]
    ConfigNotFound { path: PathBuf },
    #[error("{}: {message}", .path.display())]
    Config { path: PathBuf, message: String },
    #[error("Plugin name conflicts detected:\n{}\nUse --force to override.", .conflicts.iter().map(|c| format!("  - {c}")).collect::<Vec<_>>().join("\n"))]
    Conflicts { conflicts: Vec<String> },
    #[error("'{src}' is an npm package of the original beige: a TypeScript module loaded into the gateway process, which this build cannot run. Use an external plugin instead (any language: a plugin.json with `run`, talking JSON-RPC over stdin/stdout — docs/external-plugins.md) or command tools for host CLIs (docs/command-tools.md). The toolkit's Telegram plugin is built in: list `telegram` under plugins without a `_source`.")]
    Npm { src: String },
    #[error("cannot use the plugin source '{src}': {message}")]
    BadSource { src: String, message: String },
    #[error("git {step} of {url} failed: {message}")]
    Git {
        url: String,
        step: String,
        message: String,
    },
    #[error("no plugins found (no plugin.json) in {src}{}", notes_text(.notes))]
    NoPlugins { src: String, notes: Vec<String> },
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("{}: {error}", .path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("no plugin '{name}' in {} and no folder {}", .config.display(), .folder.display())]
    NotInstalled {
        name: String,
        config: PathBuf,
        folder: PathBuf,
    },
    #[error("plugin '{name}' has no _source in the config, so there is nothing to update it from; reinstall it with `beige plugins install <source> --force`")]
    NoSource { name: String },
    #[error("'{name}' is the name of a built-in plugin; a plugin installed under that name would hide it — rename it in its plugin.json")]
    Reserved { name: String },
}

fn notes_text(notes: &[String]) -> String {
    if notes.is_empty() {
        String::new()
    } else {
        format!(
            "\n{}",
            notes
                .iter()
                .map(|n| format!("  - {n}"))
                .collect::<Vec<_>>()
                .join("\n")
        )
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> InstallError + '_ {
    move |error| InstallError::Io {
        path: path.to_path_buf(),
        error,
    }
}

// ---- sources ----

/// Where plugins come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A folder on this machine (absolute).
    Local(PathBuf),
    Git(GitSource),
}

/// A git repository, fetched with the system `git`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitSource {
    /// What `git fetch` gets (`https://github.com/owner/repo` for `github:`).
    pub url: String,
    /// `Some((owner, repo))` for `github:` sources (recorded in that form).
    pub github: Option<(String, String)>,
    /// A folder inside the repository to look for plugins in.
    pub subpath: Option<String>,
    /// What to check out: a commit, branch or tag; `None` for the default branch.
    pub checkout: Option<String>,
    /// The branch or tag `update` follows; `None` for the default branch.
    pub track: Option<String>,
}

impl Source {
    /// Parse a source as given on the command line or recorded in `_source`; local paths
    /// are resolved against `cwd`.
    pub fn parse(text: &str, cwd: &Path) -> Result<Source, InstallError> {
        let text = text.trim();
        let bad = |message: &str| InstallError::BadSource {
            src: text.to_string(),
            message: message.to_string(),
        };
        if text.starts_with("npm:") {
            return Err(InstallError::Npm { src: text.into() });
        }
        if let Some(rest) = text.strip_prefix("github:") {
            let (rest, checkout, track) = split_refs(rest);
            check_refs(text, &checkout, &track)?;
            let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
            if parts.len() < 2 {
                return Err(bad("a GitHub source is github:owner/repo[/path][#ref]"));
            }
            let ok = |s: &str| {
                s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                    && !s.starts_with('.')
            };
            if !ok(parts[0]) || !ok(parts[1]) {
                return Err(bad(
                    "owner and repository may contain letters, digits, '-', '_' and '.'",
                ));
            }
            let subpath = (parts.len() > 2).then(|| parts[2..].join("/"));
            if let Some(sub) = &subpath {
                if let Err(why) = check_subpath(sub) {
                    return Err(bad(&format!(
                        "the path '{sub}' inside the repository {why}"
                    )));
                }
            }
            return Ok(Source::Git(GitSource {
                url: format!("https://github.com/{}/{}", parts[0], parts[1]),
                github: Some((parts[0].to_string(), parts[1].to_string())),
                subpath,
                checkout,
                track,
            }));
        }
        if let Some(url) = text.strip_prefix("git+") {
            let (url, checkout, track) = split_refs(url);
            if !GIT_SCHEMES
                .iter()
                .any(|s| url.starts_with(&format!("{s}://")))
            {
                return Err(bad(
                    "a git source is git+https://…, git+ssh://…, git+git://… or git+file://…",
                ));
            }
            if let Err(why) = check_url(url) {
                return Err(bad(&format!("the URL {why}")));
            }
            check_refs(text, &checkout, &track)?;
            return Ok(Source::Git(GitSource {
                url: url.to_string(),
                github: None,
                subpath: None,
                checkout,
                track,
            }));
        }
        let looks_local = text.starts_with('/')
            || text.starts_with("./")
            || text.starts_with("../")
            || text.starts_with("~/")
            || text == "."
            || text == ".."
            || cwd.join(text).is_dir();
        if looks_local {
            let path = match text.strip_prefix("~/") {
                Some(rest) => user_home().join(rest),
                None => cwd.join(text),
            };
            let path = normalize(&path);
            if !path.is_dir() {
                return Err(bad(&format!("{} is not a folder", path.display())));
            }
            return Ok(Source::Local(path));
        }
        Err(bad(
            "give a local folder (./path or /path), git+https://…, git+file://… or github:owner/repo[/path][#ref]; npm packages of the original cannot run in this build",
        ))
    }

    /// What `update` fetches: the tracked branch or tag (or the default branch).
    pub fn for_update(&self) -> Source {
        match self {
            Source::Local(p) => Source::Local(p.clone()),
            Source::Git(g) => Source::Git(GitSource {
                checkout: g.track.clone(),
                ..g.clone()
            }),
        }
    }

    /// The `_source` to record after fetching `commit`.
    fn recorded(&self, commit: Option<&str>) -> String {
        match self {
            Source::Local(p) => p.display().to_string(),
            Source::Git(g) => {
                let base = match &g.github {
                    Some((owner, repo)) => format!(
                        "github:{owner}/{repo}{}",
                        g.subpath
                            .as_deref()
                            .map(|s| format!("/{s}"))
                            .unwrap_or_default()
                    ),
                    None => format!("git+{}", g.url),
                };
                let track = g
                    .track
                    .as_deref()
                    .map(|t| format!("?ref={t}"))
                    .unwrap_or_default();
                match commit.or(g.checkout.as_deref()) {
                    Some(c) => format!("{base}{track}#{c}"),
                    None => format!("{base}{track}"),
                }
            }
        }
    }

    /// The same repository (or folder) regardless of refs: how `update` groups plugins.
    fn key(&self) -> String {
        match self {
            Source::Local(p) => p.display().to_string(),
            Source::Git(g) => Source::Git(GitSource {
                checkout: None,
                ..g.clone()
            })
            .recorded(None),
        }
    }
}

/// Split `base[?ref=track][#checkout]`; a fragment that is not a full commit is also
/// the tracked ref.
fn split_refs(s: &str) -> (&str, Option<String>, Option<String>) {
    let (base, fragment) = match s.split_once('#') {
        Some((b, f)) if !f.is_empty() => (b, Some(f.to_string())),
        Some((b, _)) => (b, None),
        None => (s, None),
    };
    let (base, track) = match base.rsplit_once("?ref=") {
        Some((b, t)) if !t.is_empty() => (b, Some(t.to_string())),
        _ => (base, None),
    };
    let track = track.or_else(|| fragment.clone().filter(|f| !is_commit(f)));
    (base, fragment, track)
}

fn is_commit(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.chars().all(|c| c.is_ascii_hexdigit())
}

/// The URL schemes a git source may use; also the only transports `git` may use
/// (`GIT_ALLOW_PROTOCOL`), so no `ext::` or `fd::` remote helper ever runs.
const GIT_SCHEMES: [&str; 5] = ["https", "http", "ssh", "git", "file"];

/// Whether `r` is a ref this installer passes to git: a branch, tag or commit name of
/// letters, digits and `.`, `_`, `-`, `/`, at most 200 characters, not starting with
/// `-`, `.` or `/`, not ending with `/`, `.` or `.lock`, without `..` or `//`. Stricter
/// than git itself (no `+`, `:`, `@{`, `~`, `^`, spaces or control characters), so a
/// ref can never read as an option or a refspec.
pub fn check_ref(r: &str) -> Result<(), String> {
    if r.starts_with('-') {
        return Err("starts with '-', so git would read it as an option".into());
    }
    if r.is_empty() || r.len() > 200 {
        return Err("must be 1 to 200 characters long".into());
    }
    if let Some(c) = r
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/')))
    {
        return Err(format!(
            "contains {c:?}: a branch, tag or commit name here may only use letters, digits, '.', '_', '-' and '/'"
        ));
    }
    if r.starts_with(['.', '/']) || r.ends_with(['.', '/']) || r.ends_with(".lock") {
        return Err("must not start with '.' or '/', nor end with '.', '/' or '.lock'".into());
    }
    if r.contains("..") || r.contains("//") {
        return Err("must not contain '..' or '//'".into());
    }
    Ok(())
}

/// Whether `url` (after `git+`) may be given to git: no whitespace or control
/// characters, no `-` where git could read an option (the start, the host), and only
/// an allowed scheme.
fn check_url(url: &str) -> Result<(), String> {
    if url.starts_with('-') {
        return Err("starts with '-', so git would read it as an option".into());
    }
    if let Some(c) = url.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("contains {c:?}: no spaces or control characters"));
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err("has no scheme (e.g. https://)".into());
    };
    if !GIT_SCHEMES.contains(&scheme) {
        return Err(format!(
            "uses the scheme '{scheme}'; use one of {}",
            GIT_SCHEMES.join(", ")
        ));
    }
    let authority = rest.split('/').next().unwrap_or_default();
    let host = authority.rsplit('@').next().unwrap_or_default();
    if host.starts_with('-') || authority.starts_with('-') {
        return Err(
            "has a host or user starting with '-', which ssh would read as an option".into(),
        );
    }
    if scheme != "file" && host.is_empty() {
        return Err("has no host".into());
    }
    Ok(())
}

/// A folder inside a repository (`github:owner/repo/<path>`): relative, no `..`, the
/// same characters as refs.
fn check_subpath(sub: &str) -> Result<(), String> {
    if sub.split('/').any(|part| part == "..") {
        return Err("must not contain '..'".into());
    }
    check_ref(sub).map_err(|why| format!("is refused: it {why}"))
}

/// The checkout and tracked refs of a source, or the error naming the bad one.
fn check_refs(
    src: &str,
    checkout: &Option<String>,
    track: &Option<String>,
) -> Result<(), InstallError> {
    for (what, r) in [("#", checkout), ("?ref=", track)] {
        if let Some(r) = r {
            check_ref(r).map_err(|why| InstallError::BadSource {
                src: src.to_string(),
                message: format!(
                    "the ref '{r}' (after {what}) is refused: it {why}. Give a branch, tag or commit, e.g. #main, #v1.2.0 or a full commit hash"
                ),
            })?;
        }
    }
    Ok(())
}

impl GitSource {
    /// The same checks as [`Source::parse`], for a source built another way: nothing
    /// reaches git unchecked.
    fn check(&self) -> Result<(), InstallError> {
        let bad = |message: String| InstallError::BadSource {
            src: self.url.clone(),
            message,
        };
        check_url(&self.url).map_err(|why| bad(format!("the URL {why}")))?;
        if let Some(sub) = &self.subpath {
            check_subpath(sub).map_err(|why| bad(format!("the path '{sub}' {why}")))?;
        }
        check_refs(&self.url, &self.checkout, &self.track)
    }
}

/// Run `git` with hooks off, no prompts, and only the allowed transports; stdout on
/// success, stderr on failure.
fn git(args: &[&str], url: &str, step: &str) -> Result<String, InstallError> {
    let out = Command::new("git")
        .args([
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "advice.detachedHead=false",
            "-c",
            "protocol.allow=never",
        ])
        .args(
            GIT_SCHEMES
                .iter()
                .flat_map(|s| ["-c".to_string(), format!("protocol.{s}.allow=always")]),
        )
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_ALLOW_PROTOCOL", GIT_SCHEMES.join(":"))
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| InstallError::Git {
            url: url.to_string(),
            step: step.to_string(),
            message: if e.kind() == std::io::ErrorKind::NotFound {
                "the `git` program is not installed (it is needed for git and github: sources)"
                    .into()
            } else {
                e.to_string()
            },
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(InstallError::Git {
            url: url.to_string(),
            step: step.to_string(),
            message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Fetch `g` into `into` (shallow where possible); returns the checked-out commit.
fn fetch_git(g: &GitSource, into: &Path) -> Result<String, InstallError> {
    g.check()?;
    let dir = into.display().to_string();
    let url = g.url.as_str();
    git(&["init", "-q", "--", &dir], url, "init")?;
    let want = g.checkout.as_deref().unwrap_or("HEAD");
    let shallow = git(
        &["-C", &dir, "fetch", "-q", "--depth", "1", "--", url, want],
        url,
        "fetch",
    );
    match shallow {
        Ok(_) => {
            git(
                &[
                    "-C",
                    &dir,
                    "checkout",
                    "-q",
                    "--end-of-options",
                    "FETCH_HEAD",
                    "--",
                ],
                url,
                "checkout",
            )?;
        }
        Err(first) => {
            // Some servers refuse a shallow fetch of a commit: fetch everything instead.
            let Some(rev) = g.checkout.as_deref() else {
                return Err(first);
            };
            git(
                &[
                    "-C",
                    &dir,
                    "fetch",
                    "-q",
                    "--",
                    url,
                    "+refs/heads/*:refs/remotes/origin/*",
                    "+refs/tags/*:refs/tags/*",
                ],
                url,
                "fetch",
            )
            .map_err(|_| first)?;
            let origin = format!("origin/{rev}");
            let checkout = |rev: &str| {
                git(
                    &["-C", &dir, "checkout", "-q", "--end-of-options", rev, "--"],
                    url,
                    "checkout",
                )
            };
            checkout(rev)
                .or_else(|_| checkout(&origin))
                .map_err(|e| match e {
                    InstallError::Git { url, message, .. } => InstallError::Git {
                        url,
                        step: "checkout".into(),
                        message: format!("no commit, branch or tag '{rev}': {message}"),
                    },
                    other => other,
                })?;
        }
    }
    git(
        &[
            "-C",
            &dir,
            "rev-parse",
            "--verify",
            "--end-of-options",
            "HEAD",
        ],
        url,
        "rev-parse",
    )
}

// ---- discovery ----

/// A plugin found in a source.
#[derive(Debug, Clone)]
pub struct Found {
    pub dir: PathBuf,
    pub manifest: Manifest,
}

/// `plugin.json` at `root`, else in its immediate subfolders (not hidden ones, not
/// `node_modules`). Subfolders whose manifest cannot be used are skipped with a note.
pub fn discover(root: &Path, src: &str) -> Result<(Vec<Found>, Vec<String>), InstallError> {
    if root.join(MANIFEST_FILE).is_file() {
        let manifest = read_manifest(root)?;
        return Ok((
            vec![Found {
                dir: root.to_path_buf(),
                manifest,
            }],
            Vec::new(),
        ));
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .map_err(io_err(root))?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            !n.starts_with('.') && n != "node_modules"
        })
        .map(|e| e.path())
        .collect();
    dirs.sort();
    let mut found: Vec<Found> = Vec::new();
    let mut notes = Vec::new();
    for dir in dirs {
        if !dir.join(MANIFEST_FILE).is_file() {
            continue;
        }
        match read_manifest(&dir) {
            Ok(manifest) => {
                if let Some(first) = found.iter().find(|f| f.manifest.name == manifest.name) {
                    notes.push(format!(
                        "{} also names itself '{}' (as {} does); skipped",
                        dir.display(),
                        manifest.name,
                        first.dir.display()
                    ));
                    continue;
                }
                found.push(Found { dir, manifest });
            }
            Err(e) => notes.push(format!("skipped: {e}")),
        }
    }
    if found.is_empty() {
        return Err(InstallError::NoPlugins {
            src: src.to_string(),
            notes,
        });
    }
    Ok((found, notes))
}

// ---- the config file ----

/// The config file's text and its parsed value.
struct ConfigFile {
    path: PathBuf,
    text: String,
    value: Value,
}

impl ConfigFile {
    fn read(path: &Path) -> Result<Self, InstallError> {
        let text = std::fs::read_to_string(path).map_err(|error| {
            if error.kind() == std::io::ErrorKind::NotFound {
                InstallError::ConfigNotFound {
                    path: path.to_path_buf(),
                }
            } else {
                InstallError::Io {
                    path: path.to_path_buf(),
                    error,
                }
            }
        })?;
        let value: Value = json5::from_str(&text).map_err(|e| InstallError::Config {
            path: path.to_path_buf(),
            message: format!("not valid JSON5: {e}"),
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            text,
            value,
        })
    }

    fn plugins(&self) -> serde_json::Map<String, Value> {
        self.value
            .get("plugins")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    }

    fn dir(&self) -> PathBuf {
        self.path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/"))
    }

    /// An entry's `path`, resolved like the config loader does (relative to the file).
    fn entry_path(&self, entry: &Value) -> Option<PathBuf> {
        let raw = entry.get("path")?.as_str()?;
        let p = match raw.strip_prefix("~/") {
            Some(rest) => user_home().join(rest),
            None if raw == "~" => user_home(),
            None => self.dir().join(raw),
        };
        Some(normalize(&p))
    }

    fn edit_error(&self, e: edit::EditError) -> InstallError {
        InstallError::Config {
            path: self.path.clone(),
            message: format!("cannot edit the file in place: {}", e.0),
        }
    }

    fn write(&self, text: &str) -> Result<(), InstallError> {
        write_atomic(&self.path, text.as_bytes())
    }
}

/// Write through a temporary file in the same folder and rename it over `path`, keeping
/// its permissions.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), InstallError> {
    use std::io::Write;
    let real = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let dir = real.parent().unwrap_or(Path::new("/"));
    let mut tmp = tempfile::Builder::new()
        .prefix(".config-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(io_err(dir))?;
    tmp.write_all(bytes).map_err(io_err(&real))?;
    tmp.as_file().sync_all().map_err(io_err(&real))?;
    if let Ok(meta) = std::fs::metadata(&real) {
        std::fs::set_permissions(tmp.path(), meta.permissions()).map_err(io_err(&real))?;
    }
    tmp.persist(&real).map_err(|e| InstallError::Io {
        path: real.clone(),
        error: e.error,
    })?;
    Ok(())
}

// ---- install ----

/// One installed plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    pub name: String,
    pub description: String,
    /// `<BEIGE_HOME>/plugins/<name>`.
    pub dir: PathBuf,
    /// What was recorded as `_source`.
    pub source: String,
    /// The commit of a git source.
    pub commit: Option<String>,
}

/// What an install did.
#[derive(Debug, Clone, Default)]
pub struct InstallReport {
    pub installed: Vec<Installed>,
    /// Subfolders that were skipped, and why.
    pub notes: Vec<String>,
}

/// `beige plugins install <source> [--force]`: fetch, discover, check conflicts (before
/// anything is copied, unless `force`), copy into `<BEIGE_HOME>/plugins/<name>` and add
/// or update the `plugins.<name>` entries of the config file at `config_path`.
pub fn install(
    config_path: &Path,
    home: &BeigeHome,
    source: &str,
    force: bool,
) -> Result<InstallReport, InstallError> {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let src = Source::parse(source, &cwd)?;
    install_source(config_path, home, &src, force, None)
}

/// Install from a parsed source; `only` limits it to these plugin names.
pub fn install_source(
    config_path: &Path,
    home: &BeigeHome,
    src: &Source,
    force: bool,
    only: Option<&[String]>,
) -> Result<InstallReport, InstallError> {
    let config = ConfigFile::read(config_path)?;
    let plugins_dir = home.plugins_dir();
    std::fs::create_dir_all(&plugins_dir).map_err(io_err(&plugins_dir))?;
    let staging = tempfile::Builder::new()
        .prefix(".install-")
        .tempdir_in(&plugins_dir)
        .map_err(io_err(&plugins_dir))?;
    let display = src.recorded(None);
    let (root, commit) = match src {
        Source::Local(dir) => (dir.clone(), None),
        Source::Git(g) => {
            let checkout = staging.path().join("src");
            let commit = fetch_git(g, &checkout)?;
            let root = match &g.subpath {
                Some(sub) => safe_join(&checkout, sub).map_err(|e| InstallError::BadSource {
                    src: display.clone(),
                    message: format!("path '{sub}': {e}"),
                })?,
                None => checkout,
            };
            if !root.is_dir() {
                return Err(InstallError::BadSource {
                    src: display,
                    message: "that folder does not exist in the repository".into(),
                });
            }
            (root, Some(commit))
        }
    };
    let (mut found, notes) = discover(&root, &display)?;
    if let Some(only) = only {
        found.retain(|f| only.contains(&f.manifest.name));
        if found.is_empty() {
            return Err(InstallError::NoPlugins {
                src: display,
                notes: vec![format!("none of {} is in it any more", only.join(", "))],
            });
        }
    }
    let recorded = src.recorded(commit.as_deref());

    // Everything that could conflict is checked before anything is copied.
    let existing = config.plugins();
    let mut conflicts = Vec::new();
    for f in &found {
        let name = &f.manifest.name;
        if BUILTIN.contains(&name.as_str()) {
            return Err(InstallError::Reserved { name: name.clone() });
        }
        if !valid_plugin_name(name) {
            return Err(InstallError::Manifest(ManifestError::Invalid {
                path: f.dir.join(MANIFEST_FILE),
                message: format!("name {name:?} is not a valid plugin name"),
            }));
        }
        if force {
            continue;
        }
        if existing.contains_key(name) {
            conflicts.push(format!(
                "'{name}' is already in {} (plugins.{name})",
                config.path.display()
            ));
        }
        let target = plugins_dir.join(name);
        if target.exists() || target.is_symlink() {
            conflicts.push(format!(
                "'{name}': the folder {} already exists",
                target.display()
            ));
        }
    }
    if !conflicts.is_empty() {
        return Err(InstallError::Conflicts { conflicts });
    }

    // Stage copies, then swap them into place.
    let stage = staging.path().join("stage");
    let old = staging.path().join("old");
    for dir in [&stage, &old] {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    }
    let mut placed = Vec::new();
    for f in &found {
        let name = &f.manifest.name;
        let target = plugins_dir.join(name);
        let same = match (f.dir.canonicalize(), target.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        };
        if !same {
            let staged = stage.join(name);
            copy_tree(&f.dir, &staged)?;
            if target.exists() || target.is_symlink() {
                std::fs::rename(&target, old.join(name)).map_err(io_err(&target))?;
            }
            std::fs::rename(&staged, &target).map_err(io_err(&target))?;
        }
        placed.push(Installed {
            name: name.clone(),
            description: f.manifest.description.clone().unwrap_or_default(),
            dir: target,
            source: recorded.clone(),
            commit: commit.clone(),
        });
    }

    // The config, edited in place.
    let mut text = config.text.clone();
    for (f, p) in found.iter().zip(&placed) {
        let default_config = f
            .manifest
            .default_config
            .as_ref()
            .filter(|c| !c.is_null() && c.as_object().is_none_or(|o| !o.is_empty()));
        text = edit::set_entry(
            &text,
            &p.name,
            &p.dir.display().to_string(),
            &p.source,
            default_config,
        )
        .map_err(|e| config.edit_error(e))?;
    }
    if text != config.text {
        config.write(&text)?;
    }
    Ok(InstallReport {
        installed: placed,
        notes,
    })
}

/// Copy a folder (not `.git`), keeping file modes and symlinks.
fn copy_tree(from: &Path, to: &Path) -> Result<(), InstallError> {
    std::fs::create_dir_all(to).map_err(io_err(to))?;
    for entry in std::fs::read_dir(from).map_err(io_err(from))? {
        let entry = entry.map_err(io_err(from))?;
        let name = entry.file_name();
        if name == ".git" {
            continue;
        }
        let (src, dst) = (entry.path(), to.join(&name));
        let kind = entry.file_type().map_err(io_err(&src))?;
        if kind.is_symlink() {
            let target = std::fs::read_link(&src).map_err(io_err(&src))?;
            std::os::unix::fs::symlink(&target, &dst).map_err(io_err(&dst))?;
        } else if kind.is_dir() {
            copy_tree(&src, &dst)?;
        } else if kind.is_file() {
            std::fs::copy(&src, &dst).map_err(io_err(&src))?;
        }
    }
    Ok(())
}

// ---- list, remove, update, ensure_installed ----

/// What kind of plugin an entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PluginKind {
    /// Built into the binary (`kv`, `telegram`).
    BuiltIn,
    /// A plugin.json with `run`.
    External,
    /// A plugin.json with `tools`.
    CommandTools,
    /// The folder or its manifest is missing or unusable; the reason.
    Broken(String),
    /// No path and not built in.
    NotInstalled,
}

/// One `plugins` entry of the config.
#[derive(Debug, Clone)]
pub struct Listing {
    pub name: String,
    pub path: Option<PathBuf>,
    pub source: Option<String>,
    /// The entry has a non-empty `config`.
    pub has_config: bool,
    pub kind: PluginKind,
    pub description: Option<String>,
}

/// `beige plugins list`: the config's plugins in order.
pub fn list(config_path: &Path) -> Result<Vec<Listing>, InstallError> {
    let config = ConfigFile::read(config_path)?;
    let mut out = Vec::new();
    for (name, entry) in config.plugins() {
        let path = config.entry_path(&entry);
        let source = entry
            .get("_source")
            .and_then(Value::as_str)
            .map(str::to_string);
        let has_config = match entry.get("config") {
            Some(Value::Object(o)) => !o.is_empty(),
            Some(Value::Null) | None => false,
            Some(_) => true,
        };
        let (kind, description) = match &path {
            None if BUILTIN.contains(&name.as_str()) => (PluginKind::BuiltIn, None),
            None => (PluginKind::NotInstalled, None),
            Some(p) => match read_manifest(p) {
                Ok(m) if m.run.is_some() => (PluginKind::External, m.description),
                Ok(m) => (PluginKind::CommandTools, m.description),
                Err(e) => (PluginKind::Broken(e.to_string()), None),
            },
        };
        out.push(Listing {
            name,
            path,
            source,
            has_config,
            kind,
            description,
        });
    }
    Ok(out)
}

/// What `remove` did.
#[derive(Debug, Clone, Default)]
pub struct Removal {
    /// The config entry existed and was removed.
    pub removed_entry: bool,
    /// The plugin folder that was deleted.
    pub deleted_dir: Option<PathBuf>,
    /// The entry's folder outside `<BEIGE_HOME>/plugins`, left alone.
    pub kept_dir: Option<PathBuf>,
    /// Agents that still refer to the plugin, one line each.
    pub warnings: Vec<String>,
}

/// `beige plugins remove <name>`: delete the `plugins.<name>` entry and
/// `<BEIGE_HOME>/plugins/<name>` (a folder elsewhere that the entry points to is left
/// alone), and say which agents still list its tools or configure it.
pub fn remove(config_path: &Path, home: &BeigeHome, name: &str) -> Result<Removal, InstallError> {
    let config = ConfigFile::read(config_path)?;
    let plugins_dir = home.plugins_dir();
    let folder = plugins_dir.join(name);
    let entry = config.plugins().get(name).cloned();
    let has_folder = valid_plugin_name(name) && (folder.exists() || folder.is_symlink());
    if entry.is_none() && !has_folder {
        return Err(InstallError::NotInstalled {
            name: name.to_string(),
            config: config.path.clone(),
            folder,
        });
    }
    let mut removal = Removal::default();
    if let Some(entry) = &entry {
        if let Some(p) = config.entry_path(entry) {
            if p != folder && p.exists() {
                removal.kept_dir = Some(p);
            }
        }
        let text = edit::remove_entry(&config.text, name).map_err(|e| config.edit_error(e))?;
        if let Some(text) = text {
            config.write(&text)?;
            removal.removed_entry = true;
        }
    }
    if has_folder {
        let gone = if folder.is_symlink() || folder.is_file() {
            std::fs::remove_file(&folder)
        } else {
            std::fs::remove_dir_all(&folder)
        };
        gone.map_err(io_err(&folder))?;
        removal.deleted_dir = Some(folder);
    }
    if let Some(agents) = config.value.get("agents").and_then(Value::as_object) {
        for (agent, a) in agents {
            let tools: Vec<&str> = a
                .get("tools")
                .and_then(Value::as_array)
                .map(|t| t.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            for t in tools {
                if t == name || t.strip_prefix(name).is_some_and(|r| r.starts_with('.')) {
                    removal.warnings.push(format!(
                        "agent '{agent}' still lists tool '{t}' in agents.{agent}.tools; remove it there, or the gateway will not start"
                    ));
                }
            }
            if a.get("pluginConfigs")
                .and_then(Value::as_object)
                .is_some_and(|p| p.contains_key(name))
            {
                removal.warnings.push(format!(
                    "agent '{agent}' still configures it in agents.{agent}.pluginConfigs.{name}; remove that too, or the gateway will not start"
                ));
            }
        }
    }
    Ok(removal)
}

/// What `update` did.
#[derive(Debug, Clone, Default)]
pub struct UpdateReport {
    pub updated: Vec<Installed>,
    /// `(source, error)` per source that failed.
    pub failed: Vec<(String, String)>,
    /// `(plugin, why)` per plugin that was not updated on purpose.
    pub skipped: Vec<(String, String)>,
}

/// `beige plugins update [name]`: re-fetch from `_source` (following the tracked branch
/// or tag) and reinstall, keeping each entry's `config`. With a name, any failure is an
/// error; without, every plugin with a `_source` is updated (each source once) and
/// failures are reported per source.
pub fn update(
    config_path: &Path,
    home: &BeigeHome,
    name: Option<&str>,
) -> Result<UpdateReport, InstallError> {
    let config = ConfigFile::read(config_path)?;
    let cwd = config.dir();
    let plugins = config.plugins();
    let mut report = UpdateReport::default();
    if let Some(name) = name {
        let Some(entry) = plugins.get(name) else {
            return Err(InstallError::NotInstalled {
                name: name.to_string(),
                config: config.path.clone(),
                folder: home.plugins_dir().join(name),
            });
        };
        let Some(source) = entry.get("_source").and_then(Value::as_str) else {
            return Err(InstallError::NoSource {
                name: name.to_string(),
            });
        };
        if is_builtin_toolkit(name, source) {
            report.skipped.push((
                name.to_string(),
                "built in; it is updated with beige".into(),
            ));
            return Ok(report);
        }
        let src = Source::parse(source, &cwd)?.for_update();
        let done = install_source(config_path, home, &src, true, Some(&[name.to_string()]))?;
        report.updated = done.installed;
        return Ok(report);
    }
    // Group by source so that a package with several plugins is fetched once.
    let mut groups: Vec<(String, Result<Source, String>, Vec<String>)> = Vec::new();
    for (name, entry) in &plugins {
        let Some(source) = entry.get("_source").and_then(Value::as_str) else {
            continue;
        };
        if is_builtin_toolkit(name, source) {
            report
                .skipped
                .push((name.clone(), "built in; it is updated with beige".into()));
            continue;
        }
        let parsed = Source::parse(source, &cwd)
            .map(|s| s.for_update())
            .map_err(|e| e.to_string());
        let key = match &parsed {
            Ok(s) => s.key(),
            Err(_) => source.to_string(),
        };
        match groups.iter_mut().find(|(k, _, _)| *k == key) {
            Some((_, _, names)) => names.push(name.clone()),
            None => groups.push((key, parsed, vec![name.clone()])),
        }
    }
    for (key, parsed, names) in groups {
        let outcome = parsed.and_then(|src| {
            install_source(config_path, home, &src, true, Some(&names)).map_err(|e| e.to_string())
        });
        match outcome {
            Ok(done) => report.updated.extend(done.installed),
            Err(e) => report.failed.push((key, e)),
        }
    }
    Ok(report)
}

fn is_builtin_toolkit(name: &str, source: &str) -> bool {
    name == "telegram" && source.starts_with(TOOLKIT_NPM_SOURCE)
}

/// At gateway start, before the config is loaded: install every plugin that has a
/// `_source` but whose `path` is missing or does not exist, from exactly that source
/// (a pinned commit stays pinned), writing the new `path` into the config file at
/// `config_path`. Returns what was installed; the caller then loads the config. The
/// toolkit's `telegram` entry (`_source: "npm:@matthias-hausberger/beige-toolkit"`) is
/// left alone (built in); other npm sources are an error.
pub fn ensure_installed(
    config_path: &Path,
    home: &BeigeHome,
) -> Result<Vec<Installed>, InstallError> {
    let config = ConfigFile::read(config_path)?;
    let cwd = config.dir();
    let mut installed = Vec::new();
    for (name, entry) in config.plugins() {
        let Some(source) = entry.get("_source").and_then(Value::as_str) else {
            continue;
        };
        if config.entry_path(&entry).is_some_and(|p| p.exists()) {
            continue;
        }
        if is_builtin_toolkit(&name, source) {
            continue;
        }
        let src = Source::parse(source, &cwd)?;
        tracing::info!(plugin = %name, source, "installing plugin from its _source");
        let done = install_source(
            config_path,
            home,
            &src,
            true,
            Some(std::slice::from_ref(&name)),
        )?;
        installed.extend(done.installed);
    }
    Ok(installed)
}

// ---- the in-place JSON5 editor ----

/// A minimal JSON5 editor that changes one `plugins` entry and leaves every other byte
/// alone. It understands exactly what it must skip: comments, strings (both quotes),
/// nested objects and arrays, unquoted keys and scalars.
pub(crate) mod edit {
    //! Structural edits of a JSON5 config that keep its comments and layout: members
    //! are found by a scanner that skips strings and comments, and only their text is
    //! replaced, inserted or removed.
    use serde_json::Value;

    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct EditError(pub String);

    #[derive(Debug)]
    pub struct Obj {
        pub open: usize,
        pub close: usize,
        pub members: Vec<Member>,
    }

    #[derive(Debug)]
    pub struct Member {
        pub key: String,
        pub key_start: usize,
        pub value_start: usize,
        pub value_end: usize,
        pub comma: Option<usize>,
    }

    impl Obj {
        pub fn member(&self, key: &str) -> Option<&Member> {
            self.members.iter().find(|m| m.key == key)
        }
    }

    fn err<T>(msg: impl Into<String>) -> Result<T, EditError> {
        Err(EditError(msg.into()))
    }

    fn line_col(text: &str, pos: usize) -> String {
        let before = &text[..pos.min(text.len())];
        let line = before.matches('\n').count() + 1;
        let col = before
            .rsplit('\n')
            .next()
            .map(|l| l.chars().count())
            .unwrap_or(0)
            + 1;
        format!("line {line}, column {col}")
    }

    /// Skip whitespace and comments.
    fn skip_ws(text: &str, mut pos: usize) -> Result<usize, EditError> {
        loop {
            let rest = &text[pos..];
            if rest.starts_with("//") {
                pos = match rest.find('\n') {
                    Some(i) => pos + i + 1,
                    None => text.len(),
                };
            } else if let Some(body) = rest.strip_prefix("/*") {
                match body.find("*/") {
                    Some(i) => pos += 2 + i + 2,
                    None => return err(format!("unterminated comment at {}", line_col(text, pos))),
                }
            } else if let Some(c) = rest
                .chars()
                .next()
                .filter(|c| c.is_whitespace() || *c == '\u{feff}')
            {
                pos += c.len_utf8();
            } else {
                return Ok(pos);
            }
        }
    }

    /// `pos` is at a quote; returns the position after the closing quote.
    fn skip_string(text: &str, pos: usize) -> Result<usize, EditError> {
        let b = text.as_bytes();
        let quote = b[pos];
        let mut i = pos + 1;
        while i < b.len() {
            match b[i] {
                b'\\' => i += 2,
                c if c == quote => return Ok(i + 1),
                _ => i += 1,
            }
        }
        err(format!("unterminated string at {}", line_col(text, pos)))
    }

    /// Returns the position after the value starting at `pos`.
    fn skip_value(text: &str, pos: usize) -> Result<usize, EditError> {
        let b = text.as_bytes();
        match b.get(pos) {
            None => err("the file ends where a value should be"),
            Some(b'"' | b'\'') => skip_string(text, pos),
            Some(b'{' | b'[') => {
                let mut depth = 0usize;
                let mut i = pos;
                while i < b.len() {
                    match b[i] {
                        b'"' | b'\'' => {
                            i = skip_string(text, i)?;
                            continue;
                        }
                        b'/' if matches!(b.get(i + 1), Some(b'/' | b'*')) => {
                            i = skip_ws(text, i)?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                return Ok(i + 1);
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
                err(format!("unclosed bracket at {}", line_col(text, pos)))
            }
            Some(_) => {
                let mut i = pos;
                for c in text[pos..].chars() {
                    if c.is_whitespace() || matches!(c, ',' | '}' | ']' | ':') {
                        break;
                    }
                    if c == '/' && matches!(b.get(i + 1), Some(b'/' | b'*')) {
                        break;
                    }
                    i += c.len_utf8();
                }
                if i == pos {
                    return err(format!("expected a value at {}", line_col(text, pos)));
                }
                Ok(i)
            }
        }
    }

    fn unquote(raw: &str) -> String {
        if raw.starts_with('"') {
            if let Ok(s) = serde_json::from_str::<String>(raw) {
                return s;
            }
        }
        let inner = &raw[1..raw.len().saturating_sub(1).max(1)];
        let mut out = String::new();
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            if c == '\\' {
                match chars.next() {
                    Some('n') => out.push('\n'),
                    Some('t') => out.push('\t'),
                    Some(o) => out.push(o),
                    None => {}
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    /// Parse the object whose `{` is at `open`.
    pub fn parse_object(text: &str, open: usize) -> Result<Obj, EditError> {
        let b = text.as_bytes();
        if b.get(open) != Some(&b'{') {
            return err(format!("expected an object at {}", line_col(text, open)));
        }
        let mut members = Vec::new();
        let mut pos = open + 1;
        loop {
            pos = skip_ws(text, pos)?;
            match b.get(pos) {
                None => return err("the file ends inside an object"),
                Some(b'}') => {
                    return Ok(Obj {
                        open,
                        close: pos,
                        members,
                    })
                }
                _ => {}
            }
            let key_start = pos;
            let key = match b[pos] {
                b'"' | b'\'' => {
                    let end = skip_string(text, pos)?;
                    let k = unquote(&text[pos..end]);
                    pos = end;
                    k
                }
                _ => {
                    let mut end = pos;
                    for c in text[pos..].chars() {
                        if c.is_alphanumeric() || matches!(c, '_' | '$' | '\\') {
                            end += c.len_utf8();
                        } else {
                            break;
                        }
                    }
                    if end == pos {
                        return err(format!("expected a key at {}", line_col(text, pos)));
                    }
                    let k = text[pos..end].to_string();
                    pos = end;
                    k
                }
            };
            pos = skip_ws(text, pos)?;
            if b.get(pos) != Some(&b':') {
                return err(format!("expected ':' at {}", line_col(text, pos)));
            }
            let value_start = skip_ws(text, pos + 1)?;
            let value_end = skip_value(text, value_start)?;
            pos = skip_ws(text, value_end)?;
            let comma = if b.get(pos) == Some(&b',') {
                pos += 1;
                Some(pos - 1)
            } else {
                None
            };
            members.push(Member {
                key,
                key_start,
                value_start,
                value_end,
                comma,
            });
            if comma.is_none() {
                pos = skip_ws(text, pos)?;
                if b.get(pos) != Some(&b'}') {
                    return err(format!("expected ',' or '}}' at {}", line_col(text, pos)));
                }
            }
        }
    }

    pub fn root(text: &str) -> Result<Obj, EditError> {
        let open = skip_ws(text, 0)?;
        parse_object(text, open)
    }

    fn line_start(text: &str, pos: usize) -> usize {
        text[..pos].rfind('\n').map(|i| i + 1).unwrap_or(0)
    }

    /// The whitespace before `pos` when only whitespace precedes it on its line.
    fn indent_before(text: &str, pos: usize) -> Option<&str> {
        let s = &text[line_start(text, pos)..pos];
        s.chars().all(|c| c == ' ' || c == '\t').then_some(s)
    }

    /// The leading whitespace of the line holding `pos`.
    fn line_indent(text: &str, pos: usize) -> &str {
        let start = line_start(text, pos);
        let line = &text[start..];
        let n = line.len() - line.trim_start_matches([' ', '\t']).len();
        &line[..n]
    }

    /// The position after the newline ending the line at `pos`, if the rest of that
    /// line is only whitespace or a `//` comment.
    fn rest_of_line_is_blank(text: &str, pos: usize) -> Option<usize> {
        let rest = &text[pos..];
        let line_end = rest.find('\n').map(|i| pos + i + 1).unwrap_or(text.len());
        let line = text[pos..line_end].trim();
        (line.is_empty() || line.starts_with("//")).then_some(line_end)
    }

    fn is_ident(s: &str) -> bool {
        let mut chars = s.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '$')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
    }

    pub fn render_key(k: &str) -> String {
        if is_ident(k) {
            k.to_string()
        } else {
            Value::String(k.to_string()).to_string()
        }
    }

    /// JSON5 in the file's style: unquoted keys, trailing commas, two more spaces per
    /// level; `inline` puts objects on one line.
    pub fn render(v: &Value, indent: &str, inline: bool) -> String {
        match v {
            Value::Object(o) if o.is_empty() => "{}".into(),
            Value::Array(a) if a.is_empty() => "[]".into(),
            Value::Object(o) if inline => format!(
                "{{ {} }}",
                o.iter()
                    .map(|(k, v)| format!("{}: {}", render_key(k), render(v, indent, true)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Value::Object(o) => {
                let inner = format!("{indent}  ");
                let mut s = "{\n".to_string();
                for (k, v) in o {
                    s.push_str(&format!(
                        "{inner}{}: {},\n",
                        render_key(k),
                        render(v, &inner, false)
                    ));
                }
                s.push_str(indent);
                s.push('}');
                s
            }
            Value::Array(a) if inline || a.iter().all(|x| !x.is_object() && !x.is_array()) => {
                format!(
                    "[{}]",
                    a.iter()
                        .map(|x| render(x, indent, true))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
            Value::Array(a) => {
                let inner = format!("{indent}  ");
                let mut s = "[\n".to_string();
                for x in a {
                    s.push_str(&format!("{inner}{},\n", render(x, &inner, false)));
                }
                s.push_str(indent);
                s.push(']');
                s
            }
            scalar => scalar.to_string(),
        }
    }

    type Edit = (usize, usize, String);

    fn apply(text: &str, mut edits: Vec<Edit>) -> String {
        edits.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
        let mut out = text.to_string();
        for (start, end, with) in edits {
            out.replace_range(start..end, &with);
        }
        out
    }

    /// Edits that add `new` members at the end of `obj`, in the object's style.
    fn insert_members(text: &str, obj: &Obj, new: &[(String, Value)]) -> Vec<Edit> {
        let inline = !text[obj.open..obj.close].contains('\n');
        let inline_text = |joined: &mut String| {
            *joined = new
                .iter()
                .map(|(k, v)| format!("{}: {}", render_key(k), render(v, "", true)))
                .collect::<Vec<_>>()
                .join(", ");
        };
        let Some(last) = obj.members.last() else {
            if inline {
                let mut joined = String::new();
                inline_text(&mut joined);
                return vec![(obj.open + 1, obj.close, format!(" {joined} "))];
            }
            let indent = format!("{}  ", line_indent(text, obj.open));
            let lines: String = new
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{indent}{}: {},\n",
                        render_key(k),
                        render(v, &indent, false)
                    )
                })
                .collect();
            return match indent_before(text, obj.close) {
                Some(_) => {
                    let at = line_start(text, obj.close);
                    vec![(at, at, lines)]
                }
                None => vec![(obj.close, obj.close, format!("\n{lines}"))],
            };
        };
        let (after, needs_comma) = match last.comma {
            Some(c) => (c + 1, false),
            None => (last.value_end, true),
        };
        let comma = if needs_comma { "," } else { "" };
        if inline {
            let mut joined = String::new();
            inline_text(&mut joined);
            let trailing = if needs_comma { "" } else { "," };
            return vec![(after, after, format!("{comma} {joined}{trailing}"))];
        }
        let indent = indent_before(text, last.key_start)
            .map(str::to_string)
            .unwrap_or_else(|| format!("{}  ", line_indent(text, obj.open)));
        let lines: String = new
            .iter()
            .map(|(k, v)| {
                format!(
                    "{indent}{}: {},\n",
                    render_key(k),
                    render(v, &indent, false)
                )
            })
            .collect();
        let mut edits = Vec::new();
        match rest_of_line_is_blank(text, after) {
            Some(eol) => {
                if needs_comma {
                    edits.push((after, after, ",".to_string()));
                }
                if text[..eol].ends_with('\n') {
                    edits.push((eol, eol, lines));
                } else {
                    edits.push((eol, eol, format!("\n{}", lines.trim_end_matches('\n'))));
                }
            }
            None => edits.push((
                after,
                after,
                format!("{comma}\n{}", lines.trim_end_matches('\n')),
            )),
        }
        edits
    }

    /// Add `plugins.<name>` or update its `path` and `_source` (keeping its `config`);
    /// a new entry gets `config: default_config`.
    pub fn set_entry(
        text: &str,
        name: &str,
        path: &str,
        source: &str,
        default_config: Option<&Value>,
    ) -> Result<String, EditError> {
        let root = root(text)?;
        let mut entry = serde_json::Map::new();
        entry.insert("path".into(), Value::String(path.into()));
        entry.insert("_source".into(), Value::String(source.into()));
        if let Some(c) = default_config {
            entry.insert("config".into(), c.clone());
        }
        let entry = Value::Object(entry);
        let Some(plugins) = root.member("plugins") else {
            let mut wrapper = serde_json::Map::new();
            wrapper.insert(name.to_string(), entry);
            let edits = insert_members(text, &root, &[("plugins".into(), Value::Object(wrapper))]);
            return Ok(apply(text, edits));
        };
        if text.as_bytes().get(plugins.value_start) != Some(&b'{') {
            return err("`plugins` is not an object");
        }
        let plugins = parse_object(text, plugins.value_start)?;
        let Some(existing) = plugins.member(name) else {
            let edits = insert_members(text, &plugins, &[(name.to_string(), entry)]);
            return Ok(apply(text, edits));
        };
        if text.as_bytes().get(existing.value_start) != Some(&b'{') {
            return err(format!("`plugins.{name}` is not an object"));
        }
        let obj = parse_object(text, existing.value_start)?;
        let mut edits = Vec::new();
        let mut missing = Vec::new();
        for (field, value) in [("path", path), ("_source", source)] {
            let rendered = Value::String(value.to_string());
            match obj.member(field) {
                Some(m) => edits.push((m.value_start, m.value_end, rendered.to_string())),
                None => missing.push((field.to_string(), rendered)),
            }
        }
        if !missing.is_empty() {
            edits.extend(insert_members(text, &obj, &missing));
        }
        Ok(apply(text, edits))
    }

    /// Remove `plugins.<name>` with its line; `None` when there is no such entry.
    pub fn remove_entry(text: &str, name: &str) -> Result<Option<String>, EditError> {
        remove_member(text, "plugins", name)
    }

    /// Set `<section>.<name>` to `value` (an existing value is replaced whole), adding
    /// the section when the config has none.
    pub fn set_member(
        text: &str,
        section: &str,
        name: &str,
        value: &Value,
    ) -> Result<String, EditError> {
        let root = root(text)?;
        let Some(sec) = root.member(section) else {
            let mut wrapper = serde_json::Map::new();
            wrapper.insert(name.to_string(), value.clone());
            let edits = insert_members(text, &root, &[(section.into(), Value::Object(wrapper))]);
            return Ok(apply(text, edits));
        };
        if text.as_bytes().get(sec.value_start) != Some(&b'{') {
            return err(format!("`{section}` is not an object"));
        }
        let obj = parse_object(text, sec.value_start)?;
        let edits = match obj.member(name) {
            None => insert_members(text, &obj, &[(name.to_string(), value.clone())]),
            Some(m) => {
                let indent = indent_before(text, m.key_start).unwrap_or("").to_string();
                vec![(m.value_start, m.value_end, render(value, &indent, false))]
            }
        };
        Ok(apply(text, edits))
    }

    /// Remove `<section>.<name>` with its line; `None` when there is no such entry.
    pub fn remove_member(
        text: &str,
        section: &str,
        name: &str,
    ) -> Result<Option<String>, EditError> {
        let root = root(text)?;
        let Some(sec) = root.member(section) else {
            return Ok(None);
        };
        if text.as_bytes().get(sec.value_start) != Some(&b'{') {
            return Ok(None);
        }
        let sec = parse_object(text, sec.value_start)?;
        let Some(m) = sec.member(name) else {
            return Ok(None);
        };
        let end = m.comma.map(|c| c + 1).unwrap_or(m.value_end);
        let (start, end) = match (
            indent_before(text, m.key_start),
            rest_of_line_is_blank(text, end),
        ) {
            (Some(_), Some(eol)) => (line_start(text, m.key_start), eol),
            _ => {
                // Shares its line with something else: remove it and the spaces after.
                let spaces = text[end..].len() - text[end..].trim_start_matches(' ').len();
                (m.key_start, end + spaces)
            }
        };
        Ok(Some(apply(text, vec![(start, end, String::new())])))
    }
}

#[cfg(test)]
#[path = "install_flow_tests.rs"]
mod flow_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CONFIG: &str = r#"// My beige config.
{
  llm: { providers: { anthropic: { apiKey: "${ANTHROPIC_API_KEY:-}" } } }, // keys
  /* plugins: { a "}" in a comment } */
  plugins: {
    kv: {}, // built in
    'odd key': { path: "/x/{y}", config: { s: 'it\'s } here' } },
  },
  agents: {
    a: { model: { provider: "anthropic", model: "m" }, tools: ["kv", "notes.x"] },
  },
}
"#;

    fn parses(text: &str) {
        let v: Result<Value, _> = json5::from_str(text);
        assert!(v.is_ok(), "not JSON5 any more: {v:?}\n{text}");
    }

    #[test]
    fn insert_update_and_remove_keep_everything_else() {
        let added = edit::set_entry(
            CONFIG,
            "notes",
            "/h/plugins/notes",
            "/src/notes",
            Some(&json!({"maxNotes": 100, "tags": ["a"]})),
        )
        .unwrap();
        parses(&added);
        let inserted = "    notes: {\n      path: \"/h/plugins/notes\",\n      _source: \"/src/notes\",\n      config: {\n        maxNotes: 100,\n        tags: [\"a\"],\n      },\n    },\n";
        assert!(
            added.contains(&format!("here' }} }},\n{inserted}  }},")),
            "{added}"
        );
        assert_eq!(added.replacen(inserted, "", 1), CONFIG);

        let updated = edit::set_entry(&added, "notes", "/new", "/src2", None).unwrap();
        parses(&updated);
        assert_eq!(
            updated,
            added
                .replace("/h/plugins/notes", "/new")
                .replace("\"/src/notes\"", "\"/src2\"")
        );

        let removed = edit::remove_entry(&updated, "notes").unwrap().unwrap();
        assert_eq!(removed, CONFIG);
        assert_eq!(edit::remove_entry(CONFIG, "nope").unwrap(), None);
        let no_kv = edit::remove_entry(CONFIG, "kv").unwrap().unwrap();
        assert_eq!(no_kv, CONFIG.replace("    kv: {}, // built in\n", ""));
        parses(&no_kv);
        let no_odd = edit::remove_entry(CONFIG, "odd key").unwrap().unwrap();
        parses(&no_odd);
        assert!(!no_odd.contains("odd key"));
    }

    #[test]
    fn plugins_section_is_created_and_styles_are_followed() {
        let text = "// c\n{\n  agents: {}, // end\n  // trailing comment\n}\n";
        let out = edit::set_entry(text, "python-notes", "/p", "/s", None).unwrap();
        assert_eq!(
            out,
            "// c\n{\n  agents: {}, // end\n  plugins: {\n    \"python-notes\": {\n      path: \"/p\",\n      _source: \"/s\",\n    },\n  },\n  // trailing comment\n}\n"
        );
        parses(&out);
        // No trailing comma on the last member, inline objects, empty objects.
        let out = edit::set_entry("{ agents: {} }", "n", "/p", "/s", None).unwrap();
        assert_eq!(
            out,
            "{ agents: {}, plugins: { n: { path: \"/p\", _source: \"/s\" } } }"
        );
        let out = edit::set_entry("{ plugins: {} }", "n", "/p", "/s", None).unwrap();
        assert_eq!(out, "{ plugins: { n: { path: \"/p\", _source: \"/s\" } } }");
        let out = edit::set_entry("{\n  plugins: {\n  },\n}", "n", "/p", "/s", None).unwrap();
        assert_eq!(out, "{\n  plugins: {\n    n: {\n      path: \"/p\",\n      _source: \"/s\",\n    },\n  },\n}");
        // An existing entry without path/_source keeps its config.
        let out = edit::set_entry(
            "{ plugins: { n: { config: { a: 1 } } } }",
            "n",
            "/p",
            "/s",
            None,
        )
        .unwrap();
        assert_eq!(
            out,
            "{ plugins: { n: { config: { a: 1 }, path: \"/p\", _source: \"/s\" } } }"
        );
        parses(&out);
        // Broken files are refused, not mangled.
        assert!(edit::set_entry("{ plugins: { /* x } }", "n", "/p", "/s", None).is_err());
        assert!(edit::set_entry("{ plugins: [] }", "n", "/p", "/s", None).is_err());
    }

    #[test]
    fn sources() {
        let cwd = Path::new("/");
        let s = Source::parse("github:o/r/plugins/x#v1", cwd).unwrap();
        let Source::Git(g) = &s else { panic!() };
        assert_eq!(g.url, "https://github.com/o/r");
        assert_eq!(g.subpath.as_deref(), Some("plugins/x"));
        assert_eq!(g.checkout.as_deref(), Some("v1"));
        assert_eq!(g.track.as_deref(), Some("v1"));
        let sha = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(
            s.recorded(Some(sha)),
            format!("github:o/r/plugins/x?ref=v1#{sha}")
        );
        let again = Source::parse(&s.recorded(Some(sha)), cwd).unwrap();
        let Source::Git(g2) = &again else { panic!() };
        assert_eq!(
            (g2.checkout.as_deref(), g2.track.as_deref()),
            (Some(sha), Some("v1"))
        );
        let Source::Git(up) = again.for_update() else {
            panic!()
        };
        assert_eq!(up.checkout.as_deref(), Some("v1"));

        let s = Source::parse("git+file:///tmp/repo", cwd).unwrap();
        assert_eq!(s.recorded(Some(sha)), format!("git+file:///tmp/repo#{sha}"));
        let pinned = Source::parse(&format!("git+file:///tmp/repo#{sha}"), cwd).unwrap();
        let Source::Git(up) = pinned.for_update() else {
            panic!()
        };
        assert_eq!((up.checkout, up.track), (None, None));

        assert!(matches!(
            Source::parse("npm:@scope/pkg", cwd),
            Err(InstallError::Npm { .. })
        ));
        assert!(matches!(
            Source::parse("github:o", cwd),
            Err(InstallError::BadSource { .. })
        ));
        assert!(matches!(
            Source::parse("left-pad", cwd),
            Err(InstallError::BadSource { .. })
        ));
        assert!(matches!(
            Source::parse("git+ftp://x", cwd),
            Err(InstallError::BadSource { .. })
        ));
        assert_eq!(Source::parse("/", cwd).unwrap(), Source::Local("/".into()));
    }

    #[test]
    fn refs_and_urls_that_git_would_read_as_options_are_refused() {
        let cwd = Path::new("/");
        let refused = |src: &str, expected: &str| match Source::parse(src, cwd) {
            Err(InstallError::BadSource { message, .. }) => {
                assert!(message.contains(expected), "{src}: {message}")
            }
            other => panic!("{src} accepted: {other:?}"),
        };
        refused(
            "git+file:///tmp/repo#--upload-pack=touch /tmp/x",
            "starts with '-', so git would read it as an option",
        );
        refused("git+file:///tmp/repo?ref=-x#main", "after ?ref=");
        refused("github:o/r#--upload-pack=x", "starts with '-'");
        refused("git+https://h/r#a..b", "'..'");
        refused("git+https://h/r#a:b", "contains ':'");
        refused("git+https://h/r#+main", "contains '+'");
        refused("git+https://h/r#main\u{1b}[2J", "contains '\\u{1b}'");
        refused("git+https://h/r#v1.lock", ".lock");
        refused("git+https://h/a b", "no spaces or control characters");
        refused("git+https://h/a\tb", "no spaces or control characters");
        refused("git+ssh://-oProxyCommand=x/r", "starting with '-'");
        refused("git+ssh://u@-oProxyCommand=x/r", "starting with '-'");
        refused("git+https:///r", "has no host");
        refused("github:o/r/../x", "'..'");
        assert!(matches!(
            Source::parse("git+ext::sh -c touch% /tmp/x", cwd),
            Err(InstallError::BadSource { .. })
        ));
        assert!(matches!(
            Source::parse("git+fd::3", cwd),
            Err(InstallError::BadSource { .. })
        ));
        for ok in [
            "git+https://example.invalid/o/r.git#v1.2.0",
            "git+file:///tmp/repo#feature/x_y-z",
            "git+ssh://git@example.invalid/o/r?ref=release/2#0123456789abcdef0123456789abcdef01234567",
            "github:o/r/plugins/x#main",
        ] {
            Source::parse(ok, cwd).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        // A source built without `parse` is checked before git runs.
        let g = GitSource {
            url: "file:///tmp/repo".into(),
            github: None,
            subpath: None,
            checkout: Some("--upload-pack=x".into()),
            track: None,
        };
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            fetch_git(&g, &dir.path().join("x")),
            Err(InstallError::BadSource { .. })
        ));
        assert!(!dir.path().join("x").exists());
    }
}
