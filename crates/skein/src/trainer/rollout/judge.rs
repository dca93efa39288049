//! Judging single-turn responses: the task's checker scores a finished response the moment
//! it finishes (it is the reward when no `[reward]` sources are configured), and the run's
//! judge of correctness (`eval.correct_by`: that checker or a built-in answer check) decides
//! `correct` there too; configured sources only receive the request then and are collected
//! after generation, so scoring overlaps it. [`answer_prompts`] runs a fixed batch of prompts
//! this way (evaluation, `skein eval`); the training rollout does the same per round in
//! `buffer.rs`.

use super::reward::{failed_status, request, RewardStats, RoundRewards};
use crate::engine::{EngineStats, Finish, GenRequest, Generator, SamplingParams};
use crate::model::Model;
use crate::trainer::config::CorrectBy;
use serde::{Deserialize, Serialize};
use skein_plan::{KeptSets, Status, Trajectory, Transition};
use skein_reward::Rewarder;
use skein_tasks::{Problem, Task};
use skein_text::Tokenizer;

/// Scored answers to a batch of prompts.
pub struct Answers {
    pub trajectories: Vec<Trajectory>,
    /// Parallel to `trajectories`: whether the run's judge (`eval.correct_by`) found the
    /// answer correct. A failed answer (its engine call or its reward failed) is not, whatever
    /// the judge said, so every count built on this (accuracy, pass@k, a samples file)
    /// agrees.
    pub correct: Vec<bool>,
    pub engine: EngineStats,
    pub rewards: RewardStats,
}

pub struct PromptBatch {
    pub problems: Vec<Problem>,
    pub prompt_ids: Vec<Vec<u32>>,
}

/// How one batch of prompts is answered: the judge and the generation settings.
pub struct Answering<'a> {
    pub engine: &'a Generator,
    pub policy: &'a Model,
    pub version: u64,
    pub task: &'a dyn Task,
    pub tokenizer: &'a Tokenizer,
    pub params: &'a SamplingParams,
    pub rewarder: Option<&'a Rewarder>,
    /// What decides `correct` (`eval.correct_by`).
    pub correct_by: &'a CorrectBy,
}

/// Generates `n` samples for each prompt and scores them as they finish; trajectory ids are
/// `{tag}-p{prompt}-s{sample}`.
pub fn answer_prompts(a: &Answering, batch: &PromptBatch, n: usize, tag: &str) -> Answers {
    answer_prompts_with(a, batch, n, tag, || {})
}

/// [`answer_prompts`], calling `on_answer` as each sample finishes (a progress bar's tick).
pub fn answer_prompts_with(
    a: &Answering,
    batch: &PromptBatch,
    n: usize,
    tag: &str,
    mut on_answer: impl FnMut(),
) -> Answers {
    let Answering {
        engine,
        policy,
        version,
        task,
        tokenizer,
        params,
        rewarder,
        correct_by,
    } = *a;
    let mut requests = Vec::with_capacity(batch.problems.len() * n);
    for (p, ids) in batch.prompt_ids.iter().enumerate() {
        for k in 0..n {
            requests.push(GenRequest {
                id: (p * n + k) as u64,
                prompt: ids.clone(),
                resumed: Vec::new(),
                params: params.clone(),
                budget: None,
                session: None,
                watch: None,
            });
        }
    }
    let mut slots: Vec<Option<(Trajectory, bool)>> = (0..requests.len()).map(|_| None).collect();
    let mut round = RoundRewards::new(rewarder);
    let stats = engine.generate(policy, version, requests, |out| {
        let id = out.id as usize;
        let (p, k) = (id / n, id % n);
        let mut judged = score_response(
            task,
            correct_by,
            tokenizer,
            &batch.problems[p],
            &out.tokens,
            out.finish,
            out.error.as_deref(),
        );
        let traj_id = format!("{tag}-p{p}-s{k}");
        if let (true, Some(text)) = (round.active(), judged.text.take()) {
            let req = request(
                traj_id.clone(),
                &batch.problems[p],
                &batch.prompt_ids[p],
                &out.tokens,
                text,
            );
            round.submit(id, req);
        }
        let sampled = Sampled {
            tokens: out.tokens,
            logprobs: out.logprobs,
            versions: out.versions,
            kept: out.kept,
        };
        let correct = judged.correct;
        let trajectory = single_turn(
            traj_id,
            format!("{tag}-p{p}"),
            batch.prompt_ids[p].clone(),
            sampled,
            judged,
        );
        slots[id] = Some((trajectory, correct));
        on_answer();
    });
    let rewards = round.finish(|id, result| {
        if let Some((t, _)) = &mut slots[id] {
            apply_reward(t, result);
        }
    });
    let (trajectories, correct) = settle(slots);
    Answers {
        trajectories,
        correct,
        engine: stats,
        rewards,
    }
}

