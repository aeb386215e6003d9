//! Tests of the store. The contract suite — every generic `async fn name<B: Backend>()`
//! below — runs against [`SqliteStore`] on a real database file in a temp dir
//! (`store::tests::sqlite_store::name`), against [`PostgresStore`] on a fresh database of
//! a real PostgreSQL server (`store::tests::postgres_store::name`; the server of
//! `scripts/setup-postgres`, named by `BEIGE_TEST_POSTGRES_URL`) and against
//! [`MemoryStore`] (`store::tests::memory_store::name`); the file, migrations, locks,
//! corruption and crash safety are tested on SQLite only, and the two schemas are
//! compared column by column.

use std::collections::BTreeSet;
use std::io::{BufRead as _, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;

use super::*;
use crate::llm::{Block, Role, ToolResultPart};
use crate::testing::MemoryStore;

// ---- the contract suite, on both stores ----

/// A store under test, and how to reach it again after "a restart".
trait Backend: Sized {
    type Store: Store + Clone + 'static;

    /// A new, empty store (and the temp dir it may live in).
    async fn temp_db() -> (tempfile::TempDir, Self);

    /// Open the store; opened again, it holds what was stored before. Each call is
    /// another handle (another connection or pool), as another gateway would have.
    async fn open(&self) -> Self::Store;

    /// Another connection to the database file, for checks of its tables; `None` when
    /// the store has no file.
    fn raw(&self) -> Option<rusqlite::Connection>;
}

/// [`SqliteStore`] on `beige.db` in a temp dir; opening it again reads the file anew.
struct Sqlite(PathBuf);

impl Backend for Sqlite {
    type Store = SqliteStore;

    async fn temp_db() -> (tempfile::TempDir, Self) {
        let (dir, path) = temp_db();
        (dir, Self(path))
    }

    async fn open(&self) -> SqliteStore {
        open(&self.0)
    }

    fn raw(&self) -> Option<rusqlite::Connection> {
        Some(raw(&self.0))
    }
}

/// [`MemoryStore`]; opening it again is another handle on the same memory.
struct Memory(MemoryStore);

impl Backend for Memory {
    type Store = MemoryStore;

    async fn temp_db() -> (tempfile::TempDir, Self) {
        let dir = tempfile::tempdir().expect("temp dir");
        (dir, Self(MemoryStore::new()))
    }

    async fn open(&self) -> MemoryStore {
        self.0.clone()
    }

    fn raw(&self) -> Option<rusqlite::Connection> {
        None
    }
}

/// One `#[tokio::test]` per backend for each generic test of the contract.
macro_rules! contract {
    ($($test:ident),* $(,)?) => {
        /// The contract suite on [`SqliteStore`](super::SqliteStore).
        mod sqlite_store {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test::<super::Sqlite>().await;
                }
            )*
        }

        /// The contract suite on [`PostgresStore`](super::PostgresStore), each test on a
        /// database of its own.
        mod postgres_store {
            $(
                #[tokio::test]
                async fn $test() {
                    if super::postgres::available() {
                        super::$test::<super::postgres::Postgres>().await;
                    }
                }
            )*
        }

        /// The contract suite on [`MemoryStore`](crate::testing::MemoryStore).
        mod memory_store {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test::<super::Memory>().await;
                }
            )*
        }
    };
}

contract!(
    sessions_create_current_list_and_resume,
    append_turn_orders_titles_and_counts,
    every_block_kind_round_trips,
    compaction_marks_and_places_the_summary_first,
    the_message_revision_counts_appends_and_compactions,
    settings_update_partially,
    metadata_fields_are_set_and_removed,
    health_survives_a_restart,
    offsets_dedup_and_outbox_retry,
    kv_operations_and_scope_isolation,
    kv_usage_follows_every_write_path,
    kv_set_within_refuses_beyond_the_limits_and_keeps_the_data,
    concurrent_sets_cannot_overshoot_a_limit,
    the_ledger_sums_filters_and_groups_and_survives_a_restart,
    child_sessions_keep_their_lineage_and_parents_count_their_spending,
    two_handles_appending_to_one_session_keep_every_turn_whole,
    a_lease_has_one_holder_and_changes_hands_only_with_a_higher_epoch,
    of_many_racing_for_a_free_lease_through_two_handles_exactly_one_gets_it,
    a_keyed_answer_is_stored_with_its_turn_or_not_at_all,
);

// ---- helpers ----

fn temp_db() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("beige.db");
    (dir, path)
}

fn open(path: &Path) -> SqliteStore {
    SqliteStore::open(path).expect("open store")
}

fn raw(path: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(path).expect("raw connection")
}

fn new_session(agent: &str, key: &str) -> NewSession {
    NewSession {
        agent: agent.into(),
        key: key.into(),
        parent_id: None,
        model: Some("anthropic/claude-sonnet-4".into()),
    }
}

fn usage(input: u64, output: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        cache_read_tokens: 1,
        cache_write_tokens: 2,
    }
}

/// A complete turn: user prompt, a tool call, its result, the final answer.
fn turn(n: usize) -> Vec<NewMessage> {
    let call_id = format!("call_{n}");
    vec![
        NewMessage::plain(Message::user_text(format!("prompt {n}"))),
        NewMessage {
            message: Message {
                role: Role::Assistant,
                content: vec![Block::ToolUse {
                    id: call_id.clone(),
                    name: "exec".into(),
                    input: json!({"command": format!("echo {n}")}),
                }],
            },
            model: Some("anthropic/claude-sonnet-4".into()),
            usage: Some(usage(100, 10)),
        },
        NewMessage::plain(Message {
            role: Role::User,
            content: vec![Block::ToolResult {
                tool_use_id: call_id,
                content: vec![ToolResultPart::Text {
                    text: format!("{n}\n"),
                }],
                is_error: false,
            }],
        }),
        NewMessage {
            message: Message::assistant_text(format!("answer {n}")),
            model: Some("anthropic/claude-sonnet-4".into()),
            usage: Some(usage(120, 5)),
        },
    ]
}

fn texts(messages: &[StoredMessage]) -> Vec<String> {
    messages
        .iter()
        .map(|m| match m.message.content.first() {
            Some(Block::ToolUse { id, .. }) => format!("use:{id}"),
            Some(Block::ToolResult { tool_use_id, .. }) => format!("result:{tool_use_id}"),
            _ => m.message.text(),
        })
        .collect()
}

// ---- open, migrations, file ----

#[tokio::test]
async fn migrations_are_idempotent_and_the_file_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let (_dir, path) = temp_db();

    let store = open(&path);
    let s = store
        .create_session(new_session("a", "tui:a:default"))
        .await
        .unwrap();
    // A second store on the same file while the first is open: nothing is re-applied.
    let second = open(&path);
    assert_eq!(second.get_session(&s.id).await.unwrap().unwrap().id, s.id);
    drop((store, second));

    let store = open(&path);
    assert_eq!(
        store
            .current_session("tui:a:default")
            .await
            .unwrap()
            .unwrap()
            .id,
        s.id
    );

    let conn = raw(&path);
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let file_mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(file_mode, 0o600);
}

#[tokio::test]
async fn an_existing_readable_file_is_made_private() {
    use std::os::unix::fs::PermissionsExt;
    let (_dir, path) = temp_db();
    std::fs::write(&path, b"").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let store = open(&path);
    store.set_offset("telegram", 1).await.unwrap();
    let file_mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(file_mode, 0o600);
}

#[test]
fn a_newer_database_is_refused() {
    let (_dir, path) = temp_db();
    drop(open(&path));
    raw(&path)
        .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    let err = SqliteStore::open(&path).unwrap_err();
    assert!(
        matches!(err, StoreError::TooNew { found, supported, .. } if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&path.display().to_string()) && text.contains("upgrade beige"),
        "{text}"
    );
}

