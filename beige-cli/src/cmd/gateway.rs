//! `beige gateway start|stop|restart|status|logs` — controlling the daemon from another
//! process.
//!
//! `start` checks Docker and the config in this process (so mistakes are reported here,
//! not in a log), rotates `gateway.log`, re-executes `beige gateway start --foreground`
//! in a new session with its output in the log, writes `gateway.pid` (the pid only)
//! and `run/gateway.url` and waits for
//! `/api/health` while showing the new log lines. `stop` sends SIGTERM and waits for the
//! process to exit; `restart` asks the running gateway to reload in place; `status`
//! asks `/api/health` and `/api/agents`; `logs` prints or follows the log.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use beige_core::config::{Config, LoadedConfig};
use beige_core::home::BeigeHome;
use serde_json::Value;

use super::config::ensure_setup;
use crate::client::{self, Target};
use crate::daemon::http::RestartRecord;
use crate::daemon::{PidFile, PidState};
use crate::logfile::{self, Follower};
use crate::{code, sys, Exit};

/// The config file: `--config`, else `<BEIGE_HOME>/config.json5` (set up first if
/// missing).
pub fn config_path(home: &BeigeHome, explicit: Option<&Path>) -> Result<PathBuf> {
    match explicit {
        Some(p) => Ok(std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())),
        None => {
            ensure_setup(home)?;
            Ok(home.config_path())
        }
    }
}

/// Load the config, printing warnings; an error ends the command with the message.
pub fn load_config(home: &BeigeHome, path: &Path) -> Result<LoadedConfig> {
    let loaded = Config::load(path, home).map_err(|e| Exit::new(1, format!("error: {e}")))?;
    for w in &loaded.warnings {
        eprintln!("warning: {}: {w}", loaded.path.display());
    }
    Ok(loaded)
}

/// The gateway log: `gateway.logFile` from the config, else `<BEIGE_HOME>/logs/gateway.log`.
pub fn log_path(home: &BeigeHome, config: Option<&Config>) -> PathBuf {
    config
        .and_then(|c| c.gateway.log_file.clone())
        .unwrap_or_else(|| home.gateway_log_path())
}

/// Check that a Docker engine answers; the error says how to fix it.
pub async fn check_docker(home: &BeigeHome) -> Result<String> {
    let connect = beige_core::sandbox::docker::DockerSandbox::connect(home.hash());
    let docker = match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(d)) => d,
        Ok(Err(e)) => return Err(Exit::new(1, format!("error: {e}")).into()),
        Err(_) => {
            return Err(Exit::new(
                1,
                "error: the Docker engine did not answer within 10 s. Check it with `docker info`; start it with `scripts/setup-docker` (or `systemctl start docker`).",
            )
            .into())
        }
    };
    Ok(docker
        .client()
        .version()
        .await
        .ok()
        .and_then(|v| v.version)
        .unwrap_or_else(|| "?".into()))
}

