//! The model catalogue: context window, output limit, image input, reasoning and price
//! of well-known models, with per-provider overrides from config.
//!
//! Unknown model ids work with conservative defaults (128k context, 8k output, text only)
//! and one warning in the log per id.

use std::collections::HashSet;
use std::sync::Mutex;

pub use beige_client::llm::ModelInfo;

/// `(id prefix, context, max output, images, reasoning, $/M in, $/M out)`; the longest
/// matching prefix wins, so dated ids (`claude-sonnet-4-6-20260101`) match too.
const BUILTIN: &[(&str, u64, u32, bool, bool, f64, f64)] = &[
    ("claude-opus-4", 200_000, 32_000, true, true, 15.0, 75.0),
    ("claude-sonnet-4", 200_000, 64_000, true, true, 3.0, 15.0),
    ("claude-haiku-4", 200_000, 64_000, true, true, 1.0, 5.0),
    ("claude-3-7-sonnet", 200_000, 64_000, true, true, 3.0, 15.0),
    ("claude-3-5-haiku", 200_000, 8_192, true, false, 0.8, 4.0),
    ("gpt-4o-mini", 128_000, 16_384, true, false, 0.15, 0.6),
    ("gpt-4o", 128_000, 16_384, true, false, 2.5, 10.0),
    ("gpt-4.1-mini", 1_047_576, 32_768, true, false, 0.4, 1.6),
    ("gpt-4.1", 1_047_576, 32_768, true, false, 2.0, 8.0),
    ("gpt-5-mini", 400_000, 128_000, true, true, 0.25, 2.0),
    ("gpt-5", 400_000, 128_000, true, true, 1.25, 10.0),
    ("o3", 200_000, 100_000, true, true, 2.0, 8.0),
    ("o4-mini", 200_000, 100_000, true, true, 1.1, 4.4),
    ("gemini-2.5-pro", 1_048_576, 65_536, true, true, 1.25, 10.0),
    ("gemini-2.5-flash", 1_048_576, 65_536, true, true, 0.3, 2.5),
    ("gemini-2.0-flash", 1_048_576, 8_192, true, false, 0.1, 0.4),
];

static WARNED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Look a model up: config override, else the built-in table, else defaults.
pub fn lookup(id: &str, overrides: Option<&serde_json::Value>) -> ModelInfo {
    let mut info = BUILTIN
        .iter()
        .filter(|(prefix, ..)| id.starts_with(prefix))
        .max_by_key(|(prefix, ..)| prefix.len())
        .map(|&(_, ctx, out, images, reasoning, cin, cout)| ModelInfo {
            id: id.to_string(),
            context_window: ctx,
            max_output_tokens: out,
            images,
            reasoning,
            cost_input: cin,
            cost_output: cout,
        });
    if info.is_none() && overrides.is_none() {
        let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
        if warned
            .get_or_insert_with(HashSet::new)
            .insert(id.to_string())
        {
            tracing::warn!(model = id, "unknown model id: assuming 128k context, 8k output, text only (set llm.providers.<p>.models.<id> to describe it)");
        }
    }
    let mut base = info.take().unwrap_or_else(|| ModelInfo {
        id: id.to_string(),
        context_window: 128_000,
        max_output_tokens: 8_192,
        images: false,
        reasoning: false,
        cost_input: 0.0,
        cost_output: 0.0,
    });
    if let Some(serde_json::Value::Object(o)) = overrides {
        let u64_of = |k: &str| o.get(k).and_then(|v| v.as_u64());
        let f64_of = |k: &str| o.get(k).and_then(|v| v.as_f64());
        let bool_of = |k: &str| o.get(k).and_then(|v| v.as_bool());
        if let Some(v) = u64_of("contextWindow") {
            base.context_window = v;
        }
        if let Some(v) = u64_of("maxOutputTokens").or_else(|| u64_of("maxTokens")) {
            base.max_output_tokens = u32::try_from(v).unwrap_or(u32::MAX);
        }
        if let Some(v) = bool_of("images") {
            base.images = v;
        }
        if let Some(v) = bool_of("reasoning") {
            base.reasoning = v;
        }
        if let Some(v) = f64_of("costInput") {
            base.cost_input = v;
        }
        if let Some(v) = f64_of("costOutput") {
            base.cost_output = v;
        }
    }
    base
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_prefers_longest_prefix_and_overrides() {
        assert_eq!(lookup("gpt-4o-mini-2024", None).cost_input, 0.15);
        assert_eq!(lookup("gpt-4o", None).cost_input, 2.5);
        assert!(lookup("claude-sonnet-4-6", None).images);
        let unknown = lookup("llama3.1:8b", None);
        assert_eq!(
            (
                unknown.context_window,
                unknown.max_output_tokens,
                unknown.images
            ),
            (128_000, 8_192, false)
        );
        let o = serde_json::json!({"contextWindow": 32000, "images": true});
        let custom = lookup("llama3.1:8b", Some(&o));
        assert_eq!((custom.context_window, custom.images), (32_000, true));
    }
}
