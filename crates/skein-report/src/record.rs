//! One line of `metrics.jsonl` ([`Record`]), as the metrics log and the TensorBoard writer both
//! take it.

use serde_json::{Map, Value};

/// One line of `metrics.jsonl`: metric name (a plain string; `/` groups by convention only) to
/// value, usually with a `step`.
pub type Record = Map<String, Value>;

/// A record of `step` with the given figures.
pub fn record<const N: usize>(step: usize, values: [(&str, f64); N]) -> Record {
    let mut m = Map::new();
    m.insert("step".into(), Value::from(step));
    for (k, v) in values {
        m.insert(k.into(), Value::from(v));
    }
    m
}
