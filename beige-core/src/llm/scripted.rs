//! `ScriptedProvider` — a **scripted model**, not a real one: a deterministic
//! [`LlmProvider`] that plays back prepared answers. Used by `beige demo` and by tests of
//! the agent loop; everything it says is labelled as scripted.
//!
//! Each call takes the next step of the script, and costs next to nothing whatever the
//! request's length (the request log shares the request's messages; the usage it reports
//! counts characters of text, about four a token). A step is a function of the request, so a
//! script can react to tool results (e.g. answer with the number a tool returned).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::{
    Block, EventStream, LlmError, LlmProvider, ModelRequest, ModelResponse, StopReason,
    StreamEvent, Usage,
};

/// Characters of a message's text (text, thinking, tool names and results, image data):
/// the scripted model's stand-in for the tokens a real API counts, cheap enough that a
/// call costs next to nothing however long the conversation is.
fn text_len(m: &super::Message) -> usize {
    m.content
        .iter()
        .map(|b| match b {
            Block::Text { text } => text.len(),
            Block::Thinking { thinking, .. } => thinking.len(),
            Block::ToolUse { name, .. } => name.len(),
            Block::ToolResult { content, .. } => content
                .iter()
                .map(|p| match p {
                    super::ToolResultPart::Text { text } => text.len(),
                    super::ToolResultPart::Image { data, .. } => data.len(),
                })
                .sum(),
            Block::Image { data, .. } => data.len(),
        })
        .sum()
}

/// One step: produce the model's answer to this request.
pub type Step = Box<dyn Fn(&ModelRequest) -> Result<Vec<Block>, LlmError> + Send + Sync>;

/// A scripted model. Cheap to clone; clones share the script and the request log.
#[derive(Clone)]
pub struct ScriptedProvider {
    name: String,
    steps: Arc<Mutex<VecDeque<Step>>>,
    requests: Arc<Mutex<Vec<ModelRequest>>>,
}

impl std::fmt::Debug for ScriptedProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedProvider")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ScriptedProvider {
    /// An empty script under the provider name `name` (the name the config's model refs
    /// use). A call once the script has run out fails with [`LlmError::Config`].
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            steps: Arc::default(),
            requests: Arc::default(),
        }
    }

    /// Add a step computed from the request.
    pub fn then(
        self,
        step: impl Fn(&ModelRequest) -> Result<Vec<Block>, LlmError> + Send + Sync + 'static,
    ) -> Self {
        self.steps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(Box::new(step));
        self
    }

    /// Add a step that answers with text.
    pub fn then_text(self, text: impl Into<String>) -> Self {
        let text = text.into();
        self.then(move |_| Ok(vec![Block::Text { text: text.clone() }]))
    }

    /// Add a step that calls one tool.
    pub fn then_tool(
        self,
        id: impl Into<String>,
        name: impl Into<String>,
        input: serde_json::Value,
    ) -> Self {
        let (id, name) = (id.into(), name.into());
        self.then(move |_| {
            Ok(vec![Block::ToolUse {
                id: id.clone(),
                name: name.clone(),
                input: input.clone(),
            }])
        })
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<ModelRequest> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Steps not yet played.
    pub fn remaining(&self) -> usize {
        self.steps.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[async_trait]
impl LlmProvider for ScriptedProvider {
    fn name(&self) -> &str {
        &self.name
    }

    async fn stream(&self, request: ModelRequest) -> Result<EventStream, LlmError> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(request.clone());
        let step = self
            .steps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
            .ok_or_else(|| LlmError::Config {
                provider: self.name.clone(),
                message: "the scripted model has no more steps".into(),
            })?;
        let content = step(&request)?;
        let mut events = Vec::new();
        for b in &content {
            match b {
                Block::Text { text } => events.push(Ok(StreamEvent::TextDelta(text.clone()))),
                Block::Thinking { thinking, .. } => {
                    events.push(Ok(StreamEvent::ThinkingDelta(thinking.clone())))
                }
                Block::ToolUse { id, name, .. } => events.push(Ok(StreamEvent::ToolUseStarted {
                    id: id.clone(),
                    name: name.clone(),
                })),
                _ => {}
            }
        }
        let stop_reason = if content.iter().any(|b| matches!(b, Block::ToolUse { .. })) {
            StopReason::ToolUse
        } else {
            StopReason::EndTurn
        };
        let chars: usize = request.messages.iter().map(text_len).sum();
        let usage = Usage {
            input_tokens: (chars / 4) as u64,
            output_tokens: content.len() as u64 * 10,
            ..Default::default()
        };
        events.push(Ok(StreamEvent::Completed(ModelResponse {
            content,
            stop_reason,
            usage,
        })));
        Ok(Box::pin(futures_util::stream::iter(events)))
    }
}
