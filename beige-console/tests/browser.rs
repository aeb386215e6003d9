//! The web console in a real browser (`spec/people.md` §4): Debian's Chromium, headless,
//! driven through its chromedriver with fantoccini, against a real gateway (SQLite
//! store, the Anthropic client talking to the testkit's fake LLM, the in-memory sandbox)
//! behind the real HTTP channel with the console mounted, all on `127.0.0.1`.
//!
//! Each test starts its own chromedriver on a free port (and ends it by its pid) and a
//! Chromium with a temporary profile whose host resolver maps every name but 127.0.0.1
//! to nothing: no traffic leaves loopback. Without Chromium or chromedriver the tests
//! skip with a printed reason, except with `CI=true` or `BEIGE_REQUIRE_BROWSER=1`, where
//! they fail (`scripts/setup-browser` installs both). Screenshots of the key steps, at
//! 1280×900 and 390×844, go to `target/browser-artifacts/<test>/`; a failure adds the
//! page's HTML there.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stderr,
    clippy::panic
)]

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use beige_console::ConsoleOptions;
use beige_core::api::approvals::ApprovalStatus;
use beige_core::api::tools::{CoreToolCall, ToolContext};
use beige_core::api::{Admin as _, Gateway as _};
use beige_core::channel::http::{ApiOptions, HttpApiChannel};
use beige_core::channel::{Channel as _, ChannelContext, ChannelError};
use beige_core::config::Config;
use beige_core::testing::MemorySandbox;
use beige_core::{BeigeHome, GatewayBuilder, GatewayFull, LocalGateway};
use beige_testkit::anthropic::{text_response, MessageStream};
use beige_testkit::llm::FakeLlmServer;
use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
use futures_util::FutureExt as _;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "console-test-token-0123456789abcdef";
const KEY: &str = "sk-ant-test-key-0123456789";
const WAIT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------
// Skipping

fn required() -> bool {
    let set = |name: &str, yes: &[&str]| {
        std::env::var(name)
            .map(|v| yes.contains(&v.as_str()))
            .unwrap_or(false)
    };
    set("CI", &["true", "1"]) || set("BEIGE_REQUIRE_BROWSER", &["1", "true"])
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Chromium and chromedriver, or `None` (after printing why) when the test skips.
fn browser_binaries() -> Option<(PathBuf, PathBuf)> {
    let chromium = std::env::var_os("BEIGE_CHROMIUM")
        .map(PathBuf::from)
        .or_else(|| which("chromium"))
        .or_else(|| which("chromium-browser"));
    let driver = std::env::var_os("BEIGE_CHROMEDRIVER")
        .map(PathBuf::from)
        .or_else(|| which("chromedriver"));
    match (chromium, driver) {
        (Some(c), Some(d)) => Some((c, d)),
        _ => {
            let why = "Chromium or chromedriver not found: run scripts/setup-browser";
            if required() {
                panic!("browser test cannot run (CI=true or BEIGE_REQUIRE_BROWSER=1): {why}");
            }
            eprintln!("SKIPPED (no browser): {why}");
            None
        }
    }
}

// ---------------------------------------------------------------------------------------
// The gateway

struct Gw {
    _dir: tempfile::TempDir,
    home: BeigeHome,
    llm: FakeLlmServer,
    gw: Arc<LocalGateway>,
    sandbox: Arc<MemorySandbox>,
    addr: SocketAddr,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), ChannelError>>,
}

