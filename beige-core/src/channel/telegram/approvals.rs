//! Approvals in Telegram: a request of a chat's prompt appears in that chat as a message
//! with inline buttons (`callback_data` `ap:<id>:<o|d>`, 21 bytes); a press is checked
//! (an allowed user, deciding for their own chat) and sent to the gateway as that user;
//! the message is then edited to say who decided. Calls denied in unattended runs are
//! reported to the `approvals.notify` chats.
//!
//! The call is shown as plain text (no parse mode), so nothing the model wrote can
//! format or fake the prompt.

use std::sync::Arc;

use beige_client::approvals::{Approval, ApprovalEvent, ApprovalStatus, ButtonCode};
use futures_util::StreamExt;

use super::api::CallbackQuery;
use super::Ctx;
use crate::api::Principal;

/// The text of a request message.
pub(crate) fn request_text(a: &Approval) -> String {
    let mut text = format!("🔐 Approval needed\n{}", a.call_line());
    if let Some(cwd) = &a.cwd {
        text.push_str(&format!("\nin /workspace/{cwd}"));
    }
    text.push_str(&format!("\nagent {}", a.agent));
    if let Some(rule) = &a.rule {
        text.push_str(&format!(" · rule {rule}"));
    }
    if let Some(j) = &a.justification {
        text.push_str(&format!(": {j}"));
    }
    text.push_str(&format!("\nid {} · expires {}", a.id, a.expires_at));
    text
}

/// The text of a settled request.
pub(crate) fn settled_text(a: &Approval) -> String {
    let by = a.decided_by.as_deref().unwrap_or("?");
    let what = match a.status {
        ApprovalStatus::Approved | ApprovalStatus::Consumed => format!(
            "✅ Approved ({}) by {by}",
            a.scope.map(|s| s.as_str()).unwrap_or("once")
        ),
        ApprovalStatus::Denied => match &a.decision_reason {
            Some(r) => format!("❌ Denied by {by}: {r}"),
            None => format!("❌ Denied by {by}"),
        },
        ApprovalStatus::Expired => "⌛ Expired: nobody answered in time".to_string(),
        ApprovalStatus::Pending => "🔐 Waiting".to_string(),
    };
    format!("{what}\n{}\nid {}", a.call_line(), a.id)
}

/// The buttons under a request: what a chat member may decide.
fn buttons(id: &str) -> Vec<Vec<(String, String)>> {
    vec![vec![
        (
            "✅ Approve once".to_string(),
            ButtonCode::Once.callback_data(id),
        ),
        ("❌ Deny".to_string(), ButtonCode::Deny.callback_data(id)),
    ]]
}

impl Ctx {
    /// Show a request of this chat's prompt, with its buttons.
    pub(crate) async fn show_approval(&self, chat: i64, thread: Option<i64>, a: &Approval) {
        match self
            .api
            .send_with_buttons(chat, thread, &request_text(a), &buttons(&a.id))
            .await
        {
            Ok(message) => {
                self.approval_messages
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(a.id.clone(), (chat, message));
            }
            Err(e) => {
                tracing::warn!(chat, approval = %a.id, error = %e, "could not show an approval request")
            }
        }
    }

    /// Edit a shown request to say how it ended (buttons go).
    async fn show_settled(&self, a: &Approval) {
        let shown = self
            .approval_messages
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&a.id)
            .copied();
        if let Some((chat, message)) = shown {
            if let Err(e) = self
                .api
                .edit_message_text(chat, message, &settled_text(a), false)
                .await
            {
                tracing::debug!(chat, error = %e, "could not edit an approval message");
            }
            if a.status != ApprovalStatus::Pending {
                self.approval_messages
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&a.id);
            }
        }
    }

    /// A button was pressed.
    pub(crate) async fn on_callback(&self, q: CallbackQuery) {
        let answer = self.callback_answer(&q).await;
        if let Err(e) = self.api.answer_callback_query(&q.id, &answer).await {
            tracing::debug!(error = %e, "answerCallbackQuery failed");
        }
    }

    async fn callback_answer(&self, q: &CallbackQuery) -> String {
        let Some((id, code)) = q.data.as_deref().and_then(ButtonCode::parse) else {
            return "This button is not one of beige's.".to_string();
        };
        if q.from.is_bot || !self.cfg.is_allowed(q.from.id) {
            tracing::warn!(
                user = q.from.id,
                approval = id,
                "an approval button pressed by a user not in allowedUsers"
            );
            return "You cannot approve this: your Telegram user id is not in allowedUsers."
                .to_string();
        }
        let principal = Principal::user(super::outbox::CHANNEL, q.from.id.to_string());
        match self
            .gateway
            .decide_approval(id, code.decision(), principal)
            .await
        {
            Ok(a) => {
                self.show_settled(&a).await;
                match code {
                    ButtonCode::Deny => "Denied.".to_string(),
                    _ => "Approved.".to_string(),
                }
            }
            Err(e) => format!("Not decided: {e}"),
        }
    }
}

/// Edit requests decided elsewhere, and report unattended denials to the notify chats,
/// until the channel stops.
pub(crate) async fn follow(ctx: Arc<Ctx>, mut events: beige_client::ApprovalEventStream) {
    while let Some(event) = events.next().await {
        match event {
            ApprovalEvent::ApprovalDecided { approval } => ctx.show_settled(&approval).await,
            ApprovalEvent::UnattendedDenied {
                agent,
                call,
                rule,
                origin,
                notify,
                ..
            } => {
                let rule = rule.map(|r| format!(" (rule {r})")).unwrap_or_default();
                let text = format!(
                    "⚠️ {agent}: '{call}' needed approval{rule} and was denied, because the run is unattended ({origin})."
                );
                for target in notify
                    .iter()
                    .filter(|t| t.channel == super::outbox::CHANNEL)
                {
                    let Ok(chat) = target.chat_id.parse::<i64>() else {
                        tracing::warn!(chat = %target.chat_id, "approvals.notify: not a Telegram chat id");
                        continue;
                    };
                    if let Err(e) = ctx.api.send_message(chat, None, &text, false, None).await {
                        tracing::warn!(chat, error = %e, "could not send an unattended-denial report");
                    }
                }
            }
            ApprovalEvent::ApprovalRequest { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approval() -> Approval {
        Approval {
            id: "ABCDEFGHJKMNPQRS".into(),
            agent: "intern".into(),
            session: "telegram:42".into(),
            exec: None,
            tool: "exec".into(),
            args: vec!["git push <b>origin</b>".into()],
            cwd: None,
            rule: Some("push".into()),
            justification: Some("publishes work".into()),
            reason: "r".into(),
            call_digest: "d".into(),
            status: ApprovalStatus::Pending,
            requested_at: "t0".into(),
            expires_at: "t1".into(),
            decided_by: None,
            scope: None,
            decision_reason: None,
            joined: 0,
            kind: Default::default(),
            attempts: None,
        }
    }

    #[test]
    fn requests_show_the_call_as_plain_text_with_small_buttons() {
        let a = approval();
        let text = request_text(&a);
        assert!(text.contains("exec git push <b>origin</b>"), "{text}");
        assert!(text.contains("rule push: publishes work"));
        for (_, data) in buttons(&a.id).concat() {
            assert!(data.len() <= 64);
            assert!(ButtonCode::parse(&data).is_some());
        }
        let mut done = a.clone();
        done.status = ApprovalStatus::Denied;
        done.decided_by = Some("telegram:42".into());
        assert!(settled_text(&done).starts_with("❌ Denied by telegram:42"));
    }
}
