//! Built-in reward functions: cheap, pure, and run inline (no executor needed).

use crate::{math, BatchScorer, RewardError, RewardOutput, RewardRequest};
use serde::{Deserialize, Serialize};
use skein_config::Validator;

/// A built-in function, as written in the config (`kind = "math"` and its options). Each
/// kind's options are a struct of their own, so a wrong value among them is named by its key
/// (`reward.sources.len.max_response_tokens`), not only by its source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum RewardFn {
    /// 1 if the trimmed response equals the trimmed ground truth, else 0.
    ExactMatch,
    /// 1 if the final answer equals the reference answer (see `math`), else 0.
    Math(MathAnswer),
    /// 1 if every `require`d string appears, in order, and (if `boxed`) a `\boxed{}` answer
    /// exists; else 0.
    Format(FormatCheck),
    /// DAPO overlong shaping: 0 up to `max_response_tokens - overlong_buffer` response tokens,
    /// then falling linearly to `-penalty` at `max_response_tokens` (and staying there).
    Overlong(OverlongShaping),
}

/// The options of `kind = "math"`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MathAnswer {
    /// Without a `\boxed{}` or `####` answer, fall back to the last number in the response.
    #[serde(default)]
    pub flexible: bool,
}

/// The options of `kind = "format"`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FormatCheck {
    #[serde(default)]
    pub require: Vec<String>,
    #[serde(default)]
    pub boxed: bool,
}

/// The options of `kind = "overlong"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverlongShaping {
    pub max_response_tokens: usize,
    pub overlong_buffer: usize,
    #[serde(default = "one")]
    pub penalty: f64,
}

impl RewardFn {
    /// Strict `math`: a `\boxed{}` or `####` answer.
    pub fn math() -> Self {
        RewardFn::Math(MathAnswer { flexible: false })
    }

    /// `math` falling back to the response's last number.
    pub fn flexible_math() -> Self {
        RewardFn::Math(MathAnswer { flexible: true })
    }
}

fn one() -> f64 {
    1.0
}

impl RewardFn {
    /// Records every problem with the options under `key` (e.g. `reward.sources.len`).
    pub fn validate(&self, key: &str, v: &mut Validator) {
        match self {
            RewardFn::Format(FormatCheck { require, boxed }) => {
                v.check(
                    !require.is_empty() || *boxed,
                    &format!("{key}.require"),
                    "a format check needs at least one required string or `boxed = true`",
                    "[]",
                );
            }
            RewardFn::Overlong(OverlongShaping {
                max_response_tokens,
                overlong_buffer,
                penalty,
            }) => {
                v.at_least(&format!("{key}.overlong_buffer"), *overlong_buffer, 1);
                v.check(
                    overlong_buffer <= max_response_tokens,
                    &format!("{key}.overlong_buffer"),
                    &format!("must be ≤ max_response_tokens ({max_response_tokens})"),
                    overlong_buffer,
                );
                v.check(
                    penalty.is_finite() && *penalty >= 0.0,
                    &format!("{key}.penalty"),
                    "must be a finite number ≥ 0",
                    penalty,
                );
            }
            RewardFn::ExactMatch | RewardFn::Math(_) => {}
        }
    }

    /// Whether `response` answers `ground_truth` correctly, for the functions whose reward is
    /// that verdict (`math`, `exact_match`); None for those that reward something else
    /// (`format`, `overlong`). The trainer's accuracy uses it, so it agrees with `score`.
    pub fn verdict(&self, response: &str, ground_truth: &str) -> Option<bool> {
        match self {
            RewardFn::ExactMatch => Some(response.trim() == ground_truth.trim()),
            RewardFn::Math(MathAnswer { flexible }) => {
                let answer = math::extract_answer(response, *flexible);
                let reference = math::reference_answer(ground_truth);
                Some(
                    answer
                        .as_deref()
                        .is_some_and(|a| math::equivalent(a, &reference)),
                )
            }
            RewardFn::Format(_) | RewardFn::Overlong(_) => None,
        }
    }