impl Gw {
    /// A gateway with agent `a` (and `b`), `extra` merged into the config, behind the HTTP
    /// channel with the console, on `127.0.0.1:0`.
    async fn start(extra: Value) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let home = BeigeHome::new(dir.path().join("home"));
        std::fs::create_dir_all(home.root()).unwrap();
        let llm = FakeLlmServer::start().await;
        let mut config = json!({
            "llm": {"providers": {"anthropic": {"apiKey": KEY, "baseUrl": llm.url()}}},
            "agents": {
                "a": {"model": {"provider": "anthropic", "model": "claude-sonnet-4-6"}, "tools": []},
                "b": {"model": {"provider": "anthropic", "model": "claude-haiku-4-5"}, "tools": []},
            },
        });
        merge(&mut config, extra);
        let config: Config = serde_json::from_value(config).unwrap();
        let sandbox = Arc::new(MemorySandbox::new().on_exec(|_, command| {
            (command == "echo hi").then(|| MemorySandbox::exec_reply("hi\n", 0))
        }));
        let gw = Arc::new(
            GatewayBuilder::new(config, home.clone())
                .sandbox(sandbox.clone())
                .build()
                .await
                .unwrap(),
        );
        let audit_log = home.audit_log_path();
        let options = ApiOptions::new(Some(TOKEN.into())).with_extra_routes(Arc::new(move |s| {
            beige_console::router(s, ConsoleOptions::new().audit_log(audit_log.clone()))
        }));
        let (channel, addr) = HttpApiChannel::bind("127.0.0.1", 0, options).unwrap();
        let shutdown = CancellationToken::new();
        let full: Arc<dyn GatewayFull> = gw.clone();
        let stop = shutdown.clone();
        let task = tokio::spawn(async move { channel.run(ChannelContext::new(full, stop)).await });
        Self {
            _dir: dir,
            home,
            llm,
            gw,
            sandbox,
            addr,
            shutdown,
            task,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
        self.gw.shutdown().await.unwrap();
    }

    /// A core `exec` through the guarded path, as the API's owner would run it.
    async fn exec(&self, command: &str, attended: bool) -> String {
        let ctx = ToolContext {
            session_key: Some("api:a:default".into()),
            channel: Some("api".into()),
            attended,
            ..ToolContext::default()
        };
        let call = CoreToolCall::parse("exec", json!({ "command": command })).unwrap();
        self.gw
            .call_tool("a", call, ctx)
            .await
            .map(|o| o.joined_text())
            .unwrap_or_else(|e| e.to_string())
    }

    async fn pending(&self) -> Vec<beige_core::api::approvals::Approval> {
        self.gw
            .approvals(Some("a"))
            .await
            .unwrap()
            .into_iter()
            .filter(|a| a.status == ApprovalStatus::Pending)
            .collect()
    }
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

// ---------------------------------------------------------------------------------------
// The browser

/// A chromedriver this test started (ended by its pid when dropped) and a session in it.
struct Browser {
    client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
    artifacts: PathBuf,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn artifacts_dir(test: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = target.join("browser-artifacts").join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl Browser {
    async fn start(test: &str, chromium: &Path, chromedriver: &Path) -> Self {
        let port = free_port();
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let profile = tempfile::tempdir().unwrap();
        let args = vec![
            "--headless=new".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-dev-shm-usage".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-extensions".into(),
            "--no-first-run".into(),
            "--no-default-browser-check".into(),
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1".into(),
            format!("--user-data-dir={}", profile.path().display()),
            "--window-size=1280,900".into(),
        ];
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({"binary": chromium, "args": args}),
        );
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + WAIT;
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(c) => break c,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("cannot start a browser session through chromedriver: {e}"),
            }
        };
        Self {
            client,
            driver,
            _profile: profile,
            artifacts: artifacts_dir(test),
        }
    }

    async fn goto(&self, url: &str) {
        self.client.goto(url).await.unwrap();
    }

    async fn find(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .wait()
            .at_most(WAIT)
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no element `{css}`: {e}"))
    }

    /// The text of `css`; an element the page replaced between finding and reading it
    /// (a navigation, an htmx swap) is found again.
    async fn text(&self, css: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            match self.find(css).await.text().await {
                Ok(t) => return t,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("reading `{css}` again: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("cannot read `{css}`: {e}"),
            }
        }
    }

