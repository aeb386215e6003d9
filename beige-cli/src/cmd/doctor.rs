//! `beige doctor [--agent A]`: checks what the gateway needs and says how to fix what is
//! wrong — BEIGE_HOME and token permissions, the config, the descriptor limit, free
//! space, the Docker engine, the shim, the agents' images, the port and, when a gateway
//! runs, the shim link of each agent —
//! plus, with `--agent`, what the agent's system prompt tells it about its tools and
//! skills.
//!
//! Doctor only looks: it never runs setup, builds images or starts anything, so it can
//! be run on a broken installation. It exits with 1 when any check failed.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use beige_core::config::{Config, LinkMode, DEFAULT_IMAGE};
use beige_core::home::BeigeHome;
use beige_core::plugin::{kv::KvPlugin, Plugin, PluginRegistry};
use beige_core::sandbox::docker::DockerSandbox;
use beige_core::sandbox::SandboxStatus;
use beige_core::store::SqliteStore;
use beige_core::RemoteGateway;
use beige_core::SkillSet;
use beige_core::{system_prompt, PromptSession, PromptSkill, PromptTool};
use beige_core::{Admin, Gateway, GatewayError};

use crate::client;
use crate::Exit;

/// The outcome of all checks.
#[derive(Debug, Default)]
struct Report {
    failed: usize,
    warned: usize,
}

impl Report {
    fn ok(&mut self, what: impl AsRef<str>) {
        println!("✓ {}", what.as_ref());
    }

    fn note(&mut self, what: impl AsRef<str>) {
        println!("• {}", what.as_ref());
    }

    /// Something degraded that still works: does not fail doctor.
    fn warn(&mut self, what: impl AsRef<str>) {
        self.warned += 1;
        println!("⚠ {}", what.as_ref());
    }

    fn fail(&mut self, what: impl AsRef<str>, fix: impl AsRef<str>) {
        self.failed += 1;
        println!("✗ {}", what.as_ref());
        for (i, line) in fix.as_ref().lines().enumerate() {
            if i == 0 {
                println!("    fix: {line}");
            } else {
                println!("         {line}");
            }
        }
    }
}

fn mode_of(path: &Path) -> Option<u32> {
    std::fs::metadata(path)
        .ok()
        .map(|m| m.permissions().mode() & 0o777)
}

