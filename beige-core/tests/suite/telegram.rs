//! The Telegram channel against a fake Bot API server on loopback (beige-testkit's
//! `FakeTelegram`: real HTTP, the documented JSON shapes, HTML validated like Telegram
//! does), a gateway with the labelled `MemorySandbox`, and either the labelled
//! `ScriptedProvider` or a fake Anthropic server. Every test awaits what it checks;
//! timeouts only bound a failure.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use beige_core::channel::telegram::{TelegramChannel, TelegramConfig, TelegramPlugin};
use beige_core::channel::{Channel, ChannelContext, ChannelError};
use beige_core::config::Config;
use beige_core::llm::scripted::ScriptedProvider;
use beige_core::llm::LlmProvider;
use beige_core::plugin::{SessionInfo, ToolCall};
use beige_core::store::{SqliteStore, Store};
use beige_core::Sessions as _;
use beige_core::{Admin as _, Gateway as _};
use beige_core::{BeigeHome, GatewayBuilder, GatewayFull, LocalGateway};
use beige_testkit::anthropic::{text_response, MessageStream};
use beige_testkit::llm::{FakeLlmServer, Part, Reply};
use beige_testkit::telegram::{FakeTelegram, SentMessage};
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use beige_core::testing::MemorySandbox;

const TOKEN: &str = "123456:TEST-secret-token";
const USER: i64 = 4242;
const STRANGER: i64 = 666;

/// Bound a wait that should succeed; a hang fails the test instead of blocking it.
async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(30), fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// Where the model answers come from.
enum Models {
    Scripted(Vec<ScriptedProvider>),
    Server(String),
}

struct Harness {
    _dir: tempfile::TempDir,
    tg: FakeTelegram,
    gw: Arc<LocalGateway>,
    store: Arc<dyn Store>,
    config: TelegramConfig,
    channel: Arc<TelegramChannel>,
    run: Option<JoinHandle<Result<(), ChannelError>>>,
    sandbox: Arc<MemorySandbox>,
}

impl Harness {
    async fn new(models: Models, channel: Value) -> Option<Self> {
        Self::build(models, channel, false).await
    }

    async fn build(models: Models, channel: Value, with_plugin: bool) -> Option<Self> {
        Self::build_with(models, channel, with_plugin, json!({})).await
    }

    /// `patch` is merged into the gateway config: its `agent` object into agent `a`,
    /// every other key at the top level.
    async fn build_with(
        models: Models,
        channel: Value,
        with_plugin: bool,
        patch: Value,
    ) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let home = BeigeHome::new(dir.path().join("home"));
        std::fs::create_dir_all(home.root()).unwrap();
        let tg = FakeTelegram::start(TOKEN).await;
        let mut tg_config = json!({
            "token": TOKEN,
            "allowedUsers": [USER],
            "agentMapping": {"default": "a"},
            "apiBaseUrl": tg.url(),
            "pollTimeout": 1,
            "watchdogGrace": 1,
        });
        if let (Some(o), Value::Object(extra)) = (tg_config.as_object_mut(), channel) {
            o.extend(extra);
        }
        let base_url = match &models {
            Models::Server(url) => url.clone(),
            Models::Scripted(_) => "http://127.0.0.1:9".into(),
        };
        let agent = |tools: Value| {
            json!({
                "model": {"provider": "anthropic", "model": "claude-sonnet-4-6"},
                "fallbackModels": [{"provider": "spare", "model": "claude-haiku-4-5"}],
                "tools": tools,
                "sandbox": {"image": super::support::test_image(), "memoryLimit": "256m"},
            })
        };
        let tools = if with_plugin {
            json!(["telegram"])
        } else {
            json!([])
        };
        let mut cfg = json!({
            "llm": {"providers": {
                "anthropic": {"apiKey": "sk-ant-test-0123456789", "baseUrl": base_url},
                "spare": {"api": "anthropic-messages", "apiKey": "sk-spare-0123456789", "baseUrl": "http://127.0.0.1:9"},
            }},
            "agents": {"a": agent(tools), "b": agent(json!([]))},
        });
        if with_plugin {
            cfg["plugins"] = json!({"telegram": {"config": tg_config.clone()}});
        }
        if let Value::Object(patch) = patch {
            for (k, v) in patch {
                if k == "agent" {
                    if let (Some(a), Value::Object(extra)) = (cfg["agents"]["a"].as_object_mut(), v)
                    {
                        a.extend(extra);
                    }
                } else {
                    cfg[k] = v;
                }
            }
        }
        let config: Config = serde_json::from_value(cfg).unwrap();
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(home.db_path()).unwrap());
        let sandbox = Arc::new(MemorySandbox::new());
        let mut builder = GatewayBuilder::new(config, home)
            .sandbox(sandbox.clone())
            .store(store.clone());
        if let Models::Scripted(list) = models {
            for p in list {
                builder = builder.provider(Arc::new(p) as Arc<dyn LlmProvider>);
            }
        }
        if with_plugin {
            builder = builder.plugin(Arc::new(TelegramPlugin::new()));
        }
        let gw = Arc::new(builder.build().await.unwrap());
        let config = TelegramConfig::from_value(&tg_config).unwrap();
        let channel = Arc::new(TelegramChannel::new(config.clone(), store.clone()).unwrap());
        let mut h = Self {
            _dir: dir,
            tg,
            gw,
            store,
            config,
            channel,
            run: None,
            sandbox,
        };
        h.start();
        Some(h)
    }

    /// Wait until the channel is up (it has polled once): a gateway event raised before
    /// that would race the channel's start.
    async fn polling(&self) {
        tokio::time::timeout(
            Duration::from_secs(30),
            self.tg.wait_until(|t| !t.calls_to("getUpdates").is_empty()),
        )
        .await
        .expect("the Telegram channel never polled");
    }

    fn start(&mut self) {
        let ch = self.channel.clone();
        let gw: Arc<dyn GatewayFull> = self.gw.clone();
        self.run = Some(tokio::spawn(async move {
            ch.run(ChannelContext::new(gw, CancellationToken::new()))
                .await
        }));
    }

    /// Simulate a kill: the run is aborted wherever it is; a new channel starts on the
    /// same store.
    async fn crash_and_restart(&mut self) {
        if let Some(run) = self.run.take() {
            run.abort();
            let _ = run.await;
        }
        self.channel =
            Arc::new(TelegramChannel::new(self.config.clone(), self.store.clone()).unwrap());
        self.start();
    }

    /// Wait for a final message in `chat` whose visible text contains `needle`: sent
    /// as HTML, or a streamed preview the final HTML edit was sent for (Telegram answers
    /// "not modified" when the HTML renders to the same text).
    async fn reply_containing(&self, chat: i64, needle: &str) -> SentMessage {
        let is_final = |t: &FakeTelegram, m: &SentMessage| {
            m.chat_id == chat
                && m.visible.contains(needle)
                && (m.parse_mode.as_deref() == Some("HTML")
                    || t.calls_to("editMessageText").iter().any(|c| {
                        c.status != 0
                            && c.params["message_id"] == m.message_id
                            && c.params["chat_id"] == chat
                            && c.params["parse_mode"] == "HTML"
                    }))
        };
        within(&format!("a message containing {needle:?}"), async {
            self.tg
                .wait_until(|t| t.messages().iter().any(|m| is_final(t, m)))
                .await
        })
        .await;
        let found = self
            .tg
            .messages()
            .into_iter()
            .find(|m| is_final(&self.tg, m));
        found.unwrap()
    }

    fn texts(&self, chat: i64) -> Vec<String> {
        self.tg
            .messages_in(chat)
            .into_iter()
            .map(|m| m.visible)
            .collect()
    }
}

