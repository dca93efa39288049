//! `guess`: find a secret number with higher/lower feedback.
//!
//! The secret is uniform in 1..=N, N = 16, 64, 256 at difficulty 1, 2, 3. The prompt is
//! `guess 1-N\n`; each model message is a number; the environment answers `higher` or `lower`
//! (the secret is above or below the guess), or `1-N?` when the message is not a number in range
//! (the episode goes on: a wasted turn), and ends when the guess is right.
//!
//! Reward: 1 for a first-turn hit, 0.1 less per further turn, never below 0.1 — finding it at all
//! beats being cut off, finding it sooner beats finding it later. `formatted`: every message was
//! a number in range. An episode may take ceil(log2 N) + 2 turns, binary search plus slack.

use crate::env::{AgentTask, Env, EnvError, EnvMessage, EnvRole, EnvStep, Turn};
use crate::rng::TaskRng;
use crate::task::{Problem, Score};
use serde_json::json;

pub struct Guess {
    pub difficulty: u32,
}

pub const MAX_DIFFICULTY: u32 = 3;

const HIGHER: &str = "higher";
const LOWER: &str = "lower";
/// Reward lost per turn after the first.
const TURN_COST: f64 = 0.1;
const MIN_REWARD: f64 = 0.1;

impl Guess {
    /// The largest secret.
    pub fn n(&self) -> u64 {
        match self.difficulty {
            0 | 1 => 16,
            2 => 64,
            _ => 256,
        }
    }
}

/// The reward for finding the secret on turn `turns` (1-based).
pub fn reward_for(turns: usize) -> f64 {
    (1.0 - TURN_COST * turns.saturating_sub(1) as f64).max(MIN_REWARD)
}

/// The message as a guess: trimmed, ASCII digits only, short enough not to overflow.
fn parse_guess(message: &str) -> Option<u64> {
    let t = message.trim();
    (!t.is_empty() && t.len() <= 9 && t.bytes().all(|b| b.is_ascii_digit()))
        .then(|| t.parse().ok())
        .flatten()
}

struct GuessEnv {
    secret: u64,
    n: u64,
    turns: usize,
    formatted: bool,
    done: bool,
    /// Each message so far with its reply (`8>` for "higher", `12<`, `?` for no guess): what
    /// the player knows, and so the state the next guess is made in.
    history: String,
}

impl Env for GuessEnv {
    fn step(&mut self, message: &str) -> Result<EnvStep, EnvError> {
        if self.done {
            return Err(EnvError::new("guess: step after the episode ended"));
        }
        self.turns += 1;
        let reply = match parse_guess(message).filter(|g| (1..=self.n).contains(g)) {
            None => {
                self.formatted = false;
                self.history.push_str("? ");
                format!("1-{}?", self.n)
            }
            Some(g) if g == self.secret => {
                self.done = true;
                return Ok(EnvStep::Done(Score {
                    reward: reward_for(self.turns),
                    correct: true,
                    formatted: self.formatted,
                }));
            }
            Some(g) if g < self.secret => {
                self.history.push_str(&format!("{g}> "));
                HIGHER.into()
            }
            Some(g) => {
                self.history.push_str(&format!("{g}< "));
                LOWER.into()
            }
        };
        Ok(EnvStep::Continue {
            messages: vec![EnvMessage::user(reply)],
            reward: None,
        })
    }

    fn state_key(&self) -> Option<String> {
        Some(self.history.clone())
    }
}

impl AgentTask for Guess {
    fn name(&self) -> &str {
        "guess"
    }

    fn sample(&self, rng: &mut TaskRng) -> Problem {
        let n = self.n();
        let secret = 1 + rng.below(n);
        Problem {
            prompt: format!("guess 1-{n}\n"),
            ground_truth: secret.to_string(),
            data_source: "guess".into(),
            meta: json!({ "difficulty": self.difficulty, "n": n }),
        }
    }

