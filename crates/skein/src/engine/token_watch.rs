//! A request's own watcher of its tokens, asked by the engine after each token it samples:
//! it may end the completion there. A served request's `stop` strings end it at the token
//! whose text completes one, instead of running on to a stop id or the token limit; a
//! streamed request passes each token on to its client, and ends when the client has gone.
//! The engine knows ids only; the caller, who knows the tokenizer and the client, supplies
//! the watcher.

use std::fmt;
use std::sync::Arc;

/// Whether the tokens a request generated in this call (`resumed` ones not included) end its
/// completion. It must answer yes only when the completion's text holds one of its stop
/// strings, or when no one is left to read the completion: the engine then finishes the
/// request with [`Finish::Stop`](super::Finish), and the caller cuts the completion at the
/// exact token.
#[derive(Clone)]
pub struct TokenWatch(Arc<Ends>);

/// The watcher itself, given the tokens generated so far.
type Ends = dyn Fn(&[u32]) -> bool + Send + Sync;

impl TokenWatch {
    pub fn new(ends: impl Fn(&[u32]) -> bool + Send + Sync + 'static) -> Self {
        TokenWatch(Arc::new(ends))
    }

    /// Whether the completion ends at its last token, `generated` being all of its tokens.
    pub fn ends(&self, generated: &[u32]) -> bool {
        (self.0)(generated)
    }
}

impl fmt::Debug for TokenWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenWatch")
    }
}
