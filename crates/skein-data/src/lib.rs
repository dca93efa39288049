//! Datasets: JSONL and verl-layout parquet prompt files, read and validated row by row, and a
//! seeded, resumable sampler over them. No tokenizer and no tensors: the trainer renders and
//! measures prompts; this crate guarantees every row it hands over is well formed, and that a
//! row which is not is either an error naming its file and row or a counted skip.
//!
//! A prompt row has the verl layout, in JSONL or parquet alike:
//!
//! ```json
//! {"prompt": [{"role": "user", "content": "2+3="}], "data_source": "arithmetic",
//!  "reward_model": {"ground_truth": "5"}, "extra_info": {"index": 0}}
//! ```
//!
//! `prompt` may also be a plain string (one user message); `extra_info` is optional.

pub mod chat;
mod error;
pub mod jsonl;
pub mod length;
pub mod load;
pub mod parquet;
pub mod row;
pub mod rows;
pub mod sampler;

pub use chat::{load_conversations, Conversation};
pub use error::DataError;
pub use length::{fit, Fit, Truncation};
pub use load::{load, Loaded};
pub use row::{ChatMessage, PromptRow};
pub use rows::{ReadOptions, RowPlace, Rows};
pub use sampler::Sampler;