/// `beige gateway start` (daemon).
pub async fn start(
    home: &BeigeHome,
    explicit_config: Option<&Path>,
    log_level: Option<&str>,
    timeout: f64,
) -> Result<()> {
    if !timeout.is_finite() || timeout < 0.0 {
        return Err(Exit::new(
            2,
            format!(
                "error: invalid --timeout {timeout}: use a number of seconds ≥ 0 (0 = no limit)"
            ),
        )
        .into());
    }
    let path = config_path(home, explicit_config)?;
    let pid_file = PidFile::new(home);
    match pid_file.state() {
        PidState::Running(pid) => {
            let url = client::Target::resolve(home, Some(&path), None).url;
            println!("The gateway is already running (PID {pid}) at {url}.");
            return Ok(());
        }
        PidState::Stale(pid) => {
            println!(
                "Removing a stale pid file ({}: PID {pid} is not running).",
                pid_file.path().display()
            );
            pid_file.remove();
        }
        PidState::Absent => {}
    }

    check_docker(home).await?;
    let loaded = load_config(home, &path)?;
    let gw = &loaded.config.gateway;
    let url = client::url_for(&gw.host, gw.port);
    if let Some(h) = client::health(&url).await {
        return Err(Exit::new(
            1,
            format!(
                "error: a gateway (version {}) already answers at {url}, but not one this BEIGE_HOME ({}) started. Stop it first, or set another gateway.port.",
                h.version,
                home.root().display()
            ),
        )
        .into());
    }
    if tokio::net::TcpStream::connect((connect_host(&gw.host), gw.port))
        .await
        .is_ok()
    {
        return Err(Exit::new(
            1,
            format!(
                "error: port {} on {} is already in use by another program. Stop it, or set gateway.port in {}.",
                gw.port,
                gw.host,
                loaded.path.display()
            ),
        )
        .into());
    }

    let log = log_path(home, Some(&loaded.config));
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    logfile::rotate(&log, gw.log.max_files)
        .with_context(|| format!("cannot rotate {}", log.display()))?;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .with_context(|| format!("cannot open {}", log.display()))?;
    let err = out
        .try_clone()
        .with_context(|| format!("cannot open {}", log.display()))?;

    let exe = std::env::current_exe().context("cannot find the beige executable")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("--config").arg(&loaded.path);
    if let Some(level) = log_level {
        cmd.arg("--log-level").arg(level);
    }
    // The daemon writes its log itself, rotating it by size while it runs; its stdout
    // and stderr go to the same file.
    cmd.args(["gateway", "start", "--foreground", "--log-file"])
        .arg(&log)
        .arg("--log-max-size")
        .arg(gw.log.max_size_bytes.to_string())
        .arg("--log-max-files")
        .arg(gw.log.max_files.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    sys::new_session(&mut cmd);
    let mut child = cmd.spawn().context("cannot start the gateway process")?;
    let pid = child.id();
    pid_file
        .write(pid, &url)
        .with_context(|| format!("cannot write {}", pid_file.path().display()))?;
    println!("Starting the gateway (PID {pid}); log: {}", log.display());

    let started = Instant::now();
    let limit = (timeout > 0.0).then(|| Duration::from_secs_f64(timeout));
    let mut follower = Follower::new(&log, true);
    let mut interrupt = std::pin::pin!(tokio::signal::ctrl_c());
    let abort = |why: String, exit: u8| -> anyhow::Error {
        let _ = sys::kill(pid as i32, sys::SIGTERM);
        pid_file.remove();
        Exit::new(exit, why).into()
    };
    loop {
        for line in follower.poll_lines() {
            eprintln!("  {line}");
        }
        if let Ok(Some(status)) = child.try_wait() {
            for line in follower.poll_lines() {
                eprintln!("  {line}");
            }
            pid_file.remove();
            return Err(Exit::new(
                1,
                format!(
                    "error: the gateway process exited during startup ({status}). The lines above (from {}) say why.",
                    log.display()
                ),
            )
            .into());
        }
        if client::health(&url).await.is_some() {
            break;
        }
        if let Some(limit) = limit {
            if started.elapsed() > limit {
                return Err(abort(
                    format!(
                        "error: the gateway did not answer at {url} within {timeout} s; stopped it. See {} (or raise --timeout).",
                        log.display()
                    ),
                    1,
                ));
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = &mut interrupt => {
                eprintln!("Startup aborted, stopping the gateway…");
                return Err(abort(String::new(), code::INTERRUPTED));
            }
        }
    }
    for line in follower.poll_lines() {
        eprintln!("  {line}");
    }
    println!("Gateway running (PID {pid}) at {url}");
    println!("Logs: {}", log.display());
    println!("Follow the log with `beige gateway logs -f`; stop with `beige gateway stop`.");
    Ok(())
}

fn connect_host(host: &str) -> &str {
    match host {
        "0.0.0.0" | "" => "127.0.0.1",
        "::" | "[::]" => "::1",
        h => h,
    }
}

/// Wait until `pid` is gone, up to `limit`.
async fn wait_exit(pid: i32, limit: Duration) -> bool {
    let started = Instant::now();
    while sys::alive(pid) {
        if started.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    true
}

/// `beige gateway stop`.
pub async fn stop(home: &BeigeHome, timeout: f64) -> Result<()> {
    let pid_file = PidFile::new(home);
    let pid = match pid_file.state() {
        PidState::Absent => {
            println!(
                "The gateway is not running (no pid file at {}).",
                pid_file.path().display()
            );
            return Ok(());
        }
        PidState::Stale(pid) => {
            println!(
                "The gateway is not running (PID {pid} from {} is gone); removed the stale pid file.",
                pid_file.path().display()
            );
            pid_file.remove();
            return Ok(());
        }
        PidState::Running(pid) => pid,
    };
    sys::kill(pid, sys::SIGTERM).map_err(|e| {
        Exit::new(
            1,
            format!("error: cannot signal the gateway (PID {pid}): {e}"),
        )
    })?;
    println!("Stopping the gateway (PID {pid})…");
    let limit = Duration::from_secs_f64(if timeout.is_finite() && timeout > 0.0 {
        timeout
    } else {
        30.0
    });
    if !wait_exit(pid, limit).await {
        return Err(Exit::new(
            1,
            format!(
                "error: the gateway (PID {pid}) is still running after {} s. Look at `beige gateway logs`; to force it: kill -9 {pid}",
                limit.as_secs_f64()
            ),
        )
        .into());
    }
    pid_file.remove();
    println!("Gateway stopped.");
    Ok(())
}

/// `beige gateway restart`: ask the running gateway to reload in place and wait for the
/// outcome it records (a config error is reported; the gateway keeps its old config).
pub async fn restart(home: &BeigeHome, target: &Target) -> Result<()> {
    if client::health(&target.url).await.is_none() {
        return Err(Exit::new(code::NOT_RUNNING, client::not_running_message(&target.url)).into());
    }
    let before = RestartRecord::read(home);
    println!("Reloading the gateway's config and plugins in place…");
    let result = client::post_json(
        target,
        "/api/gateway/restart",
        &Value::Object(Default::default()),
        Duration::from_secs(30),
    )
    .await;
    match result {
        Ok(_) => {}
        Err(client::CallError::Status(status, message)) => {
            return Err(Exit::new(
                1,
                format!("error: the gateway refused to restart (HTTP {status}): {message}"),
            )
            .into())
        }
        Err(client::CallError::Unreachable(e)) => {
            return Err(Exit::new(
                1,
                format!("error: the gateway stopped answering ({e}). Check `beige gateway logs`."),
            )
            .into())
        }
    }
    let started = Instant::now();
    let limit = Duration::from_secs(300);
    loop {
        let now = RestartRecord::read(home);
        if let Some(record) = now.filter(|r| Some(r) != before.as_ref()) {
            if record.ok {
                println!("✓ Gateway {}; sessions are kept.", record.message);
                return Ok(());
            }
            return Err(Exit::new(
                1,
                format!(
                    "error: the restart failed — the gateway keeps running with its previous config.\n{}",
                    record.message
                ),
            )
            .into());
        }
        if started.elapsed() > limit {
            return Err(Exit::new(
                1,
                format!(
                    "error: no restart outcome after {} s (is the gateway at {} run from this BEIGE_HOME?). Check `beige gateway logs`.",
                    limit.as_secs(),
                    target.url
                ),
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `beige gateway status`: 0 when running, 3 when stopped.
pub async fn status(home: &BeigeHome, target: &Target) -> Result<()> {
    let pid_file = PidFile::new(home);
    let state = pid_file.state();
    let health = client::health(&target.url).await;
    let Some(health) = health else {
        return match state {
            PidState::Running(pid) => Err(Exit::new(
                1,
                format!(
                    "Gateway: process running (PID {pid}) but not answering at {}. Look at `beige gateway logs`.",
                    target.url
                ),
            )
            .into()),
            PidState::Stale(pid) => {
                println!("Gateway: stopped (stale pid file: PID {pid} is gone)");
                println!("not running — start it with `beige gateway start`");
                Err(Exit::silent(code::NOT_RUNNING).into())
            }
            PidState::Absent => {
                println!("Gateway: stopped");
                println!("not running — start it with `beige gateway start`");
                Err(Exit::silent(code::NOT_RUNNING).into())
            }
        };
    };
    let pid = match state {
        PidState::Running(pid) => format!("{pid}"),
        _ => "unknown (not started by `beige gateway start`)".to_string(),
    };
    println!("Gateway: running");
    println!("  URL:      {}", target.url);
    println!("  PID:      {pid}");
    println!("  Version:  {}", health.version);
    let uptime = health
        .body
        .get("uptimeSecs")
        .or_else(|| health.body.get("uptime"))
        .and_then(Value::as_f64)
        .map(|s| Duration::from_secs_f64(s.max(0.0)))
        .or_else(|| {
            std::fs::metadata(pid_file.path())
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
        });
    if let Some(uptime) = uptime {
        println!("  Uptime:   {}", human_duration(uptime));
    }
    println!("  Logs:     {}", home.gateway_log_path().display());
    let agents = match target.remote() {
        Ok(gw) => beige_core::Gateway::agents(&gw).await,
        Err(e) => {
            println!("  Agents:   ({e})");
            return Ok(());
        }
    };
    match agents {
        Ok(agents) => {
            println!("  Agents:   {}", agents.len());
            for a in agents {
                let tools = if a.tools.is_empty() {
                    "core tools only".to_string()
                } else {
                    format!("tools: {}", a.tools.join(", "))
                };
                println!("    {}: {}, {tools}", a.name, a.model);
            }
        }
        Err(beige_core::GatewayError::Remote { status: 401, .. }) => {
            println!(
                "  Agents:   (the token in {} was refused)",
                home.token_path().display()
            );
        }
        Err(e) => println!("  Agents:   (could not list them: {e})"),
    }
    Ok(())
}

fn human_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        3600..=86399 => format!("{}h {}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86400, (s % 86400) / 3600),
    }
}

/// `beige gateway logs [-f]`.
pub fn logs(home: &BeigeHome, explicit_config: Option<&Path>, follow: bool) -> Result<()> {
    let config_path = explicit_config
        .map(Path::to_path_buf)
        .unwrap_or_else(|| home.config_path());
    let config = Config::load(&config_path, home).ok().map(|l| l.config);
    let log = log_path(home, config.as_ref());
    if !log.exists() && !follow {
        return Err(Exit::new(
            1,
            format!(
                "error: no gateway log at {} yet — it is written once the gateway has been started with `beige gateway start`.",
                log.display()
            ),
        )
        .into());
    }
    if !follow {
        let text = std::fs::read(&log).with_context(|| format!("cannot read {}", log.display()))?;
        print!("{}", String::from_utf8_lossy(&text));
        return Ok(());
    }
    let mut follower = Follower::new(&log, true);
    loop {
        for line in follower.poll_lines() {
            println!("{line}");
        }
        std::thread::sleep(logfile::POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_well() {
        assert_eq!(human_duration(Duration::from_secs(5)), "5s");
        assert_eq!(human_duration(Duration::from_secs(125)), "2m 5s");
        assert_eq!(human_duration(Duration::from_secs(7300)), "2h 1m");
        assert_eq!(human_duration(Duration::from_secs(90000)), "1d 1h");
    }
}
