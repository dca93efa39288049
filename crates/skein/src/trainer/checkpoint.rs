//! Checkpoints that a run resumes from exactly: the policy as a Hugging Face directory
//! (config, safetensors, tokenizer, generation config) plus the trainer's state — optimizer
//! moments, step and policy version, the task sampler's RNG, the partial-rollout buffer, the
//! frozen reference and the critic when there are any, and how much of metrics.jsonl the
//! state accounts for.
//!
//! A checkpoint is written into `NAME.tmp`, every file and the directory are fsynced, and only
//! then renamed over `NAME`: a crash mid-write leaves the previous checkpoint intact.
//!
//! The parts that never change during a run, LoRA's frozen base and a KL reference, are as
//! large as the policy. A checkpoint hard-links them from the one this process wrote before
//! it rather than writing them again, which halves what each LoRA checkpoint writes. Every
//! checkpoint still holds them whole: deleting one leaves the others' links, and nothing
//! writes into a linked file (files are replaced by rename, never rewritten in place).

use super::rollout::WorkloadState;
use super::update::optim::Optimizer;
use crate::engine::SamplingParams;
use crate::model::{Model, ModelOptions, ValueModel};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use skein_text::Tokenizer;
use std::fs::File;
use std::path::{Path, PathBuf};
use tch::Tensor;

pub const STATE_FILE: &str = "trainer_state.json";
const OPTIMIZER_FILE: &str = "optimizer.safetensors";
const REFERENCE_DIR: &str = "reference";
/// With LoRA: the frozen base the adapters train on, and the adapters in PEFT's layout (the
/// checkpoint's own model files hold the two merged, for anything that loads the policy).
pub const BASE_DIR: &str = "base";
pub const ADAPTER_DIR: &str = "adapter";
/// With LoRA and a KL term: the adapters the warm-up trained, frozen in the reference on the
/// same base, in PEFT's layout (absent where the reference is the base alone).
const REFERENCE_ADAPTER_DIR: &str = "reference_adapter";
const CRITIC_FILE: &str = "critic.safetensors";
const CRITIC_OPTIMIZER_FILE: &str = "critic_optimizer.safetensors";

/// Everything besides tensors that the step loop needs to continue.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainerState {
    /// The last RL step this checkpoint includes.
    pub step: usize,
    /// Optimizer steps taken: the policy version.
    pub optimizer_steps: usize,
    pub critic_optimizer_steps: usize,
    /// The rollout source's sampler, dataset position and partial-rollout buffer.
    #[serde(flatten)]
    pub workload: WorkloadState,
    /// Lines of metrics.jsonl written up to this step; a resumed run drops the rest.
    pub metrics_lines: usize,
    pub eval_before_accuracy: f64,
    /// None when every answer of that evaluation failed (JSON has no NaN).
    pub eval_before_reward: Option<f64>,
    /// Mean training reward of each step so far (null for a step whose every trajectory
    /// failed).
    pub rewards: Vec<Option<f64>>,
    /// The streaks that stop a run, as they stood after this step (absent from checkpoints
    /// written before they were kept: zero).
    #[serde(default)]
    pub streaks: StopStreaks,
    /// The parts beside the policy the checkpoint holds, which [`save`] records from what it
    /// wrote (None in a state built in memory, and in checkpoints written before the parts
    /// were recorded, which are read by the files present). A part recorded and missing is
    /// damage, not a run without it.
    #[serde(default)]
    pub saved_parts: Option<SavedParts>,
}

/// What a checkpoint holds besides the policy, its optimizer and the state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedParts {
    /// `reference/`: a KL reference that is a model of its own.
    pub reference: bool,
    /// `reference_adapter/`: with LoRA, the warm-up's adapters frozen in the reference.
    pub reference_adapter: bool,
    /// `critic.safetensors` and its optimizer's moments.
    pub critic: bool,
}

impl SavedParts {
    fn of(s: &Snapshot) -> SavedParts {
        let adapter = s.reference.is_some_and(|r| r.options.lora.enabled());
        SavedParts {
            reference: s.reference.is_some() && !adapter,
            reference_adapter: adapter,
            critic: s.critic.is_some(),
        }
    }

