//! Configuration files in TOML with dotted `--set key=value` overrides.
//!
//! The caller's config structs are plain serde structs with `#[serde(default,
//! deny_unknown_fields)]`: every key has a default, and a misspelt key is an error that names
//! the full dotted key and the keys allowed beside it. Semantic checks use [`Validator`];
//! [`render_documented`] writes the defaults with a comment per key.

mod command;
mod describe;
mod docs;
mod error;
mod overrides;
mod validate;

pub use docs::{check_docs, keys, render_documented, to_toml_string, KeyDoc};
pub use error::ConfigError;
pub use overrides::{apply_override, Override};
pub use validate::{ensure, Validator};

/// Deserializes a section on its own inside a custom `Deserialize` (one read by its `kind`,
/// say), keeping the path of a bad value in the error's message: serde buffers such a
/// section, and the outer path would stop at it. [`load`]'s error then names the full key.
pub fn deserialize_nested<'de, T, D>(d: D) -> Result<T, String>
where
    T: serde::Deserialize<'de>,
    D: serde::Deserializer<'de>,
{
    serde_path_to_error::deserialize(d).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        describe::nested_error(&path, inner.lines().next().unwrap_or("").trim())
    })
}

use serde::de::DeserializeOwned;
use serde::Serialize;
use toml::{Table, Value};

/// Parses `base_toml` (the text of the file called `source_name`; None: all defaults),
/// applies `overrides` (`a.b.c=value`) in order, and deserializes into `T`.
///
/// Errors name the file and line for TOML syntax, and the full dotted key for unknown keys
/// (with the keys allowed there) and wrong types; a problem that an override caused says which.
pub fn load<T: DeserializeOwned>(
    base_toml: Option<&str>,
    source_name: &str,
    overrides: &[String],
) -> Result<T, ConfigError> {
    load_onto(Table::new(), base_toml, source_name, overrides)
}

/// [`load`] on top of `T::default()` written out: a table the file or an override names only
/// in part keeps the defaults of its parent for the rest (e.g. `--set
/// rollout.sampling.temperature=0.7` keeps the rollout's own `max_new_tokens`, not the
/// sampling struct's).
pub fn load_with_defaults<T: DeserializeOwned + Serialize + Default>(
    base_toml: Option<&str>,
    source_name: &str,
    overrides: &[String],
) -> Result<T, ConfigError> {
    let defaults = match Value::try_from(T::default()) {
        Ok(Value::Table(t)) => t,
        _ => Table::new(),
    };
    load_onto(defaults, base_toml, source_name, overrides)
}

fn load_onto<T: DeserializeOwned>(
    mut table: Table,
    base_toml: Option<&str>,
    source_name: &str,
    overrides: &[String],
) -> Result<T, ConfigError> {
    if let Some(text) = base_toml {
        let file: Table = text
            .parse()
            .map_err(|e| ConfigError::new(describe::syntax_error(source_name, text, &e)))?;
        merge(&mut table, file);
    }
    let overrides = overrides
        .iter()
        .map(|o| Override::parse(o).map(|p| (o.as_str(), p)))
        .collect::<Result<Vec<_>, _>>()?;
    for (_, o) in &overrides {
        o.apply(&mut table)?;
    }
    serde_path_to_error::deserialize(Value::Table(table)).map_err(|e| {
        let path = e.path().to_string();
        // serde's first line: the rest repeats the location in the deserializer's own words.
        let inner = e.into_inner().to_string();
        let inner = inner.lines().next().unwrap_or("").trim();
        let message = describe::deserialize_error(&path, inner);
        // The last override touching the key is the one whose value is in force.
        let culprit = overrides
            .iter()
            .rev()
            .find(|(_, o)| same_or_nested(&o.key, &path));
        ConfigError::new(match culprit {
            Some((text, _)) => format!("{message} (set by `--set {text}`)"),
            None => format!("{source_name}: {message}"),
        })
    })
}

/// Whether the override of `key` set what is at `path`: the key itself, something inside it
/// (`run.tracking[0]`, `rollout.sampling.temperature`), or a section holding it.
fn same_or_nested(key: &str, path: &str) -> bool {
    let inside = |outer: &str, inner: &str| {
        inner
            .strip_prefix(outer)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
    };
    inside(key, path) || inside(path, key)
}

/// Writes `over` into `base`: tables merge key by key, any other value replaces.
pub(crate) fn merge(base: &mut Table, over: Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(Value::Table(b)), Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests;
