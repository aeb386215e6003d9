//! The cost ledger as clients read it: [`UsageQuery`] (which model calls, grouped how)
//! and [`UsageReport`] (token and cost totals per group), the shapes of
//! `GET /api/usage` and `beige usage --json`.
//!
//! Owns only these wire shapes and the parsing of `since` (`7d`, `12h`, `30m`). Where the
//! rows live (the store's `usage` table) and how costs are priced belong to beige-core.

use serde::{Deserialize, Serialize};

/// How [`UsageReport::rows`] are grouped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UsageGroupBy {
    /// One row per agent.
    #[default]
    Agent,
    /// One row per session id.
    Session,
    /// One row per model (`provider/model`).
    Model,
    /// One row per UTC day (`YYYY-MM-DD`).
    Day,
}

impl UsageGroupBy {
    /// The name used in queries and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            UsageGroupBy::Agent => "agent",
            UsageGroupBy::Session => "session",
            UsageGroupBy::Model => "model",
            UsageGroupBy::Day => "day",
        }
    }
}

impl std::str::FromStr for UsageGroupBy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "agent" => UsageGroupBy::Agent,
            "session" => UsageGroupBy::Session,
            "model" => UsageGroupBy::Model,
            "day" => UsageGroupBy::Day,
            other => {
                return Err(format!(
                    "unknown grouping '{other}': use agent, session, model or day"
                ))
            }
        })
    }
}

/// Which ledger rows to sum, and how to group them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageQuery {
    /// Only this agent's model calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// Only model calls at or after this time (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<i64>,
    /// The grouping.
    #[serde(default)]
    pub by: UsageGroupBy,
}

/// Token and cost totals of some model calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageTotals {
    /// Model calls.
    pub calls: u64,
    /// Input tokens (cache reads and writes not included).
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read_tokens: u64,
    /// Input tokens written to the prompt cache.
    pub cache_write_tokens: u64,
    /// Millionths of a US dollar.
    pub cost_micros: i64,
    /// Calls of models without a price, counted at no cost.
    pub unpriced_calls: u64,
}

impl UsageTotals {
    /// The tokens budgets count: input + output + cache writes.
    pub fn tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens + self.cache_write_tokens
    }

    /// The cost in US dollars.
    pub fn cost_usd(&self) -> f64 {
        self.cost_micros as f64 / 1_000_000.0
    }

    /// Add `other`, field by field.
    pub fn add(&mut self, other: &UsageTotals) {
        self.calls += other.calls;
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cache_read_tokens += other.cache_read_tokens;
        self.cache_write_tokens += other.cache_write_tokens;
        self.cost_micros += other.cost_micros;
        self.unpriced_calls += other.unpriced_calls;
    }
}

/// One group of a [`UsageReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageRow {
    /// The agent, session id, model or day of the group.
    pub key: String,
    /// The group's totals.
    #[serde(flatten)]
    pub totals: UsageTotals,
}

/// The answer of `GET /api/usage`: one row per group, ordered by key, and the total.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageReport {
    /// The grouping of `rows`.
    pub by: UsageGroupBy,
    /// The rows, ordered by key.
    pub rows: Vec<UsageRow>,
    /// All rows together.
    pub total: UsageTotals,
}

impl UsageReport {
    /// A report of `rows`, with their total.
    pub fn new(by: UsageGroupBy, rows: Vec<UsageRow>) -> Self {
        let mut total = UsageTotals::default();
        for r in &rows {
            total.add(&r.totals);
        }
        Self { by, rows, total }
    }
}

/// Parse a duration like `7d`, `12h`, `30m` or `45s` into milliseconds.
pub fn parse_since(text: &str) -> Result<i64, String> {
    let t = text.trim();
    let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: i64 = digits
        .parse()
        .map_err(|_| format!("invalid duration '{text}': use a number and d, h, m or s (7d)"))?;
    let ms = match unit {
        "d" => 86_400_000,
        "h" => 3_600_000,
        "m" => 60_000,
        "s" | "" => 1000,
        _ => {
            return Err(format!(
                "invalid duration '{text}': use a number and d, h, m or s (7d)"
            ))
        }
    };
    n.checked_mul(ms)
        .ok_or_else(|| format!("duration '{text}' is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_parses_units_and_refuses_the_rest() {
        assert_eq!(parse_since("7d"), Ok(7 * 86_400_000));
        assert_eq!(parse_since("12h"), Ok(12 * 3_600_000));
        assert_eq!(parse_since("30m"), Ok(1_800_000));
        assert_eq!(parse_since("45"), Ok(45_000));
        assert!(parse_since("7w").is_err());
        assert!(parse_since("d").is_err());
    }

    #[test]
    fn a_report_sums_its_rows() {
        let row = |key: &str, input, cost| UsageRow {
            key: key.into(),
            totals: UsageTotals {
                calls: 1,
                input_tokens: input,
                cost_micros: cost,
                ..UsageTotals::default()
            },
        };
        let r = UsageReport::new(UsageGroupBy::Model, vec![row("a", 10, 5), row("b", 7, 2)]);
        assert_eq!(
            (r.total.calls, r.total.input_tokens, r.total.cost_micros),
            (2, 17, 7)
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["rows"][0]["inputTokens"], 10);
        assert_eq!(json["by"], "model");
    }
}