pub async fn run(
    home: &BeigeHome,
    explicit_config: Option<&Path>,
    agent: Option<&str>,
) -> Result<()> {
    let mut r = Report::default();
    println!(
        "beige doctor {} — BEIGE_HOME {}",
        env!("CARGO_PKG_VERSION"),
        home.root().display()
    );
    println!();

    // BEIGE_HOME and the token.
    let root = home.root();
    match mode_of(root) {
        None => r.fail(
            format!("BEIGE_HOME {} does not exist", root.display()),
            "run `beige setup` (it creates the folder, a default config and the API token)",
        ),
        Some(0o700) => r.ok(format!("BEIGE_HOME {} exists, mode 0700", root.display())),
        Some(m) => r.fail(
            format!(
                "BEIGE_HOME {} has mode {m:04o}: other users can read secrets and sessions",
                root.display()
            ),
            format!(
                "chmod 700 {}   (or run `beige setup`, which tightens it)",
                root.display()
            ),
        ),
    }
    let token = home.token_path();
    match mode_of(&token) {
        None => r.fail(
            format!("no API token at {}", token.display()),
            "run `beige setup` to create one",
        ),
        Some(0o600) => r.ok(format!("API token {} has mode 0600", token.display())),
        Some(m) => r.fail(
            format!(
                "API token {} has mode {m:04o}: other users can read it",
                token.display()
            ),
            format!(
                "chmod 600 {}   (or run `beige setup`, which tightens it)",
                token.display()
            ),
        ),
    }

    // The config.
    let config_path = explicit_config
        .map(Path::to_path_buf)
        .unwrap_or_else(|| home.config_path());
    let config = match Config::load(&config_path, home) {
        Ok(loaded) => {
            let agents: Vec<&str> = loaded.config.agents.keys().map(String::as_str).collect();
            r.ok(format!(
                "config {} is valid ({} agent(s): {})",
                loaded.path.display(),
                agents.len(),
                agents.join(", ")
            ));
            for w in &loaded.warnings {
                r.note(format!("config warning: {w}"));
            }
            Some(loaded.config)
        }
        Err(e) if !config_path.exists() => {
            r.fail(
                format!("no config at {}", config_path.display()),
                "run `beige setup` to create a commented default config",
            );
            tracing::debug!(error = %e, "config missing");
            None
        }
        Err(e) => {
            r.fail(
                format!("the config does not load: {e}"),
                format!(
                    "edit {} as the message says, then check it with `beige config validate`",
                    config_path.display()
                ),
            );
            None
        }
    };

    // Each agent's egress posture, and the shared store.
    if let Some(config) = &config {
        egress(&mut r, config);
        store_check(&mut r, config).await;
    }

    // Descriptors and disk space.
    descriptors(&mut r, home);
    disk_space(&mut r, home, config.as_ref());

    // Docker.
    let docker =
        match tokio::time::timeout(Duration::from_secs(10), DockerSandbox::connect(home.hash()))
            .await
        {
            Ok(Ok(d)) => {
                let version = d
                    .client()
                    .version()
                    .await
                    .ok()
                    .and_then(|v| v.version)
                    .unwrap_or_else(|| "unknown version".into());
                r.ok(format!("Docker engine reachable (version {version})"));
                Some(d)
            }
            Ok(Err(e)) => {
                r.fail(
                    format!(
                        "Docker engine not reachable: {}",
                        docker_reason(&e.to_string())
                    ),
                    docker_fix(),
                );
                None
            }
            Err(_) => {
                r.fail("Docker engine did not answer within 10 s", docker_fix());
                None
            }
        };

    // The shim.
    let configured = config.as_ref().and_then(|c| c.sandbox.shim.clone());
    match crate::daemon::find_shim(configured.as_deref()) {
        Ok(p) => r.ok(format!("shim {} is a static executable", p.display())),
        Err(e) => r.fail(
            format!("shim: {e}"),
            "build the static shim with `scripts/build-shim`, then point BEIGE_SHIM (or sandbox.shim in the config) at target/shim/beige-shim, or put it next to the beige binary",
        ),
    }

    // Images.
    if let (Some(config), Some(docker)) = (&config, &docker) {
        let mut seen: Vec<&str> = Vec::new();
        for a in config.agents.values() {
            let image = a.sandbox.image.as_str();
            if seen.contains(&image) {
                continue;
            }
            seen.push(image);
            let users: Vec<&str> = config
                .agents
                .iter()
                .filter(|(_, x)| x.sandbox.image == image)
                .map(|(n, _)| n.as_str())
                .collect();
            let present = docker.client().inspect_image(image).await.is_ok();
            if present {
                r.ok(format!(
                    "image {image} is present (agents: {})",
                    users.join(", ")
                ));
            } else if image == DEFAULT_IMAGE || image.starts_with("beige-sandbox:") {
                r.ok(format!(
                    "image {image} is not built yet — the gateway builds it on start (agents: {})",
                    users.join(", ")
                ));
            } else {
                r.fail(
                    format!("image {image} is missing (agents: {}); beige never pulls images itself", users.join(", ")),
                    format!("docker pull {image}   (or build it; for tests: scripts/setup-docker builds beige-test-busybox:latest)"),
                );
            }
        }
    }

    // The port.
    if let Some(config) = &config {
        let gw = &config.gateway;
        let url = client::url_for(&gw.host, gw.port);
        if let Some(h) = client::health(&url).await {
            r.ok(format!(
                "port {} is used by a running beige gateway (version {}) at {url}",
                gw.port, h.version
            ));
        } else {
            match std::net::TcpListener::bind((gw.host.as_str(), gw.port)) {
                Ok(_) => r.ok(format!("port {}:{} is free", gw.host, gw.port)),
                Err(e) => r.fail(
                    format!("cannot listen on {}:{}: {e}", gw.host, gw.port),
                    format!(
                        "stop the program using port {} (e.g. `ss -ltnp | grep :{}`), or set gateway.port in {}",
                        gw.port,
                        gw.port,
                        config_path.display()
                    ),
                ),
            }
        }
    }

    // The shim links, as the running gateway sees them.
    links(&mut r, home, explicit_config).await;

    // One agent's prompt.
    if let Some(name) = agent {
        println!();
        match &config {
            None => r.fail(
                format!("cannot show agent '{name}': the config does not load"),
                "fix the config first",
            ),
            Some(c) => match c.agents.get(name) {
                None => r.fail(
                    format!("no agent '{name}' in the config"),
                    format!(
                        "use one of: {}",
                        c.agents
                            .keys()
                            .map(String::as_str)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ),
                Some(_) => match preview(home, c, name).await {
                    Ok(text) => {
                        r.ok(format!(
                            "system prompt of agent '{name}' ({} lines):",
                            text.lines().count()
                        ));
                        for line in text.lines() {
                            println!("    │ {line}");
                        }
                    }
                    Err(e) => r.fail(
                        format!("the system prompt of agent '{name}' cannot be assembled: {e}"),
                        "fix the agent's tools and skills in the config as the message says",
                    ),
                },
            },
        }
    }

    println!();
    if r.failed == 0 {
        match r.warned {
            0 => println!("All checks passed."),
            n => println!("All checks passed, with {n} warning(s) (⚠ above)."),
        }
        Ok(())
    } else {
        Err(Exit::new(
            1,
            format!("{} check(s) failed — see the fixes above.", r.failed),
        )
        .into())
    }
}

/// `store.url`: the PostgreSQL database is reachable with the config's settings, its
/// schema is one this beige can use, and which gateway holds each agent's lease. Reads
/// only: doctor migrates nothing.
async fn store_check(r: &mut Report, config: &Config) {
    use beige_core::store::{Coordination as _, PostgresOptions, PostgresStore, PG_SCHEMA_VERSION};
    let Some(store) = &config.store else {
        return;
    };
    let fix = "check store.url and store.passwordFile, that the server runs and accepts this \
               user (docs/scaling.md)";
    let pg = match PostgresOptions::from_config(store).and_then(|o| PostgresStore::connect_lazy(&o))
    {
        Ok(pg) => pg,
        Err(e) => return r.fail(format!("store: {e}"), fix),
    };
    let name = pg.name().display().to_string();
    match pg.schema_version().await {
        Err(e) => r.fail(format!("store {name} cannot be used: {e}"), fix),
        Ok(None) => r.ok(format!(
            "store {name} is reachable and holds no beige tables yet (the gateway creates them when it starts)"
        )),
        Ok(Some(v)) if v > PG_SCHEMA_VERSION => r.fail(
            format!("store {name} has schema version {v}; this beige knows up to {PG_SCHEMA_VERSION}"),
            "upgrade beige to the version that migrated the database",
        ),
        Ok(Some(v)) => {
            r.ok(format!("store {name} is reachable, schema version {v}"));
            let now = chrono::Utc::now().timestamp_millis();
            for agent in config.agents.keys() {
                if let Ok(Some(lease)) = pg.lease(&format!("agent:{agent}")).await {
                    if let (Some(holder), true) = (&lease.holder, lease.expires_ms > now) {
                        r.note(format!(
                            "agent '{agent}' is held by gateway {holder} (lease epoch {}, {} s left unless renewed)",
                            lease.epoch,
                            (lease.expires_ms - now) / 1000
                        ));
                    }
                }
            }
        }
    }
    pg.pool().close().await;
}

/// Each agent's egress posture (sealed, through the gateway, or open over Docker's
/// bridge), and a warning for every rule with `allowPrivate` or with methods or paths
/// (which today hold only for plain `http://`).
fn egress(r: &mut Report, config: &Config) {
    for (name, agent) in &config.agents {
        match super::egress::posture(config, name, agent) {
            Ok(line) if agent.egress.is_some() => r.ok(line),
            Ok(line) => r.note(line),
            Err(line) => r.warn(line),
        }
    }
    let shared = config
        .egress
        .as_ref()
        .map(|e| e.rules.as_slice())
        .unwrap_or_default();
    let uses_shared = config.agents.values().any(|a| a.egress.is_some());
    let mut sources: Vec<(String, &[beige_core::egress::config::RuleConfig])> = Vec::new();
    if uses_shared {
        sources.push(("egress.rules".to_string(), shared));
    }
    for (name, agent) in &config.agents {
        if let Some(e) = &agent.egress {
            sources.push((format!("agents.{name}.egress.rules"), e.rules.as_slice()));
        }
    }
    for (at, rules) in sources {
        for rule in rules {
            let id = &rule.id;
            let hosts = rule.hosts.join(", ");
            if !rule.allow_private.is_empty() {
                r.warn(format!(
                    "egress rule '{id}' ({at}) has allowPrivate [{}]: {hosts} may resolve into your private network, and the sandbox reaches whatever answers there; keep the ranges as narrow as the host needs",
                    rule.allow_private.join(", ")
                ));
            }
            if rule.methods.is_some() || rule.paths.is_some() {
                r.warn(format!(
                    "egress rule '{id}' ({at}) has methods or paths: HTTPS to {hosts} is inspected (TLS answered with the home's egress CA, which clients in the sandbox must be told to trust), and plain http:// gets its first request checked and the connection closed after it"
                ));
            }
        }
    }
}

/// Below this many descriptors, sandboxes holding connections can starve the gateway.
const LOW_NOFILE: u64 = 1024;

/// `Max open files` (soft, hard) from a `/proc/<pid>/limits` text; `None` is unlimited.
fn parse_nofile(limits: &str) -> Option<(Option<u64>, Option<u64>)> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let mut fields = line["Max open files".len()..].split_whitespace();
    let value = |v: &str| match v {
        "unlimited" => Some(None),
        v => v.parse::<u64>().ok().map(Some),
    };
    Some((value(fields.next()?)?, value(fields.next()?)?))
}

