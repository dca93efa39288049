//! The `[reward]` configuration: named sources, routes from data source to weighted sources,
//! and the executor settings, validated with errors that name the key.

use crate::{ExecutorConfig, RemoteConfig, RewardFn, WorkerConfig};
use serde::{Deserialize, Deserializer, Serialize};
use skein_config::{ConfigError, Validator};
use std::collections::BTreeMap;

const FUNCTION_KINDS: [&str; 4] = ["exact_match", "math", "format", "overlong"];
const SERVICE_KINDS: [&str; 3] = ["worker", "remote", "scorer"];

/// Sources that are not inline functions: they run behind an executor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ServiceConfig {
    /// A worker command speaking JSON lines (`reward.sources.NAME.command`, …).
    Worker(WorkerConfig),
    /// A remote reward service (`reward.sources.NAME.url`, …).
    Remote(RemoteConfig),
    /// A `BatchScorer` the program supplies under this source's name (e.g. a reward model),
    /// run with `reward.executor`.
    Scorer {},
}

/// One named reward source: `kind` picks a built-in function or a service.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum SourceConfig {
    Function(RewardFn),
    Service(ServiceConfig),
}

impl<'de> Deserialize<'de> for SourceConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let value = serde_json::Value::deserialize(d)?;
        let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
        let all = || {
            [&FUNCTION_KINDS[..], &SERVICE_KINDS[..]]
                .concat()
                .join(", ")
        };
        if FUNCTION_KINDS.contains(&kind) {
            function(kind, value.clone())
                .map(SourceConfig::Function)
                .map_err(D::Error::custom)
        } else if SERVICE_KINDS.contains(&kind) {
            service(kind, value.clone())
                .map(SourceConfig::Service)
                .map_err(D::Error::custom)
        } else if kind.is_empty() {
            Err(D::Error::custom(format!(
                "a reward source needs `kind`, one of: {}",
                all()
            )))
        } else {
            Err(D::Error::custom(format!(
                "unknown reward source kind `{kind}` (allowed: {})",
                all()
            )))
        }
    }
}

/// A source's table without its `kind`: the options of that kind.
fn options_of(value: &serde_json::Value) -> serde_json::Value {
    let mut table = value.clone();
    if let Some(t) = table.as_object_mut() {
        t.remove("kind");
    }
    table
}

/// A service source's table, read by its `kind` so that a wrong value names its key
/// (`reward.sources.py.timeout_ms`): serde buffers a table tagged by `kind`, and the error's
/// path would stop at the source.
fn service(kind: &str, value: serde_json::Value) -> Result<ServiceConfig, String> {
    match kind {
        "worker" => skein_config::deserialize_nested(options_of(&value)).map(ServiceConfig::Worker),
        "remote" => skein_config::deserialize_nested(options_of(&value)).map(ServiceConfig::Remote),
        // `scorer` has no options: serde's unknown-field error names the key already.
        _ => serde_json::from_value(value).map_err(|e| e.to_string()),
    }
}

/// A function source's table, read by its `kind` as `service` reads a service's
/// (`reward.sources.len.max_response_tokens`).
fn function(kind: &str, value: serde_json::Value) -> Result<RewardFn, String> {
    match kind {
        "math" => skein_config::deserialize_nested(options_of(&value)).map(RewardFn::Math),
        "format" => skein_config::deserialize_nested(options_of(&value)).map(RewardFn::Format),
        "overlong" => skein_config::deserialize_nested(options_of(&value)).map(RewardFn::Overlong),
        // `exact_match` has no options: serde's unknown-field error names the key already.
        _ => serde_json::from_value(value).map_err(|e| e.to_string()),
    }
}

/// Which sources score a data source, and with what weights (empty: all 1).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    pub sources: Vec<String>,
    #[serde(default)]
    pub weights: Vec<f64>,
}

impl RouteConfig {
    fn validate(&self, key: &str, sources: &BTreeMap<String, SourceConfig>, v: &mut Validator) {
        for name in &self.sources {
            if !sources.contains_key(name) {
                let known: Vec<&str> = sources.keys().map(String::as_str).collect();
                v.problem(format!(
                    "invalid value for `{key}.sources`: unknown reward source `{name}` (defined in reward.sources: {}); declare it as `[reward.sources.{name}]` (the task's own checker is a `kind = \"scorer\"` source named `task`)",
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                ));
            }
        }
        if !self.weights.is_empty() {
            v.check(
                self.weights.len() == self.sources.len(),
                &format!("{key}.weights"),
                &format!(
                    "needs one weight per source ({} sources)",
                    self.sources.len()
                ),
                format!("{} weights", self.weights.len()),
            );
        }
        for w in &self.weights {
            v.check(
                w.is_finite(),
                &format!("{key}.weights"),
                "must be finite numbers",
                w,
            );
        }
    }

