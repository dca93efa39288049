//! `arithmetic`: `17+25=` → `42`.
//!
//! Difficulty 1: a + b with a, b in 0..=9 (100 problems: too few to hold any out). 2: a + b in
//! 0..=31 (1,024 problems, one in eight held out; the default job's). 3: a + b in 0..=99. 4:
//! a ± b in 0..=99 (results may be negative). 5: three operands in 0..=99 with + - *,
//! evaluated left to right with the usual precedence. A response is correct when, trimmed, it
//! is exactly the decimal result.
//!
//! The additions (difficulty 1 to 3) can be demonstrated by a careless teacher, who drops each
//! carry with probability `dropped_carries`: warm-up data that is right on some problems and
//! systematically wrong on others, as real demonstrations are, while the reward still checks
//! the exact sum. Imitating it more closely never fixes it; a reward can.

use crate::rng::TaskRng;
use crate::task::{Problem, Score, Task};
use serde_json::json;

pub struct Arithmetic {
    pub difficulty: u32,
    /// The chance that a demonstration drops each carry (0: every demonstration is correct).
    pub dropped_carries: f64,
}

pub const MAX_DIFFICULTY: u32 = 5;

/// The highest difficulty whose problems are all additions of two non-negative numbers, the
/// ones a careless teacher can demonstrate.
pub const MAX_CARRY_DIFFICULTY: u32 = 3;

/// The default job's teacher (its config sets `task.dropped_carries`; unset, a teacher is
/// correct) drops seven carries in ten: on a problem with a carry, its
/// likeliest answer is wrong, so a warm-up that imitates it well answers such problems wrongly
/// when greedy, yet samples the right answer often enough (three times in ten) for RL to find.
pub const DEFAULT_DROPPED_CARRIES: f64 = 0.7;

impl Arithmetic {
    /// The task with correct demonstrations.
    pub fn new(difficulty: u32) -> Self {
        Arithmetic {
            difficulty,
            dropped_carries: 0.0,
        }
    }

    fn max_operand(&self) -> i64 {
        match self.difficulty {
            0 | 1 => 9,
            2 => 31,
            _ => 99,
        }
    }

    fn operands(&self, rng: &mut TaskRng) -> (Vec<i64>, Vec<char>) {
        let max = self.max_operand();
        let n = if self.difficulty >= 5 { 3 } else { 2 };
        let ops: &[char] = match self.difficulty {
            0..=3 => &['+'],
            4 => &['+', '-'],
            _ => &['+', '-', '*'],
        };
        let nums = (0..n).map(|_| rng.range(0, max)).collect();
        let ops = (1..n).map(|_| *rng.choose(ops).unwrap_or(&'+')).collect();
        (nums, ops)
    }
}

/// Evaluates with * before + and -, as written in the prompt.
fn evaluate(nums: &[i64], ops: &[char]) -> i64 {
    let mut terms = vec![nums[0]];
    let mut signs = vec![1];
    for (op, &n) in ops.iter().zip(&nums[1..]) {
        match op {
            '*' => {
                let last = terms.len() - 1;
                terms[last] *= n;
            }
            '-' => {
                terms.push(n);
                signs.push(-1);
            }
            _ => {
                terms.push(n);
                signs.push(1);
            }
        }
    }
    terms.iter().zip(signs).map(|(t, s)| t * s).sum()
}

