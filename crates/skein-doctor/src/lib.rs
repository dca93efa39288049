//! Names RL's known failure modes while a run happens: each rule reads a window of steps —
//! the metrics of `metrics.jsonl` and a digest of each step's trajectories — and, when it
//! holds, says what it saw (numbers, steps, example trajectories) and what to try (config
//! keys). The trainer asks after every step and announces a diagnosis once, when it starts;
//! `skein doctor` and `skein view` read the same findings back.
//!
//! | file | job |
//! | --- | --- |
//! | `step.rs` | one step as the rules see it ([`StepView`]) |
//! | `summaries.rs` | what the rules keep of the steps before the window: running summaries, folded as each step is done |
//! | `history.rs` | the window of steps the rules read, with the few lookups they need, and the summaries of the steps before it ([`History`]) |
//! | `digest.rs` | what a rule needs of one trajectory ([`Digest`]) |
//! | `diagnosis.rs` | a finding as a person reads it ([`Diagnosis`]) |
//! | `rules/` | one file per family of failure, each rule a pure function of the history |
//! | `doctor.rs` | runs the rules step by step and keeps which diagnoses hold ([`Doctor`]) |
//! | `log.rs` | `RUN_DIR/diagnoses.jsonl` |
//! | `lines.rs` | JSON-lines files read with bounded memory |
//! | `run_dir.rs` | diagnoses a run directory after the fact (bounded reads) |

pub mod diagnosis;
pub mod digest;
pub mod doctor;
pub mod history;
mod lines;
pub mod log;
pub mod rules;
pub mod run_dir;
pub mod step;
pub mod summaries;

pub use diagnosis::{Diagnosis, Example};
pub use digest::{Digest, Outcome};
pub use doctor::Doctor;
pub use history::History;
pub use log::{read_diagnoses, DiagnosisLog, FILE};
pub use run_dir::{diagnose_run_dir, replay, Replayed, RunDiagnoses};
pub use step::StepView;
