//! `arithmetic`: `17+25=` → `42`.
//!
//! Difficulty 1: a + b with a, b in 0..=9 (100 problems: too few to hold any out). 2: a + b in
//! 0..=31 (1,024 problems, one in eight held out; the default job's). 3: a + b in 0..=99. 4:
//! a ± b in 0..=99 (results may be negative). 5: three operands in 0..=99 with + - *,
//! evaluated left to right with the usual precedence. A response is correct when, trimmed, it
//! is exactly the decimal result.

use crate::rng::TaskRng;
use crate::task::{Problem, Score, Task};
use serde_json::json;

pub struct Arithmetic {
    pub difficulty: u32,
}

pub const MAX_DIFFICULTY: u32 = 5;

impl Arithmetic {
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
        let formatted = !answer.is_empty()
            && answer
                .strip_prefix('-')
                .unwrap_or(answer)
                .chars()
                .all(|c| c.is_ascii_digit());
        let correct = answer == problem.ground_truth;
        Score {
            reward: if correct { 1.0 } else { 0.0 },
            correct,
            formatted,
        }
    }

    fn demonstration(&self, problem: &Problem, _rng: &mut TaskRng) -> String {
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
            let task = Arithmetic { difficulty: d };
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
        let task = Arithmetic { difficulty: 2 };
        let p = task.sample(&mut TaskRng::new(3));
        for bad in ["", "abc", "-", "1e9", "99999999999999999999999", "１２"] {
            let s = task.score(&p, bad);
            assert!(!s.correct && s.reward == 0.0, "{bad:?}");
        }
        assert!(task.score(&p, &format!(" {} ", p.ground_truth)).correct);
    }

    #[test]
    fn precedence_and_difficulty_ranges() {
        assert_eq!(evaluate(&[2, 3, 4], &['+', '*']), 14);
        assert_eq!(evaluate(&[2, 3, 4], &['-', '*']), -10);
        let mut rng = TaskRng::new(9);
        let easy = Arithmetic { difficulty: 1 };
        for _ in 0..100 {
            let p = easy.sample(&mut rng);
            assert_eq!(p.prompt.len(), 4, "single digits: {}", p.prompt);
        }
    }
}