fn scripted() -> ScriptedProvider {
    ScriptedProvider::new("anthropic")
}

#[tokio::test]
async fn an_allowed_user_reaches_the_mapped_agent_and_the_reply_is_edited_into_place() {
    let model = scripted().then_text("Hello from **agent b**: 1 < 2 & done.");
    let Some(h) = Harness::new(
        Models::Scripted(vec![model.clone()]),
        json!({"agentMapping": {"default": "a", "4242": "b"}}),
    )
    .await
    else {
        return;
    };
    h.tg.send_text(USER, USER, "hi there");
    let m = h.reply_containing(USER, "Hello from agent b").await;

    // The mapped agent answered.
    let requests = model.requests();
    assert_eq!(requests.len(), 1);
    assert!(
        requests[0].system.contains("You are b,"),
        "{}",
        requests[0].system
    );
    assert_eq!(requests[0].messages[0].text(), "hi there");
    // sendMessage (plain preview) first, then editMessageText with the rendered answer.
    assert_eq!(m.parse_mode.as_deref(), Some("HTML"));
    assert_eq!(m.text, "Hello from <b>agent b</b>: 1 &lt; 2 &amp; done.");
    assert_eq!(m.visible, "Hello from agent b: 1 < 2 & done.");
    assert_eq!(
        m.history.first().map(String::as_str),
        Some("Hello from **agent b**: 1 < 2 & done.")
    );
    assert!(m.edits >= 1);
    let methods: Vec<String> =
        h.tg.calls()
            .into_iter()
            .map(|c| c.method)
            .filter(|m| m == "sendMessage" || m == "editMessageText")
            .collect();
    assert_eq!(methods, ["sendMessage", "editMessageText"]);
    assert_eq!(h.texts(USER).len(), 1, "one message, edited");
    // typing… was shown and the commands were registered.
    let typing = h.tg.calls_to("sendChatAction");
    assert!(typing.iter().any(|c| c.params["action"] == "typing"));
    let commands: Vec<String> =
        h.tg.commands()
            .iter()
            .map(|c| c["command"].as_str().unwrap().to_string())
            .collect();
    for c in ["start", "new", "status", "verbose", "model", "stop", "help"] {
        assert!(commands.contains(&c.to_string()), "{commands:?}");
    }
    // The session key is the chat's; the token never leaves the URL path.
    assert!(h
        .store
        .current_session(&format!("telegram:{USER}"))
        .await
        .unwrap()
        .is_some());
    assert!(h.tg.violations().is_empty(), "{:?}", h.tg.violations());
}

#[tokio::test]
async fn a_streamed_answer_is_edited_at_most_about_once_a_second() {
    let server = FakeLlmServer::start().await;
    let body = MessageStream::new()
        .text("Streaming answer: alpha beta gamma delta epsilon zeta eta theta")
        .piece_size(8)
        .body();
    // Pauses between the deltas, so the preview is updated several times.
    let marks: Vec<usize> = body
        .match_indices("event: content_block_delta")
        .map(|(i, _)| i)
        .collect();
    let (a, b) = (marks[2], marks[5]);
    server.push(Reply::sse_parts(vec![
        Part::Bytes(body[..a].to_string().into()),
        Part::Pause(Duration::from_millis(1300)),
        Part::Bytes(body[a..b].to_string().into()),
        Part::Pause(Duration::from_millis(1300)),
        Part::Bytes(body[b..].to_string().into()),
    ]));
    let Some(h) = Harness::new(Models::Server(server.url()), json!({})).await else {
        return;
    };
    h.tg.send_text(USER, USER, "stream please");
    let m = h.reply_containing(USER, "theta").await;
    assert!(m.history.len() >= 3, "{:?}", m.history);
    assert!(m.history[0].starts_with("Stream"), "{:?}", m.history);
    assert_eq!(
        m.visible,
        "Streaming answer: alpha beta gamma delta epsilon zeta eta theta"
    );
    // Preview updates (the first send and every edit but the final one) are spaced.
    let updates: Vec<_> =
        h.tg.calls()
            .into_iter()
            .filter(|c| c.method == "sendMessage" || c.method == "editMessageText")
            .collect();
    let previews = &updates[..updates.len() - 1];
    for pair in previews.windows(2) {
        let gap = pair[1].at.duration_since(pair[0].at);
        assert!(gap >= Duration::from_millis(900), "{gap:?}");
    }
    assert_eq!(h.texts(USER).len(), 1);
}