/// The two addends of an `a+b=` prompt.
fn addends(prompt: &str) -> Option<(u64, u64)> {
    let (a, b) = prompt.strip_suffix('=')?.split_once('+')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// a + b added digit by digit, each carry dropped with probability `drop`.
fn careless_sum(mut a: u64, mut b: u64, drop: f64, rng: &mut TaskRng) -> u64 {
    let (mut sum, mut carry, mut place) = (0, 0, 1u64);
    while a > 0 || b > 0 || carry > 0 {
        let column = a % 10 + b % 10 + carry;
        sum += column % 10 * place;
        carry = column / 10;
        if carry > 0 && rng.f64() < drop {
            carry = 0;
        }
        (a, b, place) = (a / 10, b / 10, place.saturating_mul(10));
    }
    sum
}

impl Task for Arithmetic {
    fn name(&self) -> &str {
        "arithmetic"
    }

    fn sample(&self, rng: &mut TaskRng) -> Problem {
        let (nums, ops) = self.operands(rng);
        let mut prompt = nums[0].to_string();
        for (op, n) in ops.iter().zip(&nums[1..]) {
            prompt.push(*op);
            prompt.push_str(&n.to_string());
        }
        prompt.push('=');
        Problem {
            prompt,
            ground_truth: evaluate(&nums, &ops).to_string(),
            data_source: "arithmetic".into(),
            meta: json!({ "difficulty": self.difficulty }),
        }
    }

    fn score(&self, problem: &Problem, response: &str) -> Score {
        let answer = response.trim();
        // Digits after an optional sign: a bare `-` is no number.
        let digits = answer.strip_prefix('-').unwrap_or(answer);
        let formatted = !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit());
        let correct = answer == problem.ground_truth;
        Score {
            reward: if correct { 1.0 } else { 0.0 },
            correct,
            formatted,
        }
    }

    fn demonstration(&self, problem: &Problem, rng: &mut TaskRng) -> String {
        if self.dropped_carries > 0.0 {
            if let Some((a, b)) = addends(&problem.prompt) {
                return careless_sum(a, b, self.dropped_carries, rng).to_string();
            }
        }
        problem.ground_truth.clone()
    }

    fn alphabet(&self) -> &'static str {
        "0123456789+-*="
    }

    fn max_response_chars(&self) -> usize {
        6
    }

    fn problem_count(&self) -> Option<u64> {
        let values = self.max_operand() as u64 + 1;
        Some(match self.difficulty {
            0..=3 => values * values,
            4 => 2 * values * values,
            _ => values * values * values * 3 * 3,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demonstrations_are_correct_at_every_difficulty() {
        let mut rng = TaskRng::new(1);
        for d in 1..=MAX_DIFFICULTY {
            let task = Arithmetic::new(d);
            for _ in 0..200 {
                let p = task.sample(&mut rng);
                let demo = task.demonstration(&p, &mut rng);
                assert!(task.score(&p, &demo).correct, "{} {}", p.prompt, demo);
                assert!(p
                    .prompt
                    .chars()
                    .chain(demo.chars())
                    .all(|c| task.alphabet().contains(c)));
            }
        }
    }

    #[test]
    fn wrong_and_garbage_answers_score_zero() {
        let task = Arithmetic::new(2);
        let p = task.sample(&mut TaskRng::new(3));
        for bad in ["", "abc", "-", "1e9", "99999999999999999999999", "１２"] {
            let s = task.score(&p, bad);
            assert!(!s.correct && s.reward == 0.0, "{bad:?}");
        }
        for not_a_number in ["", "abc", "-", "1e9", "１２"] {
            assert!(!task.score(&p, not_a_number).formatted, "{not_a_number:?}");
        }
        assert!(task.score(&p, "-12").formatted);
        assert!(task.score(&p, &format!(" {} ", p.ground_truth)).correct);
    }

    #[test]
    fn precedence_and_difficulty_ranges() {
        assert_eq!(evaluate(&[2, 3, 4], &['+', '*']), 14);
        assert_eq!(evaluate(&[2, 3, 4], &['-', '*']), -10);
        let mut rng = TaskRng::new(9);
        let easy = Arithmetic::new(1);
        for _ in 0..100 {
            let p = easy.sample(&mut rng);
            assert_eq!(p.prompt.len(), 4, "single digits: {}", p.prompt);
        }
    }

    #[test]
    fn a_careless_teacher_drops_carries_at_its_rate_and_nothing_else() {
        let mut rng = TaskRng::new(5);
        assert_eq!(careless_sum(17, 25, 0.0, &mut rng), 42);
        assert_eq!(
            careless_sum(17, 25, 1.0, &mut rng),
            32,
            "the units' carry dropped"
        );
        assert_eq!(careless_sum(99, 99, 1.0, &mut rng), 88);
        assert_eq!(careless_sum(99, 99, 0.0, &mut rng), 198);
        assert_eq!(
            careless_sum(12, 30, 1.0, &mut rng),
            42,
            "no carry, nothing to drop"
        );
        let task = Arithmetic {
            difficulty: 2,
            dropped_carries: 0.7,
        };
        let (mut carries, mut wrong) = (0, 0);
        for _ in 0..4000 {
            let p = task.sample(&mut rng);
            let (a, b) = addends(&p.prompt).unwrap();
            let demo = task.demonstration(&p, &mut rng);
            if a % 10 + b % 10 >= 10 {
                carries += 1;
                wrong += usize::from(demo != p.ground_truth);
            } else {
                assert_eq!(demo, p.ground_truth, "{}", p.prompt);
            }
        }
        let rate = wrong as f64 / carries as f64;
        assert!(
            (rate - 0.7).abs() < 0.05,
            "{wrong} of {carries} carries dropped"
        );
    }
}
