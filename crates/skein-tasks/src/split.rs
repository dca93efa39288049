//! Held-out problems: one problem in [`HELD_OUT_ONE_IN`] of a task's space, chosen by a hash of
//! the problem itself (data source, prompt and answer) — the same for every run, seed and
//! process — is never drawn for training and is the only kind drawn for evaluation. A task
//! whose space is too small to spare them ([`MIN_SPLIT_PROBLEMS`]) is not split: its
//! evaluation is on training problems and says so.

use crate::task::Problem;
use crate::TaskRng;

/// One problem in this many is held out.
pub const HELD_OUT_ONE_IN: u64 = 8;

/// Distinct problems a task needs before it is split (so at least ~125 are held out).
pub const MIN_SPLIT_PROBLEMS: u64 = 1000;

/// Draws before [`draw_in`] gives up on finding a problem of the wanted split. Where a split
/// part is rare in the draw distribution (`reverse` holds out no 1-digit string, so about one
/// draw in eleven is held out) 1000 misses in a row still never happen (p < 1e-40).
const MAX_DRAWS: usize = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    Train,
    HeldOut,
}

/// Whether a space of `problems` distinct problems (None: unbounded) is split.
pub fn splits(problems: Option<u64>) -> bool {
    problems.is_none_or(|n| n >= MIN_SPLIT_PROBLEMS)
}

/// The split `problem` belongs to.
pub fn split_of(problem: &Problem) -> Split {
    // FNV-1a: stable across builds and platforms, unlike the standard library's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [&problem.data_source, &problem.prompt, &problem.ground_truth] {
        for b in part.bytes().chain([0u8]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    // The low bits of FNV mix poorly; fold the high ones in first.
    if (h ^ (h >> 32)).is_multiple_of(HELD_OUT_ONE_IN) {
        Split::HeldOut
    } else {
        Split::Train
    }
}

/// A problem of `split` from `sample`, drawing again until one comes; None after
/// [`MAX_DRAWS`] misses.
pub fn draw_in(
    split: Split,
    rng: &mut TaskRng,
    mut sample: impl FnMut(&mut TaskRng) -> Problem,
) -> Option<Problem> {
    (0..MAX_DRAWS)
        .map(|_| sample(rng))
        .find(|p| split_of(p) == split)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{agent_task_by_name, task_by_name};
    use std::collections::HashSet;

    /// Every built-in task and difficulty: a split task's training draws and evaluation draws
    /// never share a problem, and about one in eight problems is held out.
    #[test]
    fn evaluation_problems_never_appear_in_training() {
        let cases: Vec<(&str, u32)> = vec![
            ("arithmetic", 1),
            ("arithmetic", 2),
            ("arithmetic", 3),
            ("arithmetic", 4),
            ("reverse", 1),
            ("reverse", 2),
            ("reverse", 3),
            ("guess", 1),
            ("guess", 2),
            ("guess", 3),
            ("calculator", 1),
            ("calculator", 2),
            ("calculator", 3),
        ];
        for (name, d) in cases {
            type Sampler = Box<dyn Fn(&mut TaskRng) -> Problem>;
            let (sample, space): (Sampler, Option<u64>) = match task_by_name(name, d) {
                Ok(t) => {
                    let space = t.problem_count();
                    (Box::new(move |r: &mut TaskRng| t.sample(r)), space)
                }
                Err(_) => {
                    let t = agent_task_by_name(name, d).unwrap().unwrap();
                    let space = t.problem_count();
                    (Box::new(move |r: &mut TaskRng| t.sample(r)), space)
                }
            };
            if !splits(space) {
                assert!(space.is_some_and(|n| n < MIN_SPLIT_PROBLEMS), "{name} {d}");
                continue;
            }
            let mut rng = TaskRng::new(7);
            let train: HashSet<(String, String)> = (0..4000)
                .map(|_| draw_in(Split::Train, &mut rng, &sample).unwrap())
                .map(|p| (p.prompt, p.ground_truth))
                .collect();
            let held: HashSet<(String, String)> = (0..500)
                .map(|_| draw_in(Split::HeldOut, &mut rng, &sample).unwrap())
                .map(|p| (p.prompt, p.ground_truth))
                .collect();
            assert!(
                train.is_disjoint(&held),
                "{name} {d}: a held-out problem trained"
            );
            let all: Vec<Problem> = (0..8000).map(|_| sample(&mut rng)).collect();
            let held_out = all.iter().filter(|p| split_of(p) == Split::HeldOut).count();
            assert!(
                (700..1300).contains(&held_out),
                "{name} {d}: {held_out} of 8000"
            );
        }
    }

    #[test]
    fn the_split_is_a_property_of_the_problem() {
        let p = |prompt: &str, truth: &str| Problem {
            prompt: prompt.into(),
            ground_truth: truth.into(),
            data_source: "arithmetic".into(),
            meta: serde_json::Value::Null,
        };
        for i in 0..100 {
            let a = p(&format!("{i}+1="), &(i + 1).to_string());
            assert_eq!(split_of(&a), split_of(&a.clone()));
        }
        // Data source, prompt and answer all count: some problem among these differs.
        let base = split_of(&p("1+1=", "2"));
        assert!((0..64).any(|i| split_of(&p(&format!("1+1={i}"), "2")) != base));
    }
}