fn show_limit(v: Option<u64>) -> String {
    v.map_or_else(|| "unlimited".to_string(), |v| v.to_string())
}

/// The descriptor limit of the running gateway (from `/proc/<pid>/limits`), else the one
/// a gateway started from here would get (it raises its soft limit to the hard one).
fn descriptors(r: &mut Report, home: &BeigeHome) {
    let fix = "raise the limit of the gateway's service (systemd: LimitNOFILE=65536; a shell: \
               `ulimit -Hn 65536` as root, or in /etc/security/limits.conf), then restart the \
               gateway (`beige gateway restart`)";
    if let crate::daemon::PidState::Running(pid) = crate::daemon::PidFile::new(home).state() {
        match std::fs::read_to_string(format!("/proc/{pid}/limits"))
            .ok()
            .as_deref()
            .and_then(parse_nofile)
        {
            Some((soft, hard)) => {
                let text = format!(
                    "descriptor limit of the running gateway (pid {pid}): soft {}, hard {}",
                    show_limit(soft),
                    show_limit(hard)
                );
                if soft.is_some_and(|s| s < LOW_NOFILE) {
                    r.warn(format!(
                        "{text} — low: sandboxes holding many connections can leave the API and other agents without descriptors; {fix}"
                    ));
                } else {
                    r.ok(text);
                }
            }
            None => r.note(format!(
                "descriptor limit of the running gateway (pid {pid}) not readable (/proc/{pid}/limits); run doctor as the gateway's user"
            )),
        }
        return;
    }
    let Some((soft, hard)) = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .as_deref()
        .and_then(parse_nofile)
    else {
        r.note("descriptor limit not checked: /proc/self/limits is not readable");
        return;
    };
    let text = format!(
        "descriptor limit here: soft {}, hard {} (a gateway started from here raises its soft limit to the hard one)",
        show_limit(soft),
        show_limit(hard)
    );
    if hard.is_some_and(|h| h < LOW_NOFILE) {
        r.warn(format!("{text} — low: {fix}"));
    } else {
        r.ok(text);
    }
}

