//! `skein view`: a local web server with one page for reading runs. It draws the runs' curves
//! (`metrics.jsonl`), lists a step's trajectories (`trajectories/step-N.jsonl.zst`) to sort and
//! filter, shows one token by token, coloured by what trained it and how, and the samples of
//! its prompt side by side. The page is a single static file; the data comes from a small JSON
//! API beside it.

pub mod marks;
mod routes;
pub mod runs;
mod server;
pub mod summary;

pub use routes::PAGE;
pub use server::{bind, serve, Server};
#[doc(hidden)]
pub mod fixture;
