//! A config written as TOML, optionally with a `# doc` comment above each key: the resolved
//! config of a run, and the documented defaults that `--print-config` shows.

use crate::ConfigError;
use serde::Serialize;
use toml::{Table, Value};

/// The one-line (or few-line) documentation of a dotted key, e.g.
/// `KeyDoc { key: "rollout.temperature", doc: "Sampling temperature; 0 = greedy." }`.
/// A section may be documented too (`key: "rollout"`): the comment goes above its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDoc {
    pub key: &'static str,
    pub doc: &'static str,
}

/// `cfg` as TOML, keys in declaration order, sections as `[a.b]` headers.
pub fn to_toml_string<T: Serialize>(cfg: &T) -> String {
    render_documented(cfg, &[])
}

/// `cfg` as TOML with each documented key's doc as a `# ` comment above it. Documented keys
/// absent from `cfg` (an `Option` that is `None`) are listed as comments in their section, so
/// every key shows up.
pub fn render_documented<T: Serialize>(cfg: &T, docs: &[KeyDoc]) -> String {
    match Value::try_from(cfg) {
        Ok(Value::Table(t)) => {
            let mut out = String::new();
            write_table(&mut out, &t, "", docs);
            out.trim_start_matches('\n').to_string()
        }
        Ok(other) => format!(
            "# the config is a {}, not a table of keys\n",
            other.type_str()
        ),
        Err(e) => format!("# the config could not be written as TOML: {e}\n"),
    }
}

fn write_table(out: &mut String, table: &Table, prefix: &str, docs: &[KeyDoc]) {
    let dotted = |k: &str| {
        if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}.{k}")
        }
    };
    for (k, v) in table.iter().filter(|(_, v)| !v.is_table()) {
        comment(out, doc_of(docs, &dotted(k)));
        out.push_str(&format!("{} = {v}\n", bare_or_quoted(k)));
    }
    // Documented keys the value lacks (unset options) directly in this section.
    for d in docs {
        let leaf = if prefix.is_empty() {
            Some(d.key)
        } else {
            d.key.strip_prefix(prefix).and_then(|r| r.strip_prefix('.'))
        };
        if let Some(leaf) =
            leaf.filter(|l| !l.is_empty() && !l.contains('.') && !table.contains_key(*l))
        {
            comment(out, Some(d.doc));
            out.push_str(&format!("# {} is unset by default\n", bare_or_quoted(leaf)));
        }
    }
    for (k, v) in table.iter() {
        if let Value::Table(sub) = v {
            let path = dotted(k);
            out.push('\n');
            comment(out, doc_of(docs, &path));
            let header: Vec<String> = path.split('.').map(bare_or_quoted).collect();
            out.push_str(&format!("[{}]\n", header.join(".")));
            write_table(out, sub, &path, docs);
        }
    }
}

fn doc_of<'a>(docs: &'a [KeyDoc], key: &str) -> Option<&'a str> {
    docs.iter().find(|d| d.key == key).map(|d| d.doc)
}

fn comment(out: &mut String, doc: Option<&str>) {
    for line in doc.into_iter().flat_map(str::lines) {
        if line.is_empty() {
            out.push_str("#\n");
        } else {
            out.push_str(&format!("# {line}\n"));
        }
    }
}

fn bare_or_quoted(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        key.to_string()
    } else {
        Value::String(key.to_string()).to_string()
    }
}

/// Every leaf key of `cfg` (dotted), in declaration order.
pub fn keys<T: Serialize>(cfg: &T) -> Vec<String> {
    fn walk(t: &Table, prefix: &str, out: &mut Vec<String>) {
        for (k, v) in t {
            let path = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                Value::Table(sub) => walk(sub, &path, out),
                _ => out.push(path),
            }
        }
    }
    let mut out = Vec::new();
    if let Ok(Value::Table(t)) = Value::try_from(cfg) {
        walk(&t, "", &mut out);
    }
    out
}

/// Checks that every key of `cfg` has a doc and every doc names a key or section of `cfg`
/// (or, for an unset option, a key whose section exists). Meant for a test of the caller's
/// config, so "every key is documented" cannot silently stop being true.
pub fn check_docs<T: Serialize>(cfg: &T, docs: &[KeyDoc]) -> Result<(), ConfigError> {
    let keys = keys(cfg);
    let mut problems: Vec<String> = keys
        .iter()
        .filter(|k| doc_of(docs, k).is_none())
        .map(|k| format!("key `{k}` has no doc"))
        .collect();
    let is_section = |s: &str| s.is_empty() || keys.iter().any(|k| k.starts_with(&format!("{s}.")));
    for d in docs {
        let section = d.key.rsplit_once('.').map_or("", |(s, _)| s);
        if !keys.iter().any(|k| k == d.key) && !is_section(d.key) && !is_section(section) {
            problems.push(format!("doc for `{}` names no key of the config", d.key));
        }
        if docs.iter().filter(|o| o.key == d.key).count() > 1 {
            problems.push(format!("`{}` is documented more than once", d.key));
        }
    }
    problems.dedup();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ConfigError::many(problems))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_are_not_bare_are_quoted_so_the_output_parses() {
        assert_eq!(bare_or_quoted("lr_min-2"), "lr_min-2");
        assert_eq!(bare_or_quoted("reward/mean"), "\"reward/mean\"");
        let mut t = Table::new();
        t.insert("a b".into(), Value::Integer(1));
        let mut sub = Table::new();
        sub.insert("x.y".into(), Value::Boolean(true));
        t.insert("s/t".into(), Value::Table(sub));
        let text = to_toml_string(&t);
        assert_eq!(text, "\"a b\" = 1\n\n[\"s/t\"]\n\"x.y\" = true\n");
        assert_eq!(text.parse::<Table>().unwrap(), t);
    }
}
