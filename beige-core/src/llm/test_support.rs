//! Assertions shared by the provider clients' tests: the stream ended with exactly one
//! `Completed`, and the text or thinking deltas it carried.

use super::{LlmError, ModelResponse, StreamEvent};

/// The `Completed` response that ends `events`; panics unless it is last and alone.
pub(crate) fn completed(events: &[Result<StreamEvent, LlmError>]) -> ModelResponse {
    let Some(Ok(StreamEvent::Completed(r))) = events.last() else {
        panic!("last event is not Completed: {events:?}");
    };
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, Ok(StreamEvent::Completed(_))))
            .count(),
        1,
        "exactly one Completed"
    );
    r.clone()
}

/// All text deltas, joined.
pub(crate) fn text_deltas(events: &[Result<StreamEvent, LlmError>]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            Ok(StreamEvent::TextDelta(t)) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

/// All thinking deltas, joined.
pub(crate) fn thinking_deltas(events: &[Result<StreamEvent, LlmError>]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            Ok(StreamEvent::ThinkingDelta(t)) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

/// `secret` shows neither in the error's message nor in its debug form.
pub(crate) fn assert_secret_absent(e: &LlmError, secret: &str) {
    assert!(!e.to_string().contains(secret), "{e}");
    assert!(!format!("{e:?}").contains(secret), "{e:?}");
}
