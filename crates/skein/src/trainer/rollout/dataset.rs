//! A task over a prompt dataset (`[data]`): rows from skein-data, rendered into prompt text
//! with the model's chat template, held to `data.max_prompt_tokens`, and drawn in a seeded
//! epoch order whose position the trainer checkpoints. Responses are scored by math answer
//! equivalence against the row's ground truth (`[reward]` routes can replace that).

use super::judge::PromptBatch;
use super::truncate;
use crate::trainer::config::{DataConfig, TrainConfig};
use anyhow::{bail, Result};
use skein_data::{fit, Fit, PromptRow, ReadOptions, RowPlace, Sampler};
use skein_reward::math;
use skein_tasks::{Problem, Score, Task, TaskRng};
use skein_text::{ChatTemplate, Message, Tokenizer, UnknownChars};
use std::collections::BTreeSet;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The datasets of a run: the training task, the validation problems and the counters.
pub struct Data {
    pub train: DatasetTask,
    /// The validation split, in file order; empty without `data.val_files`.
    pub val: Vec<Problem>,
    pub counts: DataCounts,
    /// The longest prompt of either split in tokens, start tokens included: what a rollout
    /// slot holds before its response (the memory estimate sizes the KV cache by it).
    pub longest_prompt: usize,
}

/// What loading left out or changed, over both splits (logged in metrics.jsonl).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DataCounts {
    pub skipped_rows: usize,
    pub filtered_prompts: usize,
    pub truncated_prompts: usize,
    /// Prompts with characters outside the tokenizer's vocabulary (read as its unknown token).
    pub unknown_char_prompts: usize,
    /// Validation prompts left out of the held-out set: also a training prompt, or a repeat
    /// of one before it ([`held_out_split`]).
    pub val_in_train: usize,
    pub val_repeats: usize,
}

impl DataCounts {
    fn add(&mut self, o: DataCounts) {
        self.skipped_rows += o.skipped_rows;
        self.filtered_prompts += o.filtered_prompts;
        self.truncated_prompts += o.truncated_prompts;
        self.unknown_char_prompts += o.unknown_char_prompts;
        self.val_in_train += o.val_in_train;
        self.val_repeats += o.val_repeats;
    }