    /// What a function with a verdict counts as correct, in words (None without one).
    pub fn verdict_rule(&self) -> Option<&'static str> {
        match self {
            RewardFn::ExactMatch => Some("exact_match: the trimmed response is the ground truth"),
            RewardFn::Math(MathAnswer { flexible: true }) => Some("math, flexible: last number"),
            RewardFn::Math(MathAnswer { flexible: false }) => Some(r"math: \boxed{} or ####"),
            RewardFn::Format(_) | RewardFn::Overlong(_) => None,
        }
    }

    pub fn score(&self, req: &RewardRequest) -> RewardOutput {
        match self {
            RewardFn::ExactMatch => {
                let hit = self.verdict(&req.response, &req.ground_truth) == Some(true);
                RewardOutput::new(indicator(hit)).with_metric("acc", indicator(hit))
            }
            RewardFn::Math(MathAnswer { flexible }) => {
                let answer = math::extract_answer(&req.response, *flexible);
                let hit = self.verdict(&req.response, &req.ground_truth) == Some(true);
                RewardOutput::new(indicator(hit))
                    .with_metric("acc", indicator(hit))
                    .with_metric("answer_found", indicator(answer.is_some()))
            }
            RewardFn::Format(FormatCheck { require, boxed }) => {
                let ok = in_order(&req.response, require)
                    && (!boxed || math::last_boxed(&req.response).is_some());
                RewardOutput::new(indicator(ok))
            }
            RewardFn::Overlong(OverlongShaping {
                max_response_tokens,
                overlong_buffer,
                penalty,
            }) => {
                let r = overlong_penalty(
                    req.response_ids.len(),
                    *max_response_tokens,
                    *overlong_buffer,
                    *penalty,
                );
                RewardOutput::new(r).with_metric("overlong", indicator(r < 0.0))
            }
        }
    }
}