    /// Refuses a part this checkpoint recorded and lacks.
    fn check_present(&self, dir: &Path) -> Result<()> {
        let wanted = [
            (self.reference, REFERENCE_DIR),
            (self.reference_adapter, REFERENCE_ADAPTER_DIR),
            (self.critic, CRITIC_FILE),
            (self.critic, CRITIC_OPTIMIZER_FILE),
        ];
        for (saved, name) in wanted {
            if saved && !dir.join(name).exists() {
                bail!("{name} is missing, though the checkpoint was written with it");
            }
        }
        Ok(())
    }
}

/// Counts that stop a run when they grow too long, kept so a resumed run stops at the step
/// the uninterrupted one would.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopStreaks {
    /// Consecutive policy updates skipped for a NaN or infinite loss or gradient
    /// (`trainer.max_consecutive_skips`).
    pub skipped_updates: usize,
    /// The same of the critic's updates (0 in a checkpoint written before it was kept).
    #[serde(default)]
    pub critic_skipped_updates: usize,
    /// Consecutive steps with no token to train (`MAX_UNTRAINED_STEPS`).
    pub untrained_steps: usize,
}

/// What a checkpoint holds, borrowed from the running trainer.
pub struct Snapshot<'a> {
    pub policy: &'a Model,
    pub tokenizer: &'a Tokenizer,
    pub sampling: &'a SamplingParams,
    pub optimizer: &'a Optimizer,
    pub reference: Option<&'a Model>,
    pub critic: Option<(&'a ValueModel, &'a Optimizer)>,
    pub state: &'a TrainerState,
    /// A checkpoint this process wrote before, of the same run: its frozen parts are linked.
    pub previous: Option<&'a Path>,
}

/// An HF model directory: config.json, model.safetensors, the tokenizer files and a
/// generation_config.json with the sampling settings and end-of-sequence ids of this run.
pub fn save_model_dir(
    policy: &Model,
    tokenizer: &Tokenizer,
    sampling: &SamplingParams,
    dir: &Path,
) -> Result<()> {
    policy.save_dir(dir)?;
    save_tokenizer_files(tokenizer, sampling, dir)
}

/// The tokenizer and generation config of an HF model directory.
fn save_tokenizer_files(
    tokenizer: &Tokenizer,
    sampling: &SamplingParams,
    dir: &Path,
) -> Result<()> {
    tokenizer.save_dir(dir)?;
    let generation = skein_text::GenerationConfig {
        eos_token_id: Some(skein_text::TokenIds::Many(sampling.stop_token_ids.clone())),
        added_stop_ids: tokenizer.added_stops(&sampling.stop_token_ids),
        pad_token_id: tokenizer.pad_token_id(),
        temperature: Some(sampling.temperature),
        top_p: Some(sampling.top_p),
        // Written even when 0 (off): without it, transformers samples with its top_k of 50.
        top_k: Some(u32::try_from(sampling.top_k).unwrap_or(u32::MAX)),
        max_new_tokens: Some(sampling.max_new_tokens),
        do_sample: Some(sampling.temperature > 0.0),
        ..Default::default()
    };
    generation.save_dir(dir)?;
    Ok(())
}

/// [`save_model_dir`], and with LoRA the frozen base (`base/`) and the adapters in PEFT's
/// layout (`adapter/`) beside the merged model. The base's weights are linked from
/// `previous`'s when it has them: a policy directory this process wrote from the same model.
pub fn save_policy_dir(
    policy: &Model,
    tokenizer: &Tokenizer,
    sampling: &SamplingParams,
    dir: &Path,
    previous: Option<&Path>,
) -> Result<()> {
    save_model_dir(policy, tokenizer, sampling, dir)?;
    if policy.options.lora.enabled() {
        let base = dir.join(BASE_DIR);
        link_or_write_frozen(&base, previous.map(|p| p.join(BASE_DIR)), |d| {
            policy.save_base_dir(d)
        })?;
        save_tokenizer_files(tokenizer, sampling, &base)?;
        policy.save_adapter(&dir.join(ADAPTER_DIR), BASE_DIR)?;
    }
    Ok(())
}

