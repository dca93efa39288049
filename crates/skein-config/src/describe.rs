//! Serde's and TOML's messages rewritten to name the full dotted key and what is allowed there.

/// How a nested deserialization ([`crate::deserialize_nested`]) hands its path outward:
/// "at `timeout_ms`: invalid type: …" in the message of the error it returns.
const NESTED_AT: &str = "at `";

/// The message of an error at `path` inside a nested deserialization, for
/// [`deserialize_error`] to join to the outer path.
pub fn nested_error(path: &str, inner: &str) -> String {
    if path == "." {
        inner.to_string()
    } else {
        format!("{NESTED_AT}{path}`: {inner}")
    }
}

/// A deserialization error at dotted `path`, from serde's one-line `inner` message.
pub fn deserialize_error(path: &str, inner: &str) -> String {
    let path = if path == "." { "" } else { path };
    if let Some((nested, rest)) = inner
        .strip_prefix(NESTED_AT)
        .and_then(|r| r.split_once("`: "))
    {
        let joined = if path.is_empty() {
            nested.to_string()
        } else {
            format!("{path}.{nested}")
        };
        return deserialize_error(&joined, rest);
    }
    if let Some(rest) = inner.strip_prefix("unknown field `") {
        let (field, expected) = rest.split_once('`').unwrap_or((rest, ""));
        return unknown_key(path, field, &names(expected));
    }
    if let Some(rest) = inner.strip_prefix("unknown variant `") {
        let (got, expected) = rest.split_once('`').unwrap_or((rest, ""));
        return format!(
            "invalid value for `{path}`: `{got}` (allowed: {})",
            names(expected).join(", ")
        );
    }
    // "invalid type: string \"many\", expected usize" reads better the other way round.
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some((got, expected)) = inner
            .strip_prefix(prefix)
            .and_then(|r| r.rsplit_once(", expected "))
        {
            let expected = friendly(expected);
            return format!("invalid value for `{path}`: expected {expected}, got {got}");
        }
    }
    format!("invalid value for `{path}`: {inner}")
}

/// Rust type names as a config author would say them.
fn friendly(expected: &str) -> String {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => "a non-negative integer".into(),
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "an integer".into(),
        "f32" | "f64" => "a number".into(),
        "a boolean" | "a string" => expected.into(),
        "a sequence" => "an array".into(),
        e if e.starts_with("struct ") || e == "a map" => "a section (a table of keys)".into(),
        e => e.into(),
    }
}

/// "unknown key `trainer.lrr` (allowed keys in `trainer`: lr, steps; did you mean `lr`?)".
/// serde_path_to_error's path ends with the unknown field, but for a section serde buffers
/// before it reads it (an enum tagged by `kind`, such as a reward source), where the path
/// stops at the section: the field is then appended to it.
fn unknown_key(path: &str, field: &str, allowed: &[String]) -> String {
    let path = match path.rsplit('.').next() {
        Some(last) if !path.is_empty() && last != field => format!("{path}.{field}"),
        _ => path.to_string(),
    };
    let section = match path.rsplit_once('.') {
        Some((section, _)) => format!("in `{section}`"),
        None => "at the top level".to_string(),
    };
    let key = if path.is_empty() { field } else { &path };
    let allowed_list = if allowed.is_empty() {
        "none".to_string()
    } else {
        allowed.join(", ")
    };
    let hint = closest(field, allowed)
        .map(|k| format!("; did you mean `{k}`?"))
        .unwrap_or_default();
    format!("unknown key `{key}` (allowed keys {section}: {allowed_list}{hint})")
}

/// The names in serde's "expected one of `a`, `b`" / "expected `a` or `b`" / "there are no
/// fields" tail.
fn names(expected: &str) -> Vec<String> {
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// An allowed key within two edits of `field` (a typo), if there is one.
fn closest<'a>(field: &str, allowed: &'a [String]) -> Option<&'a str> {
    allowed
        .iter()
        .map(|a| (edit_distance(field, a), a))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, a)| a.as_str())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// "{source}:{line}:{col}: TOML syntax error: {message}", then the offending line and a caret.
pub fn syntax_error(source: &str, text: &str, err: &toml::de::Error) -> String {
    let message = err
        .message()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(", ");
    let Some(span) = err.span() else {
        return format!("{source}: TOML syntax error: {message}");
    };
    let start = span.start.min(text.len());
    let before = &text[..start];
    let line_no = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before[line_start..].chars().count() + 1;
    let line = text[line_start..].lines().next().unwrap_or("");
    format!(
        "{source}:{line_no}:{col}: TOML syntax error: {message}\n  {line}\n  {}^",
        " ".repeat(col - 1)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_name_the_key_the_section_and_a_near_miss() {
        let m = deserialize_error(
            "trainer.lrr",
            "unknown field `lrr`, expected one of `lr`, `warmup_steps`",
        );
        assert_eq!(
            m,
            "unknown key `trainer.lrr` (allowed keys in `trainer`: lr, warmup_steps; did you mean `lr`?)"
        );
        let m = deserialize_error("zzz", "unknown field `zzz`, expected `a` or `b`");
        assert_eq!(m, "unknown key `zzz` (allowed keys at the top level: a, b)");
        let m = deserialize_error("x.y", "unknown field `y`, there are no fields");
        assert_eq!(m, "unknown key `x.y` (allowed keys in `x`: none)");
    }

    #[test]
    fn type_and_variant_errors_name_key_and_expectation() {
        assert_eq!(
            deserialize_error(
                "trainer.steps",
                "invalid type: string \"many\", expected usize"
            ),
            "invalid value for `trainer.steps`: expected a non-negative integer, got string \"many\""
        );
        assert_eq!(
            deserialize_error(
                "algo.kind",
                "unknown variant `ppx`, expected one of `ppo`, `grpo`"
            ),
            "invalid value for `algo.kind`: `ppx` (allowed: ppo, grpo)"
        );
    }

    /// A section deserialized on its own (a reward source, read by its `kind`) hands its
    /// inner path out in its message; the key named is the whole path.
    #[test]
    fn a_nested_path_is_joined_to_the_outer_one() {
        let inner = nested_error("timeout_ms", "invalid type: string \"30s\", expected u64");
        assert_eq!(
            deserialize_error("reward.sources.py", &inner),
            "invalid value for `reward.sources.py.timeout_ms`: expected a non-negative \
             integer, got string \"30s\""
        );
        let inner = nested_error(
            "urll",
            "unknown field `urll`, expected `url` or `timeout_ms`",
        );
        assert_eq!(
            deserialize_error("reward.sources.rm", &inner),
            "unknown key `reward.sources.rm.urll` (allowed keys in `reward.sources.rm`: url, \
             timeout_ms; did you mean `url`?)"
        );
        assert_eq!(
            nested_error(".", "missing field `url`"),
            "missing field `url`"
        );
    }

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("lr", "lr"), 0);
        assert_eq!(edit_distance("lrr", "lr"), 1);
        assert_eq!(edit_distance("stpes", "steps"), 2);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}
