//! `[reward]` routes against the data sources a dataset's rows name. A built-in task has one
//! data source, checked with the config; a dataset names its own per row, so the check waits
//! for the rows. Without it, a route keyed `gsm8k` for rows that say `openai/gsm8k` is never
//! used (its reward model still loads), and with no default route every such trajectory fails
//! at run time, one by one.

use anyhow::{bail, Result};
use skein_reward::RewardConfig;
use skein_tasks::Problem;
use std::collections::BTreeMap;

/// How many data sources an error lists before it says how many more there are.
const LISTED: usize = 8;

/// Refuses routes that no loaded row uses, and rows that no route (nor the default route)
/// scores. `problems` are both splits' prompts after loading.
pub fn check_dataset_routes<'a>(
    reward: &RewardConfig,
    problems: impl IntoIterator<Item = &'a Problem>,
) -> Result<()> {
    let rows_per_source = count_sources(problems);
    let mut refused = Vec::new();
    for name in reward.routes.keys() {
        if !rows_per_source.contains_key(name.as_str()) {
            refused.push(format!(
                "`reward.routes.{name}`: no loaded row has data source `{name}` (the rows \
                 have: {}); key the route by a row's `data_source`",
                listed(&rows_per_source)
            ));
        }
    }
    refused.extend(unrouted(reward, &rows_per_source));
    if !refused.is_empty() {
        bail!("{}", refused.join("\n"));
    }
    Ok(())
}

/// Refuses rows that no route (nor the default route) scores: an evaluation's file, which
/// may use only some of a run's routes, every answer of such a row would fail.
pub fn check_rows_are_routed<'a>(
    reward: &RewardConfig,
    problems: impl IntoIterator<Item = &'a Problem>,
) -> Result<()> {
    match unrouted(reward, &count_sources(problems)) {
        Some(refusal) => bail!("{refusal}"),
        None => Ok(()),
    }
}

/// Rows per data source.
fn count_sources<'a>(problems: impl IntoIterator<Item = &'a Problem>) -> BTreeMap<&'a str, usize> {
    let mut rows_per_source: BTreeMap<&str, usize> = BTreeMap::new();
    for p in problems {
        *rows_per_source.entry(p.data_source.as_str()).or_default() += 1;
    }
    rows_per_source
}

/// The refusal of rows no route scores, if there are any.
fn unrouted(reward: &RewardConfig, rows_per_source: &BTreeMap<&str, usize>) -> Option<String> {
    if !reward.default_route.sources.is_empty() {
        return None;
    }
    let unrouted: BTreeMap<&str, usize> = rows_per_source
        .iter()
        .filter(|(source, _)| !reward.routes.contains_key(**source))
        .map(|(s, n)| (*s, *n))
        .collect();
    (!unrouted.is_empty()).then(|| {
        format!(
            "`reward.default_route.sources` is empty and no route scores rows with data \
             source {}; add `[reward.routes.<source>]` or a default route",
            listed(&unrouted)
        )
    })
}

/// `a` (3 rows), `b` (1 row), … and N more
fn listed(rows_per_source: &BTreeMap<&str, usize>) -> String {
    let mut parts: Vec<String> = rows_per_source
        .iter()
        .take(LISTED)
        .map(|(source, n)| {
            let rows = if *n == 1 { "row" } else { "rows" };
            format!("`{source}` ({n} {rows})")
        })
        .collect();
    if rows_per_source.len() > LISTED {
        parts.push(format!("and {} more", rows_per_source.len() - LISTED));
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use skein_reward::RouteConfig;

    fn problem(source: &str) -> Problem {
        Problem {
            prompt: "p".into(),
            ground_truth: "1".into(),
            data_source: source.into(),
            meta: serde_json::Value::Null,
        }
    }

    fn reward(routes: &[&str], default_route: &[&str]) -> RewardConfig {
        let mut r = RewardConfig::default();
        for name in routes {
            r.routes.insert(
                name.to_string(),
                RouteConfig {
                    sources: vec!["task".into()],
                    ..Default::default()
                },
            );
        }
        r.default_route.sources = default_route.iter().map(|s| s.to_string()).collect();
        r
    }

    #[test]
    fn routes_that_match_the_rows_pass() {
        let rows = [problem("openai/gsm8k"), problem("math"), problem("math")];
        check_dataset_routes(&reward(&["openai/gsm8k", "math"], &[]), &rows).unwrap();
        // A default route scores whatever has no route of its own.
        check_dataset_routes(&reward(&["math"], &["task"]), &rows).unwrap();
    }

    #[test]
    fn a_route_no_row_uses_is_refused_naming_the_rows_sources() {
        let rows = [problem("openai/gsm8k"), problem("openai/gsm8k")];
        let err = check_dataset_routes(&reward(&["gsm8k"], &["task"]), &rows).unwrap_err();
        assert_eq!(
            err.to_string(),
            "`reward.routes.gsm8k`: no loaded row has data source `gsm8k` (the rows have: \
             `openai/gsm8k` (2 rows)); key the route by a row's `data_source`"
        );
    }

    #[test]
    fn rows_with_no_route_and_no_default_route_are_refused() {
        let rows = [problem("a"), problem("b"), problem("b"), problem("c")];
        let err = check_dataset_routes(&reward(&["a"], &[]), &rows).unwrap_err();
        assert_eq!(
            err.to_string(),
            "`reward.default_route.sources` is empty and no route scores rows with data source \
             `b` (2 rows), `c` (1 row); add `[reward.routes.<source>]` or a default route"
        );
    }

    #[test]
    fn a_long_list_of_sources_is_cut_short() {
        let rows: Vec<Problem> = (0..11).map(|i| problem(&format!("s{i:02}"))).collect();
        let err = check_dataset_routes(&reward(&[], &[]), &rows).unwrap_err();
        assert!(
            err.to_string().contains("`s07` (1 row), and 3 more;"),
            "{err}"
        );
    }
}