/// Writes a resumable checkpoint at `dir`, atomically.
pub fn save(dir: &Path, s: &Snapshot) -> Result<()> {
    write_aside(dir, |tmp| {
        save_policy_dir(s.policy, s.tokenizer, s.sampling, tmp, s.previous)?;
        write_tensors(&s.optimizer.state(), &tmp.join(OPTIMIZER_FILE))?;
        match s.reference {
            Some(r) if r.options.lora.enabled() => {
                r.save_adapter(&tmp.join(REFERENCE_ADAPTER_DIR), BASE_DIR)?
            }
            Some(r) => link_or_write_frozen(
                &tmp.join(REFERENCE_DIR),
                s.previous.map(|p| p.join(REFERENCE_DIR)),
                |d| r.save_dir(d),
            )?,
            None => {}
        }
        if let Some((critic, opt)) = s.critic {
            write_tensors(
                &crate::model::sorted_variables(&critic.vs),
                &tmp.join(CRITIC_FILE),
            )?;
            write_tensors(&opt.state(), &tmp.join(CRITIC_OPTIMIZER_FILE))?;
        }
        let state = TrainerState {
            saved_parts: Some(SavedParts::of(s)),
            ..s.state.clone()
        };
        std::fs::write(
            tmp.join(STATE_FILE),
            serde_json::to_string(&state).context("serialising the trainer state")?,
        )
        .with_context(|| format!("writing {}", tmp.join(STATE_FILE).display()))
    })
}

/// Writes the directory `dir` whole or not at all: `write` fills `NAME.tmp`, which is
/// fsynced and renamed over `dir` (the old one moved aside first, then removed). A write that
/// fails, or a crash, leaves the old `dir` as it was.
/// The files of a model directory that [`Model::save_dir`] writes.
const MODEL_FILES: [&str; 2] = ["model.safetensors", "config.json"];

/// Writes a frozen model's files into `dir` by hard-linking them from `from`, the same model
/// as an earlier checkpoint of this process wrote it, or with `write` where that cannot be
/// done (no earlier one, a file system without hard links).
fn link_or_write_frozen(
    dir: &Path,
    from: Option<PathBuf>,
    write: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    if let Some(from) = from {
        let linked = std::fs::create_dir_all(dir).and_then(|()| {
            MODEL_FILES
                .iter()
                .try_for_each(|name| std::fs::hard_link(from.join(name), dir.join(name)))
        });
        if linked.is_ok() {
            return Ok(());
        }
        let _ = std::fs::remove_dir_all(dir);
    }
    write(dir)
}

pub fn write_aside(dir: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let tmp = dir.with_extension("tmp");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).with_context(|| format!("removing {}", tmp.display()))?;
    }
    write(&tmp)?;
    sync_tree(&tmp)?;
    let old = dir.with_extension("old");
    if dir.exists() {
        std::fs::rename(dir, &old).with_context(|| format!("moving {} aside", dir.display()))?;
    }
    std::fs::rename(&tmp, dir).with_context(|| format!("renaming to {}", dir.display()))?;
    if let Some(parent) = dir.parent() {
        sync_dir(parent)?;
    }
    if old.exists() {
        std::fs::remove_dir_all(&old).with_context(|| format!("removing {}", old.display()))?;
    }
    Ok(())
}

