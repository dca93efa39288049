//! The text side of a Hugging Face model directory: tokenizer, chat template and generation
//! config.
//!
//! Text becomes token ids once, when a prompt is built; ids become text only for reward programs
//! and display. Nothing here is on the path from sampled ids to the gradient, so nothing is ever
//! detokenized and retokenized (the promise "token in, token out", docs/design.md).

mod chat_template;
mod generation_config;
mod json_file;
mod special_texts;
mod tokenizer;
mod tool_calls;
mod unknown_chars;

pub use chat_template::{ChatTemplate, FunctionCall, Message, ToolCall};
pub use generation_config::{GenerationConfig, TokenIds};
pub use special_texts::{SpecialTexts, SpelledSpecials};
pub use tokenizer::{leading_special_ids, Tokenizer};
pub use tool_calls::{parse_tool_calls, strip_tool_calls, ToolCallError, OPEN as TOOL_CALL_OPEN};
pub use unknown_chars::{UnknownChars, UNKNOWN_EXAMPLES};
