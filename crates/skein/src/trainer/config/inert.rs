//! Keys that would do nothing in the chosen setting. A user who sets `rollout.remote.url` but
//! leaves `rollout.engine = "local"` expects a remote engine and would silently get the local
//! one; so such a key is refused, naming the setting that uses it, rather than ignored.
//!
//! A key counts as set when its value differs from the default: a file that spells out a
//! default is harmless, and TOML cannot tell the two apart after merging.

use super::{AgentKind, AlgorithmConfig, CreditMode, EngineKind, TrainConfig};
use crate::trainer::update::optim::{OptimConfig, Schedule};
use serde::Serialize;
use serde_json::Value;
use skein_config::Validator;

/// Records a problem for each key that the chosen setting does not use.
pub fn validate_inert_keys(cfg: &TrainConfig, multi_turn: bool, v: &mut Validator) {
    let defaults = TrainConfig::default();
    let r = &cfg.rollout;
    if r.engine != EngineKind::Remote {
        refuse(
            v,
            changed("rollout.remote", &r.remote, &defaults.rollout.remote),
            "is used only with `rollout.engine = \"remote\"`",
        );
    }
    if !r.partial.enabled {
        refuse(
            v,
            changed("rollout.partial", &r.partial, &defaults.rollout.partial),
            "is used only with `rollout.partial.enabled = true`",
        );
    }
    if !cfg.lora.enabled() {
        refuse(
            v,
            changed("lora", &cfg.lora, &defaults.lora),
            "is used only with LoRA (`lora.rank` > 0; 0 trains every weight)",
        );
    } else if cfg.lora.dropout != defaults.lora.dropout && !cfg.warm_up_trains_adapters() {
        // RL's passes run without adapter dropout; a model built from scratch is warmed up in
        // full and gets its adapters after.
        refuse(
            v,
            vec![("lora.dropout".into(), cfg.lora.dropout.to_string())],
            "is used only in the warm-up of a loaded model's adapters (`model.path` set and \
             `sft.steps` or `sft.direct_steps` > 0): RL's passes run without it",
        );
    }
    agent_keys(cfg, multi_turn, &defaults, v);
    algorithm_keys(&cfg.algorithm, r.partial.enabled, v);
    optim_keys(&cfg.optim, v);
    let t = &cfg.trainer;
    if t.checkpoint_every == 0 && t.keep_last != defaults.trainer.keep_last {
        refuse(
            v,
            vec![("trainer.keep_last".into(), t.keep_last.to_string())],
            "is used only with numbered checkpoints (`trainer.checkpoint_every` > 0)",
        );
    }
}

/// `[agent]`: each kind reads its own keys.
fn agent_keys(cfg: &TrainConfig, multi_turn: bool, defaults: &TrainConfig, v: &mut Validator) {
    let kind = cfg.agent.kind;
    let set = changed("agent", &cfg.agent, &defaults.agent);
    let uses = |key: &str| match key {
        "agent.kind" => true,
        "agent.listen" | "agent.api_key" | "agent.rollout_timeout_s" => kind == AgentKind::External,
        "agent.command" | "agent.workers" => kind != AgentKind::Builtin,
        "agent.start_timeout_s" => kind == AgentKind::EnvWorker,
        // max_turns, max_tokens, env_timeout_s, reuse_prefix: the episodes' own limits.
        _ => multi_turn,
    };
    for (key, value) in set.into_iter().filter(|(k, _)| !uses(k)) {
        let setting = match key.as_str() {
            "agent.listen" | "agent.api_key" | "agent.rollout_timeout_s" => {
                "`agent.kind = \"external\"`"
            }
            "agent.command" | "agent.workers" => {
                "`agent.kind = \"external\"` or `\"env-worker\"`"
            }
            "agent.start_timeout_s" => "`agent.kind = \"env-worker\"`",
            _ => "a multi-turn task (`task.name = \"guess\"` or `\"calculator\"`, or `agent.kind = \"env-worker\"`)",
        };
        refuse(
            v,
            vec![(key, value)],
            &format!("is used only with {setting}"),
        );
    }
}