    pub fn metrics(&self) -> [(&'static str, f64); 6] {
        [
            ("data/skipped_rows", self.skipped_rows as f64),
            ("data/filtered_prompts", self.filtered_prompts as f64),
            ("data/truncated_prompts", self.truncated_prompts as f64),
            (
                "data/unknown_char_prompts",
                self.unknown_char_prompts as f64,
            ),
            ("data/val_in_train", self.val_in_train as f64),
            ("data/val_repeats", self.val_repeats as f64),
        ]
    }
}

/// The held-out set of a validation split: each distinct prompt once, and none that training
/// can draw, so held-out accuracy is over distinct problems the run never trains on. A prompt
/// is the text the model reads (rendered and fitted to `data.max_prompt_tokens`).
pub fn held_out_split(val: Vec<Problem>, train: &[Problem]) -> (Vec<Problem>, DataCounts) {
    let trained: std::collections::HashSet<&str> =
        train.iter().map(|p| p.prompt.as_str()).collect();
    let mut seen = std::collections::HashSet::new();
    let mut counts = DataCounts::default();
    let mut kept = Vec::with_capacity(val.len());
    for p in val {
        if trained.contains(p.prompt.as_str()) {
            counts.val_in_train += 1;
        } else if !seen.insert(p.prompt.clone()) {
            counts.val_repeats += 1;
        } else {
            kept.push(p);
        }
    }
    (kept, counts)
}

/// The task a run trains on: its dataset when `data.train_files` is set, else the built-in
/// `task.name`.
pub fn task_from_config(cfg: &TrainConfig) -> Result<(Box<dyn Task>, Option<Data>)> {
    if cfg.data.train_files.is_empty() {
        let task = skein_tasks::task_with_teacher(
            &cfg.task.name,
            cfg.task.difficulty,
            cfg.task.dropped_carries,
        )?;
        return Ok((task, None));
    }
    let data = Data::load(cfg)?;
    Ok((Box::new(data.train.clone()), Some(data)))
}

/// The run's rewarder (None without `[reward]`); its `task` scorer is the run's task, so a
/// dataset's rows are checked against their own ground truth.
pub fn rewarder(
    cfg: &TrainConfig,
    data: Option<&Data>,
    device: tch::Device,
) -> Result<Option<skein_reward::Rewarder>> {
    match (data, &cfg.reward) {
        (Some(d), Some(reward)) => {
            let task: Box<dyn Task> = Box::new(d.train.clone());
            super::reward::build_rewarder(reward, &cfg.reward_models, Some(task), device).map(Some)
        }
        _ => super::reward::from_config(cfg, device),
    }
}

impl Data {
    pub fn load(cfg: &TrainConfig) -> Result<Data> {
        let renderer = Renderer::for_config(cfg)?;
        let (train, mut counts) = read_split(
            &cfg.data,
            &cfg.data.train_files,
            "train",
            "data.train_files",
            &renderer,
        )?;
        let (val, val_counts) = if cfg.data.val_files.is_empty() {
            (Vec::new(), DataCounts::default())
        } else {
            read_split(
                &cfg.data,
                &cfg.data.val_files,
                "val",
                "data.val_files",
                &renderer,
            )?
        };
        counts.add(val_counts);
        let alphabet = alphabet_of(train.iter().chain(&val).map(|r| &r.problem));
        let tokenizer = if cfg.model.path.is_empty() {
            Tokenizer::char_level(&alphabet)?
        } else {
            Tokenizer::from_dir(&cfg.model.path)?
        };
        let start = renderer.start_ids(&tokenizer).len();
        let train = fit_split(train, &tokenizer, &cfg.data, "train", start)?;
        let val = fit_split(val, &tokenizer, &cfg.data, "val", start)?;
        counts.add(train.counts);
        counts.add(val.counts);
        let longest_prompt = train.longest_prompt.max(val.longest_prompt);
        let (train, val) = (train.problems, val.problems);
        if train.is_empty() && counts.filtered_prompts == 0 {
            bail!(
                "no training prompt is left: every row of `data.train_files` was skipped as bad \
                 ({} rows skipped in all, the first named above); fix those rows",
                counts.skipped_rows
            );
        }
        if train.is_empty() {
            bail!(
                "no training prompt is within `data.max_prompt_tokens` = {} ({} filtered, {} \
                 bad rows skipped): {}",
                cfg.data.max_prompt_tokens,
                counts.filtered_prompts,
                counts.skipped_rows,
                what_fits_more(cfg.data.truncation)
            );
        }
        let (val, c) = held_out_split(val, &train);
        counts.add(c);
        if !cfg.data.val_files.is_empty() && val.is_empty() {
            bail!(
                "`data.val_files` leave no held-out prompt: {} also in the training files, {} \
                 repeats, and the rest filtered or skipped ({} over `data.max_prompt_tokens` = \
                 {} in both splits); give validation prompts training does not have",
                c.val_in_train,
                c.val_repeats,
                counts.filtered_prompts,
                cfg.data.max_prompt_tokens
            );
        }
        if let Some(reward) = &cfg.reward {
            super::routes::check_dataset_routes(reward, train.iter().chain(&val))?;
        }
        if c.val_in_train + c.val_repeats > 0 {
            eprintln!(
                "skein: warning: val split: left {} prompts out of the held-out set that the \
                 training files also have and {} repeats, so held-out accuracy counts \
                 distinct problems the run never trains on (data/val_in_train, \
                 data/val_repeats)",
                c.val_in_train, c.val_repeats
            );
        }
        eprintln!(
            "skein: dataset: {} train and {} validation prompts; {} bad rows skipped, {} \
             prompts over {} tokens filtered, {} truncated",
            train.len(),
            val.len(),
            counts.skipped_rows,
            counts.filtered_prompts,
            cfg.data.max_prompt_tokens,
            counts.truncated_prompts
        );
        let name = format!("dataset {}", cfg.data.train_files.join(", "));
        let train = DatasetTask::new(name, train, &alphabet, &cfg.data, renderer.is_template());
        Ok(Data {
            train,
            val,
            counts,
            longest_prompt,
        })
    }