    /// Wait until the text of `css` (the first match) satisfies `ok`.
    async fn wait_text(&self, css: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(e) = self.client.find(Locator::Css(css)).await {
                if let Ok(t) = e.text().await {
                    if ok(&t) {
                        return t;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what} in `{css}`"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn js(&self, script: &str) -> Value {
        self.client.execute(script, Vec::new()).await.unwrap()
    }

    async fn shot(&self, name: &str) {
        let png = self.client.screenshot().await.unwrap();
        std::fs::write(self.artifacts.join(format!("{name}.png")), png).unwrap();
    }

    /// Screenshots at 1280×900 and 390×844.
    async fn shots(&self, name: &str) {
        self.client.set_window_size(1280, 900).await.unwrap();
        self.shot(&format!("{name}-1280x900")).await;
        self.client.set_window_size(390, 844).await.unwrap();
        self.shot(&format!("{name}-390x844")).await;
        self.client.set_window_size(1280, 900).await.unwrap();
    }

    async fn login(&self, gw: &Gw, token: &str) {
        self.goto(&gw.url("/console/login")).await;
        self.find("#token").await.send_keys(token).await.unwrap();
        self.find("form.login button").await.click().await.unwrap();
    }

    /// End the session, then chromedriver (by its pid), whatever happened.
    async fn end(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Run `body` with a browser; on a panic, keep the page's HTML in the artifacts.
async fn with_browser<F, Fut>(test: &str, body: F)
where
    F: FnOnce(Arc<Browser>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let Some((chromium, driver)) = browser_binaries() else {
        return;
    };
    let browser = Arc::new(Browser::start(test, &chromium, &driver).await);
    let outcome = std::panic::AssertUnwindSafe(body(browser.clone()))
        .catch_unwind()
        .await;
    if outcome.is_err() {
        if let Ok(html) = browser.client.source().await {
            let _ = std::fs::write(browser.artifacts.join("failure.html"), html);
        }
        let _ = browser
            .client
            .screenshot()
            .await
            .map(|png| std::fs::write(browser.artifacts.join("failure.png"), png));
    }
    if let Ok(b) = Arc::try_unwrap(browser) {
        b.end().await;
    }
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

// ---------------------------------------------------------------------------------------
// 1. Login

#[tokio::test(flavor = "multi_thread")]
async fn login_refuses_a_wrong_token_and_sets_an_httponly_strict_cookie() {
    if browser_binaries().is_none() {
        return;
    }
    let gw = Gw::start(json!({})).await;
    with_browser("login", |b| {
        let gw = &gw;
        async move {
        // Not logged in: the console sends the browser to the login page.
        b.goto(&gw.url("/console")).await;
        b.find("#token").await;
        assert!(b.client.current_url().await.unwrap().path().ends_with("/console/login"));
        b.shots("login").await;

        b.login(gw, "not-the-token").await;
        let error = b.text("#login-error").await;
        assert!(error.contains("not valid"), "{error}");
        b.shot("login-refused").await;

        b.login(gw, TOKEN).await;
        assert_eq!(b.text("main h1").await, "Agents");
        assert!(b.text("#agent-a").await.contains("anthropic/claude-sonnet-4-6"));
        // The session cookie is HttpOnly: scripts cannot read it.
        assert_eq!(b.js("return document.cookie").await, json!(""));
        b.shots("agents").await;

        // The same over plain HTTP: the cookie's attributes and the page's headers.
        let http = http();
        let page = http.get(gw.url("/console/login")).send().await.unwrap();
        let login_cookie = page
            .headers()
            .get_all("set-cookie")
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .find(|c| c.starts_with("beige_login_csrf="))
            .expect("the login page sets its pre-session cookie");
        let pre = login_cookie
            .split(';')
            .next()
            .unwrap()
            .trim_start_matches("beige_login_csrf=")
            .to_string();
        let h = page.headers();
        assert_eq!(
            h["content-security-policy"],
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
        );
        assert_eq!(h["x-content-type-options"], "nosniff");
        assert_eq!(h["referrer-policy"], "no-referrer");
        assert_eq!(h["cross-origin-opener-policy"], "same-origin");
        assert_eq!(h["cache-control"], "no-store");
        let html = page.text().await.unwrap();
        assert!(html.contains(&format!("name=\"_csrf\" value=\"{pre}\"")), "{html}");

        // Without the pre-session cookie the login is refused, even with the token.
        let r = http
            .post(gw.url("/console/login"))
            .form(&[("_csrf", pre.as_str()), ("token", TOKEN)])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403);
        let r = http
            .post(gw.url("/console/login"))
            .header("cookie", format!("beige_login_csrf={pre}"))
            .form(&[("_csrf", pre.as_str()), ("token", TOKEN)])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 303);
        assert_eq!(r.headers()["location"], "/console");
        let session = r
            .headers()
            .get_all("set-cookie")
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .find(|c| c.starts_with("beige_session="))
            .expect("a session cookie");
        let attrs: Vec<&str> = session.split("; ").collect();
        let value = attrs[0].trim_start_matches("beige_session=");
        assert_eq!(value.len(), 43, "32 random bytes, base64url: {value}");
        assert!(attrs.contains(&"HttpOnly"), "{session}");
        assert!(attrs.contains(&"SameSite=Strict"), "{session}");
        assert!(attrs.contains(&"Path=/console"), "{session}");
        assert!(!attrs.contains(&"Secure"), "plain HTTP: {session}");
        // The cookie counts on /console only: the API still wants its bearer token.
        let api = http
            .get(gw.url("/api/agents"))
            .header("cookie", attrs[0])
            .send()
            .await
            .unwrap();
        assert_eq!(api.status(), 401);
        let agents = http
            .get(gw.url("/console"))
            .header("cookie", attrs[0])
            .send()
            .await
            .unwrap();
        assert_eq!(agents.status(), 200);
        // An asset is immutable, under its hashed name.
        let body = agents.text().await.unwrap();
        let css = body
            .split("href=\"")
            .map(|s| s.split('"').next().unwrap())
            .find(|s| s.starts_with("/console/assets/console.") && s.ends_with(".css"))
            .expect("the style sheet's link")
            .to_string();
        let asset = http.get(gw.url(&css)).send().await.unwrap();
        assert_eq!(asset.status(), 200);
        assert!(asset.headers()["cache-control"]
            .to_str()
            .unwrap()
            .contains("immutable"));

        // Logging out ends the browser's session: it is back at the login page, and
        // its pages ask for a login again.
        b.find("form.logout button").await.click().await.unwrap();
        b.find("#token").await;
        b.goto(&gw.url("/console/usage")).await;
        b.find("#token").await;
        // Ten failed logins a minute from one address, then even the right token
        // waits (one failure was the browser's).
        let post = |token: &'static str| {
            http.post(gw.url("/console/login"))
                .header("cookie", format!("beige_login_csrf={pre}"))
                .form(&[("_csrf", pre.as_str()), ("token", token)])
                .send()
        };
        for _ in 0..9 {
            assert_eq!(post("wrong").await.unwrap().status(), 401);
        }
        assert_eq!(post(TOKEN).await.unwrap().status(), 429);
    }})
    .await;
    gw.stop().await;
}

// ---------------------------------------------------------------------------------------
// 2. Streaming

#[tokio::test(flavor = "multi_thread")]
async fn a_prompt_streams_text_and_a_tool_cell_with_exit_code_and_output() {
    if browser_binaries().is_none() {
        return;
    }
    let gw = Gw::start(json!({})).await;
    // The model's stream stops after its first text for a while: the page must show
    // that text before the rest of the answer exists.
    let first = MessageStream::new()
        .text("Let me check.")
        .tool_use("t1", "exec", json!({"command": "echo hi"}))
        .stop_reason("tool_use");
    let body = first.body();
    let tool_at = body.find("\"tool_use\"").unwrap();
    let hold_at = body[..tool_at].rfind("event:").unwrap();
    gw.llm
        .push(first.reply().pause_at(hold_at, Duration::from_secs(6)));
    gw.llm.push(text_response("The command said hi."));
    with_browser("streaming", |b| {
        let gw = &gw;
        async move {
            b.login(gw, TOKEN).await;
            b.find("#agent-a").await;
            b.find("#agent-a a.button").await.click().await.unwrap();
            b.find("textarea#message").await;
            assert!(b.text("main h1").await.contains("api:a:default"));
            b.shots("chat-empty").await;
            b.find("textarea#message")
                .await
                .send_keys("say hi")
                .await
                .unwrap();
            b.find("form.composer button").await.click().await.unwrap();

            // The first text is on the page while the model still holds the rest back.
            b.wait_text(".turn-log", "the first text", |t| {
                t.contains("Let me check.")
            })
            .await;
            assert!(
                b.client.find(Locator::Css(".turn .tool")).await.is_err(),
                "the tool call is not streamed yet"
            );
            assert_eq!(gw.llm.request_count(), 1);
            b.shots("chat-streaming").await;

            let exit = b
                .wait_text(".turn .tool .exit", "the exit code", |t| !t.is_empty())
                .await;
            assert_eq!(exit, "exit 0");
            assert_eq!(b.text(".turn .tool .call").await, "exec echo hi");
            assert_eq!(b.text(".turn .tool .output").await.trim(), "hi");
            b.wait_text(".turn-status", "the turn's end", |t| t.starts_with("Done"))
                .await;
            let log = b.text(".turn-log").await;
            assert!(log.contains("Let me check."), "{log}");
            assert!(log.contains("The command said hi."), "{log}");
            assert_eq!(gw.sandbox.executed("a"), vec!["echo hi".to_string()]);
            b.shots("chat-streamed").await;

            // Reloaded, the transcript shows the same from the session's history.
            b.client.refresh().await.unwrap();
            assert_eq!(b.text(".transcript .tool .exit").await, "exit 0");
            assert_eq!(b.text(".transcript .tool .output").await.trim(), "hi");
            assert!(b.text(".transcript").await.contains("The command said hi."));
            b.shots("chat-history").await;
        }
    })
    .await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_running_turn_is_cancelled_from_the_page() {
    if browser_binaries().is_none() {
        return;
    }
    let gw = Gw::start(json!({})).await;
    // The model never answers: the turn runs until it is cancelled.
    gw.llm.push(beige_testkit::llm::Reply::hang());
    with_browser("cancel", |b| {
        let gw = &gw;
        async move {
            b.login(gw, TOKEN).await;
            b.find("#agent-a").await;
            b.goto(&gw.url("/console/agents/a/sessions/api%3Aa%3Adefault"))
                .await;
            b.find("textarea#message")
                .await
                .send_keys("wait")
                .await
                .unwrap();
            b.find("form.composer button").await.click().await.unwrap();
            gw.llm.wait_for_requests(1).await;
            b.find(".turn form.cancel button")
                .await
                .click()
                .await
                .unwrap();
            let status = b
                .wait_text(".turn-status", "the cancelled status", |t| {
                    t.starts_with("Failed")
                })
                .await;
            assert!(status.contains("cancel"), "{status}");
            assert!(
                b.client
                    .find(Locator::Css(".turn form.cancel"))
                    .await
                    .is_err(),
                "the Cancel button goes with the turn"
            );
            b.shot("cancelled").await;
        }
    })
    .await;
    gw.stop().await;
}

// ---------------------------------------------------------------------------------------
// 3. Approvals

fn ask_push() -> Value {
    json!({
        "agents": {"a": {"policy": {"rules": [
            {"id": "push", "tool": "exec", "pattern": ["git", "push"], "decision": "ask",
             "justification": "publishes work"},
        ]}}},
        "approvals": {"holdSeconds": 60},
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn an_approval_given_by_keyboard_lets_the_call_finish() {
    if browser_binaries().is_none() {
        return;
    }
    let gw = Gw::start(ask_push()).await;
    gw.llm.push(
        MessageStream::new()
            .tool_use("t1", "exec", json!({"command": "git push origin main"}))
            .stop_reason("tool_use")
            .reply(),
    );
    gw.llm.push(text_response("pushed"));
    with_browser("approvals", |b| {
        let gw = &gw;
        async move {
            b.login(gw, TOKEN).await;
            b.find("#agent-a").await;
            b.goto(&gw.url("/console/agents/a/sessions/api%3Aa%3Adefault"))
                .await;
            b.find("textarea#message")
                .await
                .send_keys("push it")
                .await
                .unwrap();
            b.find("form.composer button").await.click().await.unwrap();
            // The chat shows the request inline, and the turn waits.
            b.wait_text(".turn .approval .call", "the inline request", |t| {
                t == "exec git push origin main"
            })
            .await;
            b.wait_text(".turn-status", "the waiting status", |t| {
                t.starts_with("Waiting")
            })
            .await;
            assert_eq!(gw.pending().await.len(), 1);
            assert!(gw.sandbox.executed("a").is_empty());

            // The inbox has it, with the exact call.
            b.goto(&gw.url("/console/approvals")).await;
            let call = b.text("#approval-list .approval.pending pre.call").await;
            assert_eq!(call, "exec git push origin main");
            b.shots("approvals-pending").await;
            // Keyboard only: focus "Allow once", press Enter.
            let id = b
                .find("#approval-list .approval.pending button[value=once]")
                .await
                .attr("id")
                .await
                .unwrap()
                .unwrap();
            b.js(&format!(
                "document.getElementById('{id}').focus(); return true"
            ))
            .await;
            let focused = b.client.active_element().await.unwrap();
            assert_eq!(
                focused.attr("id").await.unwrap().as_deref(),
                Some(id.as_str())
            );
            focused
                .send_keys(&char::from(Key::Enter).to_string())
                .await
                .unwrap();
            b.wait_text("#approval-list .approval .status", "the decision", |t| {
                t != "pending"
            })
            .await;
            b.shots("approvals-decided").await;

            // The call ran and the turn finished.
            let deadline = Instant::now() + WAIT;
            while gw.sandbox.executed("a").is_empty() {
                assert!(Instant::now() < deadline, "the approved call never ran");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert_eq!(
                gw.sandbox.executed("a"),
                vec!["git push origin main".to_string()]
            );
            b.goto(&gw.url("/console/agents/a/sessions/api%3Aa%3Adefault"))
                .await;
            b.wait_text(".tool .exit", "the finished call", |t| t == "exit 0")
                .await;
            let decided = gw.gw.approvals(Some("a")).await.unwrap();
            assert_ne!(decided[0].status, ApprovalStatus::Pending);
            assert!(decided[0].decided_by.is_some());
            // The audit holds the decision, with who made it.
            let audit = std::fs::read_to_string(gw.home.audit_log_path()).unwrap();
            let approved = audit
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .find(|r| {
                    r["type"] == "approval"
                        && r["approval"]["id"] == decided[0].id.as_str()
                        && r["approval"]["approver"].is_string()
                });
            assert!(
                approved.is_some(),
                "no approval record with its approver: {audit}"
            );
        }
    })
    .await;
    gw.stop().await;
}

// ---------------------------------------------------------------------------------------
// 4. Audit

#[tokio::test(flavor = "multi_thread")]
async fn the_audit_filter_by_decision_shows_only_matching_rows_and_follows() {
    if browser_binaries().is_none() {
        return;
    }
    let gw = Gw::start(json!({
        "agents": {"a": {"policy": {"rules": [
            {"id": "no-rm", "tool": "exec", "pattern": ["rm"], "decision": "deny"},
        ]}}},
    }))
    .await;
    assert!(gw.exec("echo hi", false).await.contains("hi"));
    let denied = gw.exec("rm -rf /workspace/x", false).await;
    assert!(!denied.contains("fake:"), "{denied}");
    assert!(gw.home.audit_log_path().exists());
    with_browser("audit", |b| {
        let gw = &gw;
        async move {
        b.login(gw, TOKEN).await;
        b.find("#agent-a").await;
        b.goto(&gw.url("/console/audit")).await;
        let all = b.text("#audit-rows").await;
        assert!(all.contains("allowed") && all.contains("denied"), "{all}");

        b.goto(&gw.url("/console/audit?agent=a&decision=denied")).await;
        let decisions = b
            .js("return [...document.querySelectorAll('#audit-rows tr td.decision')].map(td => td.textContent)")
            .await;
        let decisions: Vec<String> = serde_json::from_value(decisions).unwrap();
        assert!(!decisions.is_empty(), "no denied row");
        assert!(decisions.iter().all(|d| d == "denied"), "{decisions:?}");
        assert!(b.text("#audit-rows").await.contains("rm"));
        b.shots("audit-denied").await;

        // Follow: a new denied call appears without a reload; an allowed one does not.
        b.goto(&gw.url("/console/audit?agent=a&decision=denied&follow=1")).await;
        b.find("#audit-rows tr").await;
        let before = b
            .js("return document.querySelectorAll('#audit-rows tr').length")
            .await;
        let before = before.as_u64().unwrap();
        // Let the page's stream connect before the new record is written.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        gw.exec("echo again", false).await;
        gw.exec("rm -rf /workspace/y", false).await;
        let deadline = Instant::now() + WAIT;
        loop {
            let n = b
                .js("return document.querySelectorAll('#audit-rows tr').length")
                .await
                .as_u64()
                .unwrap();
            if n > before {
                break;
            }
            assert!(Instant::now() < deadline, "no followed row appeared");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let first = b.text("#audit-rows tr").await;
        assert!(first.contains("/workspace/y"), "{first}");
        let decisions: Vec<String> = serde_json::from_value(
            b.js("return [...document.querySelectorAll('#audit-rows tr td.decision')].map(td => td.textContent)")
                .await,
        )
        .unwrap();
        assert!(decisions.iter().all(|d| d == "denied"), "{decisions:?}");
        b.shots("audit-follow").await;
    }})
    .await;
    gw.stop().await;
}

// ---------------------------------------------------------------------------------------
// 5. CSRF

#[tokio::test(flavor = "multi_thread")]
async fn decisions_without_the_csrf_token_or_from_another_port_are_refused() {
    if browser_binaries().is_none() {
        return;
    }
    let gw = Arc::new(Gw::start(ask_push()).await);
    let blocked = tokio::spawn({
        let gw = gw.clone();
        async move { gw.exec("git push origin main", true).await }
    });
    let deadline = Instant::now() + WAIT;
    let approval = loop {
        if let Some(a) = gw.pending().await.pop() {
            break a;
        }
        assert!(Instant::now() < deadline, "no approval request");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // A page on another loopback port with a form aimed at the console.
    let evil = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let evil_addr = evil.local_addr().unwrap();
    let target = gw.url(&format!("/console/approvals/{}/decision", approval.id));
    let gw2 = gw.clone();
    with_browser("csrf", |b| async move {
        let gw = gw2;
        b.login(&gw, TOKEN).await;
        b.find("#agent-a").await;
        b.goto(&gw.url("/console/approvals")).await;
        b.find("#approval-list .approval.pending").await;
        let csrf = b
            .js("return document.querySelector('input[name=_csrf]').value")
            .await;
        let csrf = csrf.as_str().unwrap().to_string();
        assert_eq!(csrf.len(), 43);

        // fetch() without the token: 403, nothing changed.
        let status = b
            .js(&format!(
                "return fetch('/console/approvals/{}/decision', {{method: 'POST', headers: {{'Content-Type': 'application/x-www-form-urlencoded'}}, body: 'decision=once'}}).then(r => r.status)",
                approval.id
            ))
            .await;
        assert_eq!(status, json!(403));
        // A wrong token: the same.
        let status = b
            .js(&format!(
                "return fetch('/console/approvals/{}/decision', {{method: 'POST', headers: {{'Content-Type': 'application/x-www-form-urlencoded', 'X-CSRF-Token': 'wrong'}}, body: 'decision=once'}}).then(r => r.status)",
                approval.id
            ))
            .await;
        assert_eq!(status, json!(403));
        assert_eq!(gw.pending().await.len(), 1, "still pending");

        // A form on another port's page, even carrying the right token: refused by the
        // Origin rule.
        let page = format!(
            "<!doctype html><title>elsewhere</title><form method=post action=\"{target}\"><input type=hidden name=_csrf value=\"{csrf}\"><input type=hidden name=decision value=once><button id=go type=submit>go</button></form>"
        );
        let app = axum::Router::new().route(
            "/",
            axum::routing::get(move || {
                let page = page.clone();
                async move { axum::response::Html(page) }
            }),
        );
        let server = tokio::spawn(async move { axum::serve(evil, app).await });
        b.goto(&format!("http://{evil_addr}/")).await;
        b.find("#go").await.click().await.unwrap();
        let deadline = Instant::now() + WAIT;
        loop {
            let body = b.js("return document.body ? document.body.innerText : ''").await;
            if body.as_str().unwrap_or("").contains("not allowed") {
                break;
            }
            assert!(Instant::now() < deadline, "the cross-port form was not refused: {body}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        b.shot("csrf-cross-port-refused").await;
        server.abort();
        assert_eq!(gw.pending().await.len(), 1, "still pending");

        // The same request with the token from the console's own page goes through.
        b.goto(&gw.url("/console/approvals")).await;
        let status = b
            .js(&format!(
                "return fetch('/console/approvals/{}/decision', {{method: 'POST', headers: {{'Content-Type': 'application/x-www-form-urlencoded', 'X-CSRF-Token': '{csrf}'}}, body: 'decision=once'}}).then(r => r.status)",
                approval.id
            ))
            .await;
        assert_eq!(status, json!(200));
        assert!(gw.pending().await.is_empty());
    })
    .await;
    let out = blocked.await.unwrap();
    assert!(out.contains("fake: git push origin main"), "{out}");
    match Arc::try_unwrap(gw) {
        Ok(gw) => gw.stop().await,
        Err(_) => panic!("the gateway is still shared"),
    }
}

// ---------------------------------------------------------------------------------------
// 6. Viewer

#[tokio::test(flavor = "multi_thread")]
async fn a_viewer_sees_no_approve_button_and_a_forged_decision_is_refused() {
    if browser_binaries().is_none() {
        return;
    }
    let mut config = ask_push();
    merge(
        &mut config,
        json!({"users": {"vera": {"roles": {"a": "viewer"}}}}),
    );
    let gw = Arc::new(Gw::start(config).await);
    let minted = gw
        .gw
        .create_token(beige_core::api::auth::NewToken {
            user: "vera".into(),
            name: "browser".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let blocked = tokio::spawn({
        let gw = gw.clone();
        async move { gw.exec("git push origin main", true).await }
    });
    let deadline = Instant::now() + WAIT;
    let approval = loop {
        if let Some(a) = gw.pending().await.pop() {
            break a;
        }
        assert!(Instant::now() < deadline, "no approval request");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let gw2 = gw.clone();
    with_browser("viewer", |b| async move {
        let gw = gw2;
        b.login(&gw, &minted.token).await;
        b.find("#agent-a").await;
        // A viewer of `a` sees `a` only, and no chat button.
        let agents = b.text("main").await;
        assert!(!agents.contains("claude-haiku"), "agent b is hidden: {agents}");
        assert!(b.client.find(Locator::Css("#agent-a a.button")).await.is_err());
        b.shots("viewer-agents").await;

        b.goto(&gw.url("/console/approvals")).await;
        let call = b.text("#approval-list .approval.pending pre.call").await;
        assert_eq!(call, "exec git push origin main");
        assert!(b
            .client
            .find(Locator::Css("#approval-list button"))
            .await
            .is_err(), "a viewer has no decision buttons");
        b.shots("viewer-approvals").await;

        // A forged decision with the session's valid CSRF token: 403, still pending.
        let csrf = b
            .js("return JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRF-Token']")
            .await;
        let csrf = csrf.as_str().unwrap().to_string();
        let status = b
            .js(&format!(
                "return fetch('/console/approvals/{}/decision', {{method: 'POST', headers: {{'Content-Type': 'application/x-www-form-urlencoded', 'X-CSRF-Token': '{csrf}'}}, body: 'decision=once'}}).then(r => r.status)",
                approval.id
            ))
            .await;
        assert_eq!(status, json!(403));
        assert_eq!(gw.pending().await.len(), 1, "still pending");
        // The refusal is an `auth` record naming the viewer.
        let audit = std::fs::read_to_string(gw.home.audit_log_path()).unwrap();
        assert!(
            audit.lines().any(|l| l.contains("\"tool\":\"auth.refused\"")
                && l.contains("\"principal\":\"vera\"")
                && l.contains("may not approve")),
            "the forged decision is audited: {audit}"
        );
        // And a viewer cannot prompt.
        let status = b
            .js(&format!(
                "return fetch('/console/agents/a/sessions/api%3Aa%3Au%3Avera/prompt', {{method: 'POST', headers: {{'Content-Type': 'application/x-www-form-urlencoded', 'X-CSRF-Token': '{csrf}'}}, body: 'message=hi'}}).then(r => r.status)"
            ))
            .await;
        assert_eq!(status, json!(403));
        // Revoking the token ends the console session at once.
        gw.gw.revoke_token(&minted.info.id).await.unwrap();
        b.goto(&gw.url("/console")).await;
        b.find("#token").await;
        // Let the owner settle the request so the blocked call ends.
        let d = beige_core::api::approvals::ApprovalDecision::deny(None)
            .with_digest(approval.call_digest.clone());
        gw.gw
            .decide_approval(&approval.id, d, beige_core::api::Principal::ApiToken)
            .await
            .unwrap();
    })
    .await;
    blocked.await.unwrap();
    match Arc::try_unwrap(gw) {
        Ok(gw) => gw.stop().await,
        Err(_) => panic!("the gateway is still shared"),
    }
}
