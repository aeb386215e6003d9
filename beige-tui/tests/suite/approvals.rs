//! Approval cards: the keys that answer them (sent through `decide_approval` with the
//! request's digest), the gateway's answers and refusals, decisions made elsewhere.

use std::sync::Arc;

use beige_client::approvals::{ApprovalMode, ApprovalStatus, Scope, Verdict};
use beige_client::events::AgentEvent;
use beige_client::Principal;
use beige_tui::app::{App, Cell};
use beige_tui::runtime::Driver;
use beige_tui::update::{self, Effect, Msg};
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::fake::{approval, ApprovingGateway, FakeGateway};

fn key(c: char) -> Msg {
    Msg::Key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE))
}

fn card(app: &App, id: &str) -> beige_tui::app::ApprovalCell {
    app.cells
        .iter()
        .find_map(|c| match c {
            Cell::Approval(a) if a.approval.id == id => Some((**a).clone()),
            _ => None,
        })
        .expect("an approval card")
}

/// A driver whose prompt is running (held open) and has asked for approval `id`.
async fn asked(id: &str) -> (Arc<FakeGateway>, Arc<ApprovingGateway>, Driver) {
    let fake = Arc::new(FakeGateway::new());
    let gw = Arc::new(ApprovingGateway::new(fake.clone()));
    gw.approvals.lock().unwrap().push(approval(id));
    fake.script(
        vec![AgentEvent::ApprovalRequest {
            approval: approval(id),
        }],
        true,
    );
    let agents = fake.agents.lock().unwrap().clone();
    let app = App::new("http://127.0.0.1:7433", agents, "assistant", (80, 24));
    let mut d = Driver::new(app, gw.clone());
    d.execute(Effect::LoadAgent {
        agent: "assistant".into(),
    });
    d.settle().await;
    for c in "push it".chars() {
        d.dispatch(key(c));
    }
    d.dispatch(Msg::Key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE)));
    let first = d.recv().await.expect("the approval request");
    d.dispatch(first);
    assert!(d.app.is_running());
    (fake, gw, d)
}

#[tokio::test]
async fn y_approves_once_with_the_digest_and_the_card_says_so() {
    let (fake, gw, mut d) = asked("AP7Q2M4XK9R3T5VW").await;
    // The prompt went out attended, so the gateway streams its approval requests.
    assert_eq!(
        fake.prompts.lock().unwrap()[0].approvals,
        ApprovalMode::Stream
    );
    assert!(card(&d.app, "AP7Q2M4XK9R3T5VW").answerable());

    d.dispatch(key('y'));
    assert!(
        d.app.composer.is_empty(),
        "the key must not reach the input"
    );
    assert_eq!(
        card(&d.app, "AP7Q2M4XK9R3T5VW").sending.as_deref(),
        Some("approve once")
    );
    let answer = d.recv().await.expect("the gateway's answer");
    d.dispatch(answer);

    let decisions = gw.decisions.lock().unwrap().clone();
    assert_eq!(decisions.len(), 1);
    let (id, decision, approver) = &decisions[0];
    assert_eq!(id, "AP7Q2M4XK9R3T5VW");
    assert_eq!(decision.decision, Verdict::Approve);
    assert_eq!(decision.scope, Scope::Once);
    assert_eq!(
        decision.call_digest.as_deref(),
        Some("digest-of-AP7Q2M4XK9R3T5VW")
    );
    assert_eq!(*approver, Principal::ApiToken);
    let c = card(&d.app, "AP7Q2M4XK9R3T5VW");
    assert_eq!(c.approval.status, ApprovalStatus::Approved);
    assert!(!c.answerable());

    // Nothing is pending any more: the same key types again.
    d.dispatch(key('y'));
    assert_eq!(d.app.composer.text(), "y");
    assert_eq!(gw.decisions.lock().unwrap().len(), 1);
    d.shutdown().await;
}