    /// The held-out problems evaluated during training: the first `n` of the validation split,
    /// or without one, `n` distinct training problems drawn with a seed of their own
    /// ([`distinct_draws`]).
    pub fn eval_batch(&self, tokenizer: &Tokenizer, n: usize, seed: u64) -> Result<PromptBatch> {
        let problems = if self.val.is_empty() {
            distinct_draws(&self.train.inner.problems, n, seed)
        } else {
            self.val.iter().take(n).cloned().collect()
        };
        prompt_batch(problems, tokenizer, &self.train)
    }
}

/// `n` problems of `rows` in an order drawn from `seed`, a prompt that several rows repeat
/// (with the same answer) taken once, as the validation split keeps it once: a problem counted
/// twice weighs twice in the accuracy without adding to what it measures. Fewer when the rows
/// hold fewer distinct problems.
fn distinct_draws(rows: &[Problem], n: usize, seed: u64) -> Vec<Problem> {
    let mut order = Sampler::new(rows.len(), seed, true);
    let mut seen = std::collections::HashSet::new();
    (0..rows.len())
        .map(|_| &rows[order.next_index()])
        .filter(|p| seen.insert((&p.data_source, &p.prompt, &p.ground_truth)))
        .take(n)
        .cloned()
        .collect()
}

/// The seed of held-out problems, one training never draws from.
pub fn eval_seed(run_seed: u64) -> u64 {
    run_seed ^ 0x5eed_e7a1
}

/// A prompt of `task` as token ids: a chat template's rendering as it is (the template writes
/// its own start tokens), plain text after the tokenizer's start tokens (a BOS), as
/// transformers gives each.
pub fn prompt_ids(tokenizer: &Tokenizer, task: &dyn Task, prompt: &str) -> Result<Vec<u32>> {
    if task.prompt_is_rendered() {
        tokenizer.encode(prompt, false)
    } else {
        tokenizer.encode_plain_prompt(prompt)
    }
}

/// The ids of `answer` as they continue `prompt` (tokenised as `prompt_ids`): the two read as
/// one text, as a reply is read after its prompt, where `answer` alone would start with what
/// a SentencePiece vocabulary puts at the start of a text (`▁`). Where the whole text does not
/// begin with the prompt's own ids (a token spans the seam), `answer` alone.
pub fn continuation_ids(
    tokenizer: &Tokenizer,
    task: &dyn Task,
    prompt: &str,
    prompt_tokens: &[u32],
    answer: &str,
) -> Result<Vec<u32>> {
    let whole = prompt_ids(tokenizer, task, &format!("{prompt}{answer}"))?;
    match whole.strip_prefix(prompt_tokens) {
        Some(rest) => Ok(rest.to_vec()),
        None => tokenizer.encode(answer, false),
    }
}

/// Tokenizes problems of `task` into a batch for the engine.
pub fn prompt_batch(
    problems: Vec<Problem>,
    tokenizer: &Tokenizer,
    task: &dyn Task,
) -> Result<PromptBatch> {
    let prompt_ids = problems
        .iter()
        .map(|p| prompt_ids(tokenizer, task, &p.prompt))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(PromptBatch {
        problems,
        prompt_ids,
    })
}

/// How chat messages become prompt text: the model's chat template (with the assistant turn
/// opened), or, for a built-in character-level model (from scratch or loaded back) or one
/// without a template, the message contents joined by newlines.
pub struct Renderer(Option<ChatTemplate>);

impl Renderer {
    pub fn for_config(cfg: &TrainConfig) -> Result<Renderer> {
        if cfg.model.path.is_empty() {
            return Ok(Renderer(None));
        }
        Renderer::for_model(Path::new(&cfg.model.path))
    }

    /// A built-in model saved and loaded back renders as it was trained: without a template.
    pub fn for_model(dir: &Path) -> Result<Renderer> {
        let tokenizer = Tokenizer::from_dir(dir)?;
        if tokenizer.is_char_level() {
            return Ok(Renderer(None));
        }
        Ok(Renderer(tokenizer.chat_template()?))
    }

    /// Whether prompts go through a chat template, which writes the start tokens itself.
    pub fn is_template(&self) -> bool {
        self.0.is_some()
    }

    /// The tokens put before each rendered prompt's text: the tokenizer's start ids for plain
    /// text, none after a template.
    pub fn start_ids<'a>(&self, tokenizer: &'a Tokenizer) -> &'a [u32] {
        match self.0 {
            Some(_) => &[],
            None => tokenizer.start_ids(),
        }
    }

    pub fn render(&self, messages: &[skein_data::ChatMessage]) -> Result<String> {
        match &self.0 {
            Some(t) => {
                let msgs: Vec<Message> = messages
                    .iter()
                    .map(|m| Message::new(&m.role, &m.content))
                    .collect();
                t.render(&msgs, None, true)
            }
            None => Ok(messages
                .iter()
                .map(|m| m.content.as_str())
                .collect::<Vec<_>>()
                .join("\n")),
        }
    }
}

