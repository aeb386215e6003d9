//! `${VAR}` / `${VAR:-default}` substitution in config strings.
//!
//! Owns the interpolation rules of the original (inventory §2.2): `${…}` with a
//! non-empty body is replaced; `$VAR` and `${}` stay literal; the body is split on the
//! first `:-` into name and default; a variable set to the empty string counts as set;
//! the result is always a string. Applied to every string value of the parsed tree at
//! any depth, never to keys. The environment is a lookup function, so tests never touch
//! the process environment.

use serde_json::Value;

use super::keypath::{KeyPath, Seg};

/// `${NAME}` had no default and `NAME` is not set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("environment variable '{name}' is not set and has no default")]
pub struct UnsetVariable {
    /// The variable's name, as written between `${` and `}`.
    pub name: String,
}

/// Replace every `${NAME}` / `${NAME:-default}` in `text` using `env`.
pub fn interpolate(
    text: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<String, UnsetVariable> {
    interpolate_dyn(text, &env)
}

fn interpolate_dyn(
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, UnsetVariable> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        match after.find('}') {
            Some(end) if end > 0 => {
                let body = &after[..end];
                let (name, default) = match body.split_once(":-") {
                    Some((name, default)) => (name, Some(default)),
                    None => (body, None),
                };
                match (env(name), default) {
                    (Some(value), _) => out.push_str(&value),
                    (None, Some(default)) => out.push_str(default),
                    (None, None) => {
                        return Err(UnsetVariable {
                            name: name.to_string(),
                        })
                    }
                }
                rest = &after[end + 1..];
            }
            // `${}` or an unclosed `${`: the `$` is literal, scanning goes on after it.
            _ => {
                out.push('$');
                rest = &rest[start + 1..];
            }
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Interpolate every string value in `value`, in place. On failure, returns where in
/// the tree the unset variable was used.
pub(crate) fn interpolate_tree(
    value: &mut Value,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), (KeyPath, UnsetVariable)> {
    let mut path = KeyPath::root();
    walk(value, &mut path, env).map_err(|e| (path, e))
}

fn walk(
    value: &mut Value,
    path: &mut KeyPath,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), UnsetVariable> {
    match value {
        Value::String(s) => {
            if s.contains("${") {
                *s = interpolate_dyn(s, env)?;
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                path.push(Seg::Index(i));
                walk(item, path, env)?;
                path.pop();
            }
        }
        Value::Object(map) => {
            for (key, item) in map.iter_mut() {
                path.push(Seg::Key(key.clone()));
                walk(item, path, env)?;
                path.pop();
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOME" => Some("/home/u".into()),
            "EMPTY" => Some(String::new()),
            "ID" => Some("42".into()),
            _ => None,
        }
    }

    fn i(s: &str) -> Result<String, UnsetVariable> {
        interpolate(s, env)
    }

    #[test]
    fn plain_and_default_forms() {
        assert_eq!(i("${HOME}/x").unwrap(), "/home/u/x");
        assert_eq!(i("${NOPE:-fallback}").unwrap(), "fallback");
        assert_eq!(i("${HOME:-fallback}").unwrap(), "/home/u");
        assert_eq!(i("${NOPE:-}").unwrap(), "");
        assert_eq!(i("no refs at all").unwrap(), "no refs at all");
    }

    #[test]
    fn empty_but_set_counts_as_set() {
        assert_eq!(i("[${EMPTY}]").unwrap(), "[]");
        assert_eq!(i("[${EMPTY:-default}]").unwrap(), "[]");
    }

    #[test]
    fn splits_on_first_separator_only() {
        assert_eq!(i("${NOPE:-a:-b}").unwrap(), "a:-b");
        assert_eq!(i("${NOPE:-:-}").unwrap(), ":-");
    }

    #[test]
    fn multiple_refs_in_one_string() {
        assert_eq!(
            i("${ID}-${HOME}-${NOPE:-z}-${ID}").unwrap(),
            "42-/home/u-z-42"
        );
    }

    #[test]
    fn literals_that_are_not_references() {
        assert_eq!(i("$HOME").unwrap(), "$HOME");
        assert_eq!(i("${}").unwrap(), "${}");
        assert_eq!(i("${}${ID}").unwrap(), "${}42");
        assert_eq!(i("cost: $5").unwrap(), "cost: $5");
        assert_eq!(i("${unclosed").unwrap(), "${unclosed");
        assert_eq!(i("$${ID}").unwrap(), "$42");
    }

    #[test]
    fn unset_without_default_is_an_error() {
        assert_eq!(
            i("key=${MISSING}").unwrap_err(),
            UnsetVariable {
                name: "MISSING".into()
            }
        );
    }

    #[test]
    fn tree_interpolates_values_at_any_depth_but_not_keys() {
        let mut v = json!({
            "${ID}": "${ID}",
            "nested": { "list": ["${ID}", 7, true, null, ["${HOME}"]], "n": 3 },
        });
        interpolate_tree(&mut v, &env).unwrap();
        assert_eq!(
            v,
            json!({
                "${ID}": "42",
                "nested": { "list": ["42", 7, true, null, ["/home/u"]], "n": 3 },
            })
        );
    }

    #[test]
    fn tree_error_names_the_path() {
        let mut v = json!({ "llm": { "providers": { "anthropic": { "apiKey": "${KEY}" } } },
                            "list": ["ok", { "x": "${ALSO_MISSING}" }] });
        let (path, err) = interpolate_tree(&mut v, &env).unwrap_err();
        assert_eq!(path.to_string(), "llm.providers.anthropic.apiKey");
        assert_eq!(err.name, "KEY");

        let mut v = json!({ "list": ["ok", { "x": "${ALSO_MISSING}" }] });
        let (path, _) = interpolate_tree(&mut v, &env).unwrap_err();
        assert_eq!(path.to_string(), "list[1].x");
    }
}
