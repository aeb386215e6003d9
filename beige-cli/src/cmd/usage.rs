//! `beige usage`: the cost ledger's totals from the running gateway (`GET /api/usage`
//! through `RemoteGateway`), as a table or, with `--json`, the API's own answer.
//!
//! Owns the command's arguments to query translation and the table; the sums are the
//! gateway's.

use anyhow::Result;
use beige_core::api::usage::{parse_since, UsageQuery, UsageReport, UsageTotals};
use beige_core::api::Admin;

use crate::cli::UsageArgs;
use crate::client::Target;
use crate::Exit;

/// The query `args` ask for, with `since` counted back from `now_ms`.
pub fn query(args: &UsageArgs, now_ms: i64) -> Result<UsageQuery, Exit> {
    let since_ms = match &args.since {
        Some(s) => Some(
            now_ms - parse_since(s).map_err(|e| Exit::new(2, format!("error: --since: {e}")))?,
        ),
        None => None,
    };
    Ok(UsageQuery {
        agent: args.agent.clone(),
        since_ms,
        by: args.by,
    })
}

/// What `--json` prints: the report as `GET /api/usage` answers it.
pub fn json(report: &UsageReport) -> Result<String> {
    Ok(serde_json::to_string_pretty(report)?)
}

fn cells(key: &str, t: &UsageTotals) -> [String; 7] {
    [
        key.to_string(),
        t.calls.to_string(),
        t.input_tokens.to_string(),
        t.output_tokens.to_string(),
        t.cache_read_tokens.to_string(),
        t.cache_write_tokens.to_string(),
        if t.unpriced_calls > 0 {
            format!("${:.4} ({} unpriced)", t.cost_usd(), t.unpriced_calls)
        } else {
            format!("${:.4}", t.cost_usd())
        },
    ]
}

/// The report as an aligned table, with a total line.
pub fn table(report: &UsageReport) -> String {
    let head = [
        report.by.as_str().to_uppercase(),
        "CALLS".into(),
        "INPUT".into(),
        "OUTPUT".into(),
        "CACHE READ".into(),
        "CACHE WRITE".into(),
        "COST".into(),
    ];
    let mut lines: Vec<[String; 7]> = vec![head];
    lines.extend(report.rows.iter().map(|r| cells(&r.key, &r.totals)));
    lines.push(cells("total", &report.total));
    let widths: Vec<usize> = (0..7)
        .map(|i| {
            lines
                .iter()
                .map(|l| l[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for l in &lines {
        let row: Vec<String> = l
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i == 0 {
                    format!("{c:<w$}", w = widths[i])
                } else {
                    format!("{c:>w$}", w = widths[i])
                }
            })
            .collect();
        out.push_str(row.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// `beige usage`.
pub async fn run(target: &Target, args: UsageArgs) -> Result<()> {
    let gw = target.remote()?;
    let q = query(&args, chrono::Utc::now().timestamp_millis())?;
    let report = match gw.usage(q).await {
        Ok(r) => r,
        Err(e) => return Err(crate::client::gateway_exit(target, e)),
    };
    if args.json {
        println!("{}", json(&report)?);
    } else if report.rows.is_empty() {
        println!("No model calls in the ledger for this query.");
    } else {
        print!("{}", table(&report));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use beige_core::api::usage::{UsageGroupBy, UsageRow};

    #[test]
    fn since_counts_back_from_now_and_the_table_has_a_total() {
        let args = UsageArgs {
            agent: Some("a".into()),
            since: Some("2h".into()),
            by: UsageGroupBy::Model,
            json: false,
        };
        let q = query(&args, 10_000_000).unwrap();
        assert_eq!(q.since_ms, Some(10_000_000 - 7_200_000));
        assert_eq!((q.agent.as_deref(), q.by), (Some("a"), UsageGroupBy::Model));
        let bad = UsageArgs {
            since: Some("2w".into()),
            ..args
        };
        assert!(query(&bad, 0).is_err());

        let row = |key: &str, micros, unpriced| UsageRow {
            key: key.into(),
            totals: UsageTotals {
                calls: 1,
                input_tokens: 1000,
                output_tokens: 10,
                cost_micros: micros,
                unpriced_calls: unpriced,
                ..UsageTotals::default()
            },
        };
        let report = UsageReport::new(
            UsageGroupBy::Model,
            vec![row("p/big", 1_234_500, 0), row("local/llama", 0, 1)],
        );
        let t = table(&report);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(lines[0].starts_with("MODEL"), "{t}");
        assert!(lines[1].ends_with("$1.2345"), "{t}");
        assert!(lines[2].ends_with("$0.0000 (1 unpriced)"), "{t}");
        assert!(
            lines[3].starts_with("total") && lines[3].contains("2000"),
            "{t}"
        );
    }
}