#[tokio::test]
async fn a_ten_thousand_character_answer_arrives_in_valid_pieces() {
    let mut answer = String::new();
    let mut code_lines = Vec::new();
    let mut i = 0;
    while answer.len() < 10_000 {
        answer.push_str(&format!(
            "Paragraph {i}: some **bold** words, a `x<y>` and an & sign to escape.\n\n"
        ));
        if i % 6 == 0 {
            answer.push_str("```python\n");
            for j in 0..25 {
                let line = format!("print({i} * {j} < 100 and 'a&b')  # line {i}.{j}");
                answer.push_str(&line);
                answer.push('\n');
                code_lines.push(line);
            }
            answer.push_str("```\n\n");
        }
        i += 1;
    }
    assert!(answer.chars().count() >= 10_000);
    let model = scripted().then_text(answer.clone());
    let Some(h) = Harness::new(Models::Scripted(vec![model]), json!({})).await else {
        return;
    };
    h.tg.send_text(USER, USER, "write a lot");
    let last_line = code_lines.last().unwrap().clone();
    h.reply_containing(USER, &last_line).await;
    let messages = h.tg.messages_in(USER);
    assert!(messages.len() >= 3, "{}", messages.len());
    let mut visible_code = String::new();
    for m in &messages {
        assert!(m.text.chars().count() <= 4096, "{}", m.text.chars().count());
        assert_eq!(m.parse_mode.as_deref(), Some("HTML"));
        assert_eq!(
            m.text.matches("<pre>").count(),
            m.text.matches("</pre>").count(),
            "a code block is closed in the message that opened it"
        );
        visible_code.push_str(&m.visible);
        visible_code.push('\n');
    }
    for line in &code_lines {
        assert_eq!(visible_code.matches(line.as_str()).count(), 1, "{line}");
    }
    assert!(h.tg.violations().is_empty(), "{:?}", h.tg.violations());
}

