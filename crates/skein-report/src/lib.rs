//! What a user sees of a run: `metrics.jsonl` (and TensorBoard event files), a PNG of its
//! curves, progress bars, and the trajectories each step trained on.

mod font;
pub mod metrics;
mod num;
pub mod plot;
pub mod progress;
mod record;
mod run_dir;
mod run_names;
pub mod tensorboard;
pub mod trajectories;

pub use metrics::{read_metrics, MetricsLog};
pub use plot::{
    compare_runs, missing_keys, plot_metrics, plot_run_dir, plot_run_to, COMPARE_PANELS,
    DEFAULT_PANELS,
};
pub use progress::StepProgress;
pub use record::{record, Record};
pub use run_dir::check_run_dir;
pub use run_names::run_names;
