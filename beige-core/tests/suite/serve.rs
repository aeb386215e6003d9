//! `LocalGateway::serve` and `reload`, what the daemon used to do itself: registered
//! channels run with a gateway that survives reloads, a channel's own tools are
//! registered, a required channel's failure ends serving and an optional one's does not,
//! a reload swaps the engine under every handle (and keeps the old one when the new
//! config cannot load or start), and the HTTP API's restart route reaches the reload.
//! Uses the labelled `MemorySandbox`: these tests are about the gateway, not Docker.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use beige_core::channel::http::{ApiOptions, HttpApiChannel};
use beige_core::channel::{Channel, ChannelContext, ChannelError};
use beige_core::config::{Config, LoadedConfig};
use beige_core::plugin::{
    Plugin, PluginContext, PluginError, Registrar, Tool, ToolCall, ToolError, ToolResult,
};
use beige_core::{BeigeHome, Gateway, GatewayBuilder, LocalGateway};
use beige_core::{BoxError, ConfigSource, ServeError, Shutdown};
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use beige_core::testing::MemorySandbox;

const TOKEN: &str = "serve-test-token-0123456789";

fn config(agents: &[&str], tools: &[&str]) -> Config {
    let agents: serde_json::Map<String, serde_json::Value> = agents
        .iter()
        .map(|a| {
            (
                a.to_string(),
                json!({
                    "model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
                    "tools": tools,
                    "sandbox": {"image": super::support::test_image()},
                }),
            )
        })
        .collect();
    serde_json::from_value(json!({
        "llm": {"providers": {"anthropic": {"apiKey": "sk-ant-serve-test", "baseUrl": "http://127.0.0.1:9"}}},
        "agents": agents,
    }))
    .unwrap()
}

/// A config source the test changes: the next config, or an error text.
#[derive(Debug)]
struct Scripted {
    next: Mutex<Result<Config, String>>,
    home: BeigeHome,
}

#[async_trait]
impl ConfigSource for Scripted {
    async fn load(&self) -> Result<LoadedConfig, BoxError> {
        let next = self.next.lock().unwrap().clone();
        match next {
            Ok(config) => Ok(LoadedConfig {
                config,
                path: self.home.config_path(),
                warnings: Vec::new(),
            }),
            Err(e) => Err(e.into()),
        }
    }
}

/// A tool a channel brings.
#[derive(Debug)]
struct Ping;

#[async_trait]
impl Tool for Ping {
    fn name(&self) -> &str {
        "probe.ping"
    }
    fn description(&self) -> &str {
        "answers pong (brought by the probe channel)"
    }
    async fn call(&self, _call: ToolCall) -> Result<ToolResult, ToolError> {
        Ok(ToolResult::ok("pong"))
    }
}

#[derive(Debug)]
struct PingPlugin;

#[async_trait]
impl Plugin for PingPlugin {
    fn name(&self) -> &str {
        "probe"
    }
    async fn register(&self, _ctx: &PluginContext, reg: &mut Registrar) -> Result<(), PluginError> {
        reg.tool(Arc::new(Ping))?;
        Ok(())
    }
}

/// A channel that records what it saw: the agents through its gateway, whether it had
/// a reload handle, and when it was told to stop. `fail` makes it fail at start.
#[derive(Default)]
struct Probe {
    name: &'static str,
    fail: bool,
    started: Notify,
    seen: Mutex<Vec<String>>,
    had_reload: Mutex<Option<bool>>,
    stopped: Mutex<bool>,
    gateway: Mutex<Option<Arc<dyn beige_core::GatewayFull>>>,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probe").field("name", &self.name).finish()
    }
}

impl Probe {
    fn new(name: &'static str) -> Arc<Self> {
        Arc::new(Self {
            name,
            ..Default::default()
        })
    }

    fn failing(name: &'static str) -> Arc<Self> {
        Arc::new(Self {
            name,
            fail: true,
            ..Default::default()
        })
    }
}

#[async_trait]
impl Channel for Probe {
    fn name(&self) -> &str {
        self.name
    }

    fn plugin(&self) -> Option<Arc<dyn Plugin>> {
        (self.name == "probe").then(|| Arc::new(PingPlugin) as Arc<dyn Plugin>)
    }

