//! What a user sees of a run: `metrics.jsonl`, a PNG of its curves, and progress bars.

mod canvas;
pub mod metrics;
pub mod plot;
pub mod progress;

pub use metrics::{read_metrics, MetricsLog, Record};
pub use plot::{plot_metrics, plot_run_dir};
pub use progress::StepProgress;
