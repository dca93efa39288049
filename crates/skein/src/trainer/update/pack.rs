//! Where each row's tokens sit in a micro-batch: the layout, before any tensor exists.
//!
//! - **Padded**: one row per line, lines as wide as the longest row; plain causal attention.
//! - **Packed**: rows end to end in lines (first-fit decreasing), each row at positions
//!   0.. of its own and blind to the others (a block-diagonal causal mask).
//! - **Packed with a shared prefix**: rows whose prompts are identical (the samples of a
//!   group) are laid out as that prompt once, minus its last token, followed by every row's
//!   remainder (last prompt token and response). Each remainder sees the prefix and itself, at
//!   the positions it has in its own row, so every logit is the one the row computes alone.
//!   The prompt's last token stays in each remainder because its logit predicts the first
//!   response token, which differs between rows.
//!
//! Every layout feeds a row's tokens but its last ([`input_len`]): the last token's logit would
//! predict what comes after the row, which nothing trains.
//!
//! Prompt tokens carry no loss, so none of this changes a loss or a gradient beyond float
//! round-off; only the tokens computed change.

use crate::trainer::batch::TrainRow;
use crate::trainer::config::Batching;
use std::collections::HashMap;
use std::ops::Range;

/// Tokens of `row` the forward reads: all but the last, whose logit predicts nothing the row
/// holds. Position i of them predicts token i + 1.
pub fn input_len(row: &TrainRow) -> usize {
    row.tokens.len().saturating_sub(1).max(1)
}

/// A run of one row's tokens placed in a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Index into the micro-batch's rows.
    pub row: usize,
    /// Tokens of the row before the segment (in a shared prefix); also its first position.
    pub skip: usize,
    pub col: usize,
    pub len: usize,
    /// Columns of the shared prefix this segment also attends to.
    pub context: Option<Range<usize>>,
    /// A shared prefix: not the row's own place (its tokens carry no loss).
    pub prefix: bool,
}

/// One micro-batch: its rows (indices into the step's rows) and where they sit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MicroPlan {
    pub rows: Vec<usize>,
    pub lines: Vec<Vec<Segment>>,
    pub width: usize,
    pub attention: LineAttention,
}

/// How attention keeps the rows of a line apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineAttention {
    /// One row per line: plain causal attention.
    Causal,
    /// Narrow packed lines: a dense [width × width] mask per line.
    Mask,
    /// Wide packed lines: attention span by span, each against its own keys and its shared
    /// prefix's. A dense mask would compute every query against every key of the line, a cost
    /// that grows with the square of the width; the spans' grows with their own lengths.
    Spans,
}

/// Packed units at least this long are laid out for [`LineAttention::Spans`]: one line per
/// micro-batch, no padding. Shorter ones go into lines as wide as the largest, under a mask
/// (at this size the per-span calls would cost more than the mask saves; `skein bench
/// train-tokens` and the default job measure both sides).
pub const SPANS_FROM_TOKENS: usize = 256;

impl MicroPlan {
    /// `rows` (indices, with their token counts `lens`), one right-padded row per line.
    pub fn one_per_line(rows: Vec<usize>, lens: &[usize]) -> Self {
        MicroPlan {
            lines: lens
                .iter()
                .enumerate()
                .map(|(k, &len)| vec![Segment::whole(k, len)])
                .collect(),
            width: lens.iter().copied().max().unwrap_or(2).max(2),
            rows,
            attention: LineAttention::Causal,
        }
    }

    /// Token slots the forward computes (padding included).
    pub fn computed_tokens(&self) -> usize {
        self.lines.len() * self.width
    }
}

/// Micro-batches of `indices` into `rows`, each within `b.micro_batch_tokens` (a single
/// longer row or prefix group still gets one of its own). The loss does not depend on the
/// split: each token's weight holds the global counts.
pub fn micro_batches(rows: &[TrainRow], indices: &[usize], b: &Batching) -> Vec<MicroPlan> {
    if b.packing {
        packed(rows, indices, b)
    } else {
        padded(rows, indices, b.micro_batch_tokens)
    }
}