/// Reads one split's files and renders its prompts (no length limit yet), each with the file
/// and row it was read from. A row whose chat template fails is a bad row: an error naming it,
/// or with `data.skip_bad_rows` skipped and counted. `named_by` is what named the files, for
/// errors: `data.<split>_files`, or `skein eval`'s `--data`.
pub fn read_split(
    cfg: &DataConfig,
    files: &[String],
    split: &str,
    named_by: &str,
    renderer: &Renderer,
) -> Result<(Vec<ReadPrompt>, DataCounts)> {
    let paths: Vec<PathBuf> = files.iter().map(PathBuf::from).collect();
    let opts = ReadOptions {
        skip_bad_rows: cfg.skip_bad_rows,
    };
    let loaded = skein_data::load(&paths, &opts).map_err(|e| {
        // Skipping rows helps with a bad row, not with a file that cannot be read.
        let hint = match e.row {
            Some(_) => "; `data.skip_bad_rows = true` skips and counts bad rows",
            None => "",
        };
        anyhow::Error::new(e).context(format!("reading the {split} split (`{named_by}`{hint})"))
    })?;
    if let Some(first) = loaded.skipped.first() {
        eprintln!(
            "skein: {split} split: skipped {} bad rows; the first: {first}",
            loaded.skipped.len()
        );
    }
    let mut counts = DataCounts {
        skipped_rows: loaded.skipped.len(),
        ..Default::default()
    };
    let mut problems = Vec::with_capacity(loaded.rows.len());
    let mut first_skipped = None;
    for (place, row) in loaded.places.into_iter().zip(loaded.rows) {
        match problem(row, renderer) {
            Ok((problem, question)) => problems.push(ReadPrompt {
                place,
                problem,
                question,
            }),
            Err(e) if cfg.skip_bad_rows => {
                counts.skipped_rows += 1;
                first_skipped.get_or_insert_with(|| place.error(format!("{e:#}")));
            }
            Err(e) => {
                return Err(e.context(format!(
                    "{place}: rendering the prompt through the model's chat template \
                     (`data.skip_bad_rows = true` skips and counts such rows)"
                )))
            }
        }
    }
    if let Some(first) = first_skipped {
        eprintln!(
            "skein: {split} split: skipped rows whose chat template failed; the first: {first}"
        );
    }
    Ok((problems, counts))
}

/// What lets more prompts within `data.max_prompt_tokens`, given `data.truncation`.
pub fn what_fits_more(truncation: skein_data::Truncation) -> &'static str {
    match truncation {
        skein_data::Truncation::Left | skein_data::Truncation::Right => {
            "they could not be cut inside their question (the rest of the prompt alone is over \
             the limit, or the chat template does not copy the question as written); raise the \
             limit, or shorten what comes before the question"
        }
        _ => "raise the limit or set `data.truncation` to `left` or `right`",
    }
}

/// A prompt as read and rendered, with the file and row it came from.
#[derive(Debug)]
pub struct ReadPrompt {
    pub place: RowPlace,
    pub problem: Problem,
    /// The part of the rendered prompt `data.truncation` may cut ([`truncate`]): the question
    /// (the last user message's text) where a chat template framed it, all of a prompt
    /// without one; `None` when the template did not copy the question as written.
    pub question: Option<std::ops::Range<usize>>,
}

fn problem(row: PromptRow, renderer: &Renderer) -> Result<(Problem, Option<Range<usize>>)> {
    let prompt = renderer.render(&row.prompt)?;
    let question = match renderer.is_template() {
        true => truncate::question_span(&row.prompt, &prompt),
        false => Some(0..prompt.len()),
    };
    let problem = Problem {
        prompt,
        ground_truth: row.ground_truth,
        data_source: row.data_source,
        meta: row.extra_info,
    };
    Ok((problem, question))
}

/// A split held to `data.max_prompt_tokens`.
#[derive(Debug)]
pub struct FittedSplit {
    pub problems: Vec<Problem>,
    pub counts: DataCounts,
    /// The longest kept prompt in tokens, start tokens included (0: none kept).
    pub longest_prompt: usize,
}

