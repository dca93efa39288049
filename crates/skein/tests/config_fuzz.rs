//! Malformed training configs get an error that names a key, never a panic: random TOML
//! text, and random `--set` overrides of real keys with values of every type (negative,
//! huge, NaN, infinite, strings where numbers belong, arrays, tables).

use proptest::prelude::*;
use skein::trainer::config::validate::validate;
use skein::trainer::TrainConfig;

/// Every key `--print-config` shows, as `section.key` paths.
fn keys() -> Vec<String> {
    skein_config::keys(&TrainConfig::default())
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| format!("{v:?}")),
        Just("nan".to_string()),
        Just("-inf".to_string()),
        Just("inf".to_string()),
        "[a-z\\-]{0,12}".prop_map(|s| format!("\"{s}\"")),
        "[a-z0-9]{1,8}",
        Just("[1, 2]".to_string()),
        Just("{ a = 1 }".to_string()),
        Just("true".to_string()),
        Just("".to_string()),
    ]
}

/// Loads and validates; any error must say which key (or line) it is about.
fn load(text: Option<&str>, sets: &[String]) -> Result<(), String> {
    let cfg: TrainConfig =
        skein_config::load(text, "fuzz.toml", sets).map_err(|e| e.to_string())?;
    validate(&cfg).map_err(|e| e.to_string())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn overrides_of_real_keys_never_panic(picks in prop::collection::vec((0usize..1000, value()), 1..4)) {
        let keys = keys();
        let sets: Vec<String> = picks
            .iter()
            .map(|(i, v)| format!("{}={v}", keys[i % keys.len()]))
            .collect();
        if let Err(e) = load(None, &sets) {
            prop_assert!(e.contains('`') || e.contains("line"), "unhelpful error: {e}");
        }
    }

    #[test]
    fn random_toml_never_panics(text in "[\\[\\]a-z_.=\"0-9 \\n\\-]{0,120}") {
        let _ = load(Some(&text), &[]);
    }

    #[test]
    fn unknown_keys_are_named(key in "[a-z]{3,10}\\.[a-z_]{3,12}") {
        let set = format!("{key}=1");
        if let Err(e) = load(None, &[set]) {
            prop_assert!(e.contains('`'), "{e}");
        }
    }
}
