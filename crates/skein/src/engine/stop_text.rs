//! A request's own test for "its text has reached a stop string", run by the engine after
//! each token it samples, so generation ends there instead of running on to a stop id or the
//! token limit. The engine knows ids only; the caller, who knows the tokenizer, supplies the
//! test.

use std::fmt;
use std::sync::Arc;

/// Whether the tokens a request generated in this call (`resumed` ones not included) end its
/// completion. It must answer yes only when the completion's text holds one of the stop
/// strings: the engine then finishes the request with [`Finish::Stop`](super::Finish), and
/// the caller cuts the completion at the exact token.
#[derive(Clone)]
pub struct StopText(Arc<Reached>);

/// The test itself, given the tokens generated so far.
type Reached = dyn Fn(&[u32]) -> bool + Send + Sync;

impl StopText {
    pub fn new(reached: impl Fn(&[u32]) -> bool + Send + Sync + 'static) -> Self {
        StopText(Arc::new(reached))
    }

    pub fn reached(&self, generated: &[u32]) -> bool {
        (self.0)(generated)
    }
}

impl fmt::Debug for StopText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StopText")
    }
}
