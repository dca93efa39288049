//! `skein train`: a training run (or a resumed one) from a TOML config and `--set` overrides,
//! and the config loading `skein eval` shares.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

pub fn run(
    config: Option<PathBuf>,
    mut overrides: Vec<String>,
    print_config: bool,
    resume: Option<PathBuf>,
    overwrite: bool,
) -> Result<()> {
    if let Some(dir) = &resume {
        check_resumable(dir, config.is_some())?;
    }
    let config = config.or_else(|| resume.as_ref().map(|dir| dir.join("config.toml")));
    if let Some(dir) = &resume {
        // The resumed run stays in its own directory, whatever the config says.
        overrides.push(format!(
            "run.dir={}",
            toml_string(&dir.display().to_string())
        ));
    }
    let mut cfg = load_config(config.as_deref(), &overrides)?;
    if let Some(dir) = &resume {
        check_fixed_on_resume(dir, &cfg)?;
        warn_of_a_stretched_schedule(dir, &cfg)?;
    }
    if print_config {
        print!("{}", skein_config::render_documented(&cfg, PER_LOSS_KEYS));
        return Ok(());
    }
    if let Some(warning) = unfinished_warm_up(&cfg) {
        eprintln!("skein: warning: {warning}");
    }
    // A resumed run keeps the size its config.toml recorded; a new one may have it fitted.
    let chosen = resume.is_some() || sets_key(config.as_deref(), &overrides, MICRO_BATCH_KEY);
    if let Some(fitted) = crate::trainer::fit::fit_micro_batch(&mut cfg, chosen) {
        eprintln!("skein: {fitted}");
    }
    let summary = match resume {
        Some(_) => crate::trainer::run::resume(&cfg)?,
        None => crate::trainer::run::train_new(&cfg, overwrite)?,
    };
    if summary.rank > 0 {
        // Another rank of an MPI job: rank 0 reports the run.
        return Ok(());
    }
    if summary.interrupted {
        println!(
            "interrupted after step {}: continue with `skein train --resume {}`",
            summary.rewards.len(),
            summary.dir.display()
        );
        return Ok(());
    }
    let kind = crate::trainer::rollout::eval_kind(summary.held_out);
    // Steps whose every trajectory failed have no reward to average.
    let rewards: Vec<f64> = summary.rewards.iter().flatten().copied().collect();
    if let Some(line) = reward_change(&rewards) {
        println!("{line}");
    }
    // A run without a warm-up (neither stage) measured its model as loaded.
    let start = if cfg.sft.warms_up() {
        "after the warm-up"
    } else {
        "before RL"
    };
    // An environment worker's problems are seeds, which it may map onto fewer problems.
    let problems = if cfg.agent.kind == crate::trainer::config::AgentKind::EnvWorker {
        "distinct seeds"
    } else {
        "distinct problems"
    };
    println!(
        "{kind} greedy accuracy {:.3} → {:.3} ({start} → after RL, {} {problems}){}",
        summary.eval_before.accuracy,
        summary.eval_after.accuracy,
        summary.eval_after.problems,
        summary.eval_after.failures_note()
    );
    // The same judge decided every accuracy above, and `skein eval` of the run uses it too.
    println!("correct by               {}", summary.correct_by);
    // What to look at next: the curves, then what the policy actually said.
    let dir = summary.dir.display();
    println!("curves                   {dir}/plot.png");
    match cfg.trajectories.keep {
        crate::trainer::config::Keep::None => {
            println!("trajectories             none kept (trajectories.keep = \"none\")")
        }
        _ => println!("trajectories             skein view {dir}"),
    }
    Ok(())
}

