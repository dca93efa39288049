//! Progress of long work: a live bar on a terminal, periodic plain lines otherwise (CI logs).

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::Instant;

pub struct StepProgress {
    bar: Option<ProgressBar>,
    total: u64,
    start: Instant,
    every: u64,
}

impl StepProgress {
    pub fn new(total: u64) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::new(total);
            b.set_style(
                ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} [{elapsed_precise} < {eta_precise}] {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b
        });
        StepProgress {
            bar,
            total,
            start: Instant::now(),
            every: (total / 10).max(1),
        }
    }

    pub fn update(&mut self, step: u64, values: &[(&str, f64)]) {
        let msg = values
            .iter()
            .map(|(k, v)| format!("{k} {v:.3}"))
            .collect::<Vec<_>>()
            .join("  ");
        match &self.bar {
            Some(b) => {
                b.set_position(step);
                b.set_message(msg);
            }
            None if step.is_multiple_of(self.every) || step == self.total => {
                let elapsed = self.start.elapsed().as_secs_f64();
                let eta = elapsed / step.max(1) as f64 * self.total.saturating_sub(step) as f64;
                eprintln!(
                    "step {step}/{} [{elapsed:.0}s, eta {eta:.0}s] {msg}",
                    self.total
                );
            }
            None => {}
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish();
        }
    }
}