    async fn run(&self, ctx: ChannelContext) -> Result<(), ChannelError> {
        *self.had_reload.lock().unwrap() = Some(ctx.reload.is_some());
        if self.fail {
            self.started.notify_one();
            return Err(ChannelError::Failed {
                channel: self.name.into(),
                message: "the probe was told to fail".into(),
            });
        }
        let agents = ctx
            .gateway
            .agents()
            .await
            .map_err(|e| ChannelError::Failed {
                channel: self.name.into(),
                message: e.to_string(),
            })?;
        *self.seen.lock().unwrap() = agents.into_iter().map(|a| a.name).collect();
        *self.gateway.lock().unwrap() = Some(ctx.gateway.clone());
        self.started.notify_one();
        ctx.shutdown.cancelled().await;
        *self.stopped.lock().unwrap() = true;
        Ok(())
    }
}

async fn build(builder: GatewayBuilder) -> LocalGateway {
    builder.build().await.unwrap()
}

fn base(home: &BeigeHome, config: Config) -> GatewayBuilder {
    GatewayBuilder::new(config, home.clone()).sandbox(Arc::new(MemorySandbox::new()))
}

async fn agent_names(gw: &dyn Gateway) -> Vec<String> {
    let mut names: Vec<String> = gw
        .agents()
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.name)
        .collect();
    names.sort();
    names
}

async fn next_outcome(
    rx: &mut tokio::sync::watch::Receiver<Option<beige_core::ReloadOutcome>>,
) -> beige_core::ReloadOutcome {
    tokio::time::timeout(Duration::from_secs(30), rx.changed())
        .await
        .expect("a reload outcome within 30 s")
        .unwrap();
    rx.borrow_and_update().clone().unwrap()
}

#[tokio::test]
async fn serve_runs_registered_channels_with_their_tools_and_stops_them_on_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let probe = Probe::new("probe");
    let gw = build(base(&home, config(&["a"], &["probe.ping"])).channel(probe.clone())).await;
    // The channel's plugin was registered: its `plugins` entry needs no folder.
    assert!(gw.registry().tool("probe.ping").is_some());

    let token = CancellationToken::new();
    let serving = tokio::spawn({
        let gw = gw.clone();
        let shutdown = Shutdown::on(token.clone()).drain(Duration::from_secs(1));
        async move { gw.serve(shutdown).await }
    });
    tokio::time::timeout(Duration::from_secs(10), probe.started.notified())
        .await
        .expect("the channel started");
    assert_eq!(*probe.seen.lock().unwrap(), ["a"]);
    // No config source and no config file: nothing to reload from.
    assert_eq!(*probe.had_reload.lock().unwrap(), Some(false));
    assert!(!*probe.stopped.lock().unwrap());

    // Serving twice is refused while the first runs.
    let again = gw.serve(Shutdown::on(CancellationToken::new())).await;
    assert!(
        matches!(again, Err(ServeError::AlreadyServing)),
        "{again:?}"
    );

    token.cancel();
    let served = tokio::time::timeout(Duration::from_secs(20), serving)
        .await
        .expect("serve ends after the token")
        .unwrap();
    assert!(served.is_ok(), "{served:?}");
    assert!(
        *probe.stopped.lock().unwrap(),
        "the channel was told to stop"
    );
}