fn indicator(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// Each of `needles` occurs in `text`, each after the end of the previous one.
fn in_order(text: &str, needles: &[String]) -> bool {
    let mut rest = text;
    for n in needles {
        match rest.find(n.as_str()) {
            Some(i) => rest = &rest[i + n.len()..],
            None => return false,
        }
    }
    true
}

/// The DAPO soft length penalty of a response of `len` tokens, in `[-penalty, 0]`.
pub fn overlong_penalty(len: usize, max_tokens: usize, buffer: usize, penalty: f64) -> f64 {
    let soft_start = max_tokens.saturating_sub(buffer);
    if len <= soft_start || buffer == 0 {
        return 0.0;
    }
    let over = (len - soft_start).min(buffer) as f64;
    -(over / buffer as f64) * penalty
}

impl BatchScorer for RewardFn {
    fn score_batch(&self, batch: &[RewardRequest]) -> Vec<Result<RewardOutput, RewardError>> {
        batch.iter().map(|r| Ok(self.score(r))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(response: &str, truth: &str) -> RewardRequest {
        RewardRequest {
            response: response.into(),
            ground_truth: truth.into(),
            ..Default::default()
        }
    }

    #[test]
    fn exact_match_trims_whitespace_only() {
        assert_eq!(RewardFn::ExactMatch.score(&req(" 42\n", "42")).reward, 1.0);
        assert_eq!(RewardFn::ExactMatch.score(&req("42.0", "42")).reward, 0.0);
    }

    #[test]
    fn math_reads_boxed_and_gsm8k_answers_against_a_worked_reference() {
        let f = RewardFn::math();
        let truth = "She has 3 + 4 = 7.\n#### 1,000";
        let out = f.score(&req(r"so \boxed{1000}", truth));
        assert_eq!((out.reward, out.metrics["answer_found"]), (1.0, 1.0));
        assert_eq!(f.score(&req("#### $1,000.", truth)).reward, 1.0);
        let miss = f.score(&req("the answer is 1000", truth));
        assert_eq!((miss.reward, miss.metrics["answer_found"]), (0.0, 0.0));
        let flexible = RewardFn::flexible_math();
        assert_eq!(
            flexible.score(&req("the answer is 1000", truth)).reward,
            1.0
        );
        assert_eq!(f.score(&req(r"\boxed{999}", truth)).reward, 0.0);
    }

    #[test]
    fn verdicts_agree_with_the_reward_and_only_answer_checks_have_one() {
        let (strict, flexible) = (RewardFn::math(), RewardFn::flexible_math());
        // A chat model's usual answer: an equation, no box, no `####`.
        assert_eq!(flexible.verdict("25 + 49 = 74", "74"), Some(true));
        assert_eq!(strict.verdict("25 + 49 = 74", "74"), Some(false));
        assert_eq!(flexible.verdict("25 + 49 = 72", "74"), Some(false));
        assert_eq!(RewardFn::ExactMatch.verdict(" 74\n", "74"), Some(true));
        for (f, response) in [
            (&strict, r"so \boxed{74}"),
            (&flexible, "25 + 49 = 74"),
            (&RewardFn::ExactMatch, "74"),
        ] {
            let reward = f.score(&req(response, "74")).reward;
            assert_eq!(f.verdict(response, "74"), Some(reward == 1.0), "{f:?}");
            assert!(f.verdict_rule().is_some());
        }
        let format = RewardFn::Format(FormatCheck {
            require: vec![],
            boxed: true,
        });
        let overlong = RewardFn::Overlong(OverlongShaping {
            max_response_tokens: 10,
            overlong_buffer: 5,
            penalty: 1.0,
        });
        for f in [format, overlong] {
            assert_eq!(f.verdict("74", "74"), None);
            assert_eq!(f.verdict_rule(), None);
        }
    }

    #[test]
    fn format_requires_strings_in_order_and_a_box() {
        let f = RewardFn::Format(FormatCheck {
            require: vec!["<think>".into(), "</think>".into()],
            boxed: true,
        });
        assert_eq!(f.score(&req(r"<think>x</think> \boxed{1}", "")).reward, 1.0);
        assert_eq!(f.score(&req(r"</think><think> \boxed{1}", "")).reward, 0.0);
        assert_eq!(f.score(&req("<think>x</think> 1", "")).reward, 0.0);
    }

    #[test]
    fn overlong_penalty_is_linear_inside_the_buffer() {
        assert_eq!(overlong_penalty(50, 100, 20, 1.0), 0.0);
        assert_eq!(overlong_penalty(80, 100, 20, 1.0), 0.0);
        assert_eq!(overlong_penalty(90, 100, 20, 1.0), -0.5);
        assert_eq!(overlong_penalty(100, 100, 20, 1.0), -1.0);
        assert_eq!(overlong_penalty(150, 100, 20, 0.5), -0.5);
        let f = RewardFn::Overlong(OverlongShaping {
            max_response_tokens: 100,
            overlong_buffer: 20,
            penalty: 1.0,
        });
        let r = RewardRequest {
            response_ids: vec![0; 95],
            ..Default::default()
        };
        assert_eq!(f.score(&r).reward, -0.75);
    }

    #[test]
    fn options_are_validated_with_their_keys() {
        let mut v = Validator::new();
        RewardFn::Overlong(OverlongShaping {
            max_response_tokens: 10,
            overlong_buffer: 20,
            penalty: f64::NAN,
        })
        .validate("reward.sources.len", &mut v);
        RewardFn::Format(FormatCheck {
            require: vec![],
            boxed: false,
        })
        .validate("reward.sources.fmt", &mut v);
        let e = v.finish().unwrap_err().to_string();
        assert!(
            e.contains("`reward.sources.len.overlong_buffer`: must be ≤ max_response_tokens (10)"),
            "{e}"
        );
        assert!(e.contains("`reward.sources.len.penalty`"), "{e}");
        assert!(e.contains("`reward.sources.fmt.require`"), "{e}");
    }

    #[test]
    fn specs_parse_from_tagged_json() {
        let f: RewardFn = serde_json::from_str(r#"{"kind":"math","flexible":true}"#).unwrap();
        assert_eq!(f, RewardFn::flexible_math());
        assert!(serde_json::from_str::<RewardFn>(r#"{"kind":"math","flex":true}"#).is_err());
    }
}
