//! Prompts longer than the limit: an error, filtered out (counted), or cut to fit.

use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Truncation {
    /// A prompt over the limit stops the run, naming it.
    Error,
    /// It is left out, and counted.
    Filter,
    /// Its first tokens are cut (the end of the prompt is kept).
    Left,
    /// Its last tokens are cut.
    Right,
}

impl Truncation {
    pub const NAMES: &'static [&'static str] = &["error", "filter", "left", "right"];
}

impl FromStr for Truncation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "error" => Ok(Truncation::Error),
            "filter" => Ok(Truncation::Filter),
            "left" => Ok(Truncation::Left),
            "right" => Ok(Truncation::Right),
            other => Err(format!(
                "unknown truncation `{other}` (allowed: {})",
                Truncation::NAMES.join(", ")
            )),
        }
    }
}

impl fmt::Display for Truncation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = *self as usize;
        f.write_str(Truncation::NAMES[i])
    }
}

/// What to do with a prompt of `len` tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fit {
    Keep,
    /// Keep the tokens in this range.
    Cut(std::ops::Range<usize>),
    Drop,
    /// Too long, and `Truncation::Error` says that is an error.
    TooLong,
}

/// The decision for a prompt of `len` tokens under a limit of `max` (0: no limit).
pub fn fit(len: usize, max: usize, truncation: Truncation) -> Fit {
    if max == 0 || len <= max {
        return Fit::Keep;
    }
    match truncation {
        Truncation::Error => Fit::TooLong,
        Truncation::Filter => Fit::Drop,
        Truncation::Left => Fit::Cut(len - max..len),
        Truncation::Right => Fit::Cut(0..max),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_policy_decides_over_the_limit_only() {
        for t in [
            Truncation::Error,
            Truncation::Filter,
            Truncation::Left,
            Truncation::Right,
        ] {
            assert_eq!(fit(5, 5, t), Fit::Keep);
            assert_eq!(fit(50, 0, t), Fit::Keep);
            assert_eq!(t.to_string().parse::<Truncation>(), Ok(t));
        }
        assert_eq!(fit(7, 5, Truncation::Error), Fit::TooLong);
        assert_eq!(fit(7, 5, Truncation::Filter), Fit::Drop);
        assert_eq!(fit(7, 5, Truncation::Left), Fit::Cut(2..7));
        assert_eq!(fit(7, 5, Truncation::Right), Fit::Cut(0..5));
        assert!("middle"
            .parse::<Truncation>()
            .unwrap_err()
            .contains("left, right"));
    }
}
