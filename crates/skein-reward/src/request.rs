//! What is scored and what comes back, plus the one-line JSON answer shared by workers and the
//! HTTP service.

use crate::RewardError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One finished trajectory to score. Token ids are what the policy saw and sampled; the text is
/// their decoding, for programs that read text.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RewardRequest {
    pub id: String,
    pub data_source: String,
    pub prompt: String,
    pub response: String,
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
    pub ground_truth: String,
    pub metadata: serde_json::Value,
}

impl RewardRequest {
    /// Prompt plus response tokens: the default cost of scoring it with a model.
    pub fn tokens(&self) -> usize {
        self.prompt_ids.len() + self.response_ids.len()
    }
}

/// A scalar reward and optional named numbers that go to the run's metrics.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RewardOutput {
    pub reward: f64,
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
}

impl RewardOutput {
    pub fn new(reward: f64) -> Self {
        RewardOutput {
            reward,
            metrics: BTreeMap::new(),
        }
    }

    pub fn with_metric(mut self, name: &str, value: f64) -> Self {
        self.metrics.insert(name.to_string(), value);
        self
    }
}

/// The answer line: `{"id", "reward", "metrics"}` or `{"id", "error"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireResponse {
    #[serde(default)]
    pub id: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<f64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl WireResponse {
    pub fn from_result(id: &str, result: &Result<RewardOutput, RewardError>) -> Self {
        let id = serde_json::Value::String(id.to_string());
        match result {
            Ok(out) => WireResponse {
                id,
                reward: Some(out.reward),
                metrics: out.metrics.clone(),
                error: None,
            },
            Err(e) => WireResponse {
                id,
                reward: None,
                metrics: BTreeMap::new(),
                error: Some(e.to_string()),
            },
        }
    }

    /// The answer as a result for request `id`, or why it is not a valid answer to it.
    pub fn into_result(self, id: &str, source: &str) -> Result<RewardOutput, RewardError> {
        if self.id.as_str() != Some(id) {
            return Err(RewardError::Protocol {
                source: source.to_string(),
                detail: format!("answer for id {} where id \"{id}\" was expected", self.id),
            });
        }
        match (self.error, self.reward) {
            (Some(message), _) => Err(RewardError::Rejected {
                source: source.to_string(),
                message,
            }),
            (None, Some(reward)) if reward.is_finite() => Ok(RewardOutput {
                reward,
                metrics: self.metrics,
            }),
            (None, Some(reward)) => Err(RewardError::Protocol {
                source: source.to_string(),
                detail: format!("reward {reward} for id \"{id}\" is not a finite number"),
            }),
            (None, None) => Err(RewardError::Protocol {
                source: source.to_string(),
                detail: format!("answer for id \"{id}\" has neither `reward` nor `error`"),
            }),
        }
    }

    /// Parses one answer line.
    pub fn parse(line: &str, source: &str) -> Result<Self, RewardError> {
        serde_json::from_str(line).map_err(|e| RewardError::Protocol {
            source: source.to_string(),
            detail: format!("cannot parse answer {:?}: {e}", clip(line, 200)),
        })
    }
}

/// At most `n` characters of `s`, for error messages about untrusted text.
pub(crate) fn clip(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_missing_fields_default() {
        let r = RewardRequest {
            id: "a".into(),
            prompt_ids: vec![1, 2],
            response_ids: vec![3],
            metadata: serde_json::json!({"k": 1}),
            ..Default::default()
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<RewardRequest>(&text).unwrap(), r);
        assert_eq!(r.tokens(), 3);
        let sparse: RewardRequest = serde_json::from_str(r#"{"id":"x","response":"7"}"#).unwrap();
        assert_eq!(sparse.response, "7");
        assert!(sparse.response_ids.is_empty());
    }

    #[test]
    fn answers_must_match_the_id_and_carry_a_finite_reward_or_an_error() {
        let ok = WireResponse::parse(r#"{"id":"a","reward":0.5,"metrics":{"m":1}}"#, "w").unwrap();
        let out = ok.into_result("a", "w").unwrap();
        assert_eq!(out.reward, 0.5);
        assert_eq!(out.metrics["m"], 1.0);
        let wrong = WireResponse::parse(r#"{"id":"b","reward":1}"#, "w").unwrap();
        assert!(matches!(
            wrong.into_result("a", "w"),
            Err(RewardError::Protocol { .. })
        ));
        let rejected = WireResponse::parse(r#"{"id":"a","error":"no answer"}"#, "w").unwrap();
        let e = rejected.into_result("a", "w").unwrap_err();
        assert!(e.to_string().contains("no answer"), "{e}");
        let empty = WireResponse::parse(r#"{"id":"a"}"#, "w").unwrap();
        assert!(empty.into_result("a", "w").is_err());
        let e = WireResponse::parse("not json", "w")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not json") && e.contains("\"reward\""), "{e}");
    }

    #[test]
    fn results_become_answers() {
        let ok = WireResponse::from_result("a", &Ok(RewardOutput::new(1.0).with_metric("m", 2.0)));
        let text = serde_json::to_string(&ok).unwrap();
        assert_eq!(text, r#"{"id":"a","reward":1.0,"metrics":{"m":2.0}}"#);
        let err = WireResponse::from_result("a", &Err(RewardError::Shutdown));
        assert!(serde_json::to_string(&err).unwrap().contains("\"error\""));
    }

    #[test]
    fn clip_respects_char_boundaries() {
        assert_eq!(clip("héllo", 2), "hé…");
        assert_eq!(clip("hi", 5), "hi");
    }
}