#[tokio::test]
async fn a_required_channel_that_fails_ends_serving_an_optional_one_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));

    // Optional: logged, the other channel keeps serving until the token.
    let broken = Probe::failing("broken");
    let steady = Probe::new("steady");
    let gw = build(
        base(&home, config(&["a"], &[]))
            .channel_optional(broken.clone())
            .channel(steady.clone()),
    )
    .await;
    let token = CancellationToken::new();
    let serving = tokio::spawn({
        let gw = gw.clone();
        let shutdown = Shutdown::on(token.clone()).drain(Duration::from_secs(1));
        async move { gw.serve(shutdown).await }
    });
    tokio::time::timeout(Duration::from_secs(10), steady.started.notified())
        .await
        .expect("the steady channel started");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !serving.is_finished(),
        "an optional channel's failure ended serving"
    );
    token.cancel();
    assert!(serving.await.unwrap().is_ok());

    // Required: serving ends with that channel's error, and the others are stopped.
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let broken = Probe::failing("broken");
    let steady = Probe::new("steady");
    let gw = build(
        base(&home, config(&["a"], &[]))
            .channel(steady.clone())
            .channel(broken.clone()),
    )
    .await;
    let result = tokio::time::timeout(
        Duration::from_secs(20),
        gw.serve(Shutdown::on(CancellationToken::new()).drain(Duration::from_secs(1))),
    )
    .await
    .expect("serve ends when a required channel fails");
    match result {
        Err(ServeError::Channel { channel, source }) => {
            assert_eq!(channel, "broken");
            assert!(
                source.to_string().contains("the probe was told to fail"),
                "{source}"
            );
        }
        other => panic!("expected the channel's error, got {other:?}"),
    }
    assert!(
        *steady.stopped.lock().unwrap(),
        "the other channel was stopped"
    );
}

#[tokio::test]
async fn reload_swaps_the_engine_under_every_handle_and_keeps_it_when_the_new_config_fails() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let source = Arc::new(Scripted {
        next: Mutex::new(Ok(config(&["a"], &[]))),
        home: home.clone(),
    });
    let probe = Probe::new("steady");
    let gw = build(
        base(&home, config(&["a"], &[]))
            .config_source(source.clone())
            .channel(probe.clone()),
    )
    .await;
    let token = CancellationToken::new();
    let serving = tokio::spawn({
        let gw = gw.clone();
        let shutdown = Shutdown::on(token.clone()).drain(Duration::from_secs(1));
        async move { gw.serve(shutdown).await }
    });
    tokio::time::timeout(Duration::from_secs(10), probe.started.notified())
        .await
        .expect("the channel started");
    assert_eq!(*probe.had_reload.lock().unwrap(), Some(true));
    let channel_gateway = probe.gateway.lock().unwrap().clone().unwrap();
    let mut outcomes = gw.reload_outcomes();
    let handle = gw
        .reload_handle()
        .expect("a gateway with a config source can reload");

    // A new agent: every handle — the builder's, a clone, the channel's — sees it.
    *source.next.lock().unwrap() = Ok(config(&["a", "b"], &[]));
    handle.request();
    let outcome = next_outcome(&mut outcomes).await;
    assert!(outcome.ok, "{outcome}");
    assert!(
        outcome.to_string().starts_with("restarted in "),
        "{outcome}"
    );
    assert_eq!(agent_names(&gw).await, ["a", "b"]);
    assert_eq!(agent_names(&gw.clone()).await, ["a", "b"]);
    assert_eq!(agent_names(&*channel_gateway).await, ["a", "b"]);
    assert_eq!(gw.config().agents.len(), 2);

    // The source fails: the running engine stays, and the outcome says why.
    *source.next.lock().unwrap() = Err("config error: line 3: expected a value".into());
    handle.request();
    let outcome = next_outcome(&mut outcomes).await;
    assert!(!outcome.ok);
    assert_eq!(outcome.message, "config error: line 3: expected a value");
    assert_eq!(agent_names(&gw).await, ["a", "b"]);

    // The new config loads but cannot start (an agent names a tool nobody provides):
    // the previous config is started again.
    *source.next.lock().unwrap() = Ok(config(&["a", "b", "c"], &["no_such_tool"]));
    handle.request();
    let outcome = next_outcome(&mut outcomes).await;
    assert!(!outcome.ok);
    assert!(
        outcome
            .message
            .contains("the gateway is running with the previous config again"),
        "{outcome}"
    );
    assert_eq!(agent_names(&*channel_gateway).await, ["a", "b"]);

    token.cancel();
    assert!(serving.await.unwrap().is_ok());
}