/// The nearest folder of `path` that exists (a workspace not made yet lands there).
fn existing(path: &Path) -> Option<&Path> {
    path.ancestors().find(|p| p.exists())
}

/// Free space of the filesystems of BEIGE_HOME and of every workspace, against
/// `gateway.minFreeSpace` (below it the gateway pauses agents).
fn disk_space(r: &mut Report, home: &BeigeHome, config: Option<&Config>) {
    use beige_core::disk::{fmt_bytes, DiskGuard, WatchPath};
    let min_free = config.map(|c| c.gateway.min_free_space).unwrap_or_default();
    let Some(root) = existing(home.root()) else {
        return;
    };
    let mut paths = vec![WatchPath::shared(root, "BEIGE_HOME")];
    if let Some(c) = config {
        for name in c.agents.keys() {
            let ws = c.agent_workspace(home, name);
            if let Some(at) = existing(&ws) {
                paths.push(WatchPath::workspace(at, name));
            }
        }
    }
    let status = DiskGuard::survey(min_free, paths);
    let threshold = if min_free.is_off() {
        "the free-space guard is off (gateway.minFreeSpace = 0)".to_string()
    } else {
        format!("the gateway pauses agents below {min_free} (gateway.minFreeSpace)")
    };
    for fs in &status.filesystems {
        let what = fs.what.join(", ");
        let Some(space) = fs.space else {
            r.warn(format!(
                "free space of {} ({what}) not readable: {}",
                fs.path.display(),
                fs.error.as_deref().unwrap_or("unknown error")
            ));
            continue;
        };
        let text = format!(
            "free space on the filesystem of {} ({what}): {} of {}, {} inodes free",
            fs.path.display(),
            fmt_bytes(space.free_bytes),
            fmt_bytes(space.total_bytes),
            space.free_inodes
        );
        if fs.low {
            r.warn(format!(
                "{text} — below the threshold: {threshold}, so they are paused now or will be when the gateway starts; free space there (files in the workspaces, `docker system prune`, old logs) or lower gateway.minFreeSpace"
            ));
        } else {
            r.ok(format!("{text}; {threshold}"));
        }
    }
}

