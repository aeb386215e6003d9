//! The model catalogue: context window, output limit, image input, reasoning and price
//! of well-known models, with per-provider overrides from config.
//!
//! Unknown model ids work with conservative defaults (128k context, 8k output, text only)
//! and one warning in the log per id.

use std::collections::HashSet;
use std::sync::Mutex;

pub use beige_client::llm::ModelInfo;

/// The date the built-in prices were last checked against the providers' lists.
pub const PRICES_AS_OF: &str = "2025-06-01";

/// One built-in entry; the longest matching id prefix wins, so dated ids
/// (`claude-sonnet-4-6-20260101`) match too. Prices are US dollars per million tokens.
struct Entry {
    prefix: &'static str,
    context: u64,
    max_output: u32,
    images: bool,
    reasoning: bool,
    input: f64,
    output: f64,
    cache_read: f64,
    cache_write: f64,
}

const fn e(
    prefix: &'static str,
    context: u64,
    max_output: u32,
    (images, reasoning): (bool, bool),
    (input, output, cache_read, cache_write): (f64, f64, f64, f64),
) -> Entry {
    Entry {
        prefix,
        context,
        max_output,
        images,
        reasoning,
        input,
        output,
        cache_read,
        cache_write,
    }
}

/// Anthropic bills cache writes (5-minute) at 1.25× and reads at 0.1× input; OpenAI and
/// Google do not bill writes and bill reads at their "cached input" price.
const BUILTIN: &[Entry] = &[
    e(
        "claude-opus-4",
        200_000,
        32_000,
        (true, true),
        (15.0, 75.0, 1.5, 18.75),
    ),
    e(
        "claude-sonnet-4",
        200_000,
        64_000,
        (true, true),
        (3.0, 15.0, 0.3, 3.75),
    ),
    e(
        "claude-haiku-4",
        200_000,
        64_000,
        (true, true),
        (1.0, 5.0, 0.1, 1.25),
    ),
    e(
        "claude-3-7-sonnet",
        200_000,
        64_000,
        (true, true),
        (3.0, 15.0, 0.3, 3.75),
    ),
    e(
        "claude-3-5-haiku",
        200_000,
        8_192,
        (true, false),
        (0.8, 4.0, 0.08, 1.0),
    ),
    e(
        "gpt-4o-mini",
        128_000,
        16_384,
        (true, false),
        (0.15, 0.6, 0.075, 0.0),
    ),
    e(
        "gpt-4o",
        128_000,
        16_384,
        (true, false),
        (2.5, 10.0, 1.25, 0.0),
    ),
    e(
        "gpt-4.1-mini",
        1_047_576,
        32_768,
        (true, false),
        (0.4, 1.6, 0.1, 0.0),
    ),
    e(
        "gpt-4.1",
        1_047_576,
        32_768,
        (true, false),
        (2.0, 8.0, 0.5, 0.0),
    ),
    e(
        "gpt-5-mini",
        400_000,
        128_000,
        (true, true),
        (0.25, 2.0, 0.025, 0.0),
    ),
    e(
        "gpt-5",
        400_000,
        128_000,
        (true, true),
        (1.25, 10.0, 0.125, 0.0),
    ),
    e("o3", 200_000, 100_000, (true, true), (2.0, 8.0, 0.5, 0.0)),
    e(
        "o4-mini",
        200_000,
        100_000,
        (true, true),
        (1.1, 4.4, 0.275, 0.0),
    ),
    e(
        "gemini-2.5-pro",
        1_048_576,
        65_536,
        (true, true),
        (1.25, 10.0, 0.31, 0.0),
    ),
    e(
        "gemini-2.5-flash",
        1_048_576,
        65_536,
        (true, true),
        (0.3, 2.5, 0.075, 0.0),
    ),
    e(
        "gemini-2.0-flash",
        1_048_576,
        8_192,
        (true, false),
        (0.1, 0.4, 0.025, 0.0),
    ),
];

static WARNED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Look a model up: config override, else the built-in table, else defaults.
pub fn lookup(id: &str, overrides: Option<&serde_json::Value>) -> ModelInfo {
    let mut info = BUILTIN
        .iter()
        .filter(|entry| id.starts_with(entry.prefix))
        .max_by_key(|entry| entry.prefix.len())
        .map(|entry| ModelInfo {
            id: id.to_string(),
            context_window: entry.context,
            max_output_tokens: entry.max_output,
            images: entry.images,
            reasoning: entry.reasoning,
            cost_input: entry.input,
            cost_output: entry.output,
            cost_cache_read: entry.cache_read,
            cost_cache_write: entry.cache_write,
            priced: true,
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
        cost_cache_read: 0.0,
        cost_cache_write: 0.0,
        priced: false,
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
        // `cost: {input, output, cacheRead, cacheWrite}`, or the flat `costInput`, … keys.
        let cost = o.get("cost").and_then(|v| v.as_object());
        let price = |nested: &str, flat: &str| {
            cost.and_then(|c| c.get(nested))
                .and_then(|v| v.as_f64())
                .or_else(|| f64_of(flat))
        };
        for (nested, flat, slot) in [
            ("input", "costInput", &mut base.cost_input),
            ("output", "costOutput", &mut base.cost_output),
            ("cacheRead", "costCacheRead", &mut base.cost_cache_read),
            ("cacheWrite", "costCacheWrite", &mut base.cost_cache_write),
        ] {
            if let Some(v) = price(nested, flat) {
                *slot = v;
                base.priced = true;
            }
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
        assert!(!custom.priced, "no price was given");
    }

    #[test]
    fn prices_cover_cache_tokens_and_can_be_overridden() {
        let sonnet = lookup("claude-sonnet-4-6", None);
        assert!(sonnet.priced);
        let usage = crate::llm::Usage {
            input_tokens: 1000,
            output_tokens: 200,
            cache_read_tokens: 10_000,
            cache_write_tokens: 2000,
        };
        // 1000×3 + 200×15 + 10000×0.3 + 2000×3.75 micro-dollars.
        assert_eq!(sonnet.cost_micros(&usage), 3000 + 3000 + 3000 + 7500);
        let o = serde_json::json!({"cost": {"input": 1, "output": 2, "cacheRead": 0.5, "cacheWrite": 4}});
        let local = lookup("llama3.1:8b", Some(&o));
        assert!(local.priced);
        assert_eq!(local.cost_micros(&usage), 1000 + 400 + 5000 + 8000);
        let flat = lookup("llama3.1:8b", Some(&serde_json::json!({"costInput": 0})));
        assert!(flat.priced, "an explicit price of 0 is a price");
        assert_eq!(flat.cost_micros(&usage), 0);
    }
}