#[tokio::test]
async fn the_http_restart_route_reloads_through_the_gateway_or_answers_501_without_a_source() {
    for with_source in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let home = BeigeHome::new(dir.path().join("home"));
        let (api, addr) =
            HttpApiChannel::bind("127.0.0.1", 0, ApiOptions::new(Some(TOKEN.into()))).unwrap();
        let mut builder = base(&home, config(&["a"], &[])).channel(Arc::new(api));
        let source = Arc::new(Scripted {
            next: Mutex::new(Ok(config(&["a", "z"], &[]))),
            home: home.clone(),
        });
        if with_source {
            builder = builder.config_source(source.clone());
        }
        let gw = build(builder).await;
        let mut outcomes = gw.reload_outcomes();
        let token = CancellationToken::new();
        let serving = tokio::spawn({
            let gw = gw.clone();
            let shutdown = Shutdown::on(token.clone()).drain(Duration::from_secs(1));
            async move { gw.serve(shutdown).await }
        });
        let client = reqwest::Client::new();
        let restart = || {
            client
                .post(format!("http://{addr}/api/gateway/restart"))
                .bearer_auth(TOKEN)
                .send()
        };
        let mut response = restart().await;
        // The listener was bound before `serve`; retry while the task starts up.
        for _ in 0..50 {
            if response.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            response = restart().await;
        }
        let response = response.unwrap();
        if with_source {
            assert_eq!(response.status(), 202);
            let outcome = next_outcome(&mut outcomes).await;
            assert!(outcome.ok, "{outcome}");
            assert_eq!(agent_names(&gw).await, ["a", "z"]);
        } else {
            assert_eq!(response.status(), 501);
            assert_eq!(agent_names(&gw).await, ["a"]);
        }
        token.cancel();
        assert!(serving.await.unwrap().is_ok());
    }
}

/// A channel that keeps a record through the store its context carries.
#[derive(Debug)]
struct Recorder {
    done: Notify,
}

#[async_trait]
impl Channel for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }

    async fn run(&self, ctx: ChannelContext) -> Result<(), ChannelError> {
        let failed = |message: String| ChannelError::Failed {
            channel: "recorder".into(),
            message,
        };
        let stores = ctx
            .stores
            .clone()
            .ok_or_else(|| failed("the context carries no store".into()))?;
        stores
            .data
            .kv_set("recorder", "global", "offset", "42")
            .await
            .map_err(|e| failed(e.to_string()))?;
        self.done.notify_one();
        ctx.shutdown.cancelled().await;
        Ok(())
    }
}

#[tokio::test]
async fn a_served_channel_keeps_its_records_in_the_gateways_own_store() {
    use beige_core::store::PluginData as _;
    use beige_core::testing::MemoryStore;
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let store = MemoryStore::new();
    let recorder = Arc::new(Recorder {
        done: Notify::new(),
    });
    let gw = build(
        base(&home, config(&["a"], &[]))
            .store(Arc::new(store.clone()))
            .channel(recorder.clone()),
    )
    .await;
    let token = CancellationToken::new();
    let serving = tokio::spawn({
        let gw = gw.clone();
        let shutdown = Shutdown::on(token.clone()).drain(Duration::from_secs(1));
        async move { gw.serve(shutdown).await }
    });
    tokio::time::timeout(Duration::from_secs(10), recorder.done.notified())
        .await
        .expect("the channel wrote its record");
    // One store: what the channel wrote is in the store the gateway was given, and no
    // second database was opened next to it.
    assert_eq!(
        store.kv_get("recorder", "global", "offset").await.unwrap(),
        Some("42".to_string())
    );
    assert!(!home.db_path().exists(), "a second store was opened");
    token.cancel();
    assert!(serving.await.unwrap().is_ok());
}

/// `store.url` in the config: the gateway migrates the PostgreSQL database, keeps its
/// state there (a channel's record, read back through another handle) and opens no
/// SQLite file in `BEIGE_HOME`.
#[tokio::test]
async fn a_gateway_with_store_url_keeps_its_state_in_postgresql() {
    use beige_core::store::{PluginData as _, PostgresOptions, PostgresStore};
    let Some(db) = super::support::TempDatabase::new().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let mut cfg = config(&["a"], &[]);
    cfg.store = Some(serde_json::from_value(json!({ "url": db.url })).unwrap());
    let recorder = Arc::new(Recorder {
        done: Notify::new(),
    });
    let gw = build(base(&home, cfg).channel(recorder.clone())).await;
    let token = CancellationToken::new();
    let serving = tokio::spawn({
        let gw = gw.clone();
        let shutdown = Shutdown::on(token.clone()).drain(Duration::from_secs(1));
        async move { gw.serve(shutdown).await }
    });
    tokio::time::timeout(Duration::from_secs(10), recorder.done.notified())
        .await
        .expect("the channel wrote its record");
    let other = PostgresStore::connect(&PostgresOptions::new(&db.url))
        .await
        .unwrap();
    assert_eq!(
        other.kv_get("recorder", "global", "offset").await.unwrap(),
        Some("42".to_string())
    );
    assert!(!home.db_path().exists(), "SQLite was opened too");
    token.cancel();
    assert!(serving.await.unwrap().is_ok());
}