/// Shortest rows first, so a long-tail row does not pad a micro-batch of short ones.
fn padded(rows: &[TrainRow], indices: &[usize], budget: usize) -> Vec<MicroPlan> {
    let mut sorted = indices.to_vec();
    sorted.sort_by_key(|&i| input_len(&rows[i]));
    let lens: Vec<usize> = sorted.iter().map(|&i| input_len(&rows[i])).collect();
    split_by_tokens(&lens, budget)
        .into_iter()
        .map(|range| MicroPlan::one_per_line(sorted[range.clone()].to_vec(), &lens[range]))
        .collect()
}

/// Splits row lengths (in order) into runs of at most `max_tokens` padded tokens each
/// (a single longer row still gets a run of its own).
pub fn split_by_tokens(lens: &[usize], max_tokens: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut longest = 0;
    for (i, &len) in lens.iter().enumerate() {
        let l = longest.max(len);
        if i > start && l * (i - start + 1) > max_tokens {
            out.push(start..i);
            start = i;
            longest = len;
        } else {
            longest = l;
        }
    }
    if start < lens.len() {
        out.push(start..lens.len());
    }
    out
}

impl Segment {
    fn whole(row: usize, len: usize) -> Self {
        Segment {
            row,
            skip: 0,
            col: 0,
            len,
            context: None,
            prefix: false,
        }
    }
}

/// Rows placed together: one row, or rows sharing a prompt (computed once, minus its last
/// token).
struct Unit {
    rows: Vec<usize>,
    shared: usize,
    tokens: usize,
}

impl Unit {
    fn new(rows: &[TrainRow], members: Vec<usize>, shared: usize) -> Self {
        let tokens = shared
            + members
                .iter()
                .map(|&i| input_len(&rows[i]) - shared)
                .sum::<usize>();
        Unit {
            rows: members,
            shared,
            tokens,
        }
    }
}

/// Rows with identical prompts (of at least two tokens) form one unit; the others are alone.
/// Units larger than `budget` are split so that each part fits where it can.
fn units(rows: &[TrainRow], indices: &[usize], share: bool, budget: usize) -> Vec<Unit> {
    let mut order: Vec<&[u32]> = Vec::new();
    let mut by_prompt: HashMap<&[u32], Vec<usize>> = HashMap::new();
    let mut out = Vec::new();
    for &i in indices {
        let r = &rows[i];
        if share && r.prompt_len >= 2 && r.prompt_len < r.tokens.len() {
            let prompt = &r.tokens[..r.prompt_len];
            by_prompt
                .entry(prompt)
                .or_insert_with(|| {
                    order.push(prompt);
                    Vec::new()
                })
                .push(i);
        } else {
            out.push(Unit::new(rows, vec![i], 0));
        }
    }
    for prompt in order {
        let members = by_prompt.remove(prompt).unwrap_or_default();
        let shared = if members.len() > 1 {
            prompt.len() - 1
        } else {
            0
        };
        let mut part: Vec<usize> = Vec::new();
        let mut tokens = shared;
        for i in members {
            let more = input_len(&rows[i]) - shared;
            if !part.is_empty() && tokens + more > budget {
                out.push(Unit::new(rows, std::mem::take(&mut part), shared));
                tokens = shared;
            }
            part.push(i);
            tokens += more;
        }
        if !part.is_empty() {
            let shared = if part.len() > 1 { shared } else { 0 };
            out.push(Unit::new(rows, part, shared));
        }
    }
    out
}

