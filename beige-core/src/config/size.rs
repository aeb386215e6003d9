//! Sizes in the config: [`ByteSize`] (`sandbox.diskLimit`, `plugins.<name>.maxStoreBytes`)
//! and [`FreeSpace`] (`gateway.minFreeSpace`, which also takes a percentage).
//!
//! Both are written as a whole number of bytes or as text in the grammar of
//! `memoryLimit` ([`parse_memory_limit`]: `"512m"`, `"1.5g"`, `"64MB"`). They are parsed
//! while the file is read, so a bad value fails the load with its key path.

use std::fmt;

use schemars::gen::SchemaGenerator;
use schemars::schema::{InstanceType, Schema, SchemaObject, SubschemaValidation};
use schemars::JsonSchema;
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::validate::parse_memory_limit;

const SIZE_HELP: &str = "a whole number of bytes, or a number with an optional unit k, m or g \
                         (powers of 1024) and an optional b, e.g. \"512m\" or \"10g\"";

/// A number of bytes (at least 1), written as a whole number or as a size such as `"10g"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The number of bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&fmt_bytes(self.0))
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(SIZE_HELP)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                if v == 0 {
                    return Err(E::custom(format!(
                        "the size must be at least 1 byte; use {SIZE_HELP}, or leave the key out"
                    )));
                }
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!("invalid size {v} — use {SIZE_HELP}"))),
                }
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<ByteSize, E> {
                Err(E::custom(format!("invalid size {v} — use {SIZE_HELP}")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                parse_memory_limit(v)
                    .map(ByteSize)
                    .ok_or_else(|| E::custom(format!("invalid size \"{v}\" — use {SIZE_HELP}")))
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for ByteSize {
    fn schema_name() -> String {
        "ByteSize".to_string()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        size_schema(
            "A number of bytes: a whole number, or a number with an optional unit k, m or g \
             (powers of 1024) and an optional b, e.g. \"512m\" or \"10g\".",
            1,
            None,
        )
    }
}

/// `gateway.minFreeSpace`: how much free space the gateway keeps on the filesystems it
/// and the agents write to — a number of bytes, or a percentage of the filesystem's size.
/// `0` turns the guard off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FreeSpace {
    /// A number of bytes (`"512m"`); `0` turns the guard off.
    Bytes(u64),
    /// Percent of the filesystem's size, `0 ≤ p < 100`.
    Percent(f64),
}

/// The default of `gateway.minFreeSpace`: 512 MiB.
pub const DEFAULT_MIN_FREE_SPACE: FreeSpace = FreeSpace::Bytes(512 * 1024 * 1024);

impl Default for FreeSpace {
    fn default() -> Self {
        DEFAULT_MIN_FREE_SPACE
    }
}

impl FreeSpace {
    /// Parse `"512m"`, `"2%"`, `"0"`.
    pub fn parse(s: &str) -> Option<FreeSpace> {
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let p: f64 = p.trim().parse().ok()?;
            return (p.is_finite() && (0.0..100.0).contains(&p)).then_some(FreeSpace::Percent(p));
        }
        if t == "0" {
            return Some(FreeSpace::Bytes(0));
        }
        parse_memory_limit(t).map(FreeSpace::Bytes)
    }

    /// The bytes that must stay free on a filesystem of `total` bytes.
    pub fn bytes_of(self, total: u64) -> u64 {
        match self {
            FreeSpace::Bytes(b) => b,
            FreeSpace::Percent(p) => ((total as f64) * p / 100.0).ceil() as u64,
        }
    }

    /// `0` and `0%` turn the guard off.
    pub fn is_off(self) -> bool {
        match self {
            FreeSpace::Bytes(b) => b == 0,
            FreeSpace::Percent(p) => p == 0.0,
        }
    }
}

impl fmt::Display for FreeSpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FreeSpace::Bytes(b) => f.write_str(&fmt_bytes(*b)),
            FreeSpace::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl Serialize for FreeSpace {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            FreeSpace::Bytes(b) => s.serialize_u64(*b),
            FreeSpace::Percent(p) => s.serialize_str(&format!("{p}%")),
        }
    }
}