/// Two gateways on one PostgreSQL database with the same agent: the first leases the
/// agent; the second refuses to start and names the holder; once the first stops (and
/// gives its lease back) the second starts. The first's own home restarted takes its
/// lease back at once, with a higher epoch.
#[tokio::test]
async fn a_shared_store_leases_each_agent_to_one_gateway() {
    let Some(db) = super::support::TempDatabase::new().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let with_store = || {
        let mut cfg = config(&["a"], &[]);
        cfg.store = Some(serde_json::from_value(json!({ "url": db.url })).unwrap());
        cfg
    };
    let home1 = BeigeHome::new(dir.path().join("one"));
    let home2 = BeigeHome::new(dir.path().join("two"));
    let first = build(base(&home1, with_store())).await;
    let leases = first.agent_leases();
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(leases[0].lease, "agent:a");
    let holder = leases[0].holder.clone();

    let err = base(&home2, with_store())
        .build()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("agent:a is held by gateway"), "{err}");
    assert!(err.contains(&holder), "{err}");

    // The same home, started again while the first still holds the lease: it is the
    // same holder, so it takes the lease back, and the earlier one's fence is stale.
    let again = build(base(&home1, with_store())).await;
    let retaken = again.agent_leases();
    assert_eq!(retaken[0].holder, holder);
    assert!(
        retaken[0].epoch > leases[0].epoch,
        "{retaken:?} after {leases:?}"
    );
    drop(first);

    again.shutdown().await.unwrap();
    assert!(again.agent_leases().is_empty(), "given back on stop");
    let second = build(base(&home2, with_store())).await;
    let taken = second.agent_leases();
    assert_ne!(taken[0].holder, holder);
    assert!(taken[0].epoch > retaken[0].epoch);
    second.shutdown().await.unwrap();
}

/// A serving gateway whose agent lease another gateway took over (here: expired by
/// hand, then taken) notices at its next renewal and stops serving with `LeaseLost`.
#[tokio::test]
async fn a_gateway_that_loses_an_agents_lease_stops_serving() {
    use beige_core::store::{Coordination as _, PostgresOptions, PostgresStore};
    let Some(db) = super::support::TempDatabase::new().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let mut cfg = config(&["a"], &[]);
    cfg.store = Some(serde_json::from_value(json!({ "url": db.url })).unwrap());
    let gw = build(base(&home, cfg)).await;
    let serving = tokio::spawn({
        let gw = gw.clone();
        let shutdown = Shutdown::on(CancellationToken::new()).drain(Duration::from_secs(1));
        async move { gw.serve(shutdown).await }
    });
    let other = PostgresStore::connect(&PostgresOptions::new(&db.url))
        .await
        .unwrap();
    sqlx::query("UPDATE leases SET expires_at = 0 WHERE name = 'agent:a'")
        .execute(other.pool())
        .await
        .unwrap();
    let taken = other
        .acquire_lease("agent:a", "intruder", Duration::from_secs(60))
        .await
        .unwrap()
        .expect("an expired lease can be taken");
    let ended = tokio::time::timeout(Duration::from_secs(20), serving)
        .await
        .expect("serving stops within a renewal period")
        .unwrap();
    assert!(matches!(ended, Err(ServeError::LeaseLost)), "{ended:?}");
    // It did not give back what is no longer its own.
    assert!(other.check_fence(&taken).await.unwrap());
}