/// Sets a trajectory's reward from its sources, or fails it when they failed.
pub fn apply_reward(
    t: &mut Trajectory,
    result: Result<skein_reward::RewardOutput, skein_reward::RewardError>,
) {
    match result {
        Ok(out) => t.reward = out.reward,
        Err(e) => {
            t.reward = 0.0;
            t.status = failed_status(&e);
        }
    }
}

/// What the task's checker and the run's judge made of one response.
pub struct Judged {
    /// The task's reward (the trajectory's reward unless `[reward]` sources replace it).
    pub reward: f64,
    /// The verdict of `eval.correct_by` (false for a response that failed).
    pub correct: bool,
    pub status: Status,
    /// The decoded response (None when it does not decode; the trajectory has failed).
    pub text: Option<String>,
}

/// A response's ids as rewards, environments and the judge read its text: without a final
/// end-of-sequence id of the tokenizer. An id `stop_token_ids` adds keeps its text (a closing
/// `</answer>` or `</tool_call>` a run stops at is part of what the model wrote), as in what
/// `skein serve` returns; decoding then leaves special tokens out but the tool-call tags
/// ([`response_text`]).
pub fn text_ids<'a>(tokenizer: &Tokenizer, tokens: &'a [u32]) -> &'a [u32] {
    match tokens.split_last() {
        Some((last, rest)) if tokenizer.eos_token_ids().contains(last) => rest,
        _ => tokens,
    }
}

/// A response's text as rewards, the judge and `skein eval --samples` read it: [`text_ids`],
/// decoded as a model's message ([`Tokenizer::decode_message`]: the tool-call tags kept where
/// a vocabulary marks them special), the same text `skein serve` returns and a multi-turn
/// environment receives.
pub fn response_text(tokenizer: &Tokenizer, tokens: &[u32]) -> anyhow::Result<String> {
    tokenizer.decode_message(text_ids(tokenizer, tokens))
}

/// Scores one finished response (`tokens`, stop token included) and judges it by
/// `correct_by`. The reward program sees text ([`text_ids`]); the gradient only ever sees the
/// token ids. `engine_error` is why a remote engine failed it (`Finish::Failed`).
pub fn score_response(
    task: &dyn Task,
    correct_by: &CorrectBy,
    tokenizer: &Tokenizer,
    problem: &Problem,
    tokens: &[u32],
    finish: Finish,
    engine_error: Option<&str>,
) -> Judged {
    let failed = match finish {
        Finish::Failed => Some(format!(
            "the remote engine failed to generate it: {}",
            engine_error.unwrap_or("no reason given")
        )),
        Finish::ContextTooLong => {
            Some("its prompt is longer than the engine's context (model.max_positions)".to_string())
        }
        _ => None,
    };
    if let Some(why) = failed {
        return Judged {
            reward: 0.0,
            correct: false,
            status: Status::Failed(why),
            text: None,
        };
    }
    match response_text(tokenizer, tokens) {
        Ok(text) => {
            let score = task.score(problem, &text);
            let status = if finish == Finish::Stop {
                Status::Finished
            } else {
                Status::Truncated
            };
            // The same text the reward sources receive, so a `math` judge agrees with its reward.
            let correct = correct_by.correct(score.correct, &text, &problem.ground_truth);
            Judged {
                reward: score.reward,
                correct,
                status,
                text: Some(text),
            }
        }
        Err(e) => Judged {
            reward: 0.0,
            correct: false,
            status: Status::Failed(format!("decoding the response: {e}")),
            text: None,
        },
    }
}

/// Tokens sampled for one response, exactly as sampled: ids, behavior log-probs and the
/// policy version of each.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sampled {
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub versions: Vec<u64>,
    /// What top-k/top-p kept for each token (empty when sampling does not truncate).
    #[serde(default, skip_serializing_if = "KeptSets::is_empty")]
    pub kept: KeptSets,
}