#[test]
fn a_file_that_is_not_a_database_is_reported_corrupt() {
    let (_dir, path) = temp_db();
    std::fs::write(&path, "this is not a database\n".repeat(200)).unwrap();
    let err = SqliteStore::open(&path).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("move the file aside"), "{err}");
}

#[test]
fn a_missing_directory_is_reported() {
    let (dir, _) = temp_db();
    let path = dir.path().join("no/such/dir/beige.db");
    let err = SqliteStore::open(&path).unwrap_err();
    assert!(matches!(err, StoreError::CannotOpen { .. }), "{err:?}");
}

#[test]
fn sqlite_errors_are_classified() {
    let path = Path::new("/home/u/.beige/beige.db");
    let sqlite = |code| rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None);
    let kind = |code| sqlite::classify(sqlite(code), path);
    assert!(matches!(
        kind(rusqlite::ffi::SQLITE_BUSY),
        StoreError::Locked { .. }
    ));
    assert!(matches!(
        kind(rusqlite::ffi::SQLITE_LOCKED),
        StoreError::Locked { .. }
    ));
    assert!(matches!(
        kind(rusqlite::ffi::SQLITE_CORRUPT),
        StoreError::Corrupt { .. }
    ));
    assert!(matches!(
        kind(rusqlite::ffi::SQLITE_NOTADB),
        StoreError::Corrupt { .. }
    ));
    assert!(matches!(
        kind(rusqlite::ffi::SQLITE_FULL),
        StoreError::DiskFull { .. }
    ));
    assert!(matches!(
        kind(rusqlite::ffi::SQLITE_READONLY),
        StoreError::CannotOpen { .. }
    ));
    assert!(matches!(
        kind(rusqlite::ffi::SQLITE_MISUSE),
        StoreError::Backend { .. }
    ));
}

#[test]
fn error_messages() {
    let path = PathBuf::from("/home/u/.beige/beige.db");
    insta::assert_snapshot!(StoreError::Locked { path: path.clone() }, @"the database /home/u/.beige/beige.db is locked by another process; stop the other beige gateway using this BEIGE_HOME, or wait and retry");
    insta::assert_snapshot!(StoreError::TooNew { path: path.clone(), found: 7, supported: 1 }, @"the database /home/u/.beige/beige.db has schema version 7, but this beige only knows versions up to 1; upgrade beige, or use a backup made by this version");
    insta::assert_snapshot!(StoreError::Corrupt { path: path.clone(), detail: "file is not a database".into() }, @"the database /home/u/.beige/beige.db is damaged or is not a beige database (file is not a database); stop beige and move the file aside (a new one is created on the next start) or restore a backup");
    insta::assert_snapshot!(StoreError::DiskFull { path }, @"the database /home/u/.beige/beige.db cannot be written: the disk is full; free some space and retry");
    insta::assert_snapshot!(StoreError::NotFound { what: "session", id: "s_0123".into() }, @"session s_0123 does not exist");
}

// ---- sessions ----