/// Failover between gateways on one PostgreSQL, each with `cluster.standby` and a 5 s
/// lease (in process, each on a fake sandbox of its own; `docs/scaling.md`):
///
/// 1. the first serves agent `a` and renews its lease; a standby waits, longer than the
///    time to live, without getting it;
/// 2. the first stops cleanly and gives the lease back: the standby takes over within a
///    scan (the drain case);
/// 3. that gateway then freezes right after taking over — it never renews, as after
///    SIGKILL or SIGSTOP — and a third standby takes over once the lease runs out,
///    within the time to live + 2 s of the last write of the lease (the bound of
///    spec/scale.md §3);
/// 4. the frozen one, woken, is refused every operation on `a`'s sandbox (none reaches
///    it), while the new holder's work.
#[tokio::test]
async fn a_standby_takes_over_and_the_gateway_it_replaced_cannot_act() {
    use beige_core::api::tools::{CoreToolCall, ExecParams, ToolContext};
    use std::time::Instant;
    let Some(db) = super::support::TempDatabase::new().await else {
        return;
    };
    let ttl = Duration::from_secs(5);
    let dir = tempfile::tempdir().unwrap();
    let cfg = || {
        let mut cfg = config(&["a"], &[]);
        cfg.store = Some(serde_json::from_value(json!({ "url": db.url })).unwrap());
        cfg.cluster =
            Some(serde_json::from_value(json!({"standby": true, "lease": {"ttl": "5s"}})).unwrap());
        cfg
    };
    let gateway = |name: &str, sandbox: Arc<MemorySandbox>| {
        GatewayBuilder::new(cfg(), BeigeHome::new(dir.path().join(name))).sandbox(sandbox)
    };
    let exec = |gw: LocalGateway, command: &'static str| async move {
        let call = CoreToolCall::Exec(ExecParams {
            command: command.into(),
            timeout: None,
        });
        match gw.call_tool("a", call, ToolContext::default()).await {
            Ok(out) if !out.is_error => Ok(out.joined_text()),
            Ok(out) => Err(out.joined_text()),
            Err(e) => Err(e.to_string()),
        }
    };

    // 1. The first serves and renews; the standby waits past the time to live.
    let first = build(gateway("one", Arc::new(MemorySandbox::new()))).await;
    let stop_first = CancellationToken::new();
    let serving = tokio::spawn({
        let gw = first.clone();
        let shutdown = Shutdown::on(stop_first.clone()).drain(Duration::from_secs(1));
        async move { gw.serve(shutdown).await }
    });
    let second_sandbox = Arc::new(MemorySandbox::new());
    let second = tokio::spawn(gateway("two", second_sandbox.clone()).build());
    tokio::time::sleep(ttl + Duration::from_secs(1)).await;
    assert!(
        !second.is_finished(),
        "the standby waits while the lease is renewed"
    );
    assert!(exec(first.clone(), "echo one").await.is_ok());

    // 2. A clean stop gives the lease back: the standby starts within a scan.
    stop_first.cancel();
    serving.await.unwrap().unwrap();
    first.shutdown().await.unwrap();
    let released = Instant::now();
    let second = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("the standby takes a released lease within a scan")
        .unwrap()
        .unwrap();
    let drain_takeover = released.elapsed();
    let second_fence = second.agent_leases()[0].clone();
    assert_eq!(second_fence.lease, "agent:a");
    assert!(exec(second.clone(), "echo two").await.is_ok());

    // 3. The second freezes at once (it never serves, so never renews): a third
    //    standby takes over when the lease runs out.
    let third = tokio::spawn(gateway("three", Arc::new(MemorySandbox::new())).build());
    let third = tokio::time::timeout(ttl + Duration::from_secs(4), third)
        .await
        .expect("the third takes the expired lease over")
        .unwrap()
        .unwrap();
    let failover = released.elapsed();
    eprintln!(
        "failover_time: drain {:.0} ms; frozen holder {:.0} ms (at most, from before it took the lease; ttl {} s)",
        drain_takeover.as_secs_f64() * 1000.0,
        failover.as_secs_f64() * 1000.0,
        ttl.as_secs()
    );
    assert!(
        drain_takeover < Duration::from_secs(2),
        "{drain_takeover:?}"
    );
    assert!(failover <= ttl + Duration::from_secs(2), "{failover:?}");
    let third_fence = third.agent_leases()[0].clone();
    assert!(third_fence.epoch > second_fence.epoch);

    // 4. The frozen second wakes: refused before anything reaches its sandbox.
    let before = second_sandbox.executed("a");
    let refused = exec(second.clone(), "echo stale").await.unwrap_err();
    assert!(refused.contains("no longer holds agent:a"), "{refused}");
    assert_eq!(
        second_sandbox.executed("a"),
        before,
        "no op reached the sandbox"
    );
    assert!(exec(third.clone(), "echo three").await.is_ok());
    third.shutdown().await.unwrap();
}