    /// (source, weight) pairs, weights defaulting to 1.
    pub fn weighted(&self) -> Vec<(String, f64)> {
        self.sources
            .iter()
            .enumerate()
            .map(|(i, s)| (s.clone(), self.weights.get(i).copied().unwrap_or(1.0)))
            .collect()
    }
}

/// The whole `[reward]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RewardConfig {
    /// Batching and threads of executors (a `scorer` source uses it as is; workers and remote
    /// services take their thread count and batch size from their own keys).
    pub executor: ExecutorConfig,
    /// Named sources, e.g. `[reward.sources.answer] kind = "math"`.
    pub sources: BTreeMap<String, SourceConfig>,
    /// Data source name → weighted sources, e.g. `[reward.routes.gsm8k] sources = ["answer"]`.
    pub routes: BTreeMap<String, RouteConfig>,
    /// For data sources without a route; empty `sources` (as when the table leaves it out):
    /// such requests fail. Only the table's absence gives the built-in `math` route.
    #[serde(default)]
    pub default_route: RouteConfig,
}

impl Default for RewardConfig {
    fn default() -> Self {
        RewardConfig {
            executor: ExecutorConfig::default(),
            sources: BTreeMap::from([(
                "math".to_string(),
                SourceConfig::Function(RewardFn::math()),
            )]),
            routes: BTreeMap::new(),
            default_route: RouteConfig {
                sources: vec!["math".into()],
                weights: Vec::new(),
            },
        }
    }
}

impl RewardConfig {
    /// Every problem at once, keys under `prefix` (normally `reward`).
    pub fn validate(&self, prefix: &str) -> Result<(), ConfigError> {
        let mut v = Validator::new();
        self.executor
            .validate(&format!("{prefix}.executor"), &mut v);
        for (name, source) in &self.sources {
            let key = format!("{prefix}.sources.{name}");
            match source {
                SourceConfig::Function(f) => f.validate(&key, &mut v),
                SourceConfig::Service(ServiceConfig::Worker(w)) => w.validate(&key, &mut v),
                SourceConfig::Service(ServiceConfig::Remote(r)) => r.validate(&key, &mut v),
                SourceConfig::Service(ServiceConfig::Scorer {}) => {}
            }
        }
        for (data_source, route) in &self.routes {
            let key = format!("{prefix}.routes.{data_source}");
            v.check(
                !route.sources.is_empty(),
                &format!("{key}.sources"),
                "must name at least one source",
                "[]",
            );
            route.validate(&key, &self.sources, &mut v);
        }
        self.default_route
            .validate(&format!("{prefix}.default_route"), &self.sources, &mut v);
        v.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: serde_json::Value) -> Result<RewardConfig, serde_json::Error> {
        serde_json::from_value(json)
    }

