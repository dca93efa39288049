//! `calculator`: integer arithmetic with a calculator tool at hand.
//!
//! Difficulty 1: `a+b` or `a*b` with a, b in 10..=99. 2: the same in 100..=999. 3: three operands
//! in 10..=999 with + - *, the first two parenthesized half of the time. The prompt is
//! `{expr}=?\n`.
//!
//! A message holding a tool call in the Qwen/Hermes format,
//! `<tool_call>{"name":"calc","arguments":{"expr":"37*48"}}</tool_call>`, gets one tool message
//! per call: the value, or `error: ...` (bad call, bad expression, overflow); the episode goes
//! on. A message without a tool call is the final answer: correct when, trimmed, it is exactly the
//! decimal result. Reward 1 when correct, else 0 — no format credit, which a policy could collect
//! by answering any integer at once. `formatted`: every tool call parsed and the answer is an
//! integer.

use crate::env::{AgentTask, Env, EnvError, EnvMessage, EnvRole, EnvStep, Turn};
use crate::rng::TaskRng;
use crate::task::{Problem, Score};
use serde_json::{json, Value};
use skein_text::parse_tool_calls;

pub struct Calculator {
    pub difficulty: u32,
}

pub const MAX_DIFFICULTY: u32 = 3;
pub const TOOL_NAME: &str = "calc";

/// Longest expression the tool evaluates; also bounds the parser's recursion.
const MAX_EXPR_CHARS: usize = 64;
/// Tool calls one message may make.
const MAX_CALLS: usize = 4;

const ERR_CALL: &str = "error: bad tool call";
const ERR_TOOL: &str = "error: unknown tool";
const ERR_ARGS: &str = "error: no expr";
const ERR_MANY: &str = "error: too many calls";

/// Why an expression has no value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CalcError {
    TooLong,
    Syntax,
    Overflow,
}

impl CalcError {
    fn message(self) -> &'static str {
        match self {
            CalcError::TooLong => "error: too long",
            CalcError::Syntax => "error: bad expression",
            CalcError::Overflow => "error: overflow",
        }
    }
}