#[tokio::test]
async fn a_stranger_is_refused_and_never_reaches_an_agent() {
    let model = scripted().then_text("should never be said");
    let Some(h) = Harness::new(Models::Scripted(vec![model.clone()]), json!({})).await else {
        return;
    };
    h.tg.send_text(STRANGER, STRANGER, "let me in");
    h.tg.send_text(-100200, STRANGER, "/status");
    let m = h.reply_containing(STRANGER, "Unauthorized").await;
    assert!(m.visible.contains(&STRANGER.to_string()), "{}", m.visible);
    h.reply_containing(-100200, "Unauthorized").await;
    // An allowed user afterwards is served: the refusals did not block anything.
    h.tg.send_text(USER, USER, "hello");
    h.reply_containing(USER, "should never be said").await;
    assert_eq!(model.requests().len(), 1);
    assert_eq!(model.requests()[0].messages[0].text(), "hello");
    assert!(h
        .store
        .current_session(&format!("telegram:{STRANGER}"))
        .await
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn a_crash_before_the_reply_was_sent_handles_the_update_once_and_replies_once() {
    let model = scripted()
        .then_text("the one and only answer")
        .then_text("the second answer");
    let Some(mut h) = Harness::new(
        Models::Scripted(vec![model.clone()]),
        json!({"defaults": {"streaming": false}}),
    )
    .await
    else {
        return;
    };
    // The reply's sendMessage never gets an answer: the process "dies" while waiting.
    h.tg.hang_sends(1);
    h.tg.send_text(USER, USER, "hello");
    within("the reply to be on its way", async {
        h.tg.wait_until(|t| !t.calls_to("sendMessage").is_empty())
            .await
    })
    .await;
    // What the store committed: the update finished, its reply queued.
    assert!(h
        .store
        .due_outbox(beige_core::channel::telegram::INBOX, i64::MAX, 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        h.store
            .due_outbox(beige_core::channel::telegram::CHANNEL, i64::MAX, 10)
            .await
            .unwrap()
            .len(),
        1
    );
    h.crash_and_restart().await;
    h.reply_containing(USER, "the one and only answer").await;
    // Handled once (one model call), delivered once (one message): the hung attempt
    // before the kill and the one after it.
    assert_eq!(model.requests().len(), 1);
    let sends = h.tg.calls_to("sendMessage");
    assert_eq!(sends.len(), 2, "{sends:?}");
    assert_eq!((sends[0].status, sends[1].status), (0, 200));
    assert_eq!(h.texts(USER), ["the one and only answer"]);
    // The restarted channel carries on normally, and the history has one exchange.
    h.tg.send_text(USER, USER, "again");
    h.reply_containing(USER, "the second answer").await;
    assert_eq!(model.requests().len(), 2);
    assert_eq!(
        model.requests()[1].messages.len(),
        3,
        "hello, answer, again"
    );
    assert_eq!(
        h.texts(USER),
        ["the one and only answer", "the second answer"]
    );
    assert_eq!(h.tg.pending_updates(), 0);
}

#[tokio::test]
async fn a_crash_during_the_model_call_answers_once_after_the_restart() {
    let server = FakeLlmServer::start().await;
    server.push(Reply::hang());
    server.push(text_response("the recovered answer"));
    let Some(mut h) = Harness::new(Models::Server(server.url()), json!({})).await else {
        return;
    };
    h.tg.send_text(USER, USER, "a question");
    within("the model call", server.wait_for_requests(1)).await;
    h.crash_and_restart().await;
    h.reply_containing(USER, "the recovered answer").await;
    assert_eq!(server.request_count(), 2);
    assert_eq!(
        h.texts(USER),
        ["the recovered answer"],
        "no error, no duplicate"
    );
    // The second call saw the question (once more after the interrupted one).
    let last = server.last_request().unwrap();
    assert!(last.body["messages"].to_string().contains("a question"));
}

#[tokio::test]
async fn a_429_with_retry_after_is_honoured_and_the_reply_sent_once() {
    let model = scripted().then_text("worth the wait");
    let Some(h) = Harness::new(
        Models::Scripted(vec![model]),
        json!({"defaults": {"streaming": false}}),
    )
    .await
    else {
        return;
    };
    h.tg.rate_limit_sends(1, 2);
    h.tg.send_text(USER, USER, "hello");
    h.reply_containing(USER, "worth the wait").await;
    let sends = h.tg.calls_to("sendMessage");
    assert_eq!(sends.len(), 2, "{sends:?}");
    assert_eq!(sends[0].status, 429);
    assert_eq!(sends[0].response["parameters"]["retry_after"], 2);
    assert_eq!(sends[1].status, 200);
    let waited = sends[1].at.duration_since(sends[0].at);
    assert!(waited >= Duration::from_millis(1900), "{waited:?}");
    assert_eq!(h.texts(USER), ["worth the wait"]);
}

#[tokio::test]
async fn the_watchdog_restarts_a_hanging_poll_and_later_messages_are_handled() {
    let model = scripted().then_text("still here");
    let Some(h) = Harness::new(Models::Scripted(vec![model]), json!({})).await else {
        return;
    };
    h.tg.hang_polls(1);
    // The channel may already be in its first (normal) poll: wait for the hung one.
    within("a hanging getUpdates", async {
        h.tg.wait_until(|t| t.calls_to("getUpdates").iter().any(|c| c.status == 0))
            .await
    })
    .await;
    h.tg.send_text(USER, USER, "are you alive?");
    h.reply_containing(USER, "still here").await;
    assert!(h.channel.polling_restarts() >= 1);
}

#[tokio::test]
async fn new_starts_a_session_without_earlier_history() {
    let model = scripted()
        .then_text("first answer")
        .then_text("second answer")
        .then_text("third answer");
    let Some(h) = Harness::new(Models::Scripted(vec![model.clone()]), json!({})).await else {
        return;
    };
    h.tg.send_text(USER, USER, "one");
    h.reply_containing(USER, "first answer").await;
    h.tg.send_text(USER, USER, "two");
    h.reply_containing(USER, "second answer").await;
    let key = format!("telegram:{USER}");
    let before = h.store.current_session(&key).await.unwrap().unwrap();
    h.tg.send_text(USER, USER, "/new");
    h.reply_containing(USER, "New session started").await;
    h.tg.send_text(USER, USER, "three");
    h.reply_containing(USER, "third answer").await;
    let requests = model.requests();
    assert_eq!(requests[1].messages.len(), 3);
    assert_eq!(requests[2].messages.len(), 1, "no earlier history");
    assert_eq!(requests[2].messages[0].text(), "three");
    let after = h.store.current_session(&key).await.unwrap().unwrap();
    assert_ne!(before.id, after.id);
    assert_eq!(
        h.gw.sessions("a").await.unwrap().len(),
        2,
        "the old one is kept"
    );
}

#[tokio::test]
async fn verbose_on_shows_tool_lines() {
    let model = scripted()
        .then_tool("t1", "exec", json!({"command": "ls -la"}))
        .then_text("quietly done")
        .then_tool("t2", "exec", json!({"command": "ls -la /tmp"}))
        .then_text("loudly done");
    let Some(h) = Harness::new(Models::Scripted(vec![model]), json!({})).await else {
        return;
    };
    h.tg.send_text(USER, USER, "list files");
    h.reply_containing(USER, "quietly done").await;
    assert!(!h.texts(USER).iter().any(|t| t.starts_with("🔧")));
    h.tg.send_text(USER, USER, "/verbose on");
    h.reply_containing(USER, "Verbose on").await;
    h.tg.send_text(USER, USER, "list again");
    h.reply_containing(USER, "loudly done").await;
    let texts = h.texts(USER);
    let tool = texts.iter().position(|t| t == "🔧 exec: ls -la /tmp");
    let answer = texts.iter().position(|t| t == "loudly done");
    assert!(tool.is_some() && tool < answer, "{texts:?}");
    let settings = h.gw.settings(&format!("telegram:{USER}")).await.unwrap();
    assert_eq!(settings.verbose, Some(true));
}

#[tokio::test]
async fn stop_cancels_the_running_prompt() {
    let server = FakeLlmServer::start().await;
    server.push(Reply::hang());
    server.push(text_response("after the stop"));
    let Some(h) = Harness::new(Models::Server(server.url()), json!({})).await else {
        return;
    };
    h.tg.send_text(USER, USER, "a very long task");
    within("the model call", server.wait_for_requests(1)).await;
    h.tg.send_text(USER, USER, "/stop");
    h.reply_containing(USER, "Stopped").await;
    // The session is free again: the next message is answered.
    h.tg.send_text(USER, USER, "next");
    h.reply_containing(USER, "after the stop").await;
    assert_eq!(
        h.texts(USER),
        ["⛔ Stopped.", "after the stop"],
        "no error for the cancelled prompt"
    );
    h.tg.send_text(USER, USER, "/stop");
    h.reply_containing(USER, "No active operation").await;
}

#[tokio::test]
async fn status_shows_agent_model_session_and_usage() {
    let model = scripted().then_text("counted");
    let Some(h) = Harness::new(Models::Scripted(vec![model]), json!({})).await else {
        return;
    };
    h.tg.send_text(USER, USER, "hello");
    h.reply_containing(USER, "counted").await;
    h.tg.send_text(USER, USER, "/status");
    let m = h.reply_containing(USER, "Status").await;
    let session = h
        .store
        .current_session(&format!("telegram:{USER}"))
        .await
        .unwrap()
        .unwrap();
    assert!(m.visible.contains("Agent: a"), "{}", m.visible);
    assert!(
        m.visible.contains("Model: anthropic/claude-sonnet-4-6"),
        "{}",
        m.visible
    );
    assert!(
        m.visible.contains(&format!("telegram:{USER}")),
        "{}",
        m.visible
    );
    assert!(m.visible.contains(&session.id), "{}", m.visible);
    assert!(session.usage.input_tokens > 0);
    assert!(
        m.visible.contains(&format!(
            "Usage: {} tokens in · {} out",
            session.usage.input_tokens, session.usage.output_tokens
        )),
        "{}",
        m.visible
    );
    assert!(
        m.visible.contains("Verbose: off · Streaming: on"),
        "{}",
        m.visible
    );
}

#[tokio::test]
async fn model_switches_only_to_allowed_models() {
    let primary = scripted().then_text("from the primary");
    let spare = ScriptedProvider::new("spare").then_text("from the spare");
    let Some(h) = Harness::new(
        Models::Scripted(vec![primary.clone(), spare.clone()]),
        json!({}),
    )
    .await
    else {
        return;
    };
    h.tg.send_text(USER, USER, "/model");
    let list = h.reply_containing(USER, "Models of a").await;
    assert!(
        list.visible
            .contains("anthropic/claude-sonnet-4-6 (primary"),
        "{}",
        list.visible
    );
    assert!(
        list.visible.contains("spare/claude-haiku-4-5 (fallback"),
        "{}",
        list.visible
    );
    h.tg.send_text(USER, USER, "/model openai/gpt-5");
    let refused = h.reply_containing(USER, "not allowed").await;
    assert!(
        refused
            .visible
            .contains("anthropic/claude-sonnet-4-6, spare/claude-haiku-4-5"),
        "{}",
        refused.visible
    );
    let key = format!("telegram:{USER}");
    assert_eq!(h.gw.settings(&key).await.unwrap().model_override, None);
    h.tg.send_text(USER, USER, "/model spare/claude-haiku-4-5");
    h.reply_containing(USER, "Switched to spare/claude-haiku-4-5")
        .await;
    assert_eq!(
        h.gw.settings(&key).await.unwrap().model_override.as_deref(),
        Some("spare/claude-haiku-4-5")
    );
    h.tg.send_text(USER, USER, "who answers?");
    h.reply_containing(USER, "from the spare").await;
    assert_eq!(spare.requests().len(), 1);
    assert!(primary.requests().is_empty());
}

#[tokio::test]
async fn two_forum_topics_are_two_sessions_and_replies_stay_in_their_topic() {
    let model = scripted()
        .then_text("answer in a topic")
        .then_text("answer in another topic");
    let Some(h) = Harness::new(Models::Scripted(vec![model.clone()]), json!({})).await else {
        return;
    };
    let group = -1001234;
    h.tg.send_topic_text(group, 7, USER, "in topic seven");
    h.reply_containing(group, "answer in a topic").await;
    h.tg.send_topic_text(group, 9, USER, "in topic nine");
    h.reply_containing(group, "answer in another topic").await;
    let seven = h
        .store
        .current_session(&format!("telegram:{group}:7"))
        .await
        .unwrap()
        .unwrap();
    let nine = h
        .store
        .current_session(&format!("telegram:{group}:9"))
        .await
        .unwrap()
        .unwrap();
    assert_ne!(seven.id, nine.id);
    assert_eq!(model.requests()[1].messages.len(), 1, "no shared history");
    let messages = h.tg.messages_in(group);
    let thread_of = |needle: &str| {
        messages
            .iter()
            .find(|m| m.visible.contains(needle))
            .and_then(|m| m.thread_id)
    };
    assert_eq!(thread_of("answer in a topic"), Some(7));
    assert_eq!(thread_of("answer in another topic"), Some(9));
    // In a group the answer replies to the user's message.
    assert!(
        messages.iter().all(|m| m.reply_to.is_some()),
        "{messages:?}"
    );
}

#[tokio::test]
async fn markdown_with_special_characters_is_valid_telegram_html() {
    let text = "Use `a<b>` & **bold**, _it_, *star*, snake_case_name, 2 < 3 > 1 and [docs](https://example.com/?a=1&b=2).\n\n```rust\nfn x() -> bool { 1 < 2 && \"s\" != \"t\" }\n```\nDone_now *unclosed";
    let model = scripted().then_text(text);
    let Some(h) = Harness::new(Models::Scripted(vec![model]), json!({})).await else {
        return;
    };
    h.tg.send_text(USER, USER, "format something");
    let m = h.reply_containing(USER, "Done_now").await;
    assert!(h.tg.violations().is_empty(), "{:?}", h.tg.violations());
    assert_eq!(m.parse_mode.as_deref(), Some("HTML"));
    for part in [
        "<code>a&lt;b&gt;</code>",
        "&amp; <b>bold</b>",
        "<i>it</i>",
        "<i>star</i>",
        "snake_case_name",
        "2 &lt; 3 &gt; 1",
        "<a href=\"https://example.com/?a=1&amp;b=2\">docs</a>",
        "<pre><code class=\"language-rust\">fn x() -&gt; bool { 1 &lt; 2 &amp;&amp; \"s\" != \"t\" }</code></pre>",
        "Done_now *unclosed",
    ] {
        assert!(m.text.contains(part), "{part} in {}", m.text);
    }
    assert!(m
        .visible
        .contains("fn x() -> bool { 1 < 2 && \"s\" != \"t\" }"));
}

#[tokio::test]
async fn the_telegram_tool_and_proactive_messages_use_the_outbox() {
    let Some(h) = Harness::build(
        Models::Scripted(vec![scripted()]),
        json!({"allowedChats": [-100777]}),
        true,
    )
    .await
    else {
        return;
    };
    let tool = h.gw.registry().tool("telegram").unwrap().tool.clone();
    let workspace = h.gw.config().agent_workspace(h.gw.home(), "a");
    std::fs::create_dir_all(&workspace).unwrap();
    let call = |args: &[&str], session: SessionInfo| ToolCall {
        tool: "telegram".into(),
        args: args.iter().map(|s| s.to_string()).collect(),
        stdin: None,
        cwd: None,
        workspace: workspace.clone(),
        session,
        config: json!({"allowedChats": [-100777], "agentMapping": {"default": "a"}}),
        exec: None,
    };
    let in_chat = SessionInfo {
        agent: "a".into(),
        key: format!("telegram:{USER}"),
        channel: "telegram".into(),
        chat_id: Some(USER.to_string()),
        thread_id: None,
    };
    let r = within(
        "the tool",
        tool.call(call(
            &["send", "hello", "**from**", "the", "tool"],
            in_chat.clone(),
        )),
    )
    .await
    .unwrap();
    assert_eq!(r.exit_code, 0, "{}", r.output);
    assert_eq!(r.output, format!("Message sent to chat {USER}\n"));
    assert_eq!(h.texts(USER), ["hello from the tool"]);

    let r = tool
        .call(call(
            &["send", "--chat", "-100777", "to the team"],
            in_chat.clone(),
        ))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "{}", r.output);
    assert_eq!(h.texts(-100777), ["to the team"]);

    let r = tool
        .call(call(&["send", "--chat", "-999", "nope"], in_chat.clone()))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 1);
    assert!(
        r.output.contains("may not send to chat -999"),
        "{}",
        r.output
    );
    assert!(h.texts(-999).is_empty());

    let api_session = SessionInfo {
        agent: "a".into(),
        key: "api:a:default".into(),
        channel: "api".into(),
        chat_id: None,
        thread_id: None,
    };
    let r = tool
        .call(call(&["send", "where to?"], api_session))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 1);
    assert!(r.output.contains("not a Telegram chat"), "{}", r.output);

    let png = b"\x89PNG\r\n\x1a\nfake image bytes".to_vec();
    std::fs::write(workspace.join("chart.png"), &png).unwrap();
    let r = tool
        .call(call(
            &["photo", "chart.png", "the", "chart"],
            in_chat.clone(),
        ))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "{}", r.output);
    let photo =
        h.tg.messages_in(USER)
            .into_iter()
            .find_map(|m| m.photo)
            .unwrap();
    assert_eq!(photo.bytes, png);
    assert_eq!(photo.file_name, "chart.png");
    assert_eq!(photo.caption.as_deref(), Some("the chart"));
    let r = tool
        .call(call(&["photo", "../../etc/passwd.png"], in_chat))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 1, "{}", r.output);

    // Channel::send: a proactive message, rendered and delivered.
    h.channel
        .send(&USER.to_string(), None, "reminder: **stand-up** at 10")
        .await
        .unwrap();
    let m = h.reply_containing(USER, "reminder: stand-up at 10").await;
    assert_eq!(m.text, "reminder: <b>stand-up</b> at 10");
    assert!(h.tg.violations().is_empty(), "{:?}", h.tg.violations());
}

