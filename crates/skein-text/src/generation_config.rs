//! `generation_config.json`: the sampling defaults and stop tokens a checkpoint ships with.

use crate::json_file;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// File name inside a model directory.
pub const FILE_NAME: &str = "generation_config.json";

/// A token id field that HF writes either as one int or as a list (`eos_token_id`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

impl TokenIds {
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::One(id) => vec![*id],
            TokenIds::Many(ids) => ids.clone(),
        }
    }
}

/// The fields skein reads; every other key is kept in `extra` so that `save` writes back what
/// `load` read.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerationConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<TokenIds>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_token_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_new_tokens: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub do_sample: Option<bool>,
    /// The ids of `eos_token_id` that a skein run added as stops (its
    /// `rollout.sampling.stop_token_ids`, a `</answer>` or `</tool_call>`), not the
    /// tokenizer's end of sequence: generation ends at them, but their text is part of the
    /// response. Other readers of the file ignore the key and stop at every id.
    #[serde(
        default,
        rename = "skein_added_stop_token_ids",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub added_stop_ids: Vec<u32>,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl GenerationConfig {
    /// Reads a `generation_config.json` file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        json_file::read(path.as_ref())
    }

    /// Reads `dir/generation_config.json`; `None` when the directory has none (it is optional).
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Option<Self>> {
        json_file::read_optional(&dir.as_ref().join(FILE_NAME))
    }

    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        json_file::write(path.as_ref(), self)
    }

    pub fn save_dir(&self, dir: impl AsRef<Path>) -> Result<()> {
        self.save(dir.as_ref().join(FILE_NAME))
    }

    /// Stop ids, empty when the file names none.
    pub fn eos_token_ids(&self) -> Vec<u32> {
        self.eos_token_id
            .as_ref()
            .map(TokenIds::to_vec)
            .unwrap_or_default()
    }

    /// The stop ids that end a sequence, without those a run added ([`Self::added_stop_ids`]).
    pub fn end_of_sequence_ids(&self) -> Vec<u32> {
        let mut ids = self.eos_token_ids();
        ids.retain(|id| !self.added_stop_ids.contains(id));
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eos_may_be_an_int_or_a_list() {
        let one: GenerationConfig = json_file::parse(r#"{"eos_token_id": 7}"#).unwrap();
        assert_eq!(one.eos_token_ids(), vec![7]);
        let many: GenerationConfig = json_file::parse(r#"{"eos_token_id": [7, 9]}"#).unwrap();
        assert_eq!(many.eos_token_ids(), vec![7, 9]);
        let none: GenerationConfig = json_file::parse("{}").unwrap();
        assert!(none.eos_token_ids().is_empty());
    }

    #[test]
    fn nulls_read_as_absent() {
        let c: GenerationConfig =
            json_file::parse(r#"{"temperature": null, "top_k": null, "pad_token_id": null}"#)
                .unwrap();
        assert_eq!(c, GenerationConfig::default());
    }

    #[test]
    fn save_load_round_trip_keeps_unknown_keys() {
        let text = r#"{"eos_token_id": [2, 3], "temperature": 0.7, "top_p": 0.9, "top_k": 20,
            "max_new_tokens": 64, "do_sample": true, "repetition_penalty": 1.05,
            "transformers_version": "5.0.0"}"#;
        let c: GenerationConfig = json_file::parse(text).unwrap();
        assert_eq!(c.top_k, Some(20));
        assert_eq!(c.max_new_tokens, Some(64));
        assert_eq!(c.do_sample, Some(true));
        assert_eq!(c.extra["repetition_penalty"], serde_json::json!(1.05));
        let dir = tempfile::tempdir().unwrap();
        c.save_dir(dir.path()).unwrap();
        let back = GenerationConfig::from_dir(dir.path()).unwrap().unwrap();
        assert_eq!(back, c);
        assert!(GenerationConfig::from_dir(dir.path().join("absent"))
            .unwrap()
            .is_none());
    }

    #[test]
    fn wrong_type_names_file_and_key() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE_NAME), r#"{"eos_token_id": "two"}"#).unwrap();
        let err = format!("{:#}", GenerationConfig::from_dir(dir.path()).unwrap_err());
        assert!(
            err.contains(FILE_NAME) && err.contains("eos_token_id"),
            "{err}"
        );
    }

    #[test]
    fn reads_the_committed_model_fixture() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../skein/tests/fixtures/tiny-qwen2"
        );
        let c = GenerationConfig::from_dir(dir).unwrap().unwrap();
        assert_eq!(c.eos_token_ids(), vec![2, 3]);
        assert_eq!(c.do_sample, Some(true));
    }
}