/// `[algorithm]` keys of one estimator, of the KL term, and of off-policy correction.
fn algorithm_keys(a: &AlgorithmConfig, partial: bool, v: &mut Validator) {
    let d = AlgorithmConfig::default();
    let mut critic = Vec::new();
    for (key, value, default) in [
        ("algorithm.lambda", a.lambda, d.lambda),
        ("algorithm.value_clip", a.value_clip, d.value_clip),
        ("algorithm.critic_lr", a.critic_lr, d.critic_lr),
    ] {
        if value != default {
            critic.push((key.to_string(), value.to_string()));
        }
    }
    if !a.estimator.needs_critic() {
        refuse(
            v,
            critic,
            "is the critic's, used only with `algorithm.estimator = \"gae\"`",
        );
    }
    let turn_discounts = a.credit == CreditMode::Turn || a.step_group_weight > 0.0;
    if !turn_discounts && a.turn_gamma != d.turn_gamma {
        refuse(
            v,
            vec![("algorithm.turn_gamma".into(), a.turn_gamma.to_string())],
            "discounts per turn, used only with `algorithm.credit = \"turn\"` or step groups \
             (`algorithm.step_group_weight` > 0)",
        );
    }
    if a.kl_coef == 0.0 && a.kl_estimator != d.kl_estimator {
        refuse(
            v,
            vec![("algorithm.kl_estimator".into(), json_text(&a.kl_estimator))],
            "is used only with a KL term (`algorithm.kl_coef` > 0)",
        );
    }
    // Without partial rollout every token was sampled by the version that trains on it, so
    // only `icepop` (which weighs every token) has anything to correct.
    let icepop = a.off_policy == super::OffPolicy::Icepop;
    if !partial && !icepop {
        let mut set = Vec::new();
        if a.off_policy != d.off_policy {
            set.push(("algorithm.off_policy".to_string(), json_text(&a.off_policy)));
        }
        if a.is_cap != d.is_cap {
            set.push(("algorithm.is_cap".to_string(), a.is_cap.to_string()));
        }
        refuse(
            v,
            set,
            "corrects tokens an older policy sampled, which only partial rollout keeps \
             (`rollout.partial.enabled = true`; or `algorithm.off_policy = \"icepop\"`)",
        );
    }
}

/// `[optim]`: the cosine schedule's floor.
fn optim_keys(o: &OptimConfig, v: &mut Validator) {
    if o.schedule == Schedule::Constant && o.min_lr_ratio != OptimConfig::default().min_lr_ratio {
        refuse(
            v,
            vec![("optim.min_lr_ratio".into(), o.min_lr_ratio.to_string())],
            "is used only with `optim.schedule = \"cosine\"`",
        );
    }
}

fn refuse(v: &mut Validator, keys: Vec<(String, String)>, why: &str) {
    for (key, value) in keys {
        v.check(
            false,
            &key,
            &format!("{why}: set that, or remove the key"),
            value,
        );
    }
}

/// The keys of `section` whose values differ from `default`'s, with their values as TOML-ish
/// text.
fn changed<T: Serialize>(section: &str, value: &T, default: &T) -> Vec<(String, String)> {
    let (Ok(Value::Object(now)), Ok(Value::Object(was))) =
        (serde_json::to_value(value), serde_json::to_value(default))
    else {
        return Vec::new();
    };
    now.into_iter()
        .filter(|(k, v)| was.get(k) != Some(v))
        .map(|(k, v)| {
            // A key is a secret: the error names it without printing it.
            let shown = if k.ends_with("api_key") {
                "a key".to_string()
            } else {
                v.to_string()
            };
            (format!("{section}.{k}"), shown)
        })
        .collect()
}