/// The shim link of every agent of the running gateway (only the gateway holds the
/// links, so without one there is nothing to look at).
async fn links(r: &mut Report, home: &BeigeHome, explicit_config: Option<&Path>) {
    let target = client::Target::resolve(home, explicit_config, None);
    let Some(health) = client::health(&target.url).await else {
        r.note(format!(
            "shim links not checked: the link check needs a running gateway (none answers at {}; start it with `beige gateway start`)",
            target.url
        ));
        return;
    };
    let gw = match RemoteGateway::new(&target.url, target.token.clone()) {
        Ok(gw) => gw,
        Err(e) => {
            r.fail(
                format!("shim links: {e}"),
                "check the gateway URL (`gateway.host`/`gateway.port` in the config)",
            );
            return;
        }
    };
    let agents = match gw.agents().await {
        Ok(agents) => agents,
        Err(GatewayError::Remote { status: 401, .. }) => {
            r.fail(
                format!(
                    "shim links: the gateway at {} refused the token in {}",
                    target.url,
                    home.token_path().display()
                ),
                "run doctor as the user and with the BEIGE_HOME of the gateway, or restart the gateway (`beige gateway restart`) after changing the token",
            );
            return;
        }
        Err(e) => {
            r.fail(
                format!("shim links: cannot list the gateway's agents: {e}"),
                "look at `beige gateway logs`",
            );
            return;
        }
    };
    telemetry_check(r, &gw).await;
    for agent in agents {
        match gw.sandbox_status(&agent.name).await {
            Ok(status) => link_check(r, &status),
            // A gateway older than this route answers the generic 404.
            Err(GatewayError::Remote {
                status: 404,
                message,
            }) if message == "Not found" => {
                r.note(format!(
                    "shim links not checked: the running gateway (version {}) does not report them; restart it with this beige (`beige gateway restart`)",
                    health.version
                ));
                return;
            }
            Err(e) => r.warn(format!(
                "agent '{}': the gateway did not report its shim link: {e}",
                agent.name
            )),
        }
    }
}

/// The running gateway's trace exporter: when traces are on, whether its last export
/// reached the collector.
async fn telemetry_check(r: &mut Report, gw: &RemoteGateway) {
    let Ok(summary) = gw.config_summary().await else {
        return;
    };
    let traces = &summary["telemetry"]["traces"];
    if traces["enabled"] != serde_json::Value::Bool(true) {
        return;
    }
    let endpoint = traces["endpoint"].as_str().unwrap_or("the collector");
    let success = traces["lastSuccess"].as_str();
    let error = traces["lastError"]["message"].as_str();
    let error_at = traces["lastError"]["at"].as_str();
    match (success, error.zip(error_at)) {
        // RFC 3339 times in UTC with the same precision compare as strings.
        (Some(ok), Some((_, at))) if ok > at => {
            r.ok(format!("traces: exported to {endpoint} (last at {ok})"));
        }
        (_, Some((message, at))) => r.warn(format!(
            "traces: the last export to {endpoint} failed at {at}: {message}; prompts are not affected, spans are dropped until the collector answers (check telemetry.otlp.endpoint and headers)"
        )),
        (Some(ok), None) => r.ok(format!("traces: exported to {endpoint} (last at {ok})")),
        (None, None) => r.note(format!(
            "traces: on, to {endpoint}; nothing exported yet (spans leave in batches after a prompt)"
        )),
    }
}