pub fn load_state(dir: &Path) -> Result<TrainerState> {
    let path = dir.join(STATE_FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Named tensors as a checkpoint stores them.
pub type Tensors = Vec<(String, Tensor)>;

/// A checkpoint read whole into memory: a resume reads everything before it writes anything.
pub struct Loaded {
    pub tokenizer: Tokenizer,
    pub policy: Model,
    pub rest: Restore,
}

/// What a resumed run restores beside the policy.
pub struct Restore {
    pub dir: PathBuf,
    pub state: TrainerState,
    /// The policy's AdamW moments.
    pub optimizer: Tensors,
    /// The frozen KL reference, when the run had one of its own: a whole model, or with
    /// LoRA the policy's base and the warm-up's adapters.
    pub reference: Option<Model>,
    /// The critic's weights and AdamW moments, when the run had one.
    pub critic: Option<(Tensors, Tensors)>,
}

impl Loaded {
    /// Reads every file of the checkpoint at `dir`; any that is missing or damaged is an error
    /// naming it.
    pub fn read(dir: &Path, device: tch::Device, options: &ModelOptions) -> Result<Loaded> {
        let state = load_state(dir)?;
        if let Some(parts) = &state.saved_parts {
            parts.check_present(dir)?;
        }
        let tokenizer = Tokenizer::from_dir(dir)?;
        let policy = read_policy(dir, device, options)?;
        let optimizer = read_tensors(&dir.join(OPTIMIZER_FILE))?;
        let reference_dir = dir.join(REFERENCE_DIR);
        // Without LoRA (its reference is the base), in the policy's dtype.
        let reference_options = ModelOptions {
            dtype: options.dtype,
            ..Default::default()
        };
        let reference_adapter = dir.join(REFERENCE_ADAPTER_DIR);
        let reference = if reference_adapter.is_dir() {
            // The policy's base with the warm-up's adapters, frozen.
            let reference = policy.frozen_copy();
            reference.load_adapter(&reference_adapter)?;
            Some(reference)
        } else {
            reference_dir
                .is_dir()
                .then(|| Model::load_dir_with(&reference_dir, &reference_options, device))
                .transpose()?
        };
        let critic = if dir.join(CRITIC_FILE).exists() {
            Some((
                read_tensors(&dir.join(CRITIC_FILE))?,
                read_tensors(&dir.join(CRITIC_OPTIMIZER_FILE))?,
            ))
        } else {
            None
        };
        Ok(Loaded {
            tokenizer,
            policy,
            rest: Restore {
                dir: dir.to_path_buf(),
                state,
                optimizer,
                reference,
                critic,
            },
        })
    }
}

/// The policy of a checkpoint: its model files, or with LoRA its base and adapters.
fn read_policy(dir: &Path, device: tch::Device, options: &ModelOptions) -> Result<Model> {
    let (base, adapter) = (dir.join(BASE_DIR), dir.join(ADAPTER_DIR));
    match (options.lora.enabled(), base.is_dir()) {
        (false, false) => Model::load_dir_with(dir, options, device),
        (true, true) => {
            let policy = Model::load_dir_with(&base, options, device)?;
            policy.load_adapter(&adapter)?;
            Ok(policy)
        }
        (true, false) => bail!(
            "{} has no LoRA base and adapters (its run trained every weight): resume with \
             `lora.rank = 0`",
            dir.display()
        ),
        (false, true) => bail!(
            "{} holds LoRA adapters (its run trained with `lora.rank` > 0): resume with the \
             run's [lora] settings",
            dir.display()
        ),
    }
}

/// The newest checkpoint of `run_dir` that reads whole. A damaged newer one is reported and
/// passed over, so a resume falls back to the newest intact checkpoint and says so.
pub fn load_newest(run_dir: &Path, device: tch::Device, options: &ModelOptions) -> Result<Loaded> {
    // Every checkpoint-N directory, a state file or not: one without is damage to report
    // (checkpoints are renamed into place whole), not a directory to pass over in silence.
    let all = numbered_dirs(run_dir, false)?;
    if all.is_empty() {
        bail!(
            "nothing to resume in {}: it has no checkpoint-N directory with {} (runs write \
             them every `trainer.checkpoint_every` steps)",
            run_dir.display(),
            STATE_FILE
        );
    }
    let mut damaged = Vec::new();
    for (_, dir) in all.iter().rev() {
        match Loaded::read(dir, device, options) {
            Ok(loaded) => {
                if !damaged.is_empty() {
                    eprintln!(
                        "skein: resuming from {} instead, the newest intact checkpoint",
                        dir.display()
                    );
                }
                return Ok(loaded);
            }
            Err(e) => {
                eprintln!("skein: {} cannot be resumed: {e:#}", dir.display());
                damaged.push(dir.display().to_string());
            }
        }
    }
    bail!(
        "no checkpoint in {} can be resumed (damaged: {}); nothing was changed",
        run_dir.display(),
        damaged.join(", ")
    )
}

/// Copies saved weights into `vs`, every variable by name.
pub fn copy_into(vs: &tch::nn::VarStore, saved: &Tensors, what: &str) -> Result<()> {
    let saved: std::collections::HashMap<&str, &Tensor> =
        saved.iter().map(|(n, t)| (n.as_str(), t)).collect();
    tch::no_grad(|| {
        for (name, mut var) in vs.variables() {
            let Some(t) = saved.get(name.as_str()) else {
                bail!("{what}: no tensor `{name}`");
            };
            if t.size() != var.size() {
                bail!(
                    "{what}: `{name}` has shape {:?}, the model {:?}",
                    t.size(),
                    var.size()
                );
            }
            var.copy_(t);
        }
        Ok(())
    })
}

fn read_tensors(path: &Path) -> Result<Tensors> {
    Tensor::read_safetensors(path).with_context(|| {
        format!(
            "reading {}: the file is missing or damaged (a checkpoint written by skein has it)",
            path.display()
        )
    })
}

/// The newest `checkpoint-N` under `run_dir` that holds a trainer state.
pub fn latest(run_dir: &Path) -> Result<Option<(usize, PathBuf)>> {
    Ok(numbered(run_dir)?.into_iter().last())
}

/// The newest `checkpoint-N` with N ≤ `step`, the step a run has reached. One numbered past it
/// is not this run's: its resume passed it over as damaged.
pub fn latest_up_to(run_dir: &Path, step: usize) -> Result<Option<(usize, PathBuf)>> {
    Ok(numbered(run_dir)?.into_iter().rfind(|&(n, _)| n <= step))
}

/// Removes all but the newest `keep_last` numbered checkpoints up to step `saved`, the one
/// just written (0 keeps all). Checkpoints numbered past it are ones a resume passed over as
/// damaged: they neither count nor go, or a damaged checkpoint-30 would push out every good
/// one a run resumed before it writes again.
pub fn rotate(run_dir: &Path, keep_last: usize, saved: usize) -> Result<()> {
    if keep_last == 0 {
        return Ok(());
    }
    let all: Vec<(usize, PathBuf)> = numbered(run_dir)?
        .into_iter()
        .filter(|&(n, _)| n <= saved)
        .collect();
    for (_, dir) in all.iter().take(all.len().saturating_sub(keep_last)) {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(())
}

/// `checkpoint-N` directories with a trainer state, oldest first.
fn numbered(run_dir: &Path) -> Result<Vec<(usize, PathBuf)>> {
    numbered_dirs(run_dir, true)
}

/// The `checkpoint-N` directories of `run_dir`, oldest first; with `with_state`, only those
/// holding a state file.
fn numbered_dirs(run_dir: &Path, with_state: bool) -> Result<Vec<(usize, PathBuf)>> {
    let mut found = Vec::new();
    let entries = match std::fs::read_dir(run_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
        Err(e) => return Err(e).with_context(|| format!("listing {}", run_dir.display())),
    };
    for entry in entries {
        let path = entry?.path();
        let n = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("checkpoint-"))
            .and_then(|n| n.parse::<usize>().ok());
        if let Some(n) = n {
            if path.is_dir() && (!with_state || path.join(STATE_FILE).is_file()) {
                found.push((n, path));
            }
        }
    }
    found.sort();
    Ok(found)
}

fn write_tensors(named: &[(String, Tensor)], path: &Path) -> Result<()> {
    let refs: Vec<(&str, &Tensor)> = named.iter().map(|(n, t)| (n.as_str(), t)).collect();
    Tensor::write_safetensors(&refs, path).with_context(|| format!("writing {}", path.display()))
}

/// fsyncs every file below `dir`, then the directories themselves.
fn sync_tree(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            sync_tree(&path)?;
        } else {
            File::open(&path)
                .and_then(|f| f.sync_all())
                .with_context(|| format!("syncing {}", path.display()))?;
        }
    }
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("syncing {}", dir.display()))
}

