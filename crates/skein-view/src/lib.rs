//! `skein view`: a local web server with one page for reading runs. It draws the runs' curves
//! (`metrics.jsonl`), lists a step's trajectories (`trajectories/step-N.jsonl.zst`) to sort and
//! filter, shows one token by token, coloured by what trained it and how, and the samples of
//! its prompt side by side, and lists the failure modes the run named while it trained
//! (`diagnoses.jsonl`), marking their steps on the curves. The page is a single static file;
//! the data comes from a small JSON API beside it.

mod cache;
pub mod limits;
mod lines;
pub mod marks;
mod metrics;
mod routes;
pub mod runs;
mod server;
mod step_file;
pub mod summary;

pub use limits::Limits;
pub use routes::PAGE;
pub use server::{bind, bind_within, serve, Server};
#[doc(hidden)]
pub mod fixture;