/// Holds a split to `data.max_prompt_tokens` by `data.truncation`, counting what it drops or
/// cuts, and says which prompts have characters the tokenizer lacks (a prompt with nothing
/// else is a bad row).
///
/// A prompt of no token at all (an empty text without a chat template) is a bad row: nothing
/// would predict its first response token. The `start` tokens put before each prompt's text
/// (`Renderer::start_ids`) count against the limit; truncation cuts the text only, inside the
/// question when a chat template framed it ([`truncate`]).
pub fn fit_split(
    problems: Vec<ReadPrompt>,
    tokenizer: &Tokenizer,
    cfg: &DataConfig,
    split: &str,
    start: usize,
) -> Result<FittedSplit> {
    let truncation = cfg.truncation;
    let max = match cfg.max_prompt_tokens {
        0 => 0,
        limit if limit <= start => bail!(
            "invalid value for `data.max_prompt_tokens`: {limit} leaves no room for a prompt \
             after the tokenizer's {start} start tokens; raise it (0: no limit)"
        ),
        limit => limit - start,
    };
    let mut counts = DataCounts::default();
    let mut unknown = UnknownRows::default();
    let mut kept = Vec::with_capacity(problems.len());
    let mut longest = 0;
    // Prompts `data.truncation` could not cut inside their question, and the first of them.
    let mut uncut: Option<(usize, RowPlace)> = None;
    for ReadPrompt {
        place,
        problem: mut p,
        question,
    } in problems
    {
        let (ids, chars) = tokenizer.encode_checked(&p.prompt, false)?;
        if !unknown.note(&place, chars, cfg)? {
            counts.skipped_rows += 1;
            continue;
        }
        if ids.is_empty() {
            if cfg.skip_bad_rows {
                counts.skipped_rows += 1;
                continue;
            }
            return Err(place
                .error(
                    "the prompt is empty: it has no token to predict the response's first \
                     from; fix the row, or set `data.skip_bad_rows = true` to skip such rows",
                )
                .into());
        }
        match fit(ids.len(), max, truncation) {
            Fit::Keep => {
                longest = longest.max(ids.len() + start);
                kept.push(p);
            }
            Fit::Drop => counts.filtered_prompts += 1,
            Fit::TooLong => bail!(
                "{place}: the prompt has {} tokens, over `data.max_prompt_tokens` = {} \
                 (set `data.truncation` to `filter`, `left` or `right`, or raise the limit)",
                ids.len() + start,
                max + start
            ),
            Fit::Cut(_) => {
                let cut = match question {
                    Some(span) => {
                        truncate::cut_to_fit(tokenizer, &p.prompt, &ids, span, max, truncation)?
                    }
                    None => None,
                };
                let Some(cut) = cut else {
                    counts.filtered_prompts += 1;
                    uncut.get_or_insert((0, place)).0 += 1;
                    continue;
                };
                p.prompt = cut;
                longest = longest.max(max + start);
                counts.truncated_prompts += 1;
                kept.push(p);
            }
        }
    }
    counts.unknown_char_prompts = unknown.prompts;
    unknown.warn(split);
    if let Some((n, first)) = uncut {
        eprintln!(
            "skein: {split} split: {n} prompts over `data.max_prompt_tokens` could not be cut \
             inside their question (the rest of the prompt alone is over the limit, or the chat \
             template does not copy the last user message as written), and were left out \
             (counted in data/filtered_prompts); the first: {first}"
        );
    }
    Ok(FittedSplit {
        problems: kept,
        counts,
        longest_prompt: longest,
    })
}

/// The prompts of a split with characters outside the tokenizer's vocabulary.
#[derive(Default)]
struct UnknownRows {
    /// Prompts with some, and the first of them.
    prompts: usize,
    first: Option<RowPlace>,
    /// Prompts with nothing else, skipped (`data.skip_bad_rows`), and the first of them.
    skipped: usize,
    first_skipped: Option<RowPlace>,
    chars: UnknownChars,
}

impl UnknownRows {
    /// Counts prompt `row`'s unknown characters; false when the row is to be skipped (it has
    /// nothing else, and `data.skip_bad_rows` is set), an error when it is not.
    fn note(&mut self, place: &RowPlace, chars: UnknownChars, cfg: &DataConfig) -> Result<bool> {
        if chars.is_empty() {
            return Ok(true);
        }
        if chars.is_total() {
            if !cfg.skip_bad_rows {
                bail!(
                    "{place}: none of the prompt's characters is in the tokenizer's \
                     vocabulary ({}): the model would read only unknown tokens; fix the row, \
                     use a model whose tokenizer has them, or set `data.skip_bad_rows = true` \
                     to skip such rows",
                    chars.examples_text()
                );
            }
            self.skipped += 1;
            self.first_skipped.get_or_insert_with(|| place.clone());
            return Ok(false);
        }
        self.prompts += 1;
        self.first.get_or_insert_with(|| place.clone());
        self.chars.add(&chars);
        Ok(true)
    }

    /// Says, once for the split, what its prompts have that the tokenizer lacks.
    fn warn(&self, split: &str) {
        let prompts = |n: usize| match n {
            1 => "1 prompt".to_string(),
            n => format!("{n} prompts"),
        };
        if let Some(first) = &self.first {
            eprintln!(
                "skein: warning: {split} split: {} with {} in all, which the model reads as \
                 its unknown token (the first: {first}; counted as \
                 data/unknown_char_prompts)",
                prompts(self.prompts),
                self.chars
            );
        }
        if let Some(first) = &self.first_skipped {
            eprintln!(
                "skein: warning: {split} split: skipped {} with no character in the \
                 tokenizer's vocabulary (`data.skip_bad_rows`; the first: {first})",
                prompts(self.skipped)
            );
        }
    }
}

/// Every character of the prompts and answers: the vocabulary of a from-scratch model.
fn alphabet_of<'a>(problems: impl Iterator<Item = &'a Problem>) -> String {
    let mut chars = BTreeSet::new();
    for p in problems {
        chars.extend(p.prompt.chars());
        chars.extend(p.ground_truth.chars());
    }
    chars.into_iter().collect()
}