async fn sessions_create_current_list_and_resume<B: Backend>() {
    let (_dir, db) = B::temp_db().await;
    let store = db.open().await;
    let key = "telegram:42";
    assert_eq!(store.current_session(key).await.unwrap(), None);

    let first = store
        .create_session(new_session("alice", key))
        .await
        .unwrap();
    assert!(
        first.id.starts_with("s_") && first.id.len() == 18,
        "{}",
        first.id
    );
    assert!(first.id[2..].chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(first.model.as_deref(), Some("anthropic/claude-sonnet-4"));
    assert_eq!(store.current_session(key).await.unwrap().unwrap(), first);

    // `/new`: a new current session; the old one stays.
    let second = store
        .create_session(new_session("alice", key))
        .await
        .unwrap();
    assert_ne!(first.id, second.id);
    assert_eq!(
        store.current_session(key).await.unwrap().unwrap().id,
        second.id
    );
    assert_eq!(store.get_session(&first.id).await.unwrap().unwrap(), first);

    let other = store
        .create_session(new_session("bob", "tui:bob:default"))
        .await
        .unwrap();
    let listed = store.list_sessions("alice").await.unwrap();
    assert_eq!(
        listed.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        [second.id.as_str(), first.id.as_str()]
    );
    assert_eq!(
        store.list_sessions("bob").await.unwrap(),
        std::slice::from_ref(&other)
    );
    assert_eq!(store.list_sessions("nobody").await.unwrap(), []);

    // `/resume`.
    let resumed = store.set_current_session(key, &first.id).await.unwrap();
    assert_eq!(resumed.id, first.id);
    assert_eq!(
        store.current_session(key).await.unwrap().unwrap().id,
        first.id
    );
    let err = store
        .set_current_session(key, "s_missing")
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");

    // Sub-sessions name an existing parent.
    let child = store
        .create_session(NewSession {
            parent_id: Some(first.id.clone()),
            ..new_session("alice", "tool:alice:sub")
        })
        .await
        .unwrap();
    assert_eq!(child.parent_id.as_deref(), Some(first.id.as_str()));
    let err = store
        .create_session(NewSession {
            parent_id: Some("s_missing".into()),
            ..new_session("alice", "tool:alice:sub2")
        })
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
    assert_eq!(
        store.current_session("tool:alice:sub2").await.unwrap(),
        None
    );

    // Title, model, touch.
    store
        .set_session_title(&other.id, "hand-made")
        .await
        .unwrap();
    store
        .set_session_model(&other.id, "openai/gpt-5")
        .await
        .unwrap();
    store.touch(&other.id).await.unwrap();
    let other2 = store.get_session(&other.id).await.unwrap().unwrap();
    assert_eq!(other2.title.as_deref(), Some("hand-made"));
    assert_eq!(other2.model.as_deref(), Some("openai/gpt-5"));
    assert!(other2.updated >= other.updated);
    for err in [
        store.set_session_title("s_missing", "x").await.unwrap_err(),
        store.set_session_model("s_missing", "x").await.unwrap_err(),
        store.touch("s_missing").await.unwrap_err(),
    ] {
        assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
    }
    assert_eq!(store.get_session("s_missing").await.unwrap(), None);
}

#[test]
fn titles_are_collapsed_and_shortened() {
    assert_eq!(title_from("  hello \n  world "), Some("hello world".into()));
    assert_eq!(title_from(" \n\t"), None);
    let long = "word ".repeat(40);
    let title = title_from(&long).unwrap();
    assert_eq!(title.chars().count(), TITLE_MAX_CHARS);
    assert!(title.ends_with("word…"), "{title}");
    let exact = "é".repeat(TITLE_MAX_CHARS);
    assert_eq!(title_from(&exact), Some(exact));
}

// ---- messages ----

async fn append_turn_orders_titles_and_counts<B: Backend>() {
    let (_dir, db) = B::temp_db().await;
    let store = db.open().await;
    let s = store
        .create_session(new_session("a", "api:a:default"))
        .await
        .unwrap();

    // A turn whose first user message is a tool result only does not set the title.
    let ids = store.append_turn(&s.id, turn(1)).await.unwrap();
    assert_eq!(ids.len(), 4);
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    let after = store.get_session(&s.id).await.unwrap().unwrap();
    assert_eq!(after.title.as_deref(), Some("prompt 1"));
    store.append_turn(&s.id, turn(2)).await.unwrap();
    assert_eq!(
        store.append_turn(&s.id, vec![]).await.unwrap(),
        Vec::<i64>::new()
    );

    let s2 = store.get_session(&s.id).await.unwrap().unwrap();
    assert_eq!(
        s2.title.as_deref(),
        Some("prompt 1"),
        "the first user message stays the title"
    );
    assert_eq!(s2.message_count, 8);
    assert_eq!(
        s2.usage,
        Usage {
            input_tokens: 440,
            output_tokens: 30,
            cache_read_tokens: 4,
            cache_write_tokens: 8
        }
    );

    let messages = store.messages(&s.id, false).await.unwrap();
    assert_eq!(
        texts(&messages),
        [
            "prompt 1",
            "use:call_1",
            "result:call_1",
            "answer 1",
            "prompt 2",
            "use:call_2",
            "result:call_2",
            "answer 2"
        ]
    );
    assert_eq!(
        messages.iter().map(|m| m.seq).collect::<Vec<_>>(),
        (1..=8).collect::<Vec<_>>()
    );
    assert_eq!(messages[0].model, None);
    assert_eq!(messages[0].usage, None);
    assert_eq!(
        messages[1].model.as_deref(),
        Some("anthropic/claude-sonnet-4")
    );
    assert_eq!(messages[1].usage, Some(usage(100, 10)));
    assert!(messages.iter().all(|m| !m.compacted && !m.summary));

    let err = store.append_turn("s_missing", turn(3)).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
    let err = store.messages("s_missing", true).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
}

async fn a_keyed_answer_is_stored_with_its_turn_or_not_at_all<B: Backend>() {
    let (_dir, db) = B::temp_db().await;
    let store = db.open().await;
    let s = store
        .create_session(new_session("a", "api:a:default"))
        .await
        .unwrap();
    let answer = |key: &str, response: &str| PromptAnswer {
        agent: "a".into(),
        session_key: "api:a:default".into(),
        key: key.into(),
        request_sha256: "ab".repeat(32),
        session_id: s.id.clone(),
        response: response.into(),
        usage: usage(100, 10),
        created: 0,
    };
    assert_eq!(
        store
            .prompt_answer("a", "api:a:default", "k1")
            .await
            .unwrap(),
        None
    );

    let ids = store
        .append_answered_turn(&s.id, turn(1), None, answer("k1", "answer 1"))
        .await
        .unwrap();
    assert_eq!(ids.len(), 4, "the turn is stored");
    let got = store
        .prompt_answer("a", "api:a:default", "k1")
        .await
        .unwrap()
        .expect("the answer is stored with its turn");
    assert_eq!(got.response, "answer 1");
    assert_eq!(got.session_id, s.id);
    assert_eq!(got.request_sha256, "ab".repeat(32));
    assert_eq!(got.usage, usage(100, 10));
    assert!(got.created > 0, "the store stamps the time");
    // Scoped by agent and session key as well as by key.
    assert_eq!(
        store
            .prompt_answer("b", "api:a:default", "k1")
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store.prompt_answer("a", "api:a:other", "k1").await.unwrap(),
        None
    );

    // A second answer under the same identity keeps the first.
    store
        .append_answered_turn(&s.id, turn(2), None, answer("k1", "answer 2"))
        .await
        .unwrap();
    let kept = store
        .prompt_answer("a", "api:a:default", "k1")
        .await
        .unwrap();
    assert_eq!(kept.map(|a| a.response).as_deref(), Some("answer 1"));

    // A turn that cannot be stored stores no answer either.
    let mut missing = answer("k2", "never");
    missing.session_id = "s_missing".into();
    let err = store
        .append_answered_turn("s_missing", turn(3), None, missing)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
    assert_eq!(
        store
            .prompt_answer("a", "api:a:default", "k2")
            .await
            .unwrap(),
        None
    );
    let s2 = store.get_session(&s.id).await.unwrap().unwrap();
    assert_eq!(s2.message_count, 8, "two turns, each stored once");
}

#[tokio::test]
async fn a_failure_mid_turn_stores_nothing_of_the_turn() {
    let (_dir, path) = temp_db();
    let store = open(&path);
    let s = store
        .create_session(new_session("a", "api:a:default"))
        .await
        .unwrap();
    let before = store.get_session(&s.id).await.unwrap().unwrap();

    // Inject a failure at the third insert of the turn, from another connection.
    raw(&path)
        .execute_batch(
            "CREATE TRIGGER poison BEFORE INSERT ON messages WHEN NEW.content LIKE '%POISON%'
             BEGIN SELECT RAISE(ABORT, 'injected failure'); END;",
        )
        .unwrap();
    let mut bad = turn(1);
    bad[2] = NewMessage::plain(Message::user_text("POISON"));
    let err = store.append_turn(&s.id, bad).await.unwrap_err();
    assert!(err.to_string().contains("injected failure"), "{err}");

    assert_eq!(store.messages(&s.id, true).await.unwrap(), []);
    let after = store.get_session(&s.id).await.unwrap().unwrap();
    assert_eq!(
        after, before,
        "no title, no count, no `updated` from the failed turn"
    );

    // The next turn starts cleanly at seq 1.
    raw(&path).execute_batch("DROP TRIGGER poison").unwrap();
    store.append_turn(&s.id, turn(2)).await.unwrap();
    let messages = store.messages(&s.id, true).await.unwrap();
    assert_eq!(messages.first().map(|m| m.seq), Some(1));
    assert_eq!(messages.len(), 4);
}

async fn every_block_kind_round_trips<B: Backend>() {
    let (_dir, db) = B::temp_db().await;
    let store = db.open().await;
    let s = store
        .create_session(new_session("a", "api:a:default"))
        .await
        .unwrap();
    let user = Message {
        role: Role::User,
        content: vec![
            Block::Text {
                text: "look at this ✓ \"quoted\"\n".into(),
            },
            Block::Image {
                data: "iVBORw0KGgo=".into(),
                mime_type: "image/png".into(),
            },
            Block::ToolResult {
                tool_use_id: "t1".into(),
                content: vec![
                    ToolResultPart::Text { text: "out".into() },
                    ToolResultPart::Image {
                        data: "R0lGOD==".into(),
                        mime_type: "image/gif".into(),
                    },
                ],
                is_error: true,
            },
        ],
    };
    let assistant = Message {
        role: Role::Assistant,
        content: vec![
            Block::Thinking {
                thinking: "hmm".into(),
                signature: Some("sig==".into()),
            },
            Block::Thinking {
                thinking: "no signature".into(),
                signature: None,
            },
            Block::ToolUse {
                id: "t2".into(),
                name: "write".into(),
                input: json!({"path": "a.txt", "content": "x", "nested": {"n": [1, 2.5, null, true]}}),
            },
            Block::Text {
                text: String::new(),
            },
        ],
    };
    store
        .append_turn(
            &s.id,
            vec![
                NewMessage::plain(user.clone()),
                NewMessage::plain(assistant.clone()),
            ],
        )
        .await
        .unwrap();
    drop(store);
    let store = db.open().await;
    let stored = store.messages(&s.id, true).await.unwrap();
    assert_eq!(
        stored.iter().map(|m| m.message.clone()).collect::<Vec<_>>(),
        [user, assistant]
    );
}

async fn the_message_revision_counts_appends_and_compactions<B: Backend>() {
    let (_dir, db) = B::temp_db().await;
    let store = db.open().await;
    let s = store
        .create_session(new_session("a", "api:a:default"))
        .await
        .unwrap();
    let revision = |store: &B::Store| {
        let store = store.clone();
        let id = s.id.clone();
        async move { store.message_revision(&id).await.unwrap() }
    };
    assert_eq!(revision(&store).await, Some(0));
    store.append_turn(&s.id, turn(1)).await.unwrap();
    store.append_turn(&s.id, turn(2)).await.unwrap();
    assert_eq!(revision(&store).await, Some(2), "one per appended turn");
    // Nothing to append changes nothing; neither do writes that leave the messages be.
    store.append_turn(&s.id, Vec::new()).await.unwrap();
    store.set_session_title(&s.id, "t").await.unwrap();
    store.set_session_model(&s.id, "p/m").await.unwrap();
    store.touch(&s.id).await.unwrap();
    assert_eq!(revision(&store).await, Some(2));
    store
        .compact(&s.id, 4, Message::user_text("summary"))
        .await
        .unwrap();
    assert_eq!(revision(&store).await, Some(3), "a compaction counts");
    // A failed compaction changes nothing.
    assert!(store
        .compact(&s.id, 4, Message::user_text("again"))
        .await
        .is_err());
    assert_eq!(revision(&store).await, Some(3));
    // Another handle (after a restart) reads the same revision.
    assert_eq!(revision(&db.open().await).await, Some(3));
    assert!(matches!(
        store.message_revision("no-such-session").await,
        Err(StoreError::NotFound { .. })
    ));
}

async fn compaction_marks_and_places_the_summary_first<B: Backend>() {
    let (_dir, db) = B::temp_db().await;
    let store = db.open().await;
    let s = store
        .create_session(new_session("a", "api:a:default"))
        .await
        .unwrap();
    for n in 1..=3 {
        store.append_turn(&s.id, turn(n)).await.unwrap();
    }

    // Compact the first two turns (seq 1..=8).
    store
        .compact(&s.id, 8, Message::user_text("summary A"))
        .await
        .unwrap();
    let context = store.messages(&s.id, false).await.unwrap();
    assert_eq!(
        texts(&context),
        [
            "summary A",
            "prompt 3",
            "use:call_3",
            "result:call_3",
            "answer 3"
        ]
    );
    assert!(context[0].summary && !context[0].compacted);
    assert!(context[1..].iter().all(|m| !m.summary && !m.compacted));

    // History keeps everything, in order, with the summary after what it replaces.
    let all = store.messages(&s.id, true).await.unwrap();
    assert_eq!(all.len(), 13);
    assert!(all[..8].iter().all(|m| m.compacted && !m.summary));
    assert_eq!(all[8].message.text(), "summary A");
    assert_eq!(
        store
            .get_session(&s.id)
            .await
            .unwrap()
            .unwrap()
            .message_count,
        12
    );

    // New turns go after the kept ones; a second compaction replaces the first summary.
    store.append_turn(&s.id, turn(4)).await.unwrap();
    store
        .compact(&s.id, 12, Message::user_text("summary B"))
        .await
        .unwrap();
    assert_eq!(
        texts(&store.messages(&s.id, false).await.unwrap()),
        [
            "summary B",
            "prompt 4",
            "use:call_4",
            "result:call_4",
            "answer 4"
        ]
    );
    // Compacting again at a boundary with nothing new fails and changes nothing.
    let err = store
        .compact(&s.id, 12, Message::user_text("summary C"))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err:?}");
    // Everything compacted: the summary alone is the context, and new turns follow it.
    store
        .compact(&s.id, 16, Message::user_text("summary D"))
        .await
        .unwrap();
    store.append_turn(&s.id, turn(5)).await.unwrap();
    assert_eq!(
        texts(&store.messages(&s.id, false).await.unwrap()),
        [
            "summary D",
            "prompt 5",
            "use:call_5",
            "result:call_5",
            "answer 5"
        ]
    );

    let all = store.messages(&s.id, true).await.unwrap();
    assert_eq!(all.len(), 20 + 3, "nothing was deleted");
    assert_eq!(all.iter().filter(|m| m.summary).count(), 3);
    assert_eq!(all.iter().filter(|m| !m.compacted).count(), 5);
    let summaries: Vec<_> = all
        .iter()
        .filter(|m| m.summary)
        .map(|m| m.message.text())
        .collect();
    assert_eq!(summaries, ["summary A", "summary B", "summary D"]);
    let err = store
        .compact("s_missing", 1, Message::user_text("x"))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
}