#[tokio::test]
async fn a_wrong_config_or_token_fails_with_a_clear_error() {
    let e = TelegramConfig::from_value(
        &json!({"token": TOKEN, "allowedUsers": ["me"], "agentMapping": {"default": "a"}}),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("allowedUsers[0]"), "{e}");
    let Some(h) = Harness::new(
        Models::Scripted(vec![scripted()]),
        json!({"agentMapping": {"default": "nobody"}}),
    )
    .await
    else {
        return;
    };
    let run = h
        .channel
        .run(ChannelContext::new(h.gw.clone(), CancellationToken::new()));
    let e = within("the start error", run)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("agentMapping.default") && e.contains("'nobody'"),
        "{e}"
    );

    // A token Telegram rejects: the error says so and never shows the token.
    let mut config = h.config.clone();
    config.agent_mapping.default = "a".into();
    config.token = "999:WRONG-token".into();
    let ch = TelegramChannel::new(config, h.store.clone()).unwrap();
    let e = within(
        "the token error",
        ch.run(ChannelContext::new(h.gw.clone(), CancellationToken::new())),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(e.contains("token was rejected"), "{e}");
    assert!(!e.contains("WRONG"), "{e}");
}

#[tokio::test]
async fn a_rate_limited_model_gives_the_user_something_to_do() {
    let limited = |provider: &str| {
        let provider = provider.to_string();
        move |_: &beige_core::llm::ModelRequest| -> Result<Vec<beige_core::llm::Block>, beige_core::llm::LlmError> {
            Err(beige_core::llm::LlmError::Api {
                provider: provider.clone(),
                status: 429,
                retry_after: Some(Duration::from_secs(60)),
                error_type: Some("rate_limit_error".into()),
                message: "Number of request tokens has exceeded your per-minute rate limit".into(),
            })
        }
    };
    let mut primary = scripted();
    let mut spare = ScriptedProvider::new("spare");
    for _ in 0..5 {
        primary = primary.then(limited("anthropic"));
        spare = spare.then(limited("spare"));
    }
    let Some(h) = Harness::new(Models::Scripted(vec![primary, spare]), json!({})).await else {
        return;
    };
    h.tg.send_text(USER, USER, "hello?");
    let m = h.reply_containing(USER, "rate-limited").await;
    assert!(
        m.visible
            .starts_with("⏳ The model is rate-limited right now."),
        "{}",
        m.visible
    );
    assert!(
        m.visible
            .contains("Wait a few minutes, or switch to another allowed model (/model)"),
        "{}",
        m.visible
    );
    assert!(!m.visible.contains("sk-"), "{}", m.visible);
}

