//! `--set a.b.c=value`: dotted keys into a TOML table, values parsed as TOML.

use crate::ConfigError;
use toml::{Table, Value};

/// One parsed override: the dotted key and the value it sets.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    pub key: String,
    pub value: Value,
}

impl Override {
    /// Parses `a.b.c=value`. The value is TOML (integer, float, bool, quoted string, array,
    /// inline table); anything that is not TOML is taken as a string, so `model.name=qwen` and
    /// `run.dir=/tmp/x` need no quotes.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let (key, raw) = text.split_once('=').ok_or_else(|| {
            ConfigError::new(format!(
                "override `{text}` must look like key=value (e.g. optim.lr=1e-6)"
            ))
        })?;
        let key = key.trim();
        if key.is_empty() || key.split('.').any(|p| p.trim().is_empty()) {
            return Err(ConfigError::new(format!(
                "override `{text}` has an empty key or an empty part in `{key}`"
            )));
        }
        let key = key.split('.').map(str::trim).collect::<Vec<_>>().join(".");
        let raw = raw.trim();
        let value = parse_value(raw);
        if value.is_str() && is_integer_literal(raw) {
            return Err(ConfigError::new(format!(
                "invalid value for `{key}`: {raw} is beyond the integers a config holds \
                 ({} to {}) (set by `--set {text}`)",
                i64::MIN,
                i64::MAX
            )));
        }
        Ok(Override { key, value })
    }

    /// Sets the value in `table`, creating the sections on the way; an inline table is merged
    /// into the section there.
    pub fn apply(&self, table: &mut Table) -> Result<(), ConfigError> {
        let parts: Vec<&str> = self.key.split('.').collect();
        let (leaf, sections) = parts.split_last().unwrap_or((&"", &[]));
        let mut cur = table;
        for (i, part) in sections.iter().enumerate() {
            let entry = cur
                .entry(part.to_string())
                .or_insert_with(|| Value::Table(Table::new()));
            cur = match entry {
                Value::Table(t) => t,
                other => {
                    return Err(ConfigError::new(format!(
                        "cannot set `{}`: `{}` is a value ({}), not a section",
                        self.key,
                        parts[..=i].join("."),
                        other.type_str()
                    )))
                }
            };
        }
        // An inline table sets the keys it names, as a file's section does; the others keep
        // their values (e.g. `rollout.sampling={temperature=0.7}` keeps `max_new_tokens`).
        match (cur.get_mut(*leaf), &self.value) {
            (Some(Value::Table(base)), Value::Table(over)) => crate::merge(base, over.clone()),
            _ => {
                cur.insert(leaf.to_string(), self.value.clone());
            }
        }
        Ok(())
    }
}

/// Parses and applies one `a.b.c=value` override to `table`.
pub fn apply_override(table: &mut Table, text: &str) -> Result<(), ConfigError> {
    Override::parse(text)?.apply(table)
}

/// Digits with an optional sign (and TOML's `_` separators): an integer TOML could not hold
/// when it did not parse as one.
fn is_integer_literal(raw: &str) -> bool {
    let digits = raw.strip_prefix(['+', '-']).unwrap_or(raw);
    digits.starts_with(|c: char| c.is_ascii_digit())
        && digits.chars().all(|c| c.is_ascii_digit() || c == '_')
}

fn parse_value(raw: &str) -> Value {
    let parsed = format!("v = {raw}")
        .parse::<Table>()
        .ok()
        .and_then(|mut t| t.remove("v"));
    match parsed {
        // A date-like word (`2024-05-01`) is far more likely a name than a TOML datetime.
        Some(Value::Datetime(_)) | None => Value::String(raw.to_string()),
        Some(v) => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str) -> Value {
        Override::parse(text).unwrap().value
    }

    #[test]
    fn values_parse_as_toml_with_bare_words_as_strings() {
        assert_eq!(value("a=3"), Value::Integer(3));
        assert_eq!(value("a=-2"), Value::Integer(-2));
        assert_eq!(value("a=1e-6"), Value::Float(1e-6));
        assert_eq!(value("a=0.5"), Value::Float(0.5));
        assert_eq!(value("a=true"), Value::Boolean(true));
        assert_eq!(value("a=\"x y\""), Value::String("x y".into()));
        assert_eq!(value("a=qwen"), Value::String("qwen".into()));
        assert_eq!(value("a=/tmp/run 1"), Value::String("/tmp/run 1".into()));
        assert_eq!(value("a=cuda:0"), Value::String("cuda:0".into()));
        assert_eq!(value("a=2024-05-01"), Value::String("2024-05-01".into()));
        assert_eq!(value("a="), Value::String(String::new()));
        assert_eq!(value("a=x=y"), Value::String("x=y".into()));
        assert_eq!(
            value("a=[1, 2]"),
            Value::Array(vec![Value::Integer(1), Value::Integer(2)])
        );
        let Value::Table(t) = value("a={ b = 1, c = \"d\" }") else {
            panic!("inline table did not parse as a table")
        };
        assert_eq!(t["b"], Value::Integer(1));
        assert_eq!(t["c"], Value::String("d".into()));
    }

    /// An integer beyond i64 is refused as one, not read as a string of digits (whose error
    /// said "got string").
    #[test]
    fn integers_beyond_the_config_range_are_refused_as_integers() {
        for raw in [
            "18446744073709551615",
            "-9223372036854775809",
            "+99_999_999_999_999_999_999",
        ] {
            let text = format!("trainer.steps={raw}");
            let err = Override::parse(&text).unwrap_err().to_string();
            assert!(err.contains("`trainer.steps`"), "{err}");
            assert!(err.contains("beyond the integers"), "{err}");
            assert!(!err.contains("string"), "{err}");
        }
        assert_eq!(value("a=9223372036854775807"), Value::Integer(i64::MAX));
        assert_eq!(value("a=12ab"), Value::String("12ab".into()));
    }

    #[test]
    fn keys_are_trimmed_and_must_be_whole() {
        assert_eq!(Override::parse(" a . b = 1 ").unwrap().key, "a.b");
        for bad in ["=1", "a..b=1", "a.=1", ".a=1"] {
            let err = Override::parse(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("`{bad}`")), "{err}");
            assert!(err.contains("empty"), "{err}");
        }
        let err = Override::parse("trainer.lr").unwrap_err().to_string();
        assert!(
            err.contains("`trainer.lr`") && err.contains("key=value"),
            "{err}"
        );
    }

    #[test]
    fn apply_creates_sections_and_refuses_to_descend_into_values() {
        let mut t = Table::new();
        apply_override(&mut t, "a.b.c=1").unwrap();
        apply_override(&mut t, "a.b.d=2").unwrap();
        assert_eq!(t["a"]["b"]["c"], Value::Integer(1));
        assert_eq!(t["a"]["b"]["d"], Value::Integer(2));
        let err = apply_override(&mut t, "a.b.c.x=1").unwrap_err().to_string();
        assert!(
            err.contains("`a.b.c.x`")
                && err.contains("`a.b.c` is a value (integer), not a section"),
            "{err}"
        );
    }
}