/// Keeps the first `lines` lines of `path` (a resumed run's metrics up to its checkpoint).
/// Only whole lines are kept: a last line a crash cut short would otherwise run into the next
/// record. The file is cut where the kept lines end rather than rewritten, so an interruption
/// here cannot leave it emptier than the records it keeps.
pub fn truncate_lines(path: &Path, lines: usize) -> Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let whole: Vec<&str> = text
        .split_inclusive('\n')
        .take_while(|l| l.ends_with('\n'))
        .take(lines)
        .collect();
    let found = whole.len();
    if found < lines {
        eprintln!(
            "skein: warning: {} has {found} of the {lines} records the checkpoint was written \
             after: {} were removed since, and the curves of this run will miss their steps",
            path.display(),
            lines - found
        );
    }
    let kept_bytes: usize = whole.iter().map(|l| l.len()).sum();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    file.set_len(kept_bytes as u64)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cutting {} to {found} records", path.display()))
}

/// Lines in `path` (0 when it does not exist yet).
pub fn count_lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelConfig;
    use crate::trainer::rollout::judge::text_ids;

    /// A frozen model is linked from an earlier checkpoint that holds it, and written where
    /// that one is gone.
    #[test]
    fn frozen_files_are_linked_when_the_earlier_checkpoint_has_them() {
        use std::os::unix::fs::MetadataExt;
        let root = std::env::temp_dir().join(format!("skein-frozen-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let tokenizer = Tokenizer::char_level("abc").unwrap();
        let cfg = ModelConfig::tiny_qwen2(tokenizer.vocab_size(), 16, 1, 2, 1, 32, 16);
        let model = Model::random(&cfg, tch::Device::Cpu, 1).unwrap();
        let (first, second, third) = (root.join("1"), root.join("2"), root.join("3"));
        link_or_write_frozen(&first, None, |d| model.save_dir(d)).unwrap();
        let mut wrote = false;
        link_or_write_frozen(&second, Some(first.clone()), |_| {
            wrote = true;
            Ok(())
        })
        .unwrap();
        assert!(!wrote, "an earlier copy was at hand");
        for name in MODEL_FILES {
            let ino = |d: &Path| std::fs::metadata(d.join(name)).unwrap().ino();
            assert_eq!(ino(&first), ino(&second), "{name}");
        }
        std::fs::remove_dir_all(&first).unwrap();
        link_or_write_frozen(&third, Some(first), |d| model.save_dir(d)).unwrap();
        let back = Model::load_dir(&third, tch::Device::Cpu).unwrap();
        assert!(back.vs.variables().len() == model.vs.variables().len());
        let _ = std::fs::remove_dir_all(&root);
    }

    /// A run that stops at an id of its own (`rollout.sampling.stop_token_ids`, here the
    /// letter `c` standing for a `</answer>`) saves a checkpoint that generates as the run did
    /// (generation_config's `eos_token_id` lists it) and reads back with the same
    /// end-of-sequence ids: rewards on a resume or `skein eval` still read that id's text.
    #[test]
    fn a_checkpoint_keeps_a_runs_added_stop_apart_from_end_of_sequence() {
        let tokenizer = Tokenizer::char_level("abc").unwrap();
        let eos = tokenizer.eos_token_ids().to_vec();
        let answer_end = tokenizer.token_to_id("c").unwrap();
        let sampling = SamplingParams {
            stop_token_ids: [eos.clone(), vec![answer_end]].concat(),
            ..SamplingParams::default()
        };
        let cfg = ModelConfig::tiny_qwen2(tokenizer.vocab_size(), 16, 1, 2, 1, 32, 16);
        let policy = Model::random(&cfg, tch::Device::Cpu, 1).unwrap();
        let dir = std::env::temp_dir().join(format!("skein-added-stop-{}", std::process::id()));
        save_model_dir(&policy, &tokenizer, &sampling, &dir).unwrap();

        let generation = skein_text::GenerationConfig::from_dir(&dir)
            .unwrap()
            .unwrap();
        assert_eq!(generation.eos_token_ids(), sampling.stop_token_ids);
        let back = Tokenizer::from_dir(&dir).unwrap();
        assert_eq!(back.eos_token_ids(), eos.as_slice());
        assert_eq!(back.stop_token_ids(), sampling.stop_token_ids);
        let response = [tokenizer.token_to_id("a").unwrap(), answer_end];
        assert_eq!(
            text_ids(&back, &response),
            &response,
            "the added stop keeps its text"
        );
        let ended = [response[0], eos[0]];
        assert_eq!(text_ids(&back, &ended), &ended[..1]);

        // A checkpoint written before generation_config named its added stops lists the run's
        // stop among the ends of sequence; the run's stop_token_ids, applied on a resume or
        // an evaluation, take it back out.
        let mut legacy = generation;
        legacy.added_stop_ids.clear();
        legacy.save_dir(&dir).unwrap();
        let mut old = Tokenizer::from_dir(&dir).unwrap();
        assert!(old.eos_token_ids().contains(&answer_end));
        old.treat_as_added_stops(&[answer_end]);
        assert_eq!(old.eos_token_ids(), eos.as_slice());
        assert_eq!(text_ids(&old, &response), &response);
        old.treat_as_added_stops(&eos);
        assert_eq!(
            old.eos_token_ids(),
            eos.as_slice(),
            "the last end of sequence stays"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The trainer state is JSON, and a resume must read back the very rewards, advantages and
    /// moments it saved: every float survives the round trip bit for bit.
    #[test]
    fn floats_survive_the_state_file_bit_for_bit() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut values = vec![1.0 / 7.0, 0.1 + 0.2, 1e-300, 2.0f64.powi(-1074), 1.7e308];
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = f64::from_bits(x);
            if v.is_finite() {
                values.push(v);
            }
        }
        let text = serde_json::to_string(&values).unwrap();
        let back: Vec<f64> = serde_json::from_str(&text).unwrap();
        let differ = values
            .iter()
            .zip(&back)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(differ, 0, "{differ} of {} floats changed", values.len());
    }

    /// A run resumed before a damaged checkpoint keeps its good ones: the damaged one is
    /// newer than what it writes, and pushes none of them out, nor is it named as the run's
    /// last good checkpoint.
    #[test]
    fn checkpoints_past_the_step_reached_are_neither_counted_nor_named() {
        let dir = std::env::temp_dir().join(format!("skein-rotate-{}", std::process::id()));
        for n in [10, 20, 21, 30] {
            let c = dir.join(format!("checkpoint-{n}"));
            std::fs::create_dir_all(&c).unwrap();
            std::fs::write(c.join(super::STATE_FILE), "{}").unwrap();
        }
        // A run at step 25 names its own newest, not the damaged one past it.
        let (newest, _) = super::latest_up_to(&dir, 25).unwrap().unwrap();
        assert_eq!(newest, 21);
        assert_eq!(super::latest_up_to(&dir, 9).unwrap(), None);
        super::rotate(&dir, 2, 21).unwrap();
        let left: Vec<usize> = super::numbered(&dir)
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(left, [20, 21, 30]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A resume keeps the records up to its checkpoint, whole lines only: the line a crash cut
    /// short is dropped rather than left to run into the next record.
    #[test]
    fn a_resume_keeps_whole_records_and_drops_a_cut_one() {
        let path = std::env::temp_dir().join(format!("skein-metrics-cut-{}", std::process::id()));
        let lines = "{\"step\": 1}\n{\"step\": 2}\n{\"step\": 3}\n";
        std::fs::write(&path, format!("{lines}{{\"step\": 4, \"rew")).unwrap();
        super::truncate_lines(&path, 2).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"step\": 1}\n{\"step\": 2}\n"
        );
        std::fs::write(&path, format!("{lines}{{\"step\": 4, \"rew")).unwrap();
        super::truncate_lines(&path, 5).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), lines);
        std::fs::remove_file(&path).unwrap();
    }
}
