//! Where a row's response changes hands: the model's turns, the environment's replies between
//! them, and the tool calls inside the model's text. Worked out here, once, so the page only
//! draws what it is given.

use serde::Serialize;
use skein_report::trajectories::RowRecord;

/// Who wrote a stretch of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Sampled from the policy (loss mask 1).
    Model,
    /// Inserted by the environment (loss mask 0).
    Env,
    /// An environment reply that answers a tool call (`<tool_response>` text).
    Tool,
}

/// A run of response tokens `start..end` of one kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Segment {
    pub start: usize,
    pub end: usize,
    pub kind: Kind,
}

/// The marks of one row's response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RowMarks {
    /// Consecutive, covering the whole response; a model segment after another segment starts
    /// a new turn.
    pub segments: Vec<Segment>,
    /// Token ranges `[start, end)` of `<tool_call>…</tool_call>` blocks in the model's text.
    pub tool_calls: Vec<[usize; 2]>,
}

const TOOL_REPLY: &str = "<tool_response>";
const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";

/// The marks of `row`. A response token with no mask entry counts as sampled (the mask is
/// written per response token; a shorter one is a damaged record, not a reason to fail).
pub fn row_marks(row: &RowRecord) -> RowMarks {
    let n = row.response_ids.len().max(row.response_text.len());
    let sampled = |i: usize| row.loss_mask.get(i).is_none_or(|&m| m != 0);
    let mut segments = Vec::new();
    let mut start = 0;
    for i in 1..=n {
        if i == n || sampled(i) != sampled(start) {
            let kind = if sampled(start) {
                Kind::Model
            } else if text_of(row, start, i).contains(TOOL_REPLY) {
                Kind::Tool
            } else {
                Kind::Env
            };
            segments.push(Segment {
                start,
                end: i,
                kind,
            });
            start = i;
        }
    }
    let tool_calls = segments
        .iter()
        .filter(|s| s.kind == Kind::Model)
        .flat_map(|s| tool_calls_in(row, s.start, s.end))
        .collect();
    RowMarks {
        segments,
        tool_calls,
    }
}

fn text_of(row: &RowRecord, start: usize, end: usize) -> String {
    row.response_text
        .get(start..end.min(row.response_text.len()))
        .unwrap_or_default()
        .concat()
}

/// Token ranges of the tool-call blocks in response tokens `start..end`: the text is joined,
/// the blocks found by byte offset, and each mapped back to the tokens it overlaps (a tag may
/// be split across tokens, or share one with other text). An unclosed block runs to `end`.
fn tool_calls_in(row: &RowRecord, start: usize, end: usize) -> Vec<[usize; 2]> {
    let end = end.min(row.response_text.len());
    if start >= end {
        return Vec::new();
    }
    let mut offsets = Vec::with_capacity(end - start + 1);
    let mut text = String::new();
    for t in &row.response_text[start..end] {
        offsets.push(text.len());
        text.push_str(t);
    }
    offsets.push(text.len());
    // The token holding byte `b`: the last one starting at or before it.
    let token_at = |b: usize| start + offsets.partition_point(|&o| o <= b) - 1;
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(open) = text[from..].find(CALL_OPEN).map(|p| p + from) {
        let close = text[open..]
            .find(CALL_CLOSE)
            .map_or(text.len(), |p| open + p + CALL_CLOSE.len());
        out.push([token_at(open), token_at(close - 1) + 1]);
        from = close;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(tokens: &[(&str, u8)]) -> RowRecord {
        RowRecord {
            transition: None,
            mini_batch: Some(0),
            rank: Some(0),
            prompt_ids: vec![1],
            prompt_text: vec!["q".into()],
            response_ids: (0..tokens.len() as u32).collect(),
            response_text: tokens.iter().map(|t| t.0.to_string()).collect(),
            loss_mask: tokens.iter().map(|t| t.1).collect(),
            behavior_logp: vec![-1.0; tokens.len()],
            versions: vec![0; tokens.len()],
            advantages: vec![],
            is_weight: vec![],
        }
    }

    #[test]
    fn segments_follow_the_mask_and_name_tool_replies() {
        let r = row(&[
            ("<tool_", 1),
            ("call>{\"name\":\"calc\"}</tool_call>", 1),
            ("\n<tool_response>", 0),
            ("3</tool_response>\n", 0),
            ("It is", 1),
            (" 3", 1),
            ("\nUser: and 4?", 0),
            ("4", 1),
        ]);
        let m = row_marks(&r);
        let kinds: Vec<(usize, usize, Kind)> = m
            .segments
            .iter()
            .map(|s| (s.start, s.end, s.kind))
            .collect();
        assert_eq!(
            kinds,
            [
                (0, 2, Kind::Model),
                (2, 4, Kind::Tool),
                (4, 6, Kind::Model),
                (6, 7, Kind::Env),
                (7, 8, Kind::Model),
            ]
        );
        // The call's opening tag is split over two tokens: both are part of the call.
        assert_eq!(m.tool_calls, [[0, 2]]);
    }

    #[test]
    fn tool_calls_map_back_to_the_tokens_they_overlap() {
        let r = row(&[
            ("Let me", 1),
            (" add.<tool_call>", 1),
            ("{}", 1),
            ("</tool_call> and", 1),
            (" <tool_call>{", 1),
            ("}", 1),
        ]);
        // The second block is never closed: it runs to the end of the model's segment.
        assert_eq!(row_marks(&r).tool_calls, [[1, 4], [4, 6]]);
    }

    #[test]
    fn damaged_rows_do_not_panic() {
        let mut r = row(&[("a", 1), ("b", 0), ("c", 1)]);
        r.loss_mask.truncate(1);
        r.response_text.truncate(2);
        let m = row_marks(&r);
        assert_eq!(m.segments.len(), 1);
        assert_eq!((m.segments[0].start, m.segments[0].end), (0, 3));
        let empty = row(&[]);
        assert!(row_marks(&empty).segments.is_empty());
    }
}
