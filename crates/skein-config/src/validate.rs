//! Start-up checks of values a config parsed fine but cannot use. All problems are collected and
//! reported together, each naming its key, the rule and the value given.

use crate::ConfigError;
use std::fmt::Display;

/// One check on its own: `Err` ("invalid value for `key`: rule (got value)") unless `ok`.
pub fn ensure(ok: bool, key: &str, rule: &str, got: impl Display) -> Result<(), ConfigError> {
    let mut v = Validator::new();
    v.check(ok, key, rule, got);
    v.finish()
}

/// Collects every problem with a config, then reports them all at once:
///
/// ```
/// # use skein_config::Validator;
/// let (temperature, estimator) = (-1.0, "ppx");
/// let mut v = Validator::new();
/// v.check(temperature > 0.0, "rollout.temperature", "must be > 0", temperature);
/// v.one_of("algorithm.estimator", estimator, &["grpo", "rloo"]);
/// let err = v.finish().unwrap_err().to_string();
/// assert!(err.contains("invalid value for `rollout.temperature`: must be > 0 (got -1)"));
/// assert!(err.contains("`ppx` is not one of: grpo, rloo"));
/// ```
#[derive(Debug, Default)]
pub struct Validator {
    problems: Vec<String>,
}

impl Validator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a problem with `key` unless `ok`; `rule` says what is allowed ("must be > 0").
    pub fn check(&mut self, ok: bool, key: &str, rule: &str, got: impl Display) -> &mut Self {
        if !ok {
            self.problems
                .push(format!("invalid value for `{key}`: {rule} (got {got})"));
        }
        self
    }

    /// `got` must be one of `allowed`.
    pub fn one_of(&mut self, key: &str, got: &str, allowed: &[&str]) -> &mut Self {
        if !allowed.contains(&got) {
            self.problems.push(format!(
                "invalid value for `{key}`: `{got}` is not one of: {}",
                allowed.join(", ")
            ));
        }
        self
    }

    /// `got` must be a number ≥ `min` (NaN never is).
    pub fn at_least<N: PartialOrd + Display>(&mut self, key: &str, got: N, min: N) -> &mut Self {
        let rule = format!("must be ≥ {min}");
        self.check(got >= min, key, &rule, got)
    }

    /// `got` must lie in `[lo, hi]` (NaN never does).
    pub fn in_range<N: PartialOrd + Display>(
        &mut self,
        key: &str,
        got: N,
        lo: N,
        hi: N,
    ) -> &mut Self {
        let rule = format!("must be in [{lo}, {hi}]");
        self.check(got >= lo && got <= hi, key, &rule, got)
    }

    /// A problem that is not about one value's range, e.g. two keys that disagree.
    pub fn problem(&mut self, message: impl Into<String>) -> &mut Self {
        self.problems.push(message.into());
        self
    }

    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }

    /// `Ok` if every check passed, else one error listing every problem.
    pub fn finish(self) -> Result<(), ConfigError> {
        if self.problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::many(self.problems))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ensure_names_key_rule_and_value() {
        assert!(ensure(true, "a", "must be > 0", 1).is_ok());
        assert_eq!(
            ensure(false, "rollout.temperature", "must be > 0", -1.0)
                .unwrap_err()
                .to_string(),
            "invalid value for `rollout.temperature`: must be > 0 (got -1)"
        );
    }

    #[test]
    fn validator_reports_every_problem_together() {
        let mut v = Validator::new();
        v.at_least("rollout.samples_per_prompt", 0, 1)
            .in_range("rollout.top_p", f64::NAN, 0.0, 1.0)
            .in_range("rollout.top_p_ok", 0.5, 0.0, 1.0)
            .one_of("algorithm.estimator", "grpo", &["grpo", "rloo"])
            .one_of("algorithm.loss", "mean", &["token-mean", "seq-mean"]);
        assert!(!v.is_ok());
        let err = v.finish().unwrap_err();
        assert_eq!(
            err.problems(),
            [
                "invalid value for `rollout.samples_per_prompt`: must be ≥ 1 (got 0)",
                "invalid value for `rollout.top_p`: must be in [0, 1] (got NaN)",
                "invalid value for `algorithm.loss`: `mean` is not one of: token-mean, seq-mean",
            ]
        );
        assert!(err
            .to_string()
            .starts_with("3 problems in the configuration:"));
        let mut ok = Validator::new();
        ok.at_least("a", 2.0, 1.0);
        assert!(ok.finish().is_ok());
    }
}