#[tokio::test]
async fn a_refused_decision_shows_the_gateways_words_and_can_be_retried() {
    let (_fake, gw, mut d) = asked("AP000000000000R9").await;
    *gw.refuse.lock().unwrap() = Some((409, "the call digest does not match".into()));
    d.dispatch(key('n'));
    let answer = d.recv().await.expect("the refusal");
    d.dispatch(answer);
    let c = card(&d.app, "AP000000000000R9");
    let error = c.error.clone().unwrap_or_default();
    assert!(error.contains("409"), "{error}");
    assert!(error.contains("the call digest does not match"), "{error}");
    assert!(c.answerable(), "still pending: another key may try again");
    assert!(d.app.composer.is_empty());
    let decisions = gw.decisions.lock().unwrap().clone();
    assert_eq!(decisions[0].1.decision, Verdict::Deny);
    assert_eq!(
        decisions[0].1.call_digest.as_deref(),
        Some("digest-of-AP000000000000R9")
    );
    d.shutdown().await;
}

#[test]
fn keys_act_only_on_an_empty_input_and_h_is_one_hour() {
    let mut app = App::new("http://x", Vec::new(), "assistant", (80, 24));
    app.composer.set_text("hello");
    let id = app.next_prompt_id;
    update::update(
        &mut app,
        Msg::Key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE)),
    );
    update::update(
        &mut app,
        Msg::Event {
            id,
            event: AgentEvent::ApprovalRequest {
                approval: approval("APHOUR0000000001"),
            },
        },
    );
    // A message being typed is not cut short: `h` goes into it.
    app.composer.set_text("o");
    let effects = update::update(&mut app, key('h'));
    assert!(effects.is_empty());
    assert_eq!(app.composer.text(), "oh");

    app.composer.clear();
    let effects = update::update(&mut app, key('h'));
    match effects.as_slice() {
        [Effect::DecideApproval { id, decision }] => {
            assert_eq!(id, "APHOUR0000000001");
            assert_eq!(decision.scope, Scope::Duration);
            assert_eq!(decision.duration_seconds, Some(3600));
            assert_eq!(
                decision.call_digest.as_deref(),
                Some("digest-of-APHOUR0000000001")
            );
        }
        other => panic!("expected one decision, got {other:?}"),
    }
    assert!(app.composer.is_empty());
}

#[test]
fn a_decision_made_elsewhere_updates_the_card_and_frees_the_keys() {
    let mut app = App::new("http://x", Vec::new(), "assistant", (80, 24));
    app.composer.set_text("hello");
    let id = app.next_prompt_id;
    update::update(
        &mut app,
        Msg::Key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE)),
    );
    let mut a = approval("APELSEWHERE00001");
    update::update(
        &mut app,
        Msg::Event {
            id,
            event: AgentEvent::ApprovalRequest {
                approval: a.clone(),
            },
        },
    );
    a.status = ApprovalStatus::Denied;
    a.decided_by = Some("telegram:42".into());
    a.decision_reason = Some("not on a Friday".into());
    update::update(
        &mut app,
        Msg::Event {
            id,
            event: AgentEvent::ApprovalDecided { approval: a },
        },
    );
    let approvals: Vec<_> = app
        .cells
        .iter()
        .filter(|c| matches!(c, Cell::Approval(_)))
        .collect();
    assert_eq!(approvals.len(), 1, "the same card, updated");
    let c = card(&app, "APELSEWHERE00001");
    assert_eq!(c.approval.decided_by.as_deref(), Some("telegram:42"));
    let effects = update::update(&mut app, key('y'));
    assert!(effects.is_empty());
    assert_eq!(app.composer.text(), "y");
}

#[test]
fn the_call_is_shown_as_data() {
    let mut a = approval("APESCAPE00000001");
    assert_eq!(
        beige_tui::render::approval_call(&a),
        "exec git push origin main"
    );
    a.args = vec![
        "rm".into(),
        "a b".into(),
        String::new(),
        "x\u{202e}y".into(),
        "\u{1b}[2J".into(),
    ];
    assert_eq!(
        beige_tui::render::approval_call(&a),
        r#"exec rm "a b" "" "x\u{202e}y" "\u{1b}[2J""#
    );
}
