//! `reverse`: `31415=` → `51413`, with a long-tail length distribution: most digit strings
//! are short (1 to 4 digits), one in seven is long (8·d to 16·d digits at difficulty d), so
//! a synchronous rollout step waits on a few long responses while the rest of the batch is
//! done — the setting partial rollout is for.
//!
//! The reward is the fraction of leading characters that match the reversed string
//! (measured against the longer of answer and truth), so a long answer that is mostly right
//! earns most of the credit; only an exact answer is correct.

use crate::rng::TaskRng;
use crate::task::{Problem, Score, Task};
use serde_json::json;

pub struct Reverse {
    pub difficulty: u32,
}

pub const MAX_DIFFICULTY: u32 = 3;

/// One prompt in seven is long.
const LONG_ONE_IN: u64 = 7;

impl Reverse {
    /// The longest digit string at this difficulty.
    pub fn max_len(&self) -> usize {
        16 * self.difficulty.max(1) as usize
    }

    fn length(&self, rng: &mut TaskRng) -> usize {
        let d = self.difficulty.max(1) as i64;
        if rng.below(LONG_ONE_IN) == 0 {
            rng.range(8 * d, 16 * d) as usize
        } else {
            rng.range(1, 4) as usize
        }
    }
}

impl Task for Reverse {
    fn name(&self) -> &str {
        "reverse"
    }

    fn sample(&self, rng: &mut TaskRng) -> Problem {
        let digits: String = (0..self.length(rng))
            .map(|_| char::from(b'0' + rng.below(10) as u8))
            .collect();
        Problem {
            prompt: format!("{digits}="),
            ground_truth: digits.chars().rev().collect(),
            data_source: "reverse".into(),
            meta: json!({ "difficulty": self.difficulty, "length": digits.len() }),
        }
    }

    fn score(&self, problem: &Problem, response: &str) -> Score {
        let answer = response.trim();
        let truth = problem.ground_truth.as_str();
        let matched = answer
            .chars()
            .zip(truth.chars())
            .take_while(|(a, b)| a == b)
            .count();
        let longest = answer.chars().count().max(truth.chars().count()).max(1);
        let correct = answer == truth;
        Score {
            reward: matched as f64 / longest as f64,
            correct,
            formatted: !answer.is_empty() && answer.chars().all(|c| c.is_ascii_digit()),
        }
    }

    fn demonstration(&self, problem: &Problem, _rng: &mut TaskRng) -> String {
        problem.ground_truth.clone()
    }

    fn alphabet(&self) -> &'static str {
        "0123456789="
    }

    fn max_response_chars(&self) -> usize {
        self.max_len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_have_a_long_tail() {
        let task = Reverse { difficulty: 2 };
        let mut rng = TaskRng::new(4);
        let lens: Vec<usize> = (0..7000)
            .map(|_| task.sample(&mut rng).ground_truth.len())
            .collect();
        let long = lens.iter().filter(|&&l| l >= 16).count();
        assert!(lens.iter().all(|&l| (1..=32).contains(&l)));
        assert!((800..1200).contains(&long), "{long} long of 7000");
        let total: usize = lens.iter().sum();
        let long_tokens: usize = lens.iter().filter(|&&l| l >= 16).sum();
        assert!(long_tokens * 2 > total, "the long tail holds most tokens");
    }

    #[test]
    fn partial_credit_for_a_matching_prefix_and_only_exact_is_correct() {
        let task = Reverse { difficulty: 1 };
        let p = Problem {
            prompt: "1234=".into(),
            ground_truth: "4321".into(),
            data_source: "reverse".into(),
            meta: json!({}),
        };
        assert!(task.score(&p, " 4321 ").correct);
        assert_eq!(task.score(&p, "43").reward, 0.5);
        assert_eq!(task.score(&p, "432100").reward, 4.0 / 6.0);
        assert!(!task.score(&p, "43210").correct);
        for bad in ["", "x", "🙂🙂🙂🙂🙂"] {
            assert_eq!(task.score(&p, bad).reward, 0.0, "{bad:?}");
        }
        let mut rng = TaskRng::new(1);
        for _ in 0..100 {
            let q = task.sample(&mut rng);
            assert!(task.score(&q, &task.demonstration(&q, &mut rng)).correct);
        }
    }
}
