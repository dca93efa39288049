//! Configuration files in TOML with dotted `--set key=value` overrides.
//!
//! The caller's config structs are plain serde structs with `#[serde(default,
//! deny_unknown_fields)]`: every key has a default, and a misspelt key is an error that names
//! the full dotted key and the keys allowed beside it.

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt;
use toml::{Table, Value};

#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Parses `base_toml` (None: all defaults), applies `overrides` in order, and deserializes.
pub fn load<T: DeserializeOwned>(
    base_toml: Option<&str>,
    source_name: &str,
    overrides: &[String],
) -> Result<T, ConfigError> {
    let mut table: Table = match base_toml {
        Some(text) => text.parse().map_err(|e: toml::de::Error| {
            ConfigError(format!("{source_name}: {}", e.to_string().trim_end()))
        })?,
        None => Table::new(),
    };
    for o in overrides {
        apply_override(&mut table, o)?;
    }
    let de = Value::Table(table);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        // Keep serde's first line: the rest repeats the location in the deserializer's words.
        let inner = inner.lines().next().unwrap_or("").trim().to_string();
        ConfigError(describe(source_name, &path, &inner))
    })
}

/// Turns serde's message into one that names the dotted key (and, for unknown keys, the
/// section whose allowed keys are listed).
fn describe(source: &str, path: &str, inner: &str) -> String {
    if let Some(rest) = inner.strip_prefix("unknown field `") {
        let (field, allowed) = rest.split_once('`').unwrap_or((rest, ""));
        let section = path.rsplit_once('.').map(|(s, _)| s).unwrap_or("");
        let key = if path.is_empty() || path == "." {
            field.to_string()
        } else {
            path.to_string()
        };
        let allowed = allowed
            .trim_start_matches(", expected one of ")
            .trim_start_matches(", expected ")
            .replace('`', "")
            .replace(" or ", ", ");
        let where_ = if section.is_empty() || !path.contains('.') {
            "at the top level".to_string()
        } else {
            format!("in `{section}`")
        };
        return format!("{source}: unknown key `{key}` (allowed keys {where_}: {allowed})");
    }
    format!("{source}: invalid value for `{path}`: {inner}")
}

/// Applies `a.b.c=value`: the value is parsed as TOML (numbers, booleans, strings in quotes,
/// arrays, inline tables); a bare word that is not TOML becomes a string.
pub fn apply_override(table: &mut Table, o: &str) -> Result<(), ConfigError> {
    let (key, raw) = o
        .split_once('=')
        .ok_or_else(|| ConfigError(format!("override `{o}` must look like key=value")))?;
    let key = key.trim();
    if key.is_empty() || key.split('.').any(str::is_empty) {
        return Err(ConfigError(format!("override `{o}` has an empty key")));
    }
    let value = parse_value(raw.trim());
    let parts: Vec<&str> = key.split('.').collect();
    let mut cur = table;
    for (i, part) in parts[..parts.len() - 1].iter().enumerate() {
        let entry = cur
            .entry(part.to_string())
            .or_insert_with(|| Value::Table(Table::new()));
        cur = match entry {
            Value::Table(t) => t,
            _ => {
                return Err(ConfigError(format!(
                    "override `{o}`: `{}` is a value, not a section",
                    parts[..=i].join(".")
                )))
            }
        };
    }
    cur.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

fn parse_value(raw: &str) -> Value {
    format!("v = {raw}")
        .parse::<Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| Value::String(raw.to_string()))
}

/// The resolved config as TOML, for the run directory and `--print-config`.
pub fn to_toml_string<T: Serialize>(cfg: &T) -> String {
    toml::to_string_pretty(cfg)
        .unwrap_or_else(|e| format!("# config could not be serialized: {e}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Default, Deserialize, Serialize, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Trainer {
        lr: f64,
        steps: usize,
        name: String,
        tags: Vec<String>,
    }

    #[derive(Debug, Default, Deserialize, Serialize, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Cfg {
        trainer: Trainer,
        seed: u64,
    }

    #[test]
    fn overrides_parse_numbers_bools_strings_and_arrays() {
        let cfg: Cfg = load(
            Some("seed = 3\n[trainer]\nlr = 0.5\n"),
            "a.toml",
            &[
                "trainer.steps=7".into(),
                "trainer.name=qwen".into(),
                "trainer.tags=[\"a\", \"b\"]".into(),
                "trainer.lr=1e-3".into(),
            ],
        )
        .unwrap();
        assert_eq!(cfg.seed, 3);
        assert_eq!(cfg.trainer.steps, 7);
        assert_eq!(cfg.trainer.name, "qwen");
        assert_eq!(cfg.trainer.tags, vec!["a", "b"]);
        assert_eq!(cfg.trainer.lr, 1e-3);
        let back: Cfg = load(Some(&to_toml_string(&cfg)), "round trip", &[]).unwrap();
        assert_eq!(back, cfg);
    }

    #[test]
    fn unknown_key_names_the_dotted_key_and_the_allowed_ones() {
        let err = load::<Cfg>(None, "defaults", &["trainer.lrr=1".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`trainer.lrr`"), "{err}");
        assert!(err.contains("lr, steps, name, tags"), "{err}");
        let err = load::<Cfg>(Some("sed = 1"), "x.toml", &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`sed`") && err.contains("trainer, seed"),
            "{err}"
        );
    }

    #[test]
    fn wrong_type_and_syntax_errors_name_key_and_file() {
        let err = load::<Cfg>(None, "defaults", &["trainer.steps=many".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`trainer.steps`"), "{err}");
        let err = load::<Cfg>(Some("[trainer\nlr=1"), "bad.toml", &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("bad.toml") && err.contains("line 1"),
            "{err}"
        );
        let err = load::<Cfg>(None, "d", &["noequals".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("key=value"), "{err}");
        let err = load::<Cfg>(None, "d", &["seed=1".into(), "seed.x=1".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a section"), "{err}");
    }
}