/// The training split as a `Task`. Clones share the rows and the sampler.
#[derive(Clone)]
pub struct DatasetTask {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    problems: Vec<Problem>,
    sampler: Mutex<Sampler>,
    /// `Task::alphabet` is `'static`: the one alphabet of a run's dataset is leaked once.
    alphabet: &'static str,
    max_response_chars: usize,
    rendered: bool,
}

impl DatasetTask {
    /// `rendered`: the prompts went through a chat template (`Task::prompt_is_rendered`).
    pub fn new(
        name: String,
        problems: Vec<Problem>,
        alphabet: &str,
        cfg: &DataConfig,
        rendered: bool,
    ) -> Self {
        let sampler = Sampler::new(problems.len(), cfg.seed, cfg.shuffle);
        let max_response_chars = problems
            .iter()
            .map(|p| p.ground_truth.chars().count())
            .max()
            .unwrap_or(1);
        DatasetTask {
            inner: Arc::new(Inner {
                name,
                problems,
                sampler: Mutex::new(sampler),
                alphabet: Box::leak(alphabet.to_string().into_boxed_str()),
                max_response_chars,
                rendered,
            }),
        }
    }

    /// Rows drawn so far (the trainer checkpoints it).
    pub fn position(&self) -> u64 {
        self.sampler().position()
    }

    /// Continues from a checkpointed position.
    pub fn seek(&self, position: u64) {
        self.sampler().seek(position);
    }

    /// The epoch of the next row.
    pub fn epoch(&self) -> u64 {
        self.sampler().epoch()
    }

    fn sampler(&self) -> std::sync::MutexGuard<'_, Sampler> {
        // A panic while holding it cannot leave the sampler half-updated: take it anyway.
        self.inner
            .sampler
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Task for DatasetTask {
    fn name(&self) -> &str {
        &self.inner.name
    }

    /// The next row of the seeded epoch order. The generator is not used: the sampler's
    /// position is the state a checkpoint keeps.
    fn sample(&self, _rng: &mut TaskRng) -> Problem {
        let i = self.sampler().next_index();
        self.inner.problems[i].clone()
    }

    fn score(&self, problem: &Problem, response: &str) -> Score {
        score_math(&problem.ground_truth, response)
    }

    /// The ground truth itself: a bare answer or a worked solution ending in one.
    fn demonstration(&self, problem: &Problem, _rng: &mut TaskRng) -> String {
        problem.ground_truth.clone()
    }

    fn alphabet(&self) -> &'static str {
        self.inner.alphabet
    }

    fn max_response_chars(&self) -> usize {
        self.inner.max_response_chars
    }

    fn prompt_is_rendered(&self) -> bool {
        self.inner.rendered
    }
}