/// One agent's link: up (with the ping and where its ops went), down or off.
fn link_check(r: &mut Report, s: &SandboxStatus) {
    let agent = &s.agent;
    let mode = s.link_mode.as_str();
    let Some(link) = s.link.as_ref().filter(|_| s.link_mode != LinkMode::Off) else {
        r.note(format!(
            "agent '{agent}': link off (sandbox.link = \"off\" or a root sandbox): core tools use docker exec"
        ));
        return;
    };
    let ops = format!(
        "{} ops over the link, {} via docker exec",
        link.ops_link, link.ops_fallback
    );
    let carrier = link.carrier.map_or("an unknown carrier", |c| c.as_str());
    match (link.connected, s.ping_us) {
        (true, Some(us)) => r.ok(format!(
            "agent '{agent}': link ({mode}): up over {carrier}, ping {}, {ops}",
            ping_ms(us)
        )),
        (true, None) => r.warn(format!(
            "agent '{agent}': link ({mode}): up over {carrier} but PID 1 did not answer a ping in time; {ops}; see `beige gateway logs`"
        )),
        (false, _) => r.warn(format!(
            "agent '{agent}': link down ({mode}) — core tools fall back to docker exec (slower); see `beige gateway logs` ({ops} so far)"
        )),
    }
    if link.rejected_peers > 0 {
        r.warn(format!(
            "agent '{agent}': {} peer(s) were refused on the link's control socket; see `beige audit tail` (security.link_reject)",
            link.rejected_peers
        ));
    }
}

/// Microseconds as milliseconds, `0.21 ms` / `12.5 ms` / `340 ms`.
fn ping_ms(us: u64) -> String {
    let ms = us as f64 / 1000.0;
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else if ms < 100.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.0} ms")
    }
}

/// The first line of a Docker connection error, without bollard's internals.
fn docker_reason(message: &str) -> String {
    let m = message
        .split(". Start the Docker engine")
        .next()
        .unwrap_or(message);
    m.trim_start_matches("Docker is not usable: ").to_string()
}

fn docker_fix() -> String {
    let host = std::env::var("DOCKER_HOST").ok().filter(|h| !h.is_empty());
    let mut fix = String::from(
        "start a Docker engine: `scripts/setup-docker` (installs and starts one), or `systemctl start docker`;\nthen check with `docker info` that this user may use it (root, or a member of the docker group)",
    );
    if let Some(h) = host {
        fix.push_str(&format!(
            "\nDOCKER_HOST is set to {h}: unset it to use the local socket, or point it at a running engine"
        ));
    }
    fix
}

/// The agent's system prompt as the gateway would assemble it for a `cli` session.
async fn preview(home: &BeigeHome, config: &Config, agent: &str) -> Result<String> {
    let scratch = tempfile::tempdir()?;
    let store = Arc::new(SqliteStore::open(scratch.path().join("doctor.db"))?);
    let mut plugins: Vec<Arc<dyn Plugin>> = Vec::new();
    for (name, entry) in &config.plugins {
        if name == "kv" && entry.path.is_none() {
            plugins.push(Arc::new(KvPlugin::new()));
        }
    }
    let registry = PluginRegistry::build(
        plugins,
        config,
        &scratch.path().join("data"),
        &HashMap::new(),
        store,
    )
    .await?;
    let a = config
        .agents
        .get(agent)
        .ok_or_else(|| anyhow::anyhow!("no agent '{agent}'"))?;
    let mut missing = Vec::new();
    let tools: Vec<PromptTool> = a
        .tools
        .iter()
        .filter_map(|t| {
            let found = registry.tool(t);
            if found.is_none() {
                missing.push(t.clone());
            }
            found
        })
        .map(|r| PromptTool {
            name: r.tool.name().to_string(),
            description: r.tool.description().to_string(),
            commands: r.tool.commands(),
            docs: true,
        })
        .collect();
    if !missing.is_empty() {
        anyhow::bail!(
            "tool(s) {} are not available in this build (only the built-in kv plugin is; external plugins arrive later)",
            missing.join(", ")
        );
    }
    let skills = SkillSet::load(&config.skills, registry.skills().cloned())?;
    let prompt_skills: Vec<PromptSkill> = skills
        .for_agent(agent, a)?
        .into_iter()
        .map(|s| PromptSkill {
            name: s.name,
            description: s.description,
            context: None,
        })
        .collect();
    let workspace = config.agent_workspace(home, agent);
    // The workspace is the agent's: read beneath a handle, no links, capped.
    Ok(system_prompt(
        agent,
        &tools,
        &prompt_skills,
        &PromptSession {
            channel: "cli".into(),
            ..Default::default()
        },
        &workspace,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_limits_are_read_from_proc_limits() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max processes             63471                63471                processes \n\
                    Max open files            1024                 524288               files     \n";
        assert_eq!(parse_nofile(text), Some((Some(1024), Some(524288))));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(parse_nofile(unlimited), Some((None, None)));
        assert_eq!(parse_nofile("Max processes 1 2 processes\n"), None);
        let own = std::fs::read_to_string("/proc/self/limits").unwrap();
        assert!(parse_nofile(&own).is_some(), "{own}");
    }
}