    #[test]
    fn sources_of_every_kind_parse_and_the_default_is_valid() {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/reward_worker_example.py"
        );
        let cfg = parse(serde_json::json!({
            "sources": {
                "answer": {"kind": "math", "flexible": true},
                "len": {"kind": "overlong", "max_response_tokens": 100, "overlong_buffer": 20},
                "py": {"kind": "worker", "command": ["python3", script], "processes": 2},
                "far": {"kind": "remote", "url": "http://127.0.0.1:9/score"},
                "rm": {"kind": "scorer"}
            },
            "routes": {"gsm8k": {"sources": ["answer", "len"], "weights": [1.0, 0.5]}},
            "default_route": {"sources": ["rm"]}
        }))
        .unwrap();
        assert!(
            cfg.validate("reward").is_ok(),
            "{:?}",
            cfg.validate("reward")
        );
        assert!(matches!(
            cfg.sources["py"],
            SourceConfig::Service(ServiceConfig::Worker(WorkerConfig { processes: 2, .. }))
        ));
        assert_eq!(
            cfg.routes["gsm8k"].weighted(),
            [("answer".to_string(), 1.0), ("len".to_string(), 0.5)]
        );
        assert!(RewardConfig::default().validate("reward").is_ok());
        // What is written reads back the same.
        let text = serde_json::to_value(&cfg).unwrap();
        assert_eq!(parse(text).unwrap(), cfg);
    }

    /// A table that leaves out `default_route` has none: its unrouted data sources fail
    /// rather than go to a `math` source it never named.
    #[test]
    fn a_table_without_a_default_route_has_none() {
        let cfg = parse(serde_json::json!({
            "sources": {"rm": {"kind": "scorer"}},
            "routes": {"arithmetic": {"sources": ["rm"]}}
        }))
        .unwrap();
        assert!(cfg.default_route.sources.is_empty());
        assert!(
            cfg.validate("reward").is_ok(),
            "{:?}",
            cfg.validate("reward")
        );
    }

    #[test]
    fn unknown_kinds_and_fields_are_rejected_by_name() {
        let e = parse(serde_json::json!({"sources": {"a": {"kind": "magic"}}})).unwrap_err();
        assert!(
            e.to_string()
                .contains("unknown reward source kind `magic` (allowed: exact_match"),
            "{e}"
        );
        let e = parse(serde_json::json!({"sources": {"a": {"kind": "worker", "cmd": ["x"]}}}))
            .unwrap_err();
        assert!(e.to_string().contains("cmd"), "{e}");
        let e = parse(serde_json::json!({"sources": {"a": {}}})).unwrap_err();
        assert!(e.to_string().contains("needs `kind`"), "{e}");
        assert!(parse(serde_json::json!({"router": {}})).is_err());
        let e = parse(serde_json::json!({"sources": {"rm": {"kind": "scorer", "path": "x"}}}))
            .unwrap_err();
        assert!(e.to_string().contains("path"), "{e}");
    }

    /// The error loading `toml` as a `[reward]` table of `run.toml` gives.
    fn load_error(toml: &str) -> String {
        skein_config::load::<RewardConfig>(Some(toml), "run.toml", &[])
            .unwrap_err()
            .to_string()
    }

    /// A wrong value inside a service source names its key, not only the source.
    #[test]
    fn a_bad_value_in_a_service_source_names_its_key() {
        let e = load_error(
            "[sources.py]\nkind = \"worker\"\ncommand = [\"x\"]\ntimeout_ms = \"30s\"\n",
        );
        assert_eq!(
            e,
            "run.toml: invalid value for `sources.py.timeout_ms`: expected a non-negative \
             integer, got string \"30s\""
        );
        let e = load_error("[sources.rm]\nkind = \"remote\"\nurll = \"http://127.0.0.1:9\"\n");
        assert!(
            e.starts_with("run.toml: unknown key `sources.rm.urll` (allowed keys in `sources.rm`:")
                && e.contains("did you mean `url`?"),
            "{e}"
        );
    }

    /// So does a wrong value inside a function source, and a misspelt option gets its near
    /// miss.
    #[test]
    fn a_bad_value_in_a_function_source_names_its_key() {
        let e = load_error(
            "[sources.len]\nkind = \"overlong\"\nmax_response_tokens = \"512\"\n\
             overlong_buffer = 64\n",
        );
        assert_eq!(
            e,
            "run.toml: invalid value for `sources.len.max_response_tokens`: expected a \
             non-negative integer, got string \"512\""
        );
        let e = load_error("[sources.answer]\nkind = \"math\"\nflexibel = true\n");
        assert!(
            e.starts_with("run.toml: unknown key `sources.answer.flexibel`")
                && e.contains("did you mean `flexible`?"),
            "{e}"
        );
        let e = load_error("[sources.fmt]\nkind = \"format\"\nrequire = \"<think>\"\n");
        assert!(e.contains("`sources.fmt.require`"), "{e}");
        let ok = "[sources.len]\nkind = \"overlong\"\nmax_response_tokens = 512\n\
                  overlong_buffer = 64\n";
        let cfg = skein_config::load::<RewardConfig>(Some(ok), "run.toml", &[]).unwrap();
        assert_eq!(
            cfg.sources["len"],
            SourceConfig::Function(RewardFn::Overlong(crate::OverlongShaping {
                max_response_tokens: 512,
                overlong_buffer: 64,
                penalty: 1.0,
            }))
        );
    }

    #[test]
    fn validation_names_every_bad_key() {
        let mut cfg = RewardConfig::default();
        cfg.executor.threads = 0;
        cfg.sources.insert(
            "py".into(),
            SourceConfig::Service(ServiceConfig::Worker(WorkerConfig::default())),
        );
        cfg.routes.insert(
            "gsm8k".into(),
            RouteConfig {
                sources: vec!["math".into(), "nope".into()],
                weights: vec![1.0, 2.0, f64::INFINITY],
            },
        );
        cfg.routes.insert("empty".into(), RouteConfig::default());
        let e = cfg.validate("reward").unwrap_err().to_string();
        for needle in [
            "`reward.executor.threads`: must be ≥ 1 (got 0)",
            "`reward.sources.py.command`",
            "`reward.routes.gsm8k.sources`: unknown reward source `nope` (defined in reward.sources: math, py); declare it as `[reward.sources.nope]`",
            "`reward.routes.gsm8k.weights`: needs one weight per source (2 sources) (got 3 weights)",
            "`reward.routes.gsm8k.weights`: must be finite numbers (got inf)",
            "`reward.routes.empty.sources`: must name at least one source",
        ] {
            assert!(e.contains(needle), "missing {needle:?} in {e}");
        }
    }
}
