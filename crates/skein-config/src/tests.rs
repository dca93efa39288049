//! `load`, `to_toml_string` and the documented defaults on a config shaped like a trainer's.

use super::*;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
struct Trainer {
    lr: f64,
    warmup_steps: usize,
    name: String,
    tags: Vec<String>,
    clip: Option<f64>,
}

impl Default for Trainer {
    fn default() -> Self {
        Trainer {
            lr: 1e-6,
            warmup_steps: 10,
            name: "policy".into(),
            tags: vec![],
            clip: None,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
enum Estimator {
    #[default]
    Grpo,
    DrGrpo,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
struct Sampling {
    temperature: f64,
    stop: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
struct Rollout {
    estimator: Estimator,
    sampling: Sampling,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
struct Cfg {
    seed: u64,
    trainer: Trainer,
    rollout: Rollout,
}

fn sets(s: &[&str]) -> Vec<String> {
    s.iter().map(|s| s.to_string()).collect()
}

fn err(base: Option<&str>, overrides: &[&str]) -> String {
    load::<Cfg>(base, "run.toml", &sets(overrides))
        .unwrap_err()
        .to_string()
}

#[test]
fn no_file_and_no_overrides_is_the_default() {
    assert_eq!(load::<Cfg>(None, "defaults", &[]).unwrap(), Cfg::default());
}

#[test]
fn overrides_set_ints_floats_bools_strings_arrays_and_nested_keys_over_the_file() {
    let base = "seed = 3\n[trainer]\nlr = 0.5\nwarmup_steps = 4\n";
    let cfg: Cfg = load(
        Some(base),
        "run.toml",
        &sets(&[
            "trainer.warmup_steps=7",
            "trainer.name=qwen",
            "trainer.tags=[\"a\", \"b\"]",
            "trainer.lr=1e-3",
            "trainer.clip=0.2",
            "rollout.estimator=dr-grpo",
            // A section the file does not have is created on the way.
            "rollout.sampling.temperature=0.7",
            "rollout.sampling.stop=[\"</answer>\"]",
        ]),
    )
    .unwrap();
    assert_eq!(cfg.seed, 3);
    assert_eq!(cfg.trainer.warmup_steps, 7);
    assert_eq!(cfg.trainer.name, "qwen");
    assert_eq!(cfg.trainer.tags, ["a", "b"]);
    assert_eq!(cfg.trainer.lr, 1e-3);
    assert_eq!(cfg.trainer.clip, Some(0.2));
    assert_eq!(cfg.rollout.estimator, Estimator::DrGrpo);
    assert_eq!(cfg.rollout.sampling.temperature, 0.7);
    assert_eq!(cfg.rollout.sampling.stop, ["</answer>"]);
    // Later overrides win; an inline table sets the keys it names, as the file's section
    // does, and the section keeps the rest.
    let cfg: Cfg = load(
        Some("[rollout.sampling]\nstop = [\"</a>\"]\n"),
        "d",
        &sets(&["seed=1", "seed=2", "rollout.sampling={ temperature = 1.5 }"]),
    )
    .unwrap();
    assert_eq!(cfg.seed, 2);
    assert_eq!(cfg.rollout.sampling.temperature, 1.5);
    assert_eq!(cfg.rollout.sampling.stop, ["</a>"]);
}

#[test]
fn unknown_keys_name_the_dotted_key_and_the_allowed_ones() {
    let e = err(None, &["trainer.lrr=1"]);
    assert_eq!(
        e,
        "unknown key `trainer.lrr` (allowed keys in `trainer`: lr, warmup_steps, name, tags, \
         clip; did you mean `lr`?) (set by `--set trainer.lrr=1`)"
    );
    let e = err(Some("sed = 1"), &[]);
    assert_eq!(
        e,
        "run.toml: unknown key `sed` (allowed keys at the top level: seed, trainer, rollout; \
         did you mean `seed`?)"
    );
    let e = err(Some("[rollout.sampling]\ntemprature = 1.0\n"), &[]);
    assert!(
        e.contains("unknown key `rollout.sampling.temprature`")
            && e.contains("allowed keys in `rollout.sampling`: temperature, stop")
            && e.contains("did you mean `temperature`?"),
        "{e}"
    );
    // A section serde buffers before reading it (an enum tagged by `kind`) loses the path to
    // the field: the field is named under the section all the same.
    let e = crate::describe::deserialize_error(
        "reward.sources.py",
        "unknown field `cmd`, expected one of `command`, `processes`",
    );
    assert_eq!(
        e,
        "unknown key `reward.sources.py.cmd` (allowed keys in `reward.sources.py`: command, \
         processes)"
    );
    // A misspelt section, set from the command line.
    let e = err(None, &["trainr.lr=1"]);
    assert!(
        e.contains("unknown key `trainr`") && e.contains("seed, trainer, rollout"),
        "{e}"
    );
    assert!(e.contains("`--set trainr.lr=1`"), "{e}");
}

#[test]
fn wrong_types_name_the_key_and_what_was_expected() {
    let e = err(None, &["trainer.warmup_steps=many"]);
    assert!(e.contains("`trainer.warmup_steps`"), "{e}");
    assert!(
        e.contains("expected a non-negative integer") && e.contains("got string \"many\""),
        "{e}"
    );
    let e = err(Some("[trainer]\nwarmup_steps = -1\n"), &[]);
    assert!(
        e.starts_with("run.toml: invalid value for `trainer.warmup_steps`") && e.contains("-1"),
        "{e}"
    );
    let e = err(Some("[trainer]\ntags = \"a\"\n"), &[]);
    assert!(
        e.contains("`trainer.tags`") && e.contains("expected an array"),
        "{e}"
    );
    let e = err(None, &["rollout.estimator=ppx"]);
    assert!(
        e.contains("invalid value for `rollout.estimator`: `ppx` (allowed: grpo, dr-grpo)"),
        "{e}"
    );
    let e = err(None, &["trainer=3"]);
    assert!(
        e.contains("`trainer`: expected a section (a table of keys), got integer `3`"),
        "{e}"
    );
}

#[test]
fn syntax_errors_name_the_file_line_and_column() {
    let e = err(Some("seed = 1\n[trainer\nlr = 1\n"), &[]);
    assert!(e.starts_with("run.toml:2:9: TOML syntax error"), "{e}");
    assert!(e.contains("\n  [trainer\n          ^"), "{e}");
    let e = err(Some("seed = = 1\n"), &[]);
    assert!(e.starts_with("run.toml:1:"), "{e}");
}

#[test]
fn malformed_overrides_are_named() {
    assert!(err(None, &["noequals"]).contains("`noequals` must look like key=value"));
    assert!(err(None, &["=3"]).contains("`=3` has an empty key"));
    let e = err(None, &["seed=1", "seed.x=1"]);
    assert!(
        e.contains("`seed` is a value (integer), not a section"),
        "{e}"
    );
}

#[test]
fn written_config_loads_back_to_the_same_value() {
    let cfg: Cfg = load(
        None,
        "d",
        &sets(&[
            "trainer.tags=[\"x\"]",
            "trainer.clip=0.3",
            "rollout.estimator=dr-grpo",
            "rollout.sampling.stop=[\"a\\nb\"]",
        ]),
    )
    .unwrap();
    let text = to_toml_string(&cfg);
    // Declaration order, sections as headers.
    assert!(
        text.starts_with("seed = 0\n\n[trainer]\nlr = 0.000001\n"),
        "{text}"
    );
    assert!(text.contains("\n[rollout.sampling]\n"), "{text}");
    let back: Cfg = load(Some(&text), "written", &[]).unwrap();
    assert_eq!(back, cfg);
}

const DOCS: &[KeyDoc] = &[
    KeyDoc {
        key: "seed",
        doc: "Seed of every random choice.",
    },
    KeyDoc {
        key: "trainer",
        doc: "The optimizer and its schedule.",
    },
    KeyDoc {
        key: "trainer.lr",
        doc: "Peak learning rate.",
    },
    KeyDoc {
        key: "trainer.warmup_steps",
        doc: "Linear warm-up steps.",
    },
    KeyDoc {
        key: "trainer.name",
        doc: "Name in logs.",
    },
    KeyDoc {
        key: "trainer.tags",
        doc: "Free-form labels.",
    },
    KeyDoc {
        key: "trainer.clip",
        doc: "Gradient-norm clip.\nUnset: no clipping.",
    },
    KeyDoc {
        key: "rollout.estimator",
        doc: "Advantage estimator: grpo or dr-grpo.",
    },
    KeyDoc {
        key: "rollout.sampling.temperature",
        doc: "Sampling temperature.",
    },
    KeyDoc {
        key: "rollout.sampling.stop",
        doc: "Stop strings.",
    },
];

#[test]
fn documented_defaults_comment_every_key_and_still_load() {
    let text = render_documented(&Cfg::default(), DOCS);
    assert!(
        text.starts_with("# Seed of every random choice.\nseed = 0\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "# The optimizer and its schedule.\n[trainer]\n# Peak learning rate.\nlr = 0.000001\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("# Gradient-norm clip.\n# Unset: no clipping.\n# clip is unset by default\n"),
        "{text}"
    );
    assert!(
        text.contains("[rollout.sampling]\n# Sampling temperature.\ntemperature = 0.0\n"),
        "{text}"
    );
    let back: Cfg = load(Some(&text), "printed", &[]).unwrap();
    assert_eq!(back, Cfg::default());
}

#[test]
fn check_docs_finds_undocumented_and_stale_keys() {
    check_docs(&Cfg::default(), DOCS).unwrap();
    let mut docs = DOCS.to_vec();
    docs.retain(|d| d.key != "trainer.lr");
    docs.push(KeyDoc {
        key: "trainer.old_knob",
        doc: "Gone.",
    });
    docs.push(KeyDoc {
        key: "nowhere.knob",
        doc: "Never was.",
    });
    let err = check_docs(&Cfg::default(), &docs).unwrap_err();
    // `trainer.old_knob` may be an unset option of an existing section; `nowhere` cannot be.
    assert_eq!(
        err.problems(),
        [
            "key `trainer.lr` has no doc",
            "doc for `nowhere.knob` names no key of the config",
        ]
    );
    assert_eq!(
        keys(&Cfg::default())[..3],
        ["seed", "trainer.lr", "trainer.warmup_steps"]
    );
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
struct NestedSampling {
    temperature: f64,
    max_new_tokens: usize,
}

impl Default for NestedSampling {
    fn default() -> Self {
        NestedSampling {
            temperature: 1.0,
            max_new_tokens: 64,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
struct NestedRollout {
    sampling: NestedSampling,
}

impl Default for NestedRollout {
    fn default() -> Self {
        NestedRollout {
            sampling: NestedSampling {
                temperature: 1.0,
                max_new_tokens: 8,
            },
        }
    }
}

/// A table set only in part keeps its parent's defaults for the rest (the parent sets
/// `max_new_tokens = 8`, the nested struct's own default is 64).
#[test]
fn a_partly_set_table_keeps_the_parents_defaults() {
    let sets = vec!["sampling.temperature=0.5".to_string()];
    let r: NestedRollout = load_with_defaults(None, "x", &sets).unwrap();
    assert_eq!(
        (r.sampling.temperature, r.sampling.max_new_tokens),
        (0.5, 8)
    );
    let r: NestedRollout =
        load_with_defaults(Some("[sampling]\ntemperature = 0.5\n"), "x", &[]).unwrap();
    assert_eq!(r.sampling.max_new_tokens, 8);
    // Plain `load` starts from nothing: the nested struct's own default.
    let r: NestedRollout = load(None, "x", &sets).unwrap();
    assert_eq!(r.sampling.max_new_tokens, 64);
    let e = load_with_defaults::<NestedRollout>(None, "x", &["sampling.nope=1".to_string()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("nope"), "{e}");
}

/// An override's array with a bad element is blamed on the override, not on the file it
/// overrode (the error read "run.toml: …" for `--set` values).
#[test]
fn a_bad_array_element_names_the_override_that_set_it() {
    let e = err(Some("seed = 1\n"), &["rollout.sampling.stop=[1]"]);
    assert!(e.contains("`rollout.sampling.stop[0]`"), "{e}");
    assert!(
        e.ends_with("(set by `--set rollout.sampling.stop=[1]`)"),
        "{e}"
    );
    assert!(!e.starts_with("run.toml"), "{e}");
    // A key that only shares a prefix is not the culprit.
    let e = err(Some("[trainer]\ntags = [2]\n"), &["trainer.t=1"]);
    assert!(e.starts_with("run.toml: "), "{e}");
}