/// The summary's training reward: the mean of the first and of the last RL steps, up to 5 each
/// and never the same steps, so a short run shows a change too (a run of one step has only
/// that step for both, as `skein sft`'s losses).
fn reward_change(rewards: &[f64]) -> Option<String> {
    if rewards.is_empty() {
        return None;
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let k = (rewards.len() / 2).clamp(1, 5);
    Some(format!(
        "training reward          {:.3} → {:.3} (mean of the first and last {k} RL steps)",
        mean(&rewards[..k]),
        mean(&rewards[rewards.len() - k..]),
    ))
}

/// Sections a resume cannot change: the checkpoint's weights fix the model, and its task
/// state (problems drawn, data position) the task and the data it counts rows of. The data
/// and `run.seed` also fix which problems are held out and which are evaluated: a change would
/// evaluate prompts trained on before the resume, or others than the curves so far.
const FIXED_ON_RESUME: [&str; 4] = ["model", "task", "lora", "data"];

/// Keys of other sections that a resume cannot change either (see [`FIXED_ON_RESUME`]).
const FIXED_KEYS_ON_RESUME: [(&str, &str); 1] = [("run", "seed")];

/// A `--resume` directory is one an earlier `skein train` wrote: checked before its config is
/// read, so that a wrong path says what it is rather than which file it lacks.
fn check_resumable(dir: &Path, config_given: bool) -> Result<()> {
    if !dir.is_dir() {
        bail!(
            "nothing to resume: {} is not a directory (give --resume the `run.dir` of an \
             earlier `skein train`)",
            dir.display()
        );
    }
    if !config_given && !dir.join("config.toml").is_file() {
        bail!(
            "nothing to resume: {} holds no run (no config.toml); give --resume the `run.dir` \
             of an earlier `skein train`",
            dir.display()
        );
    }
    Ok(())
}

/// A resume keeps the run's [`FIXED_ON_RESUME`] sections as its `config.toml` has them; a
/// changed key would be ignored by the checkpoint while the config claims it.
fn check_fixed_on_resume(dir: &std::path::Path, cfg: &crate::trainer::TrainConfig) -> Result<()> {
    let Ok(mut saved) = load_config(Some(&dir.join("config.toml")), &[]) else {
        // No readable config of the run: the resume itself says what is missing.
        return Ok(());
    };
    let mut now = cfg.clone();
    positions_as_built(&mut saved, &mut now);
    let (saved, now) = (serde_json::to_value(&saved)?, serde_json::to_value(&now)?);
    let sections = FIXED_ON_RESUME.iter().flat_map(|section| {
        let keys = saved[section]
            .as_object()
            .into_iter()
            .flat_map(|a| a.keys());
        keys.map(move |key| (*section, key.as_str()))
    });
    for (section, key) in sections.chain(FIXED_KEYS_ON_RESUME) {
        let (was, is) = (&saved[section][key], &now[section][key]);
        let files = section == "data" && key.ends_with("_files");
        if was == is || (files && same_files(was, is)) {
            continue;
        }
        let moved = if files && may_have_moved(was, is) {
            format!(
                "; files that only moved: resume from the directory the run started in, or \
                 correct the paths in {}",
                dir.join("config.toml").display()
            )
        } else {
            String::new()
        };
        bail!(
            "`{section}.{key}` cannot change on --resume (the run's checkpoint was made with \
             {was}, now {is}): start a new run to change it{moved}"
        );
    }
    Ok(())
}

/// Whether two lists of data files name the same files, written another way (relative and
/// absolute, say): each pair resolves to one path.
fn same_files(was: &serde_json::Value, is: &serde_json::Value) -> bool {
    let paths = |v: &serde_json::Value| -> Option<Vec<std::path::PathBuf>> {
        v.as_array()?
            .iter()
            .map(|p| std::fs::canonicalize(p.as_str()?).ok())
            .collect()
    };
    matches!((paths(was), paths(is)), (Some(a), Some(b)) if a == b)
}

/// Whether a changed list of data files may be the run's files moved: as many files, both
/// lists named, and one the run had that no longer resolves from here. A list that was empty
/// is a switch from the built-in task, never a move.
fn may_have_moved(was: &serde_json::Value, is: &serde_json::Value) -> bool {
    let (Some(was), Some(is)) = (was.as_array(), is.as_array()) else {
        return false;
    };
    let missing = |p: &serde_json::Value| p.as_str().is_some_and(|p| !Path::new(p).exists());
    !was.is_empty() && was.len() == is.len() && was.iter().any(missing)
}

/// A resume that changes `trainer.steps` changes the length of a decaying learning-rate
/// schedule: the next step's rate is read off the new curve, which can be several times the
/// last one (a cosine run extended after its end starts again from half way). Said before
/// the run starts, with both rates, so a jump in the curves has its cause on record.
fn warn_of_a_stretched_schedule(
    dir: &std::path::Path,
    cfg: &crate::trainer::TrainConfig,
) -> Result<()> {
    let Ok(saved) = load_config(Some(&dir.join("config.toml")), &[]) else {
        return Ok(());
    };
    let Some((done, _)) = crate::trainer::checkpoint::latest(dir)? else {
        return Ok(());
    };
    if let Some(warning) = stretched_schedule(&saved, cfg, done) {
        eprintln!("skein: warning: {warning}");
    }
    Ok(())
}

/// What a resume after `done` steps does to the learning rate when it changes
/// `trainer.steps`: the next step's rate on the `saved` run's curve (its own `[optim]`) and on
/// the resumed one's, when they differ by more than 1%.
fn stretched_schedule(
    saved: &crate::trainer::TrainConfig,
    cfg: &crate::trainer::TrainConfig,
    done: usize,
) -> Option<String> {
    let (planned, now) = (saved.trainer.steps, cfg.trainer.steps);
    // lr_at counts steps from 0: the next step after checkpoint-N is step N.
    let (was, will) = (saved.optim.lr_at(done, planned), cfg.optim.lr_at(done, now));
    (planned != now && (will - was).abs() > 0.01 * was).then(|| {
        format!(
            "`trainer.steps` goes from {planned} to {now}, which stretches the learning-rate \
             schedule: step {} runs at {will:.3e} on the new curve, against {was:.3e} on the old \
             one ({:.2}×; `optim.schedule`, `optim.min_lr_ratio`)",
            done + 1,
            will / was
        )
    })
}

/// A learning-rate warm-up longer than the run: the rate rises to its last step and
/// never reaches `optim.lr` (a run shortened with `--set trainer.steps=…` keeps the warm-up
/// of its config). Not refused: a short trial of a long config is a fair thing to run.
fn unfinished_warm_up(cfg: &crate::trainer::TrainConfig) -> Option<String> {
    let (warm_up, steps) = (cfg.optim.warmup_steps, cfg.trainer.steps);
    (steps > 0 && warm_up > steps).then(|| {
        format!(
            "`optim.warmup_steps` = {warm_up} is more than `trainer.steps` = {steps}: the \
             learning rate rises for the whole run and ends at {:.3e}, below `optim.lr` = \
             {:.3e}",
            cfg.optim.lr_at(steps - 1, steps),
            cfg.optim.lr
        )
    })
}

/// `model.max_positions` of both configs as the model has it. config.toml records the context
/// the model was built with: a from-scratch model's is raised to what its task needs, and a
/// loaded model's is its directory's (the key does not apply to it), so a config that asks for
/// less, or for a loaded model's, asks for the same model.
fn positions_as_built(
    saved: &mut crate::trainer::TrainConfig,
    now: &mut crate::trainer::TrainConfig,
) {
    for c in [&mut *saved, &mut *now] {
        if c.model.path.is_empty() {
            let least = crate::trainer::rollout::tasks::min_positions(c);
            c.model.max_positions = c.model.max_positions.max(least);
        }
    }
    if !now.model.path.is_empty() {
        now.model.max_positions = saved.model.max_positions;
    }
}

/// A training config: the file at `path` (or the default job) with `--set` overrides.
/// Keys whose unset value depends on `algorithm.policy_loss`: `--print-config` shows them, with
/// what unset means, set or not.
const PER_LOSS_KEYS: &[skein_config::KeyDoc] = &[
    skein_config::KeyDoc {
        key: "algorithm.clip_low",
        doc: "The trust region below: 1 - clip_low for a ratio (ppo, cispo, gspo), a fall of\n\
              probability (dppo). Unset: 0.2 (ppo, cispo, dppo), 3e-4 (gspo); sapo has none.",
    },
    skein_config::KeyDoc {
        key: "algorithm.clip_high",
        doc:
            "The trust region above: 1 + clip_high for a ratio (ppo, cispo, gspo), a rise of\n\
              probability (dppo). Unset: 0.28 (ppo, cispo), 4e-4 (gspo), 0.2 (dppo); sapo has none.",
    },
    skein_config::KeyDoc {
        key: "eval.correct_by",
        doc:
            "What counts an answer correct: `task`, or a `math`/`exact_match` source of [reward].\n\
              Unset: the one such source the reward routes use, else `task` (docs/rewards.md).",
    },
    skein_config::KeyDoc {
        key: "task.dropped_carries",
        doc: "arithmetic, difficulty 1-3: the chance a warm-up demonstration drops each carry.\n\
              Unset: every demonstration is correct (the default job sets 0.7).",
    },
    skein_config::KeyDoc {
        key: "reward",
        doc:
            "Reward sources, routes and executor (docs/rewards.md). Unset: the task scores inline.",
    },
    skein_config::KeyDoc {
        key: "reward_models",
        doc: "Reward-model directories by source name (docs/rewards.md).",
    },
];

pub fn load_config(
    path: Option<&std::path::Path>,
    overrides: &[String],
) -> Result<crate::trainer::TrainConfig> {
    let mut cfg = load_config_file(path, overrides)?;
    if path.is_none() {
        default_job_teacher(&mut cfg, overrides);
    }
    Ok(cfg)
}

/// The default job warms up on a careless teacher's demonstrations, which it asks for here,
/// in its config (`task.dropped_carries`, shown by `--print-config` and kept in the run's
/// config.toml), while its task is the default one: a run that picks another task or
/// difficulty on top of it, or any config file, gets a correct teacher unless it sets one.
fn default_job_teacher(cfg: &mut crate::trainer::TrainConfig, overrides: &[String]) {
    let default = crate::trainer::config::TaskConfig::default();
    // Environment workers bring their own task; the name left at its default is not it.
    let its_task = cfg.task.name == default.name
        && cfg.task.difficulty == default.difficulty
        && cfg.agent.kind != crate::trainer::config::AgentKind::EnvWorker;
    let chosen = sets_key(None, overrides, "task.dropped_carries");
    if its_task && !chosen && cfg.data.train_files.is_empty() {
        cfg.task.dropped_carries = Some(skein_tasks::arithmetic::DEFAULT_DROPPED_CARRIES);
    }
}

/// The file at `path` (or the defaults) with `--set` overrides.
fn load_config_file(
    path: Option<&std::path::Path>,
    overrides: &[String],
) -> Result<crate::trainer::TrainConfig> {
    let text = match path {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("reading config {}", p.display()))?,
        ),
        None => None,
    };
    let source = path.map_or_else(|| "defaults".into(), |p| p.display().to_string());
    Ok(skein_config::load_with_defaults(
        text.as_deref(),
        &source,
        overrides,
    )?)
}