/// First-fit decreasing of units into lines, then as many lines per micro-batch as the budget
/// allows. Lines are as wide as the largest unit, or, when that is long enough for span
/// attention, as wide as the budget (one line per micro-batch, nothing padded).
fn packed(rows: &[TrainRow], indices: &[usize], b: &Batching) -> Vec<MicroPlan> {
    let mut units = units(rows, indices, b.shared_prefix, b.micro_batch_tokens);
    // Largest first; ties by first row, so the layout is the same on every rank and run.
    units.sort_by(|x, y| y.tokens.cmp(&x.tokens).then(x.rows[0].cmp(&y.rows[0])));
    let largest = units.first().map_or(2, |u| u.tokens.max(2));
    let (width, attention) = if largest >= SPANS_FROM_TOKENS {
        (largest.max(b.micro_batch_tokens), LineAttention::Spans)
    } else {
        (largest, LineAttention::Mask)
    };
    let mut lines: Vec<(usize, Vec<usize>)> = Vec::new(); // (used, unit ids)
    for (u, unit) in units.iter().enumerate() {
        match lines
            .iter_mut()
            .find(|(used, _)| used + unit.tokens <= width)
        {
            Some((used, ids)) => {
                *used += unit.tokens;
                ids.push(u);
            }
            None => lines.push((unit.tokens, vec![u])),
        }
    }
    let per_batch = (b.micro_batch_tokens / width).max(1);
    lines
        .chunks(per_batch)
        .map(|chunk| {
            let mut plan = MicroPlan {
                rows: Vec::new(),
                lines: Vec::new(),
                width: chunk
                    .iter()
                    .map(|(used, _)| *used)
                    .max()
                    .unwrap_or(2)
                    .max(2),
                attention,
            };
            for (_, ids) in chunk {
                let mut line = Vec::new();
                let mut col = 0;
                for &u in ids {
                    col = place(&units[u], rows, &mut plan.rows, &mut line, col);
                }
                plan.lines.push(line);
            }
            plan
        })
        .collect()
}

/// Lays `unit` out in `line` from `col`; returns the next free column.
fn place(
    unit: &Unit,
    rows: &[TrainRow],
    plan_rows: &mut Vec<usize>,
    line: &mut Vec<Segment>,
    mut col: usize,
) -> usize {
    let context = (unit.shared > 0).then(|| {
        line.push(Segment {
            row: plan_rows.len(),
            skip: 0,
            col,
            len: unit.shared,
            context: None,
            prefix: true,
        });
        col += unit.shared;
        col - unit.shared..col
    });
    for &i in &unit.rows {
        let len = input_len(&rows[i]) - unit.shared;
        line.push(Segment {
            row: plan_rows.len(),
            skip: unit.shared,
            col,
            len,
            context: context.clone(),
            prefix: false,
        });
        plan_rows.push(i);
        col += len;
    }
    col
}

