//! When a schedule fires: a cron expression evaluated in an IANA time zone ([`CronSpec`]),
//! or one RFC 3339 instant ([`parse_at`]), as Unix ms in UTC.
//!
//! Five fields (`minute hour day-of-month month day-of-week`) or a nickname (`@yearly`,
//! `@monthly`, `@weekly`, `@daily`, `@hourly`); a sixth, leading seconds field is
//! accepted too (`*/2 * * * * *`). A local time that falls in a DST gap fires once, at the
//! first valid instant after the gap; one that falls in a fold fires once, at its first
//! occurrence.

use std::str::FromStr as _;

use chrono::{DateTime, TimeZone as _, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};

/// A schedule time that does not parse. The message names the value and what to write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    /// The cron expression is not valid.
    #[error("cron '{expr}' is not valid ({detail}); write 5 fields 'minute hour day month weekday' such as '0 8 * * 1-5', or @hourly, @daily, @weekly, @monthly, @yearly")]
    Cron {
        /// The expression.
        expr: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The time zone is not an IANA zone.
    #[error("tz '{tz}' is not an IANA time zone; write a name such as 'Europe/Berlin', 'America/New_York' or 'UTC'")]
    Zone {
        /// The name given.
        tz: String,
    },
    /// The instant is not RFC 3339.
    #[error("at '{at}' is not an RFC 3339 instant ({detail}); write it with its offset, such as '2026-12-24T18:00:00+01:00'")]
    At {
        /// The value given.
        at: String,
        /// What is wrong with it.
        detail: String,
    },
}

/// A parsed cron expression and its zone.
#[derive(Debug, Clone)]
pub struct CronSpec {
    cron: croner::Cron,
    tz: Tz,
}

impl CronSpec {
    /// Parse `expr` in zone `tz` (`None`: the host's zone, [`host_zone`]).
    pub fn parse(expr: &str, tz: Option<&str>) -> Result<Self, TimeError> {
        let tz = match tz {
            Some(name) => parse_zone(name)?,
            None => host_zone(),
        };
        let trimmed = expr.trim();
        let bad = |detail: String| TimeError::Cron {
            expr: expr.to_string(),
            detail,
        };
        if !trimmed.starts_with('@') {
            let fields = trimmed.split_whitespace().count();
            if !(5..=6).contains(&fields) {
                return Err(bad(format!("it has {fields} fields")));
            }
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(trimmed)
            .map_err(|e| bad(e.to_string()))?;
        Ok(Self { cron, tz })
    }

    /// The zone it is evaluated in.
    pub fn zone(&self) -> Tz {
        self.tz
    }

    /// The first fire instant strictly after `after_ms` (Unix ms, UTC); `None` when
    /// there is none (a pattern such as `0 0 30 2 *`).
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        let start = Utc.timestamp_millis_opt(after_ms).single()?;
        let local: DateTime<Tz> = start.with_timezone(&self.tz);
        let next = self.cron.find_next_occurrence(&local, false).ok()?;
        let ms = next.with_timezone(&Utc).timestamp_millis();
        // Whole seconds: an `after_ms` inside the fire second must not give it again.
        if ms <= after_ms {
            return self.next_after(after_ms.div_euclid(1000) * 1000 + 999);
        }
        Some(ms)
    }

    /// The latest fire instant at or before `at_ms`, with how many fire instants lie in
    /// `(after_ms, at_ms]` (counted up to `limit`): what a missed-fire catch-up needs.
    pub fn due_between(&self, after_ms: i64, at_ms: i64, limit: u32) -> (Option<i64>, u32) {
        let mut latest = None;
        let mut count = 0u32;
        let mut cursor = after_ms;
        while let Some(next) = self.next_after(cursor) {
            if next > at_ms {
                break;
            }
            latest = Some(next);
            count += 1;
            cursor = next;
            if count >= limit {
                // Jump: the latest at or before `at_ms` without walking every instant.
                let back = self
                    .cron
                    .find_previous_occurrence(
                        &Utc.timestamp_millis_opt(at_ms)
                            .single()
                            .map(|t| t.with_timezone(&self.tz))
                            .unwrap_or_else(|| Utc::now().with_timezone(&self.tz)),
                        true,
                    )
                    .ok()
                    .map(|t| t.with_timezone(&Utc).timestamp_millis());
                if back.is_some_and(|b| b > next) {
                    latest = back;
                }
                break;
            }
        }
        (latest, count)
    }
}

/// An IANA zone by name.
pub fn parse_zone(name: &str) -> Result<Tz, TimeError> {
    Tz::from_str(name.trim()).map_err(|_| TimeError::Zone {
        tz: name.to_string(),
    })
}

/// The host's zone: `TZ` when it names an IANA zone, else `/etc/timezone`, else the
/// zone `/etc/localtime` links to, else UTC.
pub fn host_zone() -> Tz {
    if let Ok(tz) = std::env::var("TZ") {
        if let Ok(z) = Tz::from_str(tz.trim_start_matches(':')) {
            return z;
        }
    }
    if let Ok(text) = std::fs::read_to_string("/etc/timezone") {
        if let Ok(z) = Tz::from_str(text.trim()) {
            return z;
        }
    }
    if let Ok(target) = std::fs::read_link("/etc/localtime") {
        let s = target.to_string_lossy();
        if let Some((_, name)) = s.split_once("zoneinfo/") {
            if let Ok(z) = Tz::from_str(name) {
                return z;
            }
        }
    }
    Tz::UTC
}