    fn start(&self, problem: &Problem) -> Box<dyn Env> {
        let n = self.n();
        let secret = problem.ground_truth.trim().parse().unwrap_or(1).clamp(1, n);
        Box::new(GuessEnv {
            secret,
            n,
            turns: 0,
            formatted: true,
            done: false,
            history: String::new(),
        })
    }

    /// Binary search that guesses the midpoint of the interval still possible half the time
    /// and a random point of its middle half otherwise: it always narrows, usually wins within
    /// the turn limit, and is often not optimal. The midpoint gives the supervised policy a
    /// clear mode, so greedy decoding is a binary search rather than a near-tie among the
    /// middle half's numbers that tiny updates flip; sampling still explores the slower
    /// guesses that RL learns to avoid.
    fn demonstration_turn(
        &self,
        _problem: &Problem,
        transcript: &[Turn],
        rng: &mut TaskRng,
    ) -> String {
        let (mut lo, mut hi) = (1, self.n() as i64);
        for turn in transcript {
            let Some(g) = parse_guess(&turn.message) else {
                continue;
            };
            let g = g as i64;
            let said = |word| {
                turn.reply
                    .iter()
                    .any(|m| m.role == EnvRole::User && m.content == word)
            };
            if said(HIGHER) {
                lo = lo.max(g + 1);
            } else if said(LOWER) {
                hi = hi.min(g - 1);
            }
        }
        if lo > hi {
            // Contradictory feedback (not from this environment): any guess in range will do.
            return lo.min(self.n() as i64).to_string();
        }
        if rng.below(2) == 0 {
            return ((lo + hi) / 2).to_string();
        }
        let quarter = (hi - lo) / 4;
        rng.range(lo + quarter, hi - quarter).to_string()
    }

    fn problem_count(&self) -> Option<u64> {
        Some(self.n())
    }

    fn alphabet(&self) -> &str {
        "0123456789 -?\nseughirlow"
    }

    fn max_turns(&self) -> usize {
        // ceil(log2 N) + 2; N is a power of two.
        self.n().trailing_zeros() as usize + 2
    }

