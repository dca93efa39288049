//! Final-answer extraction and equivalence for math-style rewards.
//!
//! The answer is the content of the last `\boxed{...}` (braces may nest), else what follows the
//! last `#### ` marker (the GSM8K convention), else, in flexible mode, the last number in the
//! text. Two answers are equal when both read as numbers that agree (after dropping `$`,
//! thousands separators, a trailing `.`, `%`, and reading `a/b` and signed `\frac{a}{b}`), or else
//! when their normalised text is identical. All of it runs on untrusted model output: no input
//! panics.

/// The content of the last `\boxed{...}` or `\fbox{...}`, or of `\boxed 42` (up to a space or `$`).
pub fn last_boxed(text: &str) -> Option<&str> {
    let start = [r"\boxed", r"\fbox"]
        .iter()
        .filter_map(|m| text.rfind(m).map(|i| i + m.len()))
        .max()?;
    let rest = &text[start..];
    if let Some(body) = rest.strip_prefix('{') {
        return braced(body);
    }
    let body = rest.strip_prefix(' ')?.trim_start();
    let end = body
        .find(|c: char| c.is_whitespace() || c == '$')
        .unwrap_or(body.len());
    (end > 0).then(|| &body[..end])
}

/// The text before the `}` that closes an already-opened `{`; `None` if it never closes.
fn braced(body: &str) -> Option<&str> {
    let mut depth = 1usize;
    for (i, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&body[..i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// What follows the last `####` on its line, trimmed.
pub fn hash_answer(text: &str) -> Option<&str> {
    let start = text.rfind("####")? + 4;
    let line = text[start..].lines().next().unwrap_or("").trim();
    (!line.is_empty()).then_some(line)
}

/// The last number written in `text` (digits with optional sign, `,` separators and decimals).
pub fn last_number(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut end = bytes.len();
    while end > 0 && !bytes[end - 1].is_ascii_digit() {
        end -= 1;
    }
    if end == 0 {
        return None;
    }
    let mut start = end;
    while start > 0
        && (bytes[start - 1].is_ascii_digit() || matches!(bytes[start - 1], b'.' | b','))
    {
        start -= 1;
    }
    if start > 0 && bytes[start - 1] == b'-' {
        start -= 1;
    }
    // Everything in [start, end) is ASCII, so these are char boundaries. Separators before
    // the first digit are punctuation, except a point right before it: `.5` is a number.
    let (sign, span) = match text[start..end].strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", &text[start..end]),
    };
    let first_digit = span.find(|c: char| c.is_ascii_digit()).unwrap_or(0);
    let from = match first_digit.checked_sub(1) {
        Some(point) if span.as_bytes()[point] == b'.' => point,
        _ => first_digit,
    };
    let digits = &span[from..];
    Some(format!("{sign}{digits}"))
}

/// The final answer of a response: boxed, else `####`, else (if `flexible`) the last number.
pub fn extract_answer(text: &str, flexible: bool) -> Option<String> {
    if let Some(b) = last_boxed(text) {
        return Some(b.trim().to_string());
    }
    if let Some(h) = hash_answer(text) {
        return Some(h.to_string());
    }
    if flexible {
        return last_number(text);
    }
    None
}

/// The reference answer of a ground truth that may be a full worked solution.
pub fn reference_answer(ground_truth: &str) -> String {
    extract_answer(ground_truth, false).unwrap_or_else(|| ground_truth.trim().to_string())
}

/// Reads an answer as a number, if it is one.
pub fn parse_number(answer: &str) -> Option<f64> {
    let (num, den) = number_parts(answer)?;
    let (n, d) = (plain_number(&num)?, plain_number(&den)?);
    (d != 0.0).then(|| n / d)
}

/// The numerator and denominator an answer is written as (`\frac{a}{b}`, `a/b`, or a plain
/// number over `1`), each still text.
fn number_parts(answer: &str) -> Option<(String, String)> {
    let s = normalize(answer);
    let s = s.trim_end_matches('%');
    // A sign before a fraction is its numerator's: `-\frac{1}{2}` is `\frac{-1}{2}`.
    let (sign, unsigned) = match s.strip_prefix(['-', '+']) {
        Some(rest) if rest.starts_with(r"\frac") => (&s[..1], rest),
        _ => ("", s),
    };
    if let Some((num, den)) = frac(unsigned) {
        return Some((format!("{sign}{num}"), den.into()));
    }
    if let Some((num, den)) = s.split_once('/') {
        return Some((num.into(), den.into()));
    }
    Some((s.into(), "1".into()))
}

/// `[+-]digits[.digits]` only: no `inf`, `nan` or exponents sneaking in through `f64::from_str`.
fn plain_number(s: &str) -> Option<f64> {
    let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
    let ok = !digits.is_empty()
        && digits.bytes().any(|b| b.is_ascii_digit())
        && digits.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && digits.bytes().filter(|&b| b == b'.').count() <= 1;
    if !ok {
        return None;
    }
    s.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// A plain number's exact value as `numerator / 10^decimals`, if it fits an `i128`.
fn exact_decimal(s: &str) -> Option<(i128, i128)> {
    plain_number(s)?;
    let (negative, digits) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let (whole, decimals) = digits.split_once('.').unwrap_or((digits, ""));
    let all: String = format!("{whole}{decimals}");
    let all = all.trim_start_matches('0');
    let magnitude: i128 = if all.is_empty() { 0 } else { all.parse().ok()? };
    let scale = 10i128.checked_pow(u32::try_from(decimals.len()).ok()?)?;
    Some((if negative { -magnitude } else { magnitude }, scale))
}

/// An answer's exact value as a fraction (`numerator`, `denominator` ≠ 0), if it is a number
/// whose parts fit an `i128`.
fn exact_number(answer: &str) -> Option<(i128, i128)> {
    let (num, den) = number_parts(answer)?;
    let ((n, n_scale), (d, d_scale)) = (exact_decimal(&num)?, exact_decimal(&den)?);
    let numerator = n.checked_mul(d_scale)?;
    let denominator = d.checked_mul(n_scale)?;
    (denominator != 0).then_some((numerator, denominator))
}

/// `\frac{a}{b}` (also `\dfrac`, `\tfrac`) as its two parts. As in LaTeX, an argument without
/// braces is one character: `\frac12` is `\frac{1}{2}`.
fn frac(s: &str) -> Option<(&str, &str)> {
    let (num, rest) = latex_argument(s.strip_prefix(r"\frac")?)?;
    let (den, rest) = latex_argument(rest)?;
    rest.is_empty().then_some((num, den))
}

/// A LaTeX command's next argument, `{...}` or a single character, and the text after it.
fn latex_argument(s: &str) -> Option<(&str, &str)> {
    if let Some(body) = s.strip_prefix('{') {
        let arg = braced(body)?;
        return Some((arg, &body[arg.len() + 1..]));
    }
    let c = s.chars().next().filter(|c| c.is_ascii_digit())?;
    Some(s.split_at(c.len_utf8()))
}

/// Drops what does not change an answer's value: whitespace, `$`, thousands separators, sizing
/// commands, degree marks, a trailing period.
pub fn normalize(answer: &str) -> String {
    let mut s: String = answer.chars().filter(|c| !c.is_whitespace()).collect();
    for (from, to) in [
        (r"\left", ""),
        (r"\right", ""),
        (r"\!", ""),
        (r"\,", ""),
        (r"\$", ""),
        ("$", ""),
        (r"\%", "%"),
        (r"^{\circ}", ""),
        (r"^\circ", ""),
        (r"\dfrac", r"\frac"),
        (r"\tfrac", r"\frac"),
    ] {
        s = s.replace(from, to);
    }
    // A comma between digits is a thousands separator; elsewhere (tuples) it is kept.
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len());
    for (i, &c) in chars.iter().enumerate() {
        let between_digits = i > 0
            && i + 1 < chars.len()
            && chars[i - 1].is_ascii_digit()
            && chars[i + 1].is_ascii_digit();
        if !(c == ',' && between_digits) {
            out.push(c);
        }
    }
    out.trim_end_matches('.').to_string()
}

/// Whether `answer` and `reference` are the same answer. Numbers are equal when their values
/// are, exactly: `0.5`, `1/2` and `\frac{1}{2}` are one answer, while `1000001` is not
/// `1000000` and `0.333` is not `\frac{1}{3}`. Numbers too long for exact arithmetic (over
/// about 38 digits) are equal only when written the same.
pub fn equivalent(answer: &str, reference: &str) -> bool {
    if let (Some((a, b)), Some((c, d))) = (exact_number(answer), exact_number(reference)) {
        return match (a.checked_mul(d), c.checked_mul(b)) {
            (Some(left), Some(right)) => left == right,
            _ => normalize(answer) == normalize(reference),
        };
    }
    match (parse_number(answer), parse_number(reference)) {
        (Some(_), Some(_)) => normalize(answer) == normalize(reference),
        _ => {
            let (a, b) = (normalize(answer), normalize(reference));
            !a.is_empty() && a == b
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxed_answers_with_nested_braces_take_the_last_box() {
        assert_eq!(
            last_boxed(r"so \boxed{1} then \boxed{\frac{1}{2}}."),
            Some(r"\frac{1}{2}")
        );
        assert_eq!(last_boxed(r"\fbox{7}"), Some("7"));
        assert_eq!(last_boxed(r"\boxed 42$ done"), Some("42"));
        assert_eq!(last_boxed(r"\boxed{unclosed {"), None);
        assert_eq!(last_boxed("nothing here"), None);
        assert_eq!(last_boxed(r"\boxed"), None);
    }

    #[test]
    fn gsm8k_marker_and_flexible_last_number() {
        assert_eq!(hash_answer("work\n#### 1,234\nmore"), Some("1,234"));
        assert_eq!(hash_answer("####   "), None);
        assert_eq!(last_number("a 3 then -12.5."), Some("-12.5".into()));
        assert_eq!(last_number("no digits"), None);
        // A point before the digits is the number's own; other separators are not.
        assert_eq!(last_number("x = .5"), Some(".5".into()));
        assert_eq!(last_number("so -.25 it is"), Some("-.25".into()));
        assert_eq!(last_number("items: ,7"), Some("7".into()));
        assert_eq!(last_number("and so on...,3"), Some("3".into()));
        assert_eq!(extract_answer("is 5 or 6", false), None);
        assert_eq!(extract_answer("is 5 or 6", true), Some("6".into()));
        assert_eq!(
            extract_answer(r"#### 3 and \boxed{4}", false),
            Some("4".into())
        );
        assert_eq!(
            reference_answer("Natalia sold 48/2 = 24 clips.\n#### 72"),
            "72"
        );
        assert_eq!(reference_answer(" 72 "), "72");
    }

    #[test]
    fn numbers_compare_by_value() {
        for (a, b) in [
            ("$1,234.", "1234"),
            ("72.0", "72"),
            (r"\frac{1}{2}", "0.5"),
            (r"\dfrac{3}{4}", "3/4"),
            ("50%", "50"),
            (r"10^\circ", "10"),
            ("-3", "-3.0"),
        ] {
            assert!(equivalent(a, b), "{a} vs {b}");
        }
        for (a, b) in [("72", "73"), ("1/0", "0"), ("", ""), ("1e3", "1000")] {
            assert!(!equivalent(a, b), "{a} vs {b}");
        }
        // Exact, not within a tolerance: a near miss of a large count, or a rounded decimal
        // of a fraction, is another answer.
        for (a, b) in [
            ("1000001", "1000000"),
            ("5000004", "5000000"),
            ("0.0000015", "0.000001"),
            ("0.333333", r"\frac{1}{3}"),
            ("9007199254740993", "9007199254740992"),
        ] {
            assert!(!equivalent(a, b), "{a} vs {b}");
        }
        for (a, b) in [
            ("0.50", "1/2"),
            ("-1.5", r"\frac{-3}{2}"),
            ("+007", "7"),
            ("2/4", "0.5"),
            ("0", "-0.0"),
            (".5", "1/2"),
            ("-.5", r"-\frac{1}{2}"),
            (r"-\frac{1}{2}", "-0.5"),
            (r"-\dfrac{3}{4}", "-3/4"),
            (r"+\frac{1}{2}", "0.5"),
            (r"\frac12", "0.5"),
            (r"-\frac34", r"\frac{-3}{4}"),
            (r"\frac{1}2", "1/2"),
        ] {
            assert!(equivalent(a, b), "{a} vs {b}");
        }
        let long = "1234567890123456789012345678901234567890";
        assert!(equivalent(long, long) && !equivalent(long, &long.replace('0', "1")));
        assert!(equivalent(r"\left(1,2\right)", "(1, 2)"));
        assert_eq!(parse_number("nan"), None);
        assert_eq!(parse_number("inf"), None);
        assert_eq!(parse_number(r"\frac{1}{2}x"), None);
        assert_eq!(parse_number(r"\frac123"), None);
        assert_eq!(parse_number(r"--\frac{1}{2}"), None);
        assert!(!equivalent(r"-\frac{1}{2}", "0.5") && !equivalent(r"\frac12", "12"));
    }

    #[test]
    fn arbitrary_text_never_panics() {
        for t in [
            "",
            "####",
            r"\boxed{",
            "}{",
            "é#### é",
            r"\frac{",
            r"\frac{1}{",
            r"-\frac",
            r"\frac1",
            r"\fracé",
            "-.",
            ".",
            "-",
            "..,",
        ] {
            let _ = extract_answer(t, true);
            let _ = equivalent(t, t);
        }
    }
}