fn json_text<T: Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .map(|v| v.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::super::validate::validate;
    use super::super::TrainConfig;

    fn problem(set: &[&str]) -> Option<String> {
        let sets: Vec<String> = set.iter().map(|s| s.to_string()).collect();
        let cfg: TrainConfig = skein_config::load_with_defaults(None, "test", &sets).unwrap();
        validate(&cfg).err().map(|e| e.to_string())
    }

    #[test]
    fn a_key_its_switch_leaves_unused_is_refused_naming_the_switch() {
        for (set, key, switch) in [
            (
                "rollout.remote.url=\"http://h:1\"",
                "rollout.remote.url",
                "rollout.engine",
            ),
            (
                "rollout.partial.token_budget=4",
                "rollout.partial.token_budget",
                "partial.enabled",
            ),
            ("lora.alpha=32", "lora.alpha", "lora.rank"),
            ("agent.workers=2", "agent.workers", "agent.kind"),
            ("agent.listen=\"0.0.0.0:9\"", "agent.listen", "\"external\""),
            (
                "agent.api_key=\"sk-secret\"",
                "agent.api_key",
                "\"external\"",
            ),
            ("agent.max_turns=3", "agent.max_turns", "multi-turn"),
            ("algorithm.lambda=0.9", "algorithm.lambda", "\"gae\""),
            (
                "algorithm.kl_estimator=\"k2\"",
                "algorithm.kl_estimator",
                "kl_coef",
            ),
            (
                "algorithm.off_policy=\"mis\"",
                "algorithm.off_policy",
                "partial",
            ),
            ("algorithm.is_cap=3", "algorithm.is_cap", "partial"),
            (
                "algorithm.turn_gamma=0.5",
                "algorithm.turn_gamma",
                "credit = \"turn\"",
            ),
            ("optim.min_lr_ratio=0.2", "optim.min_lr_ratio", "cosine"),
            (
                "trainer.keep_last=2",
                "trainer.keep_last",
                "checkpoint_every",
            ),
        ] {
            let e = problem(&[set]).unwrap_or_else(|| panic!("{set} was accepted"));
            assert!(
                e.contains(&format!("`{key}`")) && e.contains(switch),
                "{set}: {e}"
            );
            assert!(!e.contains("sk-secret"), "a key was printed: {e}");
        }
    }

    /// `lora.dropout` acts in the warm-up of a loaded model's adapters alone: accepted there,
    /// refused without the warm-up, and for a model built from scratch.
    #[test]
    fn lora_dropout_is_accepted_only_where_a_warm_up_trains_adapters() {
        let dir = std::env::temp_dir().join(format!("skein-inert-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        let model = format!("model.path={:?}", dir.display().to_string());
        let on = ["lora.rank=4", "lora.dropout=0.1"];
        let mentions_dropout =
            |set: &[&str]| problem(set).is_some_and(|e| e.contains("`lora.dropout`"));
        assert!(!mentions_dropout(&[on[0], on[1], &model]));
        assert!(mentions_dropout(&[on[0], on[1], &model, "sft.steps=0"]));
        assert!(mentions_dropout(&on));
        std::fs::remove_dir_all(&dir).ok();
    }

    /// The configs shipped in `configs/` set only keys their settings use.
    #[test]
    fn the_shipped_configs_pass() {
        for (name, text) in [
            (
                "calculator.toml",
                include_str!("../../../../../configs/calculator.toml"),
            ),
            (
                "guess.toml",
                include_str!("../../../../../configs/guess.toml"),
            ),
        ] {
            let cfg: TrainConfig = skein_config::load_with_defaults(Some(text), name, &[]).unwrap();
            assert!(validate(&cfg).is_ok(), "{name}: {:?}", validate(&cfg));
        }
    }

    #[test]
    fn the_same_keys_are_accepted_where_they_are_used() {
        for set in [
            &[
                "rollout.engine=\"remote\"",
                "rollout.remote.url=\"http://h:1\"",
            ][..],
            &[
                "rollout.partial.enabled=true",
                "rollout.partial.token_budget=4",
            ],
            &["lora.rank=4", "lora.alpha=32"],
            &["task.name=\"guess\"", "agent.max_turns=3"],
            &["algorithm.estimator=\"gae\"", "algorithm.lambda=0.9"],
            &["algorithm.kl_coef=0.1", "algorithm.kl_estimator=\"k2\""],
            &[
                "rollout.partial.enabled=true",
                "rollout.partial.token_budget=4",
                "algorithm.off_policy=\"mis\"",
            ],
            &["algorithm.off_policy=\"icepop\"", "algorithm.is_cap=5"],
            &["algorithm.credit=\"turn\"", "algorithm.turn_gamma=0.5"],
            &[
                "algorithm.step_group_weight=0.5",
                "algorithm.turn_gamma=0.5",
            ],
            &["optim.schedule=\"cosine\"", "optim.min_lr_ratio=0.2"],
            &["trainer.checkpoint_every=5", "trainer.keep_last=2"],
        ] {
            assert_eq!(problem(set), None, "{set:?}");
        }
    }
}