/// A gateway whose agent lease was taken over, before it noticed: its next turn is not
/// written (the store refuses it as fenced, in the append's transaction) and the prompt
/// ends with an error that says so, while its first turn, made under the lease, stays.
#[tokio::test]
async fn a_stale_gateway_cannot_write_a_turn_for_an_agent_it_no_longer_holds() {
    use beige_core::llm::scripted::ScriptedProvider;
    use beige_core::store::{Coordination as _, PostgresOptions, PostgresStore, SessionStore as _};
    use beige_core::{AgentEvent, PromptRequest};
    use futures_util::StreamExt as _;
    let Some(db) = super::support::TempDatabase::new().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let mut cfg = config(&["a"], &[]);
    cfg.store = Some(serde_json::from_value(json!({ "url": db.url })).unwrap());
    let model = ScriptedProvider::new("anthropic")
        .then_text("first answer")
        .then_text("second answer");
    let gw = build(base(&home, cfg).provider(Arc::new(model))).await;
    let events = |gw: LocalGateway, text: &'static str| async move {
        gw.prompt(PromptRequest::new("a", "api:a:fence", text))
            .await
            .unwrap()
            .collect::<Vec<_>>()
            .await
    };
    let first = events(gw.clone(), "one").await;
    assert!(
        first.iter().any(|e| matches!(e, AgentEvent::Done { .. })),
        "{first:?}"
    );
    // Another gateway takes the agent over (the lease expired while this one paused).
    let other = PostgresStore::connect(&PostgresOptions::new(&db.url))
        .await
        .unwrap();
    sqlx::query("UPDATE leases SET expires_at = 0 WHERE name = 'agent:a'")
        .execute(other.pool())
        .await
        .unwrap();
    other
        .acquire_lease("agent:a", "r2", Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    let second = events(gw.clone(), "two").await;
    let error = second
        .iter()
        .find_map(|e| match e {
            AgentEvent::Error { message, .. } => Some(message.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no error in {second:?}"));
    assert!(error.contains("no longer holds agent:a"), "{error}");
    let session = other.current_session("api:a:fence").await.unwrap().unwrap();
    let stored = other.messages(&session.id, false).await.unwrap();
    let texts: Vec<String> = stored.iter().map(|m| m.message.text()).collect();
    assert_eq!(
        texts,
        ["one", "first answer"],
        "only the turn made under the lease"
    );
}

/// Two gateways on one database with agents of their own and a configured schedule each:
/// neither cancels, fires nor recovers the other's schedule (a gateway's config only
/// speaks for its own agents when the store is shared).
#[tokio::test]
async fn gateways_sharing_a_store_keep_to_their_own_agents_schedules() {
    use beige_core::api::schedules::ScheduleState;
    use beige_core::store::{PostgresOptions, PostgresStore, ScheduleStore as _};
    let Some(db) = super::support::TempDatabase::new().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let with = |agent: &str| {
        let mut cfg = config(&[agent], &[]);
        cfg.store = Some(serde_json::from_value(json!({ "url": db.url })).unwrap());
        cfg.schedules = serde_json::from_value(json!({
            format!("hourly-{agent}"): {"agent": agent, "cron": "0 * * * *", "tz": "UTC", "prompt": "report"},
        }))
        .unwrap();
        cfg
    };
    let store = PostgresStore::connect(&PostgresOptions::new(&db.url))
        .await
        .unwrap();
    let mut serving = Vec::new();
    for (agent, home) in [("a", "one"), ("b", "two")] {
        let gw = build(base(&BeigeHome::new(dir.path().join(home)), with(agent))).await;
        let token = CancellationToken::new();
        let task = tokio::spawn({
            let gw = gw.clone();
            let shutdown = Shutdown::on(token.clone()).drain(Duration::from_secs(1));
            async move { gw.serve(shutdown).await }
        });
        // Wait until this gateway stored its schedule.
        let id = format!("hourly-{agent}");
        tokio::time::timeout(Duration::from_secs(10), async {
            while store.get_schedule(&id).await.unwrap().is_none() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the schedule is stored");
        serving.push((token, task));
    }
    for id in ["hourly-a", "hourly-b"] {
        let record = store.get_schedule(id).await.unwrap().unwrap();
        assert_eq!(record.state, ScheduleState::Active, "{id}");
    }
    for (token, task) in serving {
        token.cancel();
        assert!(task.await.unwrap().is_ok());
    }
}

/// Telegram keeps its offsets, dedup window and outbox in the store under its own name:
/// with a shared store only one gateway may run it. A second gateway with other agents
/// but a Telegram channel too is refused, naming `channel:telegram`; without one it
/// starts.
#[tokio::test]
async fn only_one_gateway_on_a_shared_store_runs_telegram() {
    let Some(db) = super::support::TempDatabase::new().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let with = |agent: &str| {
        let mut cfg = config(&[agent], &[]);
        cfg.store = Some(serde_json::from_value(json!({ "url": db.url })).unwrap());
        cfg
    };
    let one = build(
        base(&BeigeHome::new(dir.path().join("one")), with("a")).channel(Probe::new("telegram")),
    )
    .await;
    let leases: Vec<String> = one.agent_leases().into_iter().map(|f| f.lease).collect();
    assert_eq!(leases, ["agent:a", "channel:telegram"]);
    let err = base(&BeigeHome::new(dir.path().join("two")), with("b"))
        .channel(Probe::new("telegram"))
        .build()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("channel:telegram is held by gateway"), "{err}");
    let two = build(base(&BeigeHome::new(dir.path().join("two")), with("b"))).await;
    one.shutdown().await.unwrap();
    two.shutdown().await.unwrap();
}

/// A channel that can send on its own and records what it was given.
#[derive(Debug, Default)]
struct Outbox {
    sent: Mutex<Vec<(String, Option<String>, String)>>,
}

#[async_trait]
impl Channel for Outbox {
    fn name(&self) -> &str {
        "outbox"
    }

    async fn run(&self, ctx: ChannelContext) -> Result<(), ChannelError> {
        ctx.shutdown.cancelled().await;
        Ok(())
    }

    async fn send(
        &self,
        chat_id: &str,
        thread_id: Option<&str>,
        text: &str,
    ) -> Result<(), ChannelError> {
        self.sent.lock().unwrap().push((
            chat_id.to_string(),
            thread_id.map(str::to_string),
            text.to_string(),
        ));
        Ok(())
    }
}

#[tokio::test]
async fn send_reaches_the_registered_channel_by_name_and_names_the_ones_that_cannot() {
    let dir = tempfile::tempdir().unwrap();
    let home = BeigeHome::new(dir.path().join("home"));
    let outbox = Arc::new(Outbox::default());
    let quiet = Probe::new("quiet");
    let gw = build(
        base(&home, config(&["a"], &[]))
            .channel(outbox.clone())
            .channel(quiet.clone()),
    )
    .await;

    gw.send("outbox", "chat-7", Some("t1"), "the nightly run finished")
        .await
        .unwrap();
    assert_eq!(
        outbox.sent.lock().unwrap().as_slice(),
        [(
            "chat-7".to_string(),
            Some("t1".to_string()),
            "the nightly run finished".to_string()
        )]
    );
    // A channel without `send` says so; an unknown name lists the registered ones.
    match gw.send("quiet", "c", None, "x").await {
        Err(ChannelError::Unsupported { channel }) => assert_eq!(channel, "quiet"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    match gw.send("telegram", "c", None, "x").await {
        Err(e @ ChannelError::Unknown { .. }) => {
            assert_eq!(
                e.to_string(),
                "no channel 'telegram' is registered; registered channels: outbox, quiet"
            );
        }
        other => panic!("expected Unknown, got {other:?}"),
    }
    assert_eq!(outbox.sent.lock().unwrap().len(), 1);
    gw.shutdown().await.unwrap();
}