/// The attention mask of a packed plan, [lines × width × width] row-major, true where a query
/// (row index) may read a key (column index). Columns no segment covers read themselves only,
/// so no softmax row is empty.
pub fn attention_mask(plan: &MicroPlan) -> Vec<bool> {
    let w = plan.width;
    let mut mask = vec![false; plan.lines.len() * w * w];
    for (l, line) in plan.lines.iter().enumerate() {
        let base = l * w * w;
        let mut covered = vec![false; w];
        for s in line {
            for q in s.col..s.col + s.len {
                covered[q] = true;
                let at = base + q * w;
                mask[at + s.col..=at + q].fill(true);
                if let Some(c) = &s.context {
                    mask[at + c.start..at + c.end].fill(true);
                }
            }
        }
        for (q, _) in covered.iter().enumerate().filter(|(_, c)| !**c) {
            mask[base + q * w + q] = true;
        }
    }
    mask
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(tokens: Vec<u32>, prompt_len: usize) -> TrainRow {
        TrainRow::sampled(tokens, prompt_len, 0.0)
    }

    #[test]
    fn split_respects_the_padded_token_budget() {
        let parts = split_by_tokens(&[4, 4, 4, 10, 1, 1], 12);
        assert_eq!(parts, vec![0..3, 3..4, 4..6]);
        assert!(split_by_tokens(&[], 8).is_empty());
    }

    /// Every row gets exactly one place of its own, no two segments overlap, and a line never
    /// outgrows the plan's width.
    fn check_plan(rows: &[TrainRow], indices: &[usize], plans: &[MicroPlan], budget: usize) {
        let mut seen: Vec<usize> = plans.iter().flat_map(|p| p.rows.clone()).collect();
        seen.sort();
        let mut want = indices.to_vec();
        want.sort();
        assert_eq!(seen, want, "every row exactly once");
        for p in plans {
            assert!(p.computed_tokens() <= budget || p.lines.len() == 1, "{p:?}");
            let mut own: Vec<usize> = p
                .lines
                .iter()
                .flatten()
                .filter(|s| !s.prefix)
                .map(|s| s.row)
                .collect();
            own.sort();
            assert_eq!(
                own,
                (0..p.rows.len()).collect::<Vec<_>>(),
                "one own segment per row"
            );
            for line in &p.lines {
                let mut end = 0;
                for s in line {
                    assert!(s.col >= end, "overlap in {line:?}");
                    end = s.col + s.len;
                    let r = &rows[p.rows[s.row]];
                    assert!(s.skip + s.len <= input_len(r));
                    if !s.prefix {
                        assert_eq!(s.skip + s.len, input_len(r), "a row's place ends it");
                    }
                }
                assert!(end <= p.width);
            }
        }
    }

    #[test]
    fn packing_places_every_row_once_within_the_budget() {
        let rows: Vec<TrainRow> = (0..40)
            .map(|i| row((0..(3 + i * 7 % 23) as u32).collect(), 2))
            .collect();
        let all: Vec<usize> = (0..rows.len()).collect();
        for share in [false, true] {
            for budget in [16, 40, 100, 1000] {
                let b = Batching {
                    micro_batch_tokens: budget,
                    packing: true,
                    shared_prefix: share,
                };
                let plans = micro_batches(&rows, &all, &b);
                check_plan(&rows, &all, &plans, budget);
            }
        }
        let plans = micro_batches(&rows, &all, &Batching::padded(100));
        check_plan(&rows, &all, &plans, 100);
    }

    /// Rows with one prompt share it once; the prompt's last token stays with each row.
    #[test]
    fn identical_prompts_are_laid_out_once() {
        let rows = vec![
            row(vec![1, 2, 3, 7, 8], 3),
            row(vec![1, 2, 3, 9], 3),
            row(vec![4, 5, 6], 2),
        ];
        let b = Batching {
            micro_batch_tokens: 100,
            packing: true,
            shared_prefix: true,
        };
        let plans = micro_batches(&rows, &[0, 1, 2], &b);
        assert_eq!(plans.len(), 1);
        let p = &plans[0];
        // Rows are fed without their last token. Shared unit: prefix [1, 2] + [3, 7] + [3]
        // = 5 tokens; the lone row is [4, 5].
        assert_eq!(p.width, 5);
        assert_eq!(p.lines.len(), 2);
        let line = &p.lines[0];
        assert!(line[0].prefix && line[0].len == 2);
        assert_eq!((line[1].skip, line[1].col, line[1].len), (2, 2, 2));
        assert_eq!((line[2].skip, line[2].col, line[2].len), (2, 4, 1));
        assert_eq!(line[2].context, Some(0..2));
        let mask = attention_mask(p);
        let at = |l: usize, q: usize, k: usize| mask[l * 25 + q * 5 + k];
        // The second row's token sees the prefix and itself, never the first row's.
        assert!(at(0, 4, 0) && at(0, 4, 1) && at(0, 4, 4) && !at(0, 4, 2) && !at(0, 4, 3));
        // Within the first row's segment: causal.
        assert!(at(0, 3, 2) && !at(0, 2, 3));
        // The unused tail of the second line reads only itself.
        assert!(at(1, 3, 3) && !at(1, 3, 0));
    }

    /// A group bigger than the budget is split, each part carrying the prefix again.
    #[test]
    fn a_group_over_the_budget_is_split() {
        let rows: Vec<TrainRow> = (0..6)
            .map(|i| row(vec![1, 2, 3, 4, 10 + i, 11 + i], 4))
            .collect();
        let all: Vec<usize> = (0..6).collect();
        let b = Batching {
            micro_batch_tokens: 12,
            packing: true,
            shared_prefix: true,
        };
        let plans = micro_batches(&rows, &all, &b);
        check_plan(&rows, &all, &plans, 12);
        // Prefix 3 + 2 per row (fed without its last token): four rows fit in 12.
        assert_eq!(plans.len(), 2, "{plans:?}");
        assert_eq!(plans[0].width, 11);
    }
}