/// An RFC 3339 instant as Unix ms.
pub fn parse_at(at: &str) -> Result<i64, TimeError> {
    DateTime::parse_from_rfc3339(at.trim())
        .map(|t| t.timestamp_millis())
        .map_err(|e| TimeError::At {
            at: at.to_string(),
            detail: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> i64 {
        DateTime::parse_from_rfc3339(s).unwrap().timestamp_millis()
    }

    fn iso(ms: i64) -> String {
        Utc.timestamp_millis_opt(ms)
            .unwrap()
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    }

    fn walk(spec: &CronSpec, from: &str, n: usize) -> Vec<String> {
        let mut out = Vec::new();
        let mut t = utc(from);
        for _ in 0..n {
            t = spec.next_after(t).unwrap();
            out.push(iso(t));
        }
        out
    }

    #[test]
    fn cron_tz() {
        // Weekdays at 08:00 in Berlin: 07:00 UTC in winter, 06:00 UTC in summer; the
        // switch on Sunday 2026-03-29 moves Monday's run an hour earlier in UTC.
        let spec = CronSpec::parse("0 8 * * 1-5", Some("Europe/Berlin")).unwrap();
        assert_eq!(
            walk(&spec, "2026-03-26T12:00:00Z", 3),
            [
                "2026-03-27T07:00:00Z", // Friday, CET
                "2026-03-30T06:00:00Z", // Monday, CEST (the weekend is skipped)
                "2026-03-31T06:00:00Z",
            ]
        );
        // And back in October (last Sunday, 2026-10-25).
        assert_eq!(
            walk(&spec, "2026-10-23T12:00:00Z", 2),
            ["2026-10-26T07:00:00Z", "2026-10-27T07:00:00Z"]
        );

        // A gap: 02:30 does not exist on 2026-03-29 in Berlin (02:00 → 03:00). It fires
        // once, at the first valid instant after the gap (03:00 CEST = 01:00 UTC), and
        // the next day at 02:30 CEST again.
        let gap = CronSpec::parse("30 2 * * *", Some("Europe/Berlin")).unwrap();
        assert_eq!(
            walk(&gap, "2026-03-28T12:00:00Z", 2),
            ["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]
        );

        // A fold: 02:30 happens twice on 2026-10-25 (CEST, then CET). It fires once, at
        // the first occurrence (00:30 UTC), not again an hour later.
        let fold = CronSpec::parse("30 2 * * *", Some("Europe/Berlin")).unwrap();
        assert_eq!(
            walk(&fold, "2026-10-24T12:00:00Z", 2),
            ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]
        );
    }

    #[test]
    fn nicknames_seconds_and_errors() {
        let daily = CronSpec::parse("@daily", Some("UTC")).unwrap();
        assert_eq!(
            walk(&daily, "2026-01-01T10:00:00Z", 1),
            ["2026-01-02T00:00:00Z"]
        );
        let every2 = CronSpec::parse("*/2 * * * * *", Some("UTC")).unwrap();
        let t = utc("2026-01-01T10:00:00Z");
        assert_eq!(every2.next_after(t), Some(t + 2000));
        assert_eq!(every2.next_after(t + 1), Some(t + 2000), "strictly after");

        let err = CronSpec::parse("0 8 * *", Some("UTC")).unwrap_err();
        assert!(err.to_string().contains("'0 8 * *'"), "{err}");
        assert!(err.to_string().contains("4 fields"), "{err}");
        let err = CronSpec::parse("0 25 * * *", Some("UTC")).unwrap_err();
        assert!(matches!(err, TimeError::Cron { .. }), "{err}");
        let err = CronSpec::parse("0 8 * * *", Some("Mars/Olympus")).unwrap_err();
        assert!(err.to_string().contains("'Mars/Olympus'"), "{err}");
        assert!(parse_at("2026-12-24T18:00:00+01:00").unwrap() == utc("2026-12-24T17:00:00Z"));
        assert!(parse_at("tomorrow").is_err());
    }

    #[test]
    fn missed_fires_are_counted_and_the_latest_kept() {
        let every5 = CronSpec::parse("*/5 * * * *", Some("UTC")).unwrap();
        let from = utc("2026-01-01T10:00:00Z");
        let (latest, n) = every5.due_between(from, utc("2026-01-01T10:17:00Z"), 1000);
        assert_eq!(
            (latest.map(iso).as_deref(), n),
            (Some("2026-01-01T10:15:00Z"), 3)
        );
        let (latest, n) = every5.due_between(from, utc("2026-01-01T10:04:00Z"), 1000);
        assert_eq!((latest, n), (None, 0));
        // Capped counting still finds the latest instant.
        let (latest, n) = every5.due_between(from, utc("2026-01-02T10:01:00Z"), 10);
        assert_eq!(
            (latest.map(iso).as_deref(), n),
            (Some("2026-01-02T10:00:00Z"), 10)
        );
    }
}