    fn max_message_chars(&self) -> usize {
        self.n().to_string().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::render_plain;

    /// Runs `policy` until the episode ends or is cut off; the transcript and the final score.
    fn play(
        task: &Guess,
        problem: &Problem,
        mut policy: impl FnMut(&[Turn]) -> String,
    ) -> (Vec<Turn>, Option<Score>) {
        let mut env = task.start(problem);
        let mut transcript = Vec::new();
        for _ in 0..task.max_turns() {
            let message = policy(&transcript);
            match env.step(&message).unwrap() {
                EnvStep::Done(score) => {
                    transcript.push(Turn {
                        message,
                        reply: vec![],
                    });
                    return (transcript, Some(score));
                }
                EnvStep::Continue { messages, .. } => transcript.push(Turn {
                    message,
                    reply: messages,
                }),
            }
        }
        (transcript, None)
    }

    /// Guesses the midpoint of what is still possible.
    fn binary_search(n: u64) -> impl FnMut(&[Turn]) -> String {
        move |t| {
            let (mut lo, mut hi) = (1, n);
            for turn in t {
                let g: u64 = turn.message.parse().unwrap();
                match turn.reply[0].content.as_str() {
                    HIGHER => lo = g + 1,
                    _ => hi = g - 1,
                }
            }
            ((lo + hi) / 2).to_string()
        }
    }

    fn binary_turns(task: &Guess, p: &Problem) -> usize {
        play(task, p, binary_search(task.n())).0.len()
    }

    fn problem(task: &Guess, secret: u64) -> Problem {
        let mut p = task.sample(&mut TaskRng::new(0));
        p.ground_truth = secret.to_string();
        p
    }

    #[test]
    fn exact_binary_search_always_wins_in_time() {
        for d in 1..=MAX_DIFFICULTY {
            let task = Guess { difficulty: d };
            for secret in 1..=task.n() {
                let p = problem(&task, secret);
                let (transcript, score) = play(&task, &p, binary_search(task.n()));
                assert_eq!(transcript.len(), binary_turns(&task, &p));
                let score = score.expect("binary search finishes");
                assert!(score.correct && score.formatted);
                assert_eq!(score.reward, reward_for(transcript.len()));
            }
        }
    }

    #[test]
    fn garbage_never_panics_and_costs_a_turn() {
        let task = Guess { difficulty: 1 };
        let p = problem(&task, 5);
        let mut env = task.start(&p);
        for bad in [
            "",
            "abc",
            "99999999999999999999",
            "１２",
            "🙂",
            "0",
            "17",
            "-3",
            "+5",
            "5.0",
        ] {
            match env.step(bad).unwrap() {
                EnvStep::Continue { messages, .. } => {
                    assert_eq!(messages, vec![EnvMessage::user("1-16?")], "{bad:?}")
                }
                EnvStep::Done(_) => panic!("{bad:?} ended the episode"),
            }
        }
        let EnvStep::Done(score) = env.step(" 5\n").unwrap() else {
            panic!("the right guess ends the episode");
        };
        assert!(score.correct && !score.formatted);
        assert_eq!(score.reward, MIN_REWARD);
        assert!(env.step("5").is_err(), "no step after the end");
    }

    #[test]
    fn the_state_is_what_the_player_knows() {
        let task = Guess { difficulty: 1 };
        let p = problem(&task, 5);
        let (mut a, mut b) = (task.start(&p), task.start(&p));
        assert_eq!(a.state_key(), Some(String::new()));
        a.step("8").unwrap();
        b.step("8").unwrap();
        assert_eq!(a.state_key(), b.state_key());
        a.step("2").unwrap();
        b.step("x").unwrap();
        assert_eq!(a.state_key().as_deref(), Some("8< 2> "));
        assert_eq!(b.state_key().as_deref(), Some("8< ? "));
    }

    #[test]
    fn rewards_fall_with_turns() {
        assert_eq!(reward_for(1), 1.0);
        for t in 1..20 {
            assert!(reward_for(t + 1) <= reward_for(t) && reward_for(t) > 0.0);
        }
        assert!(reward_for(2) < reward_for(1));
    }

    #[test]
    fn demonstrations_win_mostly_not_always_optimally_and_fit_the_alphabet() {
        for d in 1..=MAX_DIFFICULTY {
            let task = Guess { difficulty: d };
            let mut rng = TaskRng::new(d as u64);
            let (mut wins, mut slow, mut longest) = (0, 0, 0);
            for _ in 0..200 {
                let p = task.sample(&mut rng);
                let (transcript, score) = play(&task, &p, |t| {
                    let m = task.demonstration_turn(&p, t, &mut rng);
                    assert!(m.len() <= task.max_message_chars());
                    m
                });
                wins += score.is_some_and(|s| s.correct && s.formatted) as usize;
                slow += (transcript.len() > binary_turns(&task, &p)) as usize;
                // The episode as the plain format lays it out: a stop token after each message.
                let mut text = p.prompt.clone();
                for turn in &transcript {
                    text.push_str(&turn.message);
                    text.push('\n');
                    text.push_str(&render_plain(&turn.reply));
                }
                assert!(
                    text.chars().all(|c| task.alphabet().contains(c)),
                    "{text:?}"
                );
                longest = longest.max(text.len());
            }
            assert!(wins >= 180, "difficulty {d}: {wins} wins of 200");
            assert!(slow > 0, "difficulty {d}: never slower than binary search");
            if d == 1 {
                assert!(longest <= 120, "{longest} characters");
            }
        }
    }

    #[test]
    fn turn_and_message_limits() {
        let t = |d| Guess { difficulty: d };
        assert_eq!(
            (t(1).max_turns(), t(2).max_turns(), t(3).max_turns()),
            (6, 8, 10)
        );
        assert_eq!(t(3).max_message_chars(), 3);
        assert_eq!(t(1).sample(&mut TaskRng::new(1)).prompt, "guess 1-16\n");
    }
}