/// Agent `a` asks before `git push`; approvals wait long enough for a test to answer.
fn ask_on_push(extra: Value) -> Value {
    let mut patch = json!({
        "agent": {"policy": {"rules": [
            {"id": "push", "tool": "exec", "pattern": ["git", "push"], "decision": "ask",
             "justification": "publishes work outside the sandbox"},
        ]}},
        "approvals": {"holdSeconds": 30, "timeoutSeconds": 60},
    });
    if let (Some(p), Value::Object(extra)) = (patch["approvals"].as_object_mut(), extra) {
        p.extend(extra);
    }
    patch
}

/// Whether `m` was sent as an approval request (its first text), whatever it says now.
fn is_request(m: &SentMessage) -> bool {
    m.history
        .first()
        .is_some_and(|t| t.starts_with("🔐 Approval needed"))
}

/// The approval request number `after` (0-based) shown in `chat`, as sent.
async fn approval_message(h: &Harness, chat: i64, after: usize) -> SentMessage {
    within("an approval request with buttons", async {
        h.tg.wait_until(|t| t.messages_in(chat).iter().filter(|m| is_request(m)).count() > after)
            .await
    })
    .await;
    h.tg.messages_in(chat)
        .into_iter()
        .filter(is_request)
        .nth(after)
        .unwrap()
}