/// The key a run's memory fit may lower when the config leaves it at its default.
const MICRO_BATCH_KEY: &str = "trainer.micro_batch_tokens";

/// Whether the config file at `path` or an override sets the dotted `key`, as a key of its
/// own or inside an inline table (a file that cannot be read or parsed, or an override that
/// does not apply, has failed loading already).
pub(super) fn sets_key(path: Option<&std::path::Path>, overrides: &[String], key: &str) -> bool {
    let mut table = path
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|text| text.parse::<toml::Table>().ok())
        .unwrap_or_default();
    for o in overrides {
        let _ = skein_config::apply_override(&mut table, o);
    }
    let mut at = Some(&table);
    let mut parts = key.split('.').peekable();
    while let Some(part) = parts.next() {
        let Some(t) = at else { return false };
        if parts.peek().is_none() {
            return t.contains_key(part);
        }
        at = t.get(part).and_then(toml::Value::as_table);
    }
    false
}

/// `s` as a TOML string literal, for an override value.
pub fn toml_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Windows of the first and last steps never share a step: 4 steps compare steps 1–2
    /// with 3–4, not all four with themselves; one step is both.
    #[test]
    fn the_reward_change_compares_different_steps() {
        let line = reward_change(&[0.1, 0.3, 0.5, 0.7]).unwrap();
        assert!(
            line.ends_with("0.200 → 0.600 (mean of the first and last 2 RL steps)"),
            "{line}"
        );
        let line = reward_change(&[0.4]).unwrap();
        assert!(
            line.ends_with("0.400 → 0.400 (mean of the first and last 1 RL steps)"),
            "{line}"
        );
        let many: Vec<f64> = (0..20).map(f64::from).collect();
        let line = reward_change(&many).unwrap();
        assert!(
            line.ends_with("2.000 → 17.000 (mean of the first and last 5 RL steps)"),
            "{line}"
        );
        assert_eq!(reward_change(&[]), None);
    }

    /// The default job asks for its careless teacher; another task or difficulty on top of
    /// it, or a config file, gets a correct one unless it sets `task.dropped_carries`.
    #[test]
    fn only_the_default_job_has_a_careless_teacher() {
        let teacher = |path: Option<&std::path::Path>, sets: &[&str]| {
            let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
            load_config(path, &sets).unwrap().task.dropped_carries
        };
        let careless = Some(skein_tasks::arithmetic::DEFAULT_DROPPED_CARRIES);
        assert_eq!(teacher(None, &[]), careless);
        assert_eq!(teacher(None, &["trainer.steps=3"]), careless);
        assert_eq!(teacher(None, &["task.difficulty=3"]), None);
        assert_eq!(teacher(None, &["task.name=\"reverse\""]), None);
        assert_eq!(teacher(None, &["agent.kind=\"env-worker\""]), None);
        assert_eq!(teacher(None, &["task.dropped_carries=0.0"]), Some(0.0));
        assert_eq!(
            teacher(None, &["task.difficulty=3", "task.dropped_carries=0.5"]),
            Some(0.5)
        );
        let dir = std::env::temp_dir().join(format!("skein-teacher-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(&file, "[task]\nname = \"arithmetic\"\ndifficulty = 2\n").unwrap();
        assert_eq!(teacher(Some(&file), &[]), None, "a config file of its own");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// The old rate is read off the saved run's own schedule: a resume that also changes
    /// `optim.lr` is measured against the rate the run last trained at.
    #[test]
    fn a_stretched_schedule_compares_with_the_runs_own_rate() {
        let cosine = |lr: f64, steps: usize| {
            let sets = [
                "optim.schedule=\"cosine\"".to_string(),
                "optim.min_lr_ratio=0.1".into(),
                format!("optim.lr={lr}"),
                format!("trainer.steps={steps}"),
            ];
            load_config(None, &sets).unwrap()
        };
        let saved = cosine(1e-4, 100);
        let warning = stretched_schedule(&saved, &cosine(1e-4, 200), 100).unwrap();
        assert!(
            warning.contains("against 1.000e-5") && warning.contains("(5.50×"),
            "{warning}"
        );
        let warning = stretched_schedule(&saved, &cosine(2e-5, 200), 100).unwrap();
        assert!(
            warning.contains("against 1.000e-5") && warning.contains("(1.10×"),
            "{warning}"
        );
        assert_eq!(stretched_schedule(&saved, &saved, 100), None);
        let constant = load_config(None, &["trainer.steps=100".into()]).unwrap();
        let longer = load_config(None, &["trainer.steps=200".into()]).unwrap();
        assert_eq!(stretched_schedule(&constant, &longer, 50), None);
    }

    /// Data files written another way are the same files; others are not.
    #[test]
    fn data_files_are_compared_as_the_files_they_name() {
        let dir = std::env::temp_dir().join(format!("skein-same-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.jsonl"), dir.join("b.jsonl"));
        std::fs::write(&a, "").unwrap();
        std::fs::write(&b, "").unwrap();
        let list = |paths: &[&std::path::Path]| serde_json::json!(paths);
        let a_dotted = dir.join(".").join("a.jsonl");
        assert!(same_files(&list(&[&a]), &list(&[&a_dotted])));
        assert!(!same_files(&list(&[&a]), &list(&[&b])));
        let gone = dir.join("gone.jsonl");
        assert!(!same_files(&list(&[&gone]), &list(&[&gone])));
        // A file the run had that is gone may have moved; a list that was empty did not.
        assert!(may_have_moved(&list(&[&gone]), &list(&[&a])));
        assert!(!may_have_moved(&list(&[&b]), &list(&[&a])));
        assert!(!may_have_moved(&list(&[]), &list(&[&a])));
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A warm-up the run cannot finish is named with the rate the run ends at.
    #[test]
    fn a_warm_up_longer_than_the_run_is_named() {
        let cfg = |sets: &[&str]| {
            let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
            load_config(None, &sets).unwrap()
        };
        let long = cfg(&["optim.warmup_steps=10", "trainer.steps=5", "optim.lr=1e-4"]);
        let warning = unfinished_warm_up(&long).unwrap();
        assert!(warning.contains("ends at 5.000e-5"), "{warning}");
        assert_eq!(
            unfinished_warm_up(&cfg(&["optim.warmup_steps=4", "trainer.steps=5"])),
            None
        );
        assert_eq!(unfinished_warm_up(&cfg(&["trainer.steps=0"])), None);
    }

    /// A key counts as set by an override (its own or an inline table's) or by the file's
    /// table, never by a like-named key elsewhere.
    #[test]
    fn a_key_is_set_by_an_override_or_the_file() {
        let dir = std::env::temp_dir().join(format!("skein-sets-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(&file, "[trainer]\nmicro_batch_tokens = 1024\n").unwrap();
        assert!(sets_key(Some(&file), &[], MICRO_BATCH_KEY));
        std::fs::write(
            &file,
            "[trainer]\nsteps = 3\n[other]\nmicro_batch_tokens = 1\n",
        )
        .unwrap();
        assert!(!sets_key(Some(&file), &[], MICRO_BATCH_KEY));
        let set = ["trainer.micro_batch_tokens = 512".to_string()];
        assert!(sets_key(Some(&file), &set, MICRO_BATCH_KEY));
        assert!(!sets_key(
            None,
            &["trainer.steps=2".into()],
            MICRO_BATCH_KEY
        ));
        let inline = ["trainer={ micro_batch_tokens = 512 }".to_string()];
        assert!(sets_key(None, &inline, MICRO_BATCH_KEY));
        std::fs::remove_dir_all(&dir).ok();
    }
}