/// Evaluates integers with + - *, unary minus and parentheses, the usual precedence, in checked
/// i64 arithmetic. Spaces are allowed.
pub fn evaluate(expr: &str) -> Result<i64, CalcError> {
    if expr.len() > MAX_EXPR_CHARS {
        return Err(CalcError::TooLong);
    }
    let mut p = Parser {
        s: expr.as_bytes(),
        i: 0,
    };
    let v = p.sum()?;
    p.skip_spaces();
    if p.i == p.s.len() {
        Ok(v)
    } else {
        Err(CalcError::Syntax)
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn skip_spaces(&mut self) {
        while self.s.get(self.i) == Some(&b' ') {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_spaces();
        self.s.get(self.i).copied()
    }

    fn sum(&mut self) -> Result<i64, CalcError> {
        let mut v = self.product()?;
        while let Some(op @ (b'+' | b'-')) = self.peek() {
            self.i += 1;
            let r = self.product()?;
            v = if op == b'+' {
                v.checked_add(r)
            } else {
                v.checked_sub(r)
            }
            .ok_or(CalcError::Overflow)?;
        }
        Ok(v)
    }

    fn product(&mut self) -> Result<i64, CalcError> {
        let mut v = self.factor()?;
        while self.peek() == Some(b'*') {
            self.i += 1;
            v = v.checked_mul(self.factor()?).ok_or(CalcError::Overflow)?;
        }
        Ok(v)
    }

    fn factor(&mut self) -> Result<i64, CalcError> {
        match self.peek() {
            Some(b'-') => {
                self.i += 1;
                self.factor()?.checked_neg().ok_or(CalcError::Overflow)
            }
            Some(b'(') => {
                self.i += 1;
                let v = self.sum()?;
                if self.peek() != Some(b')') {
                    return Err(CalcError::Syntax);
                }
                self.i += 1;
                Ok(v)
            }
            Some(b'0'..=b'9') => {
                let mut v: i64 = 0;
                while let Some(&d @ b'0'..=b'9') = self.s.get(self.i) {
                    v = v
                        .checked_mul(10)
                        .and_then(|v| v.checked_add(i64::from(d - b'0')))
                        .ok_or(CalcError::Overflow)?;
                    self.i += 1;
                }
                Ok(v)
            }
            _ => Err(CalcError::Syntax),
        }
    }
}

/// The message that calls the tool on `expr`: compact JSON, as demonstrations write it.
pub fn call_message(expr: &str) -> String {
    // Written out rather than built as a map, so the key order is fixed whatever serde_json's
    // features are.
    let expr = Value::String(expr.into());
    format!("<tool_call>{{\"name\":\"{TOOL_NAME}\",\"arguments\":{{\"expr\":{expr}}}}}</tool_call>")
}

/// The tool's answer to one call's arguments.
fn run_call(name: &str, arguments: &Value) -> String {
    if name != TOOL_NAME {
        return ERR_TOOL.into();
    }
    // Arguments may come as the JSON text of an object.
    let parsed;
    let args = match arguments {
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(v) => {
                parsed = v;
                &parsed
            }
            Err(_) => return ERR_ARGS.into(),
        },
        v => v,
    };
    match args.get("expr").and_then(Value::as_str) {
        Some(expr) => match evaluate(expr) {
            Ok(v) => v.to_string(),
            Err(e) => e.message().into(),
        },
        None => ERR_ARGS.into(),
    }
}

fn is_integer(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

struct CalculatorEnv {
    answer: String,
    formatted: bool,
    done: bool,
}

impl Env for CalculatorEnv {
    fn step(&mut self, message: &str) -> Result<EnvStep, EnvError> {
        if self.done {
            return Err(EnvError::new("calculator: step after the episode ended"));
        }
        let replies: Vec<String> = match parse_tool_calls(message) {
            Err(_) => vec![ERR_CALL.into()],
            Ok(calls) if calls.is_empty() => {
                self.done = true;
                let answer = message.trim();
                let correct = answer == self.answer;
                return Ok(EnvStep::Done(Score {
                    reward: if correct { 1.0 } else { 0.0 },
                    correct,
                    formatted: self.formatted && is_integer(answer),
                }));
            }
            Ok(calls) if calls.len() > MAX_CALLS => vec![ERR_MANY.into()],
            Ok(calls) => calls
                .iter()
                .map(|c| run_call(&c.function.name, &c.function.arguments))
                .collect(),
        };
        if replies.iter().any(|r| r == ERR_CALL) {
            self.formatted = false;
        }
        Ok(EnvStep::Continue {
            messages: replies.into_iter().map(EnvMessage::tool).collect(),
            reward: None,
        })
    }
}

impl Calculator {
    fn operand(&self, rng: &mut TaskRng) -> i64 {
        match self.difficulty {
            0 | 1 => rng.range(10, 99),
            2 => rng.range(100, 999),
            _ => rng.range(10, 999),
        }
    }

    /// The longest expression this difficulty writes, in characters.
    fn max_expr_chars(&self) -> usize {
        match self.difficulty {
            0 | 1 => "99*99".len(),
            2 => "999*999".len(),
            _ => "(999*999)*999".len(),
        }
    }
}

impl AgentTask for Calculator {
    fn name(&self) -> &str {
        "calculator"
    }

    fn sample(&self, rng: &mut TaskRng) -> Problem {
        let expr = if self.difficulty <= 2 {
            let op = if rng.below(2) == 0 { '+' } else { '*' };
            format!("{}{op}{}", self.operand(rng), self.operand(rng))
        } else {
            let ops = ['+', '-', '*'];
            let (a, b, c) = (self.operand(rng), self.operand(rng), self.operand(rng));
            let (o1, o2) = (ops[rng.below(3) as usize], ops[rng.below(3) as usize]);
            if rng.below(2) == 0 {
                format!("({a}{o1}{b}){o2}{c}")
            } else {
                format!("{a}{o1}{b}{o2}{c}")
            }
        };
        // Operands of at most three digits cannot overflow; 0 would only mark a bug.
        let answer = evaluate(&expr).unwrap_or(0);
        Problem {
            prompt: format!("{expr}=?\n"),
            ground_truth: answer.to_string(),
            data_source: "calculator".into(),
            meta: json!({ "difficulty": self.difficulty, "expr": expr }),
        }
    }

    fn start(&self, problem: &Problem) -> Box<dyn Env> {
        Box::new(CalculatorEnv {
            answer: problem.ground_truth.trim().to_string(),
            formatted: true,
            done: false,
        })
    }

    /// Calls the tool on the prompt's expression, then answers with the value it returned.
    fn demonstration_turn(
        &self,
        problem: &Problem,
        transcript: &[Turn],
        _rng: &mut TaskRng,
    ) -> String {
        let value = transcript.last().and_then(|t| {
            t.reply
                .iter()
                .find(|m| m.role == EnvRole::Tool && is_integer(&m.content))
        });
        match value {
            Some(m) => m.content.clone(),
            None => {
                let prompt = problem.prompt.trim_end();
                call_message(prompt.strip_suffix("=?").unwrap_or(prompt))
            }
        }
    }

    /// The value written out at once, as if computed in the head.
    fn direct_answer(&self, problem: &Problem) -> Option<String> {
        Some(problem.ground_truth.trim().to_string())
    }

    fn problem_count(&self) -> Option<u64> {
        match self.difficulty {
            0 | 1 => Some(90 * 90 * 2),
            2 => Some(900 * 900 * 2),
            _ => None,
        }
    }

    fn alphabet(&self) -> &str {
        "0123456789+-*()=?\n <>/_{}\":,abcdefghijklmnopqrstuvwxyz"
    }

    fn max_turns(&self) -> usize {
        3
    }

    fn max_message_chars(&self) -> usize {
        call_message(&"9".repeat(self.max_expr_chars())).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::render_plain;

    fn task1() -> Calculator {
        Calculator { difficulty: 1 }
    }

    fn problem(expr: &str) -> Problem {
        Problem {
            prompt: format!("{expr}=?\n"),
            ground_truth: evaluate(expr).unwrap().to_string(),
            data_source: "calculator".into(),
            meta: json!({}),
        }
    }

    fn tool_replies(step: EnvStep) -> Vec<String> {
        match step {
            EnvStep::Continue { messages, .. } => {
                assert!(messages.iter().all(|m| m.role == EnvRole::Tool));
                messages.into_iter().map(|m| m.content).collect()
            }
            EnvStep::Done(s) => panic!("ended: {s:?}"),
        }
    }

    #[test]
    fn evaluates_with_precedence_and_reports_errors() {
        assert_eq!(evaluate("37*48"), Ok(1776));
        assert_eq!(evaluate(" 2 + 3*4 "), Ok(14));
        assert_eq!(evaluate("(2+3)*4-30"), Ok(-10));
        assert_eq!(evaluate("-(-5)*-2"), Ok(-10));
        assert_eq!(evaluate("9223372036854775807+1"), Err(CalcError::Overflow));
        assert_eq!(evaluate("99999999999999999999"), Err(CalcError::Overflow));
        assert_eq!(evaluate("3037000500*3037000500"), Err(CalcError::Overflow));
        for bad in ["", "1+", "(1", "1)", "2**3", "1/2", "x", "１", "1 2"] {
            assert_eq!(evaluate(bad), Err(CalcError::Syntax), "{bad:?}");
        }
        assert_eq!(evaluate(&"(".repeat(100)), Err(CalcError::TooLong));
        assert_eq!(evaluate(&"-".repeat(64)), Err(CalcError::Syntax));
    }

    #[test]
    fn tool_calls_get_values_or_error_texts() {
        let task = task1();
        let mut env = task.start(&problem("37*48"));
        let call = |args: &str| {
            format!("<tool_call>{{\"name\":\"calc\",\"arguments\":{args}}}</tool_call>")
        };
        let cases = [
            (call_message("37*48"), vec!["1776"]),
            (call(r#""{\"expr\":\"1+1\"}""#), vec!["2"]),
            (call(r#"{"expr":"1/0"}"#), vec!["error: bad expression"]),
            (
                call(r#"{"expr":"999999999999*999999999"}"#),
                vec!["error: overflow"],
            ),
            (call(r#"{"x":1}"#), vec![ERR_ARGS]),
            (
                "<tool_call>{\"name\":\"sh\"}</tool_call>".into(),
                vec![ERR_TOOL],
            ),
            ("<tool_call>{\"name\":\"calc\"".into(), vec![ERR_CALL]),
            ("<tool_call>not json</tool_call>".into(), vec![ERR_CALL]),
            (call_message("1").repeat(2), vec!["1", "1"]),
            (call_message("1").repeat(5), vec![ERR_MANY]),
        ];
        for (message, want) in cases {
            assert_eq!(tool_replies(env.step(&message).unwrap()), want, "{message}");
        }
        let EnvStep::Done(score) = env.step(" 1776\n").unwrap() else {
            panic!("an answer ends the episode");
        };
        assert!(score.correct && score.reward == 1.0 && !score.formatted);
        assert!(env.step("1").is_err(), "no step after the end");
    }

    #[test]
    fn final_answers_are_scored_strictly() {
        let task = task1();
        let p = problem("12+30");
        for (answer, correct, formatted) in [
            ("42", true, true),
            (" 42 ", true, true),
            ("41", false, true),
            ("42.0", false, false),
            ("", false, false),
            ("🙂", false, false),
            ("the answer is 42", false, false),
        ] {
            let EnvStep::Done(s) = task.start(&p).step(answer).unwrap() else {
                panic!("{answer:?} is a final answer");
            };
            assert_eq!((s.correct, s.formatted), (correct, formatted), "{answer:?}");
            assert_eq!(s.reward, if correct { 1.0 } else { 0.0 });
        }
    }

    #[test]
    fn demonstrations_are_always_correct_short_and_in_the_alphabet() {
        for d in 1..=MAX_DIFFICULTY {
            let task = Calculator { difficulty: d };
            let mut rng = TaskRng::new(d as u64);
            let mut longest = 0;
            for _ in 0..300 {
                let p = task.sample(&mut rng);
                let mut env = task.start(&p);
                let mut transcript: Vec<Turn> = Vec::new();
                let mut text = p.prompt.clone();
                let score = loop {
                    assert!(transcript.len() < task.max_turns(), "{}", p.prompt);
                    let message = task.demonstration_turn(&p, &transcript, &mut rng);
                    assert!(message.len() <= task.max_message_chars(), "{message}");
                    text.push_str(&message);
                    text.push('\n');
                    match env.step(&message).unwrap() {
                        EnvStep::Done(s) => break s,
                        EnvStep::Continue { messages, .. } => {
                            text.push_str(&render_plain(&messages));
                            transcript.push(Turn {
                                message,
                                reply: messages,
                            });
                        }
                    }
                };
                assert!(score.correct && score.formatted, "{text}");
                assert!(
                    text.chars().all(|c| task.alphabet().contains(c)),
                    "{text:?}"
                );
                longest = longest.max(text.len());
            }
            if d == 1 {
                assert!(longest <= 160, "{longest} characters");
            }
        }
    }

    #[test]
    fn a_direct_answer_ends_the_episode_correct_without_a_tool_call() {
        for d in 1..=MAX_DIFFICULTY {
            let task = Calculator { difficulty: d };
            let mut rng = TaskRng::new(d as u64);
            for _ in 0..100 {
                let p = task.sample(&mut rng);
                let answer = task.direct_answer(&p).unwrap();
                assert!(parse_tool_calls(&answer).unwrap().is_empty(), "{answer}");
                match task.start(&p).step(&answer).unwrap() {
                    EnvStep::Done(s) => assert!(s.correct && s.formatted, "{answer}"),
                    other => panic!("{answer}: {other:?}"),
                }
                assert!(answer.chars().all(|c| task.alphabet().contains(c)));
            }
        }
    }

    #[test]
    fn error_texts_are_in_the_alphabet_and_garbage_never_panics() {
        let task = task1();
        let errors = [ERR_CALL, ERR_TOOL, ERR_ARGS, ERR_MANY].into_iter().chain(
            [CalcError::TooLong, CalcError::Syntax, CalcError::Overflow].map(CalcError::message),
        );
        for e in errors {
            assert!(e.chars().all(|c| task.alphabet().contains(c)), "{e}");
        }
        let p = problem("1+1");
        for bad in [
            "<tool_call>",
            "</tool_call>",
            "<tool_call>{}</tool_call>",
            "\u{0}",
            "é🙂",
        ] {
            let _ = task.start(&p).step(bad).unwrap();
        }
    }
}