fn button(m: &SentMessage, letter: char) -> String {
    m.buttons
        .concat()
        .into_iter()
        .map(|(_, data)| data)
        .find(|d| d.ends_with(&format!(":{letter}")))
        .unwrap_or_else(|| panic!("no '{letter}' button on {m:?}"))
}

#[tokio::test]
async fn an_exec_that_needs_approval_waits_for_the_button_and_runs_exactly_that_call() {
    let model = scripted()
        .then_tool("t1", "exec", json!({"command": "git push origin main"}))
        .then_text("pushed")
        .then_tool("t2", "exec", json!({"command": "git push origin other"}))
        .then_text("asked about other");
    let requests = model.clone();
    let Some(h) = Harness::build_with(
        Models::Scripted(vec![model]),
        json!({}),
        false,
        ask_on_push(json!({})),
    )
    .await
    else {
        return;
    };
    let sandbox = h.sandbox.clone();
    h.tg.send_text(USER, USER, "push it");
    let asked = approval_message(&h, USER, 0).await;
    assert!(
        asked.visible.contains("exec git push origin main"),
        "{}",
        asked.visible
    );
    assert!(asked
        .visible
        .contains("rule push: publishes work outside the sandbox"));
    // Nothing ran while it waited.
    assert!(!sandbox.executed("a").iter().any(|c| c.contains("git push")));
    for data in asked.buttons.concat().iter().map(|(_, d)| d) {
        assert!(data.len() <= 64 && data.starts_with("ap:"), "{data}");
    }
    // A stranger's press is refused and changes nothing.
    h.tg.press_button(USER, STRANGER, asked.message_id, &button(&asked, 'o'));
    within("the stranger's answer", async {
        h.tg.wait_until(|t| {
            t.callback_answers()
                .iter()
                .any(|(_, a)| a.contains("cannot approve"))
        })
        .await
    })
    .await;
    assert!(!sandbox.executed("a").iter().any(|c| c.contains("git push")));

    h.tg.press_button(USER, USER, asked.message_id, &button(&asked, 'o'));
    h.reply_containing(USER, "pushed").await;
    let ran: Vec<String> = sandbox
        .executed("a")
        .into_iter()
        .filter(|c| c.contains("git push"))
        .collect();
    assert_eq!(ran, vec!["git push origin main".to_string()]);
    let edited =
        h.tg.messages_in(USER)
            .into_iter()
            .find(|m| m.message_id == asked.message_id)
            .unwrap();
    assert!(
        edited
            .visible
            .starts_with(&format!("✅ Approved (once) by telegram:{USER}")),
        "{}",
        edited.visible
    );
    assert!(
        edited.buttons.is_empty(),
        "the buttons go once it is decided"
    );

    // Another call is another request: deny it, and the model reads who denied it.
    h.tg.send_text(USER, USER, "push other");
    let second = approval_message(&h, USER, 1).await;
    assert!(
        second.visible.contains("git push origin other"),
        "{}",
        second.visible
    );
    assert_ne!(button(&second, 'o'), button(&asked, 'o'));
    h.tg.press_button(USER, USER, second.message_id, &button(&second, 'd'));
    h.reply_containing(USER, "asked about other").await;
    assert!(!sandbox
        .executed("a")
        .iter()
        .any(|c| c.contains("origin other")));
    let seen = requests.requests();
    let last = serde_json::to_string(&seen.last().unwrap().messages).unwrap();
    assert!(
        last.contains(&format!("was denied by telegram:{USER}")),
        "{last}"
    );
    // The audit names the approver and the steps.
    let audit = std::fs::read_to_string(h.gw.home().audit_log_path()).unwrap_or_default();
    for phase in ["\"requested\"", "\"decided\"", "\"consumed\""] {
        assert!(audit.contains(phase), "{phase} not audited");
    }
    assert!(audit.contains(&format!("\"approver\":\"telegram:{USER}\"")));
}