const FREE_HELP: &str = "a number of bytes (a whole number, or with a unit k, m or g, e.g. \
                         \"512m\"), a percentage of the filesystem's size (e.g. \"2%\"), or 0 \
                         to turn the free-space guard off";

impl<'de> Deserialize<'de> for FreeSpace {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = FreeSpace;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(FREE_HELP)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<FreeSpace, E> {
                Ok(FreeSpace::Bytes(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<FreeSpace, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!(
                        "invalid minFreeSpace {v} — use {FREE_HELP}"
                    ))),
                }
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<FreeSpace, E> {
                Err(E::custom(format!(
                    "invalid minFreeSpace {v} — use {FREE_HELP}"
                )))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<FreeSpace, E> {
                FreeSpace::parse(v).ok_or_else(|| {
                    E::custom(format!("invalid minFreeSpace \"{v}\" — use {FREE_HELP}"))
                })
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for FreeSpace {
    fn schema_name() -> String {
        "FreeSpace".to_string()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        size_schema(
            "Free space to keep: a number of bytes (a whole number, or with a unit k, m or g, \
             e.g. \"512m\"), a percentage of the filesystem's size (\"2%\"), or 0 for off.",
            0,
            Some(r"^\s*([0-9]+(\.[0-9]+)?\s*([kKmMgG]?[bB]?)|[0-9]+(\.[0-9]+)?\s*%)\s*$"),
        )
    }
}

/// `anyOf: [integer ≥ min, string]` with a description (and a pattern for the string).
fn size_schema(description: &str, min: u64, pattern: Option<&str>) -> Schema {
    let integer = SchemaObject {
        instance_type: Some(InstanceType::Integer.into()),
        number: Some(Box::new(schemars::schema::NumberValidation {
            minimum: Some(min as f64),
            ..Default::default()
        })),
        ..Default::default()
    };
    let string = SchemaObject {
        instance_type: Some(InstanceType::String.into()),
        string: pattern.map(|p| {
            Box::new(schemars::schema::StringValidation {
                pattern: Some(p.to_string()),
                ..Default::default()
            })
        }),
        ..Default::default()
    };
    SchemaObject {
        metadata: Some(Box::new(schemars::schema::Metadata {
            description: Some(description.to_string()),
            ..Default::default()
        })),
        subschemas: Some(Box::new(SubschemaValidation {
            any_of: Some(vec![integer.into(), string.into()]),
            ..Default::default()
        })),
        ..Default::default()
    }
    .into()
}

/// `512 B`, `1.5 KiB`, `64.0 MiB`, `2.3 GiB`.
pub fn fmt_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = UNITS[0];
    for next in &UNITS[1..] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = next;
    }
    format!("{v:.1} {unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_like_memory_limits() {
        let parse = |v: serde_json::Value| serde_json::from_value::<ByteSize>(v);
        assert_eq!(parse(serde_json::json!(1024)).unwrap(), ByteSize(1024));
        assert_eq!(parse(serde_json::json!("10g")).unwrap(), ByteSize(10 << 30));
        assert_eq!(parse(serde_json::json!("1.5m")).unwrap(), ByteSize(3 << 19));
        for bad in [
            serde_json::json!(0),
            serde_json::json!(-1),
            serde_json::json!(1.5),
            serde_json::json!("lots"),
            serde_json::json!("10%"),
            serde_json::json!(true),
        ] {
            let err = parse(bad.clone()).unwrap_err().to_string();
            assert!(err.contains("k, m or g"), "{bad}: {err}");
        }
        assert_eq!(serde_json::to_value(ByteSize(5)).unwrap(), 5);
    }

    #[test]
    fn free_space_takes_bytes_percentages_and_zero() {
        assert_eq!(FreeSpace::parse("512m"), Some(FreeSpace::Bytes(512 << 20)));
        assert_eq!(FreeSpace::parse(" 2.5 % "), Some(FreeSpace::Percent(2.5)));
        assert_eq!(FreeSpace::parse("0"), Some(FreeSpace::Bytes(0)));
        assert_eq!(FreeSpace::parse("0%"), Some(FreeSpace::Percent(0.0)));
        for bad in ["100%", "-1%", "x%", "lots", "", "%"] {
            assert_eq!(FreeSpace::parse(bad), None, "{bad}");
        }
        assert!(FreeSpace::Bytes(0).is_off() && FreeSpace::Percent(0.0).is_off());
        assert!(!DEFAULT_MIN_FREE_SPACE.is_off());
        assert_eq!(FreeSpace::Percent(2.0).bytes_of(1000), 20);
        assert_eq!(FreeSpace::Percent(1.0).bytes_of(150), 2);
        assert_eq!(FreeSpace::Bytes(7).bytes_of(1), 7);
        let de = |v| serde_json::from_value::<FreeSpace>(v);
        assert_eq!(de(serde_json::json!(0)).unwrap(), FreeSpace::Bytes(0));
        assert_eq!(
            de(serde_json::json!("2%")).unwrap(),
            FreeSpace::Percent(2.0)
        );
        let err = de(serde_json::json!("lots")).unwrap_err().to_string();
        assert!(err.contains("invalid minFreeSpace \"lots\""), "{err}");
        assert_eq!(serde_json::to_value(FreeSpace::Percent(2.0)).unwrap(), "2%");
        assert_eq!(FreeSpace::Percent(2.0).to_string(), "2%");
        assert_eq!(DEFAULT_MIN_FREE_SPACE.to_string(), "512.0 MiB");
    }

    fn load(extra_gateway: &str, extra_sandbox: &str, extra_plugin: &str) -> String {
        let text = format!(
            "{{ llm: {{ providers: {{ anthropic: {{}} }} }},
               gateway: {{ {extra_gateway} }},
               plugins: {{ notes: {{ {extra_plugin} }} }},
               agents: {{ bot: {{ model: {{ provider: 'anthropic', model: 'm' }}, tools: [],
                                 sandbox: {{ {extra_sandbox} }} }} }} }}"
        );
        let home = crate::home::BeigeHome::new("/nonexistent/beige-home");
        match crate::config::Config::from_str_with_env(
            &text,
            std::path::Path::new("/nonexistent/config.json5"),
            &home,
            |_| None,
        ) {
            Ok(loaded) => format!(
                "ok {} {:?} {:?}",
                loaded.config.gateway.min_free_space,
                loaded.config.agents["bot"].sandbox.disk_limit,
                loaded.config.plugins["notes"].max_store_bytes
            ),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn the_config_keys_load_and_bad_values_name_their_path() {
        assert_eq!(
            load("", "", ""),
            "ok 512.0 MiB None None",
            "defaults: the guard on, no root limit, the plugin default"
        );
        assert_eq!(
            load(
                "minFreeSpace: '2%'",
                "diskLimit: '10g'",
                "maxStoreBytes: 1048576"
            ),
            "ok 2% Some(ByteSize(10737418240)) Some(ByteSize(1048576))"
        );
        assert_eq!(load("minFreeSpace: 0", "", ""), "ok 0 B None None");
        let bad = load("minFreeSpace: 'lots'", "", "");
        assert!(
            bad.contains("gateway.minFreeSpace") && bad.contains("invalid minFreeSpace \"lots\""),
            "{bad}"
        );
        let bad = load("", "diskLimit: 0", "");
        assert!(
            bad.contains("agents.bot.sandbox.diskLimit") && bad.contains("at least 1 byte"),
            "{bad}"
        );
        let bad = load("", "", "maxStoreBytes: '5 parsecs'");
        assert!(
            bad.contains("plugins.notes.maxStoreBytes") && bad.contains("invalid size"),
            "{bad}"
        );
    }
}