/// Math answer equivalence: the response's `\boxed{}` or `####` answer, or the whole response
/// when it is a bare number, against the ground truth's answer.
pub fn score_math(ground_truth: &str, response: &str) -> Score {
    let bare = response.trim();
    let answer = math::extract_answer(response, false)
        .or_else(|| math::parse_number(bare).map(|_| bare.to_string()));
    let reference = math::reference_answer(ground_truth);
    let correct = answer
        .as_deref()
        .is_some_and(|a| math::equivalent(a, &reference));
    Score {
        reward: if correct { 1.0 } else { 0.0 },
        correct,
        formatted: answer.is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn math_scoring_takes_boxed_hash_and_bare_answers() {
        assert!(score_math("42", "42").correct);
        assert!(score_math("42", " 42.0 ").correct);
        assert!(score_math("Work.\n#### 42", r"so \boxed{42}").correct);
        assert!(score_math("42", "the answer is 6*7 #### 42").correct);
        let wrong = score_math("42", "41");
        assert!(!wrong.correct && wrong.formatted && wrong.reward == 0.0);
        let unformatted = score_math("42", "about forty-two");
        assert!(!unformatted.correct && !unformatted.formatted);
        // An equation is not a bare number: only a flexible `math` source reads its last one
        // (`eval.correct_by`).
        assert!(!score_math("74", "25 + 49 = 74").correct);
    }

    /// An answer reads on from its prompt: a vocabulary that puts `▁` before each text it
    /// encodes gives the answer alone a `▁` the prompt and answer read as one do not have.
    #[test]
    fn an_answer_is_tokenised_as_it_continues_its_prompt() {
        let vocab: serde_json::Map<String, serde_json::Value> = ["▁", "1", "4", "5", "+", "="]
            .iter()
            .enumerate()
            .map(|(i, c)| (c.to_string(), serde_json::json!(i)))
            .collect();
        let json = serde_json::json!({"version": "1.0", "added_tokens": [],
            "normalizer": {"type": "Prepend", "prepend": "▁"}, "pre_tokenizer": null,
            "post_processor": null, "decoder": null,
            "model": {"type": "BPE", "vocab": vocab, "merges": []}});
        let path = std::env::temp_dir().join(format!("skein-prepend-{}.json", std::process::id()));
        std::fs::write(&path, json.to_string()).unwrap();
        let tokenizer = Tokenizer::from_file(&path).unwrap();
        std::fs::remove_file(&path).ok();
        let problems = vec![Problem {
            prompt: "1+4=".into(),
            ground_truth: "5".into(),
            data_source: "d".into(),
            meta: serde_json::Value::Null,
        }];
        let task = DatasetTask::new("d".into(), problems, "145+=", &DataConfig::default(), false);
        let prompt = prompt_ids(&tokenizer, &task, "1+4=").unwrap();
        let answer = continuation_ids(&tokenizer, &task, "1+4=", &prompt, "5").unwrap();
        assert_eq!(answer, [3], "`5`, not `▁5`");
        assert_eq!(tokenizer.encode("5", false).unwrap(), [0, 3]);
    }

    #[test]
    fn the_task_draws_epochs_and_resumes_from_a_position() {
        let problems: Vec<Problem> = (0..5)
            .map(|i| Problem {
                prompt: format!("{i}+0="),
                ground_truth: i.to_string(),
                data_source: "d".into(),
                meta: serde_json::Value::Null,
            })
            .collect();
        let cfg = DataConfig::default();
        let task = DatasetTask::new("d".into(), problems, "0123456789+=", &cfg, false);
        let mut rng = TaskRng::new(0);
        let first: Vec<_> = (0..5).map(|_| task.sample(&mut rng).ground_truth).collect();
        let mut sorted = first.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            vec!["0", "1", "2", "3", "4"],
            "one epoch visits every row once"
        );
        assert_eq!(task.epoch(), 1);
        let more: Vec<_> = (0..3).map(|_| task.sample(&mut rng).ground_truth).collect();
        task.seek(5);
        let again: Vec<_> = (0..3).map(|_| task.sample(&mut rng).ground_truth).collect();
        assert_eq!(more, again);
    }

    /// Without validation files, evaluation draws distinct training problems: rows that
    /// repeat a prompt count once, the same ones for the same seed.
    #[test]
    fn evaluation_rows_drawn_from_training_are_distinct_problems() {
        let rows: Vec<Problem> = ["1+0=", "2+0=", "1+0=", "3+0=", "1+0=", "4+0="]
            .into_iter()
            .map(problem)
            .collect();
        let prompts = |n: usize, seed: u64| -> Vec<String> {
            distinct_draws(&rows, n, seed)
                .into_iter()
                .map(|p| p.prompt)
                .collect()
        };
        let all = prompts(10, 7);
        let mut sorted = all.clone();
        sorted.sort();
        assert_eq!(sorted, ["1+0=", "2+0=", "3+0=", "4+0="]);
        assert_eq!(prompts(3, 7), all[..3]);
        assert_eq!(prompts(3, 7), prompts(3, 7));
    }

    fn problem(prompt: &str) -> Problem {
        Problem {
            prompt: prompt.into(),
            ground_truth: "1".into(),
            data_source: "d".into(),
            meta: serde_json::Value::Null,
        }
    }

    /// `prompts` as read from lines 1, 2, … of d.jsonl.
    fn placed(prompts: Vec<Problem>) -> Vec<ReadPrompt> {
        prompts
            .into_iter()
            .enumerate()
            .map(|(i, problem)| {
                let file = PathBuf::from("d.jsonl");
                let place = RowPlace { file, row: i + 1 };
                let question = Some(0..problem.prompt.len());
                ReadPrompt {
                    place,
                    problem,
                    question,
                }
            })
            .collect()
    }

    /// A base Llama's tokenizer: its post-processor puts a BOS before every text, and it has
    /// no chat template.
    fn bos_first_tokenizer() -> Tokenizer {
        let dir =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../skein-text/tests/fixtures/bpe-bos");
        Tokenizer::from_dir(dir).unwrap()
    }

    /// Plain prompts start with the BOS, as transformers' `tokenizer(prompt)` gives them; a
    /// template's rendering is left as it is, since the template writes its own.
    #[test]
    fn a_plain_prompt_starts_with_the_tokenizers_bos_and_a_rendered_one_does_not() {
        let tok = bos_first_tokenizer();
        let bos = tok.bos_token_id().unwrap();
        let text = tok.encode("12+30=", false).unwrap();
        let cfg = DataConfig::default();
        for rendered in [false, true] {
            let task = DatasetTask::new("d".into(), vec![problem("12+30=")], "", &cfg, rendered);
            let batch = prompt_batch(vec![problem("12+30=")], &tok, &task).unwrap();
            let want: Vec<u32> = match rendered {
                false => std::iter::once(bos).chain(text.clone()).collect(),
                true => text.clone(),
            };
            assert_eq!(batch.prompt_ids, [want], "rendered: {rendered}");
        }
        let builtin = skein_tasks::task_by_name("arithmetic", 1).unwrap();
        assert_eq!(
            prompt_ids(&tok, builtin.as_ref(), "12+30=").unwrap()[0],
            bos,
            "a built-in task's prompts are plain text"
        );
    }

    /// The BOS counts against `data.max_prompt_tokens`: truncation leaves room for it.
    #[test]
    fn the_start_token_counts_against_the_prompt_limit() {
        let tok = bos_first_tokenizer();
        let long = "12+30=42 and 7*6";
        let len = tok.encode(long, false).unwrap().len();
        let cfg = DataConfig {
            max_prompt_tokens: len,
            truncation: skein_data::Truncation::Left,
            ..DataConfig::default()
        };
        let fitted = fit_split(placed(vec![problem(long)]), &tok, &cfg, "train", 1).unwrap();
        let (kept, counts) = (fitted.problems, fitted.counts);
        assert_eq!(counts.truncated_prompts, 1);
        assert_eq!(
            fitted.longest_prompt, len,
            "the cut prompt and its start token"
        );
        let task = DatasetTask::new("d".into(), kept.clone(), "", &cfg, false);
        let batch = prompt_batch(kept, &tok, &task).unwrap();
        assert!(batch.prompt_ids[0].len() <= len, "{:?}", batch.prompt_ids);
        let fitted = fit_split(placed(vec![problem(long)]), &tok, &cfg, "train", 0).unwrap();
        assert_eq!(fitted.counts.truncated_prompts, 0, "the text alone fits");
        assert_eq!(fitted.longest_prompt, len);
        let tiny = DataConfig {
            max_prompt_tokens: 1,
            ..cfg
        };
        let err = fit_split(placed(vec![problem(long)]), &tok, &tiny, "train", 1).unwrap_err();
        assert!(
            format!("{err:#}").contains("data.max_prompt_tokens"),
            "{err:#}"
        );
    }

    #[test]
    fn prompts_with_unknown_characters_are_counted_and_one_without_known_ones_is_a_bad_row() {
        let tok = Tokenizer::char_level("0123456789+=").unwrap();
        let mut cfg = DataConfig::default();
        let prompts = ["1+1=", "1+é=", "2€+2=", "1+2="].map(problem).to_vec();
        let fitted = fit_split(placed(prompts.clone()), &tok, &cfg, "train", 0).unwrap();
        let (kept, counts) = (fitted.problems, fitted.counts);
        assert_eq!(kept.len(), 4, "text is kept as it is");
        assert_eq!(counts.unknown_char_prompts, 2);
        assert_eq!(counts.skipped_rows, 0);
        let metrics = counts.metrics();
        assert!(metrics.contains(&("data/unknown_char_prompts", 2.0)));

        let mut bad = prompts;
        bad.insert(2, problem(" éé "));
        let err = fit_split(placed(bad.clone()), &tok, &cfg, "train", 0).unwrap_err();
        let err = format!("{err:#}");
        assert!(
            err.contains("d.jsonl, row 3") && err.contains("'é'"),
            "{err}"
        );
        assert!(err.contains("data.skip_bad_rows"), "{err}");

        cfg.skip_bad_rows = true;
        let fitted = fit_split(placed(bad), &tok, &cfg, "train", 0).unwrap();
        assert_eq!(fitted.problems.len(), 4);
        let counts = fitted.counts;
        assert_eq!((counts.skipped_rows, counts.unknown_char_prompts), (1, 2));
    }

    /// `data.skip_bad_rows` is offered for a bad row, not for a file that is not there.
    #[test]
    fn a_missing_file_is_not_offered_skipping_bad_rows() {
        let dir = std::env::temp_dir().join(format!("skein-missing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = DataConfig::default();
        let missing = dir.join("missing.jsonl").display().to_string();
        let renderer = Renderer(None);
        let err = read_split(&cfg, &[missing], "val", "data.val_files", &renderer).unwrap_err();
        let err = format!("{err:#}");
        assert!(
            err.contains("`data.val_files`") && err.contains("missing.jsonl"),
            "{err}"
        );
        assert!(!err.contains("skip_bad_rows"), "{err}");
        let bad = dir.join("bad.jsonl");
        std::fs::write(&bad, "{\"prompt\": 5}\n").unwrap();
        let err = read_split(
            &cfg,
            &[bad.display().to_string()],
            "val",
            "--data",
            &renderer,
        )
        .unwrap_err();
        let err = format!("{err:#}");
        // Named by what named the file: here `skein eval --data`.
        assert!(
            err.contains("data.skip_bad_rows") && err.contains("(`--data`;"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