#[tokio::test]
async fn an_approval_nobody_answers_expires_and_the_model_is_told() {
    let model = scripted()
        .then_tool("t1", "exec", json!({"command": "git push origin main"}))
        .then_text("gave up");
    let requests = model.clone();
    let Some(h) = Harness::build_with(
        Models::Scripted(vec![model]),
        json!({}),
        false,
        ask_on_push(json!({"timeoutSeconds": 1})),
    )
    .await
    else {
        return;
    };
    let started = std::time::Instant::now();
    h.tg.send_text(USER, USER, "push it");
    let asked = approval_message(&h, USER, 0).await;
    h.reply_containing(USER, "gave up").await;
    assert!(started.elapsed() < Duration::from_secs(20));
    let last = serde_json::to_string(&requests.requests().last().unwrap().messages).unwrap();
    assert!(last.contains("expired before anyone answered"), "{last}");
    let edited =
        h.tg.messages_in(USER)
            .into_iter()
            .find(|m| m.message_id == asked.message_id)
            .unwrap();
    assert!(
        edited.visible.starts_with("⌛ Expired"),
        "{}",
        edited.visible
    );
}

#[tokio::test]
async fn an_unattended_prompt_is_denied_at_once_and_the_owner_is_told() {
    let model = scripted()
        .then_tool("t1", "exec", json!({"command": "git push origin main"}))
        .then_text("could not push");
    let requests = model.clone();
    let Some(h) = Harness::build_with(
        Models::Scripted(vec![model]),
        json!({}),
        false,
        ask_on_push(json!({"notify": [{"channel": "telegram", "chatId": USER.to_string()}]})),
    )
    .await
    else {
        return;
    };
    h.polling().await;
    let started = std::time::Instant::now();
    // A plain prompt (no approvals stream), with BEIGE_* looking attended changes nothing.
    let events =
        h.gw.prompt(beige_core::PromptRequest::new("a", "api:a:nightly", "push"))
            .await
            .unwrap()
            .collect_all()
            .await;
    assert!(started.elapsed() < Duration::from_secs(10), "it waited");
    assert!(events
        .iter()
        .any(|e| matches!(e, beige_core::api::AgentEvent::Done { .. })));
    let sandbox = h.sandbox.clone();
    assert!(!sandbox.executed("a").iter().any(|c| c.contains("git push")));
    let last = serde_json::to_string(&requests.requests().last().unwrap().messages).unwrap();
    assert!(last.contains("this run is unattended"), "{last}");
    let report =
        h.tg.wait_for_message(|m| m.chat_id == USER && m.visible.contains("needed approval"))
            .await;
    assert!(
        report.visible.contains("'exec git push origin main'"),
        "{}",
        report.visible
    );
    assert!(report.visible.contains("rule push"), "{}", report.visible);
    assert!(
        h.gw.approvals(None).await.unwrap().is_empty(),
        "no request waits"
    );
}

/// Telegram ids mapped to users act with those users' roles: a viewer's message is
/// refused with the reason and reaches no model, a viewer's press of an approval button
/// decides nothing, and the member's own press does; the audit names the users.
#[tokio::test]
async fn mapped_telegram_users_act_with_their_roles() {
    const VIEWER: i64 = 4343;
    let model = scripted()
        .then_tool("t1", "exec", json!({"command": "git push origin main"}))
        .then_text("pushed");
    let requests = model.clone();
    let mut patch = ask_on_push(json!({}));
    patch["users"] = json!({
        "mem": {"roles": {"a": "member"}, "telegram": [USER]},
        "vi": {"roles": {"*": "viewer"}, "telegram": [VIEWER]},
    });
    let Some(h) = Harness::build_with(
        Models::Scripted(vec![model]),
        json!({"allowedUsers": [USER, VIEWER]}),
        false,
        patch,
    )
    .await
    else {
        return;
    };
    // The viewer is heard (allowedUsers) but may not prompt.
    h.tg.send_text(VIEWER, VIEWER, "hello");
    let refused = h.reply_containing(VIEWER, "may not prompt").await;
    assert!(
        refused.visible.contains("vi (viewer on a)"),
        "{}",
        refused.visible
    );
    assert!(
        requests.requests().is_empty(),
        "no model call for a refused prompt"
    );

    h.tg.send_text(USER, USER, "push it");
    let asked = approval_message(&h, USER, 0).await;
    // The viewer's press (an allowed user) is refused by their role.
    h.tg.press_button(USER, VIEWER, asked.message_id, &button(&asked, 'o'));
    within("the viewer's answer", async {
        h.tg.wait_until(|t| {
            t.callback_answers()
                .iter()
                .any(|(_, a)| a.contains("may not approve"))
        })
        .await
    })
    .await;
    assert!(!h
        .sandbox
        .executed("a")
        .iter()
        .any(|c| c.contains("git push")));
    // The member approves a request of their own chat, once.
    h.tg.press_button(USER, USER, asked.message_id, &button(&asked, 'o'));
    h.reply_containing(USER, "pushed").await;
    assert_eq!(
        h.sandbox
            .executed("a")
            .iter()
            .filter(|c| c.contains("git push"))
            .count(),
        1
    );
    let audit: Vec<Value> = std::fs::read_to_string(h.gw.home().audit_log_path())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        audit.iter().any(|r| r["type"] == "prompt"
            && r["principal"] == "mem"
            && r["via"] == format!("telegram:{USER}")),
        "the prompt names the user"
    );
    assert!(
        audit
            .iter()
            .any(|r| r["type"] == "approval" && r["approval"]["approver"] == "mem"),
        "the approval names the user"
    );
    assert!(audit
        .iter()
        .any(|r| r["tool"] == "auth.refused" && r["principal"] == "vi"));
}