/// The answers in order with their verdicts, once rewards are in: a judge's "correct" does
/// not survive its answer failing (a reward service that timed out, say).
fn settle(slots: Vec<Option<(Trajectory, bool)>>) -> (Vec<Trajectory>, Vec<bool>) {
    slots
        .into_iter()
        .flatten()
        .map(|(t, correct)| {
            let correct = correct && !t.is_failed();
            (t, correct)
        })
        .unzip()
}

/// A one-call trajectory whose every response token was sampled by the policy, with the
/// judge's reward and status.
pub fn single_turn(
    id: String,
    group: String,
    prompt: Vec<u32>,
    sampled: Sampled,
    judged: Judged,
) -> Trajectory {
    let len = sampled.tokens.len();
    Trajectory {
        id,
        group,
        transitions: vec![Transition {
            prompt,
            response: sampled.tokens,
            loss_mask: vec![1; len],
            logprobs: sampled.logprobs,
            versions: sampled.versions,
            kept: sampled.kept,
            reward: None,
            state: None,
        }],
        reward: judged.reward,
        status: judged.status,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skein_plan::Status;

    fn arithmetic(prompt: &str, ground_truth: &str) -> Problem {
        Problem {
            prompt: prompt.into(),
            ground_truth: ground_truth.into(),
            data_source: "arithmetic".into(),
            meta: serde_json::Value::Null,
        }
    }

    /// The tokenizer's end-of-sequence id ends a response without text; an id
    /// `stop_token_ids` adds (here `)`) is part of what the model wrote, as `skein serve`
    /// returns it, so a reward that looks for a closing tag finds it.
    #[test]
    fn a_stop_id_that_is_text_stays_in_the_text_rewards_read() {
        let tokenizer = Tokenizer::char_level("0123456789+=()").unwrap();
        let task = skein_tasks::task_by_name("arithmetic", 1).unwrap();
        let problem = arithmetic("2+3=", "5");
        let ids = |text: &str| tokenizer.encode(text, false).unwrap();
        let eos = tokenizer.eos_token_ids()[0];
        let judge = |tokens: &[u32]| {
            score_response(
                task.as_ref(),
                &CorrectBy::Task,
                &tokenizer,
                &problem,
                tokens,
                Finish::Stop,
                None,
            )
        };
        let ended = judge(&[ids("5"), vec![eos]].concat());
        assert_eq!(ended.text.as_deref(), Some("5"));
        assert!(ended.correct);
        let closed = judge(&ids("(5)"));
        assert_eq!(closed.text.as_deref(), Some("(5)"));
        assert_eq!(text_ids(&tokenizer, &ids("5=")), ids("5=").as_slice());
        let refused = "http://server answered 400: prompt token 99 is outside the vocabulary";
        let failed = score_response(
            task.as_ref(),
            &CorrectBy::Task,
            &tokenizer,
            &problem,
            &[],
            Finish::Failed,
            Some(refused),
        );
        match failed.status {
            Status::Failed(why) => assert!(why.ends_with(refused), "{why}"),
            s => panic!("{s:?}"),
        }
    }

    /// Where a vocabulary marks the tool-call tags special, the text rewards read keeps them,
    /// as `skein serve` and a multi-turn environment do: a format reward finds the call.
    #[test]
    fn rewards_read_tool_call_tags_that_the_vocabulary_marks_special() {
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../skein-text/tests/fixtures/tool-tags-special/tokenizer.json");
        let tokenizer = Tokenizer::from_file(fixture).unwrap();
        let task = skein_tasks::task_by_name("arithmetic", 1).unwrap();
        let problem = arithmetic("x", "x");
        let judged = score_response(
            task.as_ref(),
            &CorrectBy::Task,
            &tokenizer,
            &problem,
            &[2, 1, 3, 4],
            Finish::Stop,
            None,
        );
        // (A vocabulary without a decoder joins its tokens with spaces.)
        assert_eq!(judged.text.as_deref(), Some("<tool_call> x </tool_call>"));
    }

    #[test]
    fn an_answer_whose_reward_failed_is_not_correct() {
        let answer = |status: Status| Trajectory {
            id: "t".into(),
            group: "g".into(),
            transitions: Vec::new(),
            reward: 0.0,
            status,
        };
        let slots = vec![
            Some((answer(Status::Finished), true)),
            None,
            Some((answer(Status::Failed("reward: timeout".into())), true)),
            Some((answer(Status::Finished), false)),
        ];
        let (trajectories, correct) = settle(slots);
        assert_eq!(trajectories.len(), 3);
        assert_eq!(correct, [true, false, false]);
    }
}