// ---- settings and metadata ----

async fn settings_update_partially<B: Backend>() {
    let (_dir, db) = B::temp_db().await;
    let store = db.open().await;
    let key = "telegram:42:7";
    assert_eq!(
        store.get_settings(key).await.unwrap(),
        SessionSettings::default()
    );

    let s = store
        .update_settings(
            key,
            SettingsPatch {
                verbose: Some(Some(true)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        s,
        SessionSettings {
            verbose: Some(true),
            ..Default::default()
        }
    );

    store
        .update_settings(
            key,
            SettingsPatch {
                streaming: Some(Some(false)),
                model_override: Some(Some("openai/gpt-5".into())),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let expected = SessionSettings {
        verbose: Some(true),
        streaming: Some(false),
        model_override: Some("openai/gpt-5".into()),
    };
    assert_eq!(store.get_settings(key).await.unwrap(), expected);

    // Clearing one field leaves the others; settings outlive `/new` and restarts.
    store
        .update_settings(
            key,
            SettingsPatch {
                verbose: Some(None),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    store.create_session(new_session("a", key)).await.unwrap();
    drop(store);
    let store = db.open().await;
    assert_eq!(
        store.get_settings(key).await.unwrap(),
        SessionSettings {
            verbose: None,
            ..expected
        }
    );
    assert_eq!(
        store.get_settings("telegram:43").await.unwrap(),
        SessionSettings::default()
    );
}

async fn metadata_fields_are_set_and_removed<B: Backend>() {
    let (_dir, db) = B::temp_db().await;
    let store = db.open().await;
    let key = "telegram:42";
    assert_eq!(store.get_metadata(key).await.unwrap(), json!({}));
    store
        .set_metadata(
            key,
            "activeModel",
            json!({"provider": "openai", "modelId": "gpt-5"}),
        )
        .await
        .unwrap();
    store.set_metadata(key, "depth", json!(1)).await.unwrap();
    store.set_metadata(key, "depth", json!(2)).await.unwrap();
    assert_eq!(
        store.get_metadata(key).await.unwrap(),
        json!({"activeModel": {"provider": "openai", "modelId": "gpt-5"}, "depth": 2})
    );
    store
        .set_metadata(key, "activeModel", serde_json::Value::Null)
        .await
        .unwrap();
    assert_eq!(store.get_metadata(key).await.unwrap(), json!({"depth": 2}));
    assert_eq!(store.get_metadata("other").await.unwrap(), json!({}));
    // Metadata and settings share the key's row without clobbering each other.
    store
        .update_settings(
            key,
            SettingsPatch {
                verbose: Some(Some(true)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(store.get_metadata(key).await.unwrap(), json!({"depth": 2}));
}

// ---- health ----

async fn health_survives_a_restart<B: Backend>() {
    let (_dir, db) = B::temp_db().await;
    let store = db.open().await;
    let limited = HealthRecord {
        model_key: "openrouter/meta/llama-3".into(),
        cooldown_until: Some(now_ms() + 300_000),
        consecutive_failures: 2,
        last_error: Some("429 rate limited".into()),
    };
    let failing = HealthRecord {
        model_key: "anthropic/claude-sonnet-4".into(),
        cooldown_until: None,
        consecutive_failures: 1,
        last_error: Some("529 overloaded".into()),
    };
    store.save_health(limited.clone()).await.unwrap();
    store.save_health(failing.clone()).await.unwrap();
    let updated = HealthRecord {
        consecutive_failures: 3,
        ..limited.clone()
    };
    store.save_health(updated.clone()).await.unwrap();
    drop(store);

    let store = db.open().await;
    assert_eq!(
        store.load_health().await.unwrap(),
        [failing.clone(), updated]
    );
    store.clear_health("openrouter/meta/llama-3").await.unwrap();
    store.clear_health("never/stored").await.unwrap();
    assert_eq!(store.load_health().await.unwrap(), [failing]);
}

// ---- channels ----

async fn offsets_dedup_and_outbox_retry<B: Backend>() {
    let (_dir, db) = B::temp_db().await;
    let store = db.open().await;

    assert_eq!(store.get_offset("telegram").await.unwrap(), None);
    store.set_offset("telegram", 1001).await.unwrap();
    store.set_offset("telegram", 1002).await.unwrap();
    assert_eq!(store.get_offset("telegram").await.unwrap(), Some(1002));
    assert_eq!(store.get_offset("other").await.unwrap(), None);

    assert!(store.mark_seen("telegram", 1001).await.unwrap());
    assert!(!store.mark_seen("telegram", 1001).await.unwrap());
    assert!(
        store.mark_seen("other", 1001).await.unwrap(),
        "channels are separate"
    );

    // The window keeps the newest SEEN_WINDOW ids.
    for id in 0..SEEN_WINDOW as i64 {
        assert!(store.mark_seen("telegram", 5000 + id).await.unwrap());
    }
    assert!(
        !store.mark_seen("telegram", 5000).await.unwrap(),
        "inside the window"
    );
    assert!(
        store.mark_seen("telegram", 1001).await.unwrap(),
        "pruned, so new again"
    );
    if let Some(raw) = db.raw() {
        let kept: i64 = raw
            .query_row(
                "SELECT COUNT(*) FROM channel_seen WHERE channel = 'telegram'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(kept, SEEN_WINDOW as i64);
    }
    assert!(
        !store.mark_seen("other", 1001).await.unwrap(),
        "other channels are not pruned"
    );

    // Outbox: enqueue, fail once with backoff, survive a restart, deliver once.
    let first = store
        .enqueue_outbox("telegram", json!({"chatId": 42, "text": "one"}))
        .await
        .unwrap();
    let second = store
        .enqueue_outbox("telegram", json!({"chatId": 42, "text": "two"}))
        .await
        .unwrap();
    store
        .enqueue_outbox("slack", json!({"text": "elsewhere"}))
        .await
        .unwrap();
    assert!(first < second);
    let now = now_ms();
    let due = store.due_outbox("telegram", now, 10).await.unwrap();
    assert_eq!(
        due.iter().map(|i| i.id).collect::<Vec<_>>(),
        [first, second]
    );
    assert_eq!(due[0].payload, json!({"chatId": 42, "text": "one"}));
    assert_eq!((due[0].attempts, due[0].channel.as_str()), (0, "telegram"));
    assert_eq!(store.due_outbox("telegram", now, 1).await.unwrap().len(), 1);

    store
        .outbox_retry(first, now + 30_000, "429 retry_after 30")
        .await
        .unwrap();
    drop(store);
    let store = db.open().await;
    let due = store.due_outbox("telegram", now, 10).await.unwrap();
    assert_eq!(due.iter().map(|i| i.id).collect::<Vec<_>>(), [second]);
    store.outbox_done(second).await.unwrap();

    let later = store
        .due_outbox("telegram", now + 30_000, 10)
        .await
        .unwrap();
    assert_eq!(later.len(), 1);
    assert_eq!(later[0].id, first);
    assert_eq!(later[0].attempts, 1);
    assert_eq!(later[0].next_attempt_at, now + 30_000);
    assert_eq!(later[0].last_error.as_deref(), Some("429 retry_after 30"));
    store.outbox_done(first).await.unwrap();
    assert_eq!(
        store.due_outbox("telegram", i64::MAX, 10).await.unwrap(),
        []
    );
    assert_eq!(
        store.due_outbox("slack", i64::MAX, 10).await.unwrap().len(),
        1
    );

    let err = store.outbox_retry(first, now, "gone").await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err:?}");
    // Ids are never reused after delivery.
    let third = store.enqueue_outbox("telegram", json!({})).await.unwrap();
    assert!(third > second);
}

// ---- plugin data ----

async fn kv_operations_and_scope_isolation<B: Backend>() {
    let (_dir, db) = B::temp_db().await;
    let store = db.open().await;
    assert_eq!(store.kv_get("kv", "alice", "k").await.unwrap(), None);
    store.kv_set("kv", "alice", "notes/a", "1").await.unwrap();
    store.kv_set("kv", "alice", "notes/b", "2").await.unwrap();
    store.kv_set("kv", "alice", "notes%c", "3").await.unwrap();
    store.kv_set("kv", "alice", "other", "4").await.unwrap();
    store.kv_set("kv", "alice", "notes/a", "1b").await.unwrap();
    store.kv_set("kv", "bob", "notes/a", "bob's").await.unwrap();
    store
        .kv_set("other-plugin", "alice", "notes/z", "p")
        .await
        .unwrap();

    assert_eq!(
        store
            .kv_get("kv", "alice", "notes/a")
            .await
            .unwrap()
            .as_deref(),
        Some("1b")
    );
    assert_eq!(
        store
            .kv_get("kv", "bob", "notes/a")
            .await
            .unwrap()
            .as_deref(),
        Some("bob's")
    );
    assert_eq!(
        store.kv_list("kv", "alice", "notes/").await.unwrap(),
        ["notes/a", "notes/b"]
    );
    assert_eq!(
        store.kv_list("kv", "alice", "notes%").await.unwrap(),
        ["notes%c"]
    );
    assert_eq!(store.kv_list("kv", "alice", "").await.unwrap().len(), 4);
    assert_eq!(store.kv_list("kv", "bob", "").await.unwrap(), ["notes/a"]);
    assert_eq!(
        store.kv_list("other-plugin", "alice", "").await.unwrap(),
        ["notes/z"]
    );

    assert!(store.kv_del("kv", "alice", "notes/a").await.unwrap());
    assert!(!store.kv_del("kv", "alice", "notes/a").await.unwrap());
    assert_eq!(store.kv_get("kv", "alice", "notes/a").await.unwrap(), None);
    assert_eq!(
        store
            .kv_get("kv", "bob", "notes/a")
            .await
            .unwrap()
            .as_deref(),
        Some("bob's")
    );
}

async fn kv_usage_follows_every_write_path<B: Backend>() {
    let (_dir, db) = B::temp_db().await;
    let store = db.open().await;
    let usage = |entries, bytes| KvUsage { entries, bytes };
    assert_eq!(store.kv_usage("kv", Some("a")).await.unwrap(), usage(0, 0));
    store.kv_set("kv", "a", "k1", "value").await.unwrap(); // 2 + 5
    store.kv_set("kv", "a", "ключ", "é").await.unwrap(); // 8 + 2 bytes of UTF-8
    store.kv_set("kv", "b", "k", "v").await.unwrap();
    assert_eq!(store.kv_usage("kv", Some("a")).await.unwrap(), usage(2, 17));
    // An overwrite counts the new size only.
    store.kv_set("kv", "a", "k1", "v").await.unwrap();
    assert_eq!(store.kv_usage("kv", Some("a")).await.unwrap(), usage(2, 13));
    assert_eq!(store.kv_usage("kv", None).await.unwrap(), usage(3, 15));
    assert!(store.kv_del("kv", "a", "k1").await.unwrap());
    assert!(store.kv_del("kv", "a", "ключ").await.unwrap());
    assert_eq!(store.kv_usage("kv", Some("a")).await.unwrap(), usage(0, 0));
    assert_eq!(store.kv_usage("kv", None).await.unwrap(), usage(1, 2));
    // No usage row is left behind for an emptied scope.
    if let Some(raw) = db.raw() {
        let rows: i64 = raw
            .query_row(
                "SELECT count(*) FROM plugin_kv_usage WHERE scope = 'a'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(rows, 0);
    }
}

async fn kv_set_within_refuses_beyond_the_limits_and_keeps_the_data<B: Backend>() {
    let (_dir, db) = B::temp_db().await;
    let store = db.open().await;
    let limits = KvLimits {
        max_entries: Some(2),
        max_bytes: Some(20),
        ..KvLimits::default()
    };
    let set = |k: &'static str, v: &'static str| {
        let store = store.clone();
        async move { store.kv_set_within("kv", "a", k, v, limits).await.unwrap() }
    };
    assert_eq!(set("k1", "12345678").await, KvWrite::Stored); // 10
    assert_eq!(
        set("k2", "123456789").await, // 11 → 21 > 20
        KvWrite::TooManyBytes {
            used: 10,
            after: 21,
            max: 20
        }
    );
    assert_eq!(set("k2", "12345678").await, KvWrite::Stored); // 20: at the limit
    assert_eq!(
        set("k3", "").await,
        KvWrite::TooManyEntries { held: 2, max: 2 }
    );
    // Overwriting with a value of the same size or smaller passes at the limit.
    assert_eq!(set("k1", "abcdefgh").await, KvWrite::Stored);
    assert_eq!(set("k1", "x").await, KvWrite::Stored);
    assert_eq!(
        store.kv_get("kv", "a", "k2").await.unwrap().as_deref(),
        Some("12345678")
    );
    // Other scopes count separately unless the limit covers the whole plugin.
    let whole = KvLimits {
        max_bytes: Some(25),
        entry_overhead: 2,
        whole_plugin: true,
        ..KvLimits::default()
    };
    assert_eq!(
        store
            .kv_set_within("kv", "b", "k", "v", limits)
            .await
            .unwrap(),
        KvWrite::Stored
    );
    // a: 3 + 10 bytes, b: 2 bytes, 3 entries × 2 = 21; one more of 2 bytes + 2 = 25.
    assert_eq!(
        store
            .kv_set_within("kv", "c", "k", "v", whole)
            .await
            .unwrap(),
        KvWrite::Stored
    );
    assert_eq!(
        store
            .kv_set_within("kv", "d", "k", "v", whole)
            .await
            .unwrap(),
        KvWrite::TooManyBytes {
            used: 25,
            after: 29,
            max: 25
        }
    );
    assert_eq!(store.kv_get("kv", "d", "k").await.unwrap(), None);
}

async fn concurrent_sets_cannot_overshoot_a_limit<B: Backend>() {
    let (_dir, db) = B::temp_db().await;
    let store = db.open().await;
    // Two handles, as two gateways on one database would have.
    let other = db.open().await;
    let limits = KvLimits {
        max_entries: None,
        max_bytes: Some(1000),
        ..KvLimits::default()
    };
    let value = "v".repeat(98); // 100 bytes with a two-character key
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let store = if i % 2 == 0 {
                store.clone()
            } else {
                other.clone()
            };
            let value = value.clone();
            tokio::spawn(async move {
                store
                    .kv_set_within("kv", "a", &format!("{:02}", i), &value, limits)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut stored = 0;
    for t in tasks {
        if t.await.unwrap() == KvWrite::Stored {
            stored += 1;
        }
    }
    assert_eq!(stored, 10);
    assert_eq!(
        store.kv_usage("kv", Some("a")).await.unwrap(),
        KvUsage {
            entries: 10,
            bytes: 1000
        }
    );
}

#[tokio::test]
async fn migrating_counts_the_data_already_stored() {
    let (_dir, path) = temp_db();
    // A version-1 database with plugin data, as an earlier beige left it.
    {
        let conn = raw(&path);
        conn.execute_batch(sqlite::MIGRATIONS[0]).unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        conn.execute_batch(
            "INSERT INTO plugin_kv VALUES ('kv', 'a', 'k1', 'abc', 0);
             INSERT INTO plugin_kv VALUES ('kv', 'a', 'k2', 'de', 0);
             INSERT INTO plugin_kv VALUES ('notes', 'global', 'n', 'x', 0);",
        )
        .unwrap();
    }
    let store = open(&path);
    assert_eq!(
        store.kv_usage("kv", Some("a")).await.unwrap(),
        KvUsage {
            entries: 2,
            bytes: 9
        }
    );
    assert_eq!(
        store.kv_usage("notes", None).await.unwrap(),
        KvUsage {
            entries: 1,
            bytes: 2
        }
    );
    store.kv_set("kv", "a", "k3", "f").await.unwrap();
    assert_eq!(
        store.kv_usage("kv", Some("a")).await.unwrap(),
        KvUsage {
            entries: 3,
            bytes: 12
        }
    );
}

#[tokio::test]
async fn migrating_counts_the_messages_of_sessions_already_stored() {
    let (_dir, path) = temp_db();
    // A version-5 database with one session of three messages (one a summary), as an
    // earlier beige left it.
    {
        let conn = raw(&path);
        for step in &sqlite::MIGRATIONS[..5] {
            conn.execute_batch(step).unwrap();
        }
        conn.pragma_update(None, "user_version", 5).unwrap();
        conn.execute_batch(
            r#"INSERT INTO sessions (id, agent, key, created, updated) VALUES ('s1', 'a', 'k', 0, 0);
               INSERT INTO messages (session_id, seq, content, input_tokens, output_tokens, created)
                   VALUES ('s1', 1, '{"role":"user","content":[]}', NULL, NULL, 0),
                          ('s1', 2, '{"role":"assistant","content":[]}', 10, 3, 0);
               INSERT INTO messages (session_id, seq, sub, content, summary, created)
                   VALUES ('s1', 2, 1, '{"role":"user","content":[]}', 1, 0);"#,
        )
        .unwrap();
    }
    let store = open(&path);
    let s = store.get_session("s1").await.unwrap().unwrap();
    assert_eq!(s.message_count, 2, "the summary is not counted");
    assert_eq!((s.usage.input_tokens, s.usage.output_tokens), (10, 3));
    assert_eq!(store.message_revision("s1").await.unwrap(), Some(0));
    store.append_turn("s1", turn(2)).await.unwrap();
    let s = store.get_session("s1").await.unwrap().unwrap();
    assert_eq!(s.message_count, 6);
    assert_eq!((s.usage.input_tokens, s.usage.output_tokens), (230, 18));
    assert_eq!(store.message_revision("s1").await.unwrap(), Some(1));
}

// ---- crash safety ----

/// The database the crash child writes to.
const CRASH_CHILD_ENV: &str = "BEIGE_STORE_CRASH_CHILD_DB";
/// Printed by the child once it is inside the transaction of the unfinished turn.
const CRASH_MARKER: &str = "CRASH_CHILD in-transaction";
/// How many completed turns the child commits first.
const CRASH_TURNS: usize = 3;

/// When non-zero, [`crash_point`] stops the process after that many inserts of a turn.
static STOP_AFTER_INSERTS: AtomicUsize = AtomicUsize::new(0);

/// Called by `append_turn` after each insert. In the crash child it reports that the
/// transaction is open and half written, then waits for the parent's SIGKILL.
pub(super) fn crash_point(inserted: usize) {
    if STOP_AFTER_INSERTS.load(Ordering::SeqCst) != inserted {
        return;
    }
    println!("{CRASH_MARKER}");
    let _ = std::io::stdout().flush();
    loop {
        std::thread::park();
    }
}

#[tokio::test]
#[ignore = "run by `a_crash_mid_turn_keeps_every_completed_turn` in a child process"]
async fn crash_child() {
    let Some(path) = std::env::var_os(CRASH_CHILD_ENV) else {
        return;
    };
    let store = open(Path::new(&path));
    let s = store
        .create_session(new_session("a", "api:a:default"))
        .await
        .unwrap();
    for n in 1..=CRASH_TURNS {
        store.append_turn(&s.id, turn(n)).await.unwrap();
    }
    println!("CRASH_CHILD session {}", s.id);
    // Big messages overflow the page cache, so uncommitted pages reach the WAL file
    // before the kill: recovery must ignore them, not merely never see them.
    let big = "x".repeat(3 << 20);
    STOP_AFTER_INSERTS.store(2, Ordering::SeqCst);
    let unfinished = vec![
        NewMessage::plain(Message::user_text(format!("unfinished {big}"))),
        NewMessage::plain(Message::assistant_text(format!("unfinished {big}"))),
        NewMessage::plain(Message::user_text("unfinished")),
    ];
    let _ = store.append_turn(&s.id, unfinished).await;
    panic!("the crash point was not reached");
}

#[test]
fn a_crash_mid_turn_keeps_every_completed_turn() {
    use std::os::unix::process::ExitStatusExt;
    let (_dir, path) = temp_db();
    let test_name = format!(
        "{}::crash_child",
        module_path!().trim_start_matches("beige_core::")
    );
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            test_name.as_str(),
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CRASH_CHILD_ENV, &path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();

    // Wait for the child to be inside the unfinished turn's transaction.
    let stdout = child.stdout.take().unwrap();
    let mut session_id = None;
    let mut reached = false;
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.unwrap();
        // libtest may print `test … ` before the child's own output on the same line.
        if let Some((_, id)) = line.split_once("CRASH_CHILD session ") {
            session_id = Some(id.trim().to_string());
        }
        if line.contains(CRASH_MARKER) {
            reached = true;
            break;
        }
    }
    child.kill().unwrap(); // SIGKILL: no destructor, no rollback, no checkpoint.
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(
        reached,
        "the child never reached the crash point ({status}):\n{stderr}"
    );
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{stderr}");
    let session_id = session_id.expect("the child reported its session");

    let wal = PathBuf::from(format!("{}-wal", path.display()));
    let wal_len = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    assert!(
        wal_len > 2 << 20,
        "uncommitted pages should have reached the WAL ({wal_len} bytes)"
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = open(&path);
        let messages = store.messages(&session_id, true).await.unwrap();
        let expected: Vec<String> = (1..=CRASH_TURNS)
            .flat_map(|n| {
                [
                    format!("prompt {n}"),
                    format!("use:call_{n}"),
                    format!("result:call_{n}"),
                    format!("answer {n}"),
                ]
            })
            .collect();
        assert_eq!(texts(&messages), expected);
        let session = store.get_session(&session_id).await.unwrap().unwrap();
        assert_eq!(session.message_count, 4 * CRASH_TURNS as u64);

        let check: String = raw(&path)
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
        let leftovers: i64 = raw(&path)
            .query_row(
                "SELECT COUNT(*) FROM messages WHERE content LIKE '%unfinished%'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(leftovers, 0);

        // The session carries on where the last completed turn ended.
        store.append_turn(&session_id, turn(9)).await.unwrap();
        let messages = store.messages(&session_id, true).await.unwrap();
        assert_eq!(
            messages.last().map(|m| m.seq),
            Some(4 * CRASH_TURNS as i64 + 4)
        );
    });
}

// ---- the cost ledger ----

fn ledger_row(
    agent: &str,
    session: &str,
    model: &str,
    ts: i64,
    usage: Usage,
    cost: i64,
) -> LedgerEntry {
    LedgerEntry {
        ts,
        agent: agent.into(),
        session_id: Some(session.into()),
        session_key: Some(format!("api:{agent}:default")),
        turn_id: Some("t1".into()),
        model: model.into(),
        usage,
        cost_micros: cost,
        unpriced: cost == 0,
        parent_session_id: None,
    }
}

async fn the_ledger_sums_filters_and_groups_and_survives_a_restart<B: Backend>() {
    let (_dir, backend) = B::temp_db().await;
    let store = backend.open().await;
    let day = 86_400_000;
    let u = |i, o, r, w| Usage {
        input_tokens: i,
        output_tokens: o,
        cache_read_tokens: r,
        cache_write_tokens: w,
    };
    // Day 10: two calls of a in s1; day 11: one of a in s2 (unpriced), one of b.
    store
        .record_usage(ledger_row(
            "a",
            "s1",
            "p/m1",
            10 * day + 5,
            u(100, 10, 1000, 50),
            700,
        ))
        .await
        .unwrap();
    store
        .record_usage(ledger_row(
            "a",
            "s1",
            "p/m2",
            10 * day + 9,
            u(200, 20, 0, 0),
            300,
        ))
        .await
        .unwrap();
    store
        .record_usage(ledger_row("a", "s2", "p/m1", 11 * day, u(1, 2, 3, 4), 0))
        .await
        .unwrap();
    store
        .record_usage(ledger_row(
            "b",
            "s3",
            "p/m1",
            11 * day + 1,
            u(7, 7, 7, 7),
            49,
        ))
        .await
        .unwrap();
    let store = backend.open().await;

    let s1 = store
        .usage_totals(LedgerFilter {
            session_id: Some("s1".into()),
            ..LedgerFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        s1,
        UsageTotals {
            calls: 2,
            input_tokens: 300,
            output_tokens: 30,
            cache_read_tokens: 1000,
            cache_write_tokens: 50,
            cost_micros: 1000,
            unpriced_calls: 0,
        }
    );
    assert_eq!(s1.tokens(), 380, "cache reads are not budget tokens");
    let a_today = store
        .usage_totals(LedgerFilter {
            agent: Some("a".into()),
            since_ms: Some(11 * day),
            ..LedgerFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        (a_today.calls, a_today.unpriced_calls, a_today.cost_micros),
        (1, 1, 0)
    );
    let none = store
        .usage_totals(LedgerFilter {
            agent: Some("nobody".into()),
            ..LedgerFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(none, UsageTotals::default());

    let keys = |r: &UsageReport| r.rows.iter().map(|r| r.key.clone()).collect::<Vec<_>>();
    let by_model = store
        .usage_report(UsageQuery {
            by: UsageGroupBy::Model,
            ..UsageQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(keys(&by_model), ["p/m1", "p/m2"]);
    assert_eq!(by_model.rows[0].totals.calls, 3);
    assert_eq!(by_model.total.cost_micros, 1049);
    assert_eq!(by_model.total.input_tokens, 308);
    let by_day = store
        .usage_report(UsageQuery {
            agent: Some("a".into()),
            by: UsageGroupBy::Day,
            ..UsageQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(keys(&by_day), ["1970-01-11", "1970-01-12"]);
    assert_eq!(by_day.rows[1].totals.input_tokens, 1);
    let by_session = store
        .usage_report(UsageQuery {
            since_ms: Some(10 * day + 6),
            by: UsageGroupBy::Session,
            ..UsageQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(keys(&by_session), ["s1", "s2", "s3"]);
    assert_eq!(
        by_session.rows[0].totals.calls, 1,
        "the call before `since` is left out"
    );
    let by_agent = store.usage_report(UsageQuery::default()).await.unwrap();
    assert_eq!(keys(&by_agent), ["a", "b"]);
    assert_eq!(by_agent.rows[1].totals.cost_micros, 49);
}

async fn child_sessions_keep_their_lineage_and_parents_count_their_spending<B: Backend>() {
    let (_dir, backend) = B::temp_db().await;
    let store = backend.open().await;
    let root = store
        .create_session(NewSession {
            agent: "a".into(),
            key: "telegram:1".into(),
            ..NewSession::default()
        })
        .await
        .unwrap();
    let lineage = |parent: &str, depth| Lineage {
        parent_session_id: parent.to_string(),
        depth,
        invoked_by_exec: Some("x_1".into()),
        rights: json!({"tools": ["kv"], "maxDepth": 2}),
    };
    let child = store
        .create_child_session(
            NewSession {
                agent: "r".into(),
                key: "spawn:telegram:1:r:1".into(),
                ..NewSession::default()
            },
            lineage(&root.id, 1),
        )
        .await
        .unwrap();
    assert_eq!(child.parent_id.as_deref(), Some(root.id.as_str()));
    let grandchild = store
        .create_child_session(
            NewSession {
                agent: "r".into(),
                key: "spawn:x:r:2".into(),
                ..NewSession::default()
            },
            lineage(&child.id, 2),
        )
        .await
        .unwrap();
    let store = backend.open().await;
    assert_eq!(
        store.session_lineage(&grandchild.id).await.unwrap(),
        Some(lineage(&child.id, 2))
    );
    assert_eq!(store.session_lineage(&root.id).await.unwrap(), None);
    // A parent that does not exist: nothing is created.
    let missing = store
        .create_child_session(
            NewSession {
                agent: "r".into(),
                key: "spawn:none".into(),
                ..NewSession::default()
            },
            lineage("s_00000000000000ff", 1),
        )
        .await;
    assert!(
        matches!(missing, Err(StoreError::NotFound { .. })),
        "{missing:?}"
    );
    assert_eq!(store.current_session("spawn:none").await.unwrap(), None);

    let row = |agent: &str, session: &str, parent: Option<&str>, cost| LedgerEntry {
        parent_session_id: parent.map(str::to_string),
        ..ledger_row(agent, session, "p/m", 1, Usage::default(), cost)
    };
    for r in [
        row("a", &root.id, None, 100),
        row("r", &child.id, Some(&root.id), 20),
        row("r", &grandchild.id, Some(&child.id), 3),
        row("b", "s_other", None, 1000),
    ] {
        store.record_usage(r).await.unwrap();
    }
    let cost = |session: &str, with_children| {
        let store = store.clone();
        let session = session.to_string();
        async move {
            store
                .usage_totals(LedgerFilter {
                    session_id: Some(session),
                    with_children,
                    ..LedgerFilter::default()
                })
                .await
                .unwrap()
                .cost_micros
        }
    };
    assert_eq!(cost(&root.id, false).await, 100);
    assert_eq!(cost(&root.id, true).await, 123);
    assert_eq!(cost(&child.id, true).await, 23);
    assert_eq!(cost(&grandchild.id, true).await, 3);
}
/// Two handles on one database (two gateways) appending to one session at once: every
/// turn is stored whole and contiguous, `seq` runs 1..n without a gap or a repeat, and
/// the session's count agrees.
async fn two_handles_appending_to_one_session_keep_every_turn_whole<B: Backend>() {
    let (_dir, db) = B::temp_db().await;
    let a = db.open().await;
    let b = db.open().await;
    let session = a.create_session(new_session("a", "k")).await.unwrap();
    let tasks: Vec<_> = (0..20)
        .map(|n| {
            let store = if n % 2 == 0 { a.clone() } else { b.clone() };
            let id = session.id.clone();
            tokio::spawn(async move { store.append_turn(&id, turn(n)).await.unwrap() })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().len(), turn(0).len());
    }
    let messages = b.messages(&session.id, false).await.unwrap();
    let per_turn = turn(0).len();
    assert_eq!(messages.len(), 20 * per_turn);
    let seqs: Vec<i64> = messages.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, (1..=messages.len() as i64).collect::<Vec<_>>());
    let mut seen = BTreeSet::new();
    for chunk in messages.chunks(per_turn) {
        let n: usize = chunk[0]
            .message
            .text()
            .strip_prefix("prompt ")
            .and_then(|n| n.parse().ok())
            .expect("a turn starts with its prompt");
        let call = serde_json::to_string(&chunk[1].message).unwrap();
        assert!(
            call.contains(&format!("call_{n}")),
            "turn {n} is interleaved: {call}"
        );
        assert!(seen.insert(n), "turn {n} twice");
    }
    let record = a.get_session(&session.id).await.unwrap().unwrap();
    assert_eq!(record.message_count, messages.len() as u64);
}

// ---- leases ----

/// A lease is one holder's until it expires or is released; each new holder gets a
/// higher epoch, and an earlier holder's fence stops checking — its renewal and its
/// release find nothing.
async fn a_lease_has_one_holder_and_changes_hands_only_with_a_higher_epoch<B: Backend>() {
    use std::time::Duration;
    let (_dir, db) = B::temp_db().await;
    let a = db.open().await;
    let b = db.open().await;
    let ttl = Duration::from_millis(1000);
    assert_eq!(a.lease("agent:x").await.unwrap(), None);
    let first = a
        .acquire_lease("agent:x", "r1", ttl)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((first.holder.as_str(), first.epoch), ("r1", 1));
    assert_eq!(b.acquire_lease("agent:x", "r2", ttl).await.unwrap(), None);
    assert!(b.check_fence(&first).await.unwrap());
    // The same holder taking it again (a restart) fences its earlier self.
    let restarted = a
        .acquire_lease("agent:x", "r1", ttl)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(restarted.epoch, 2);
    assert!(!a.check_fence(&first).await.unwrap());
    assert!(!a.release_lease(&first).await.unwrap());
    let first = restarted;
    let other = b
        .acquire_lease("agent:y", "r2", ttl)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(other.epoch, 1, "epochs are per lease");
    // Renewing keeps r1's lease past the first ttl.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        a.renew_leases("r1", ttl).await.unwrap(),
        vec![first.clone()]
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(a.check_fence(&first).await.unwrap(), "renewed");
    assert_eq!(b.acquire_lease("agent:x", "r2", ttl).await.unwrap(), None);
    // Not renewed: it expires and another takes it over with a higher epoch.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(!a.check_fence(&first).await.unwrap(), "expired");
    let second = b
        .acquire_lease("agent:x", "r2", ttl)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((second.holder.as_str(), second.epoch), ("r2", 3));
    // The stale holder is fenced everywhere.
    assert!(!a.check_fence(&first).await.unwrap());
    assert_eq!(
        a.renew_leases("r1", ttl).await.unwrap(),
        Vec::<Fence>::new()
    );
    assert!(!a.release_lease(&first).await.unwrap());
    let info = a.lease("agent:x").await.unwrap().unwrap();
    assert_eq!((info.holder.as_deref(), info.epoch), (Some("r2"), 3));
    // Released, it is free at once, and the next holder's epoch is higher still.
    assert!(b.release_lease(&second).await.unwrap());
    assert!(!b.check_fence(&second).await.unwrap());
    let third = a
        .acquire_lease("agent:x", "r1", ttl)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(third.epoch, 4);
    // Opened again (a restart), the lease is as it was.
    let again = db.open().await;
    assert!(again.check_fence(&third).await.unwrap());
}

/// Twenty holders on two handles race for one free lease: exactly one gets it.
async fn of_many_racing_for_a_free_lease_through_two_handles_exactly_one_gets_it<B: Backend>() {
    let (_dir, db) = B::temp_db().await;
    let a = db.open().await;
    let b = db.open().await;
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                store
                    .acquire_lease(
                        "channel:telegram",
                        &format!("r{i}"),
                        std::time::Duration::from_secs(30),
                    )
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut won = Vec::new();
    for t in tasks {
        if let Some(fence) = t.await.unwrap() {
            won.push(fence);
        }
    }
    assert_eq!(won.len(), 1, "{won:?}");
    assert_eq!(won[0].epoch, 1);
    assert!(a.check_fence(&won[0]).await.unwrap());
}

// ---- schedules ----

#[path = "schedule_tests.rs"]
mod schedules;

// ---- PostgreSQL ----

#[path = "postgres_tests.rs"]
mod postgres;
