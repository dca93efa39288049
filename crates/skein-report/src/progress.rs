//! Progress of long work: a live bar when stderr is a terminal; otherwise (CI, `2> log`) plain
//! periodic lines, since a redrawn bar turns a log file into noise.

use crate::num::compact;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Plain-line mode writes at most about this often, besides every tenth of the run and its end.
const LINE_EVERY: Duration = Duration::from_secs(30);

pub struct StepProgress {
    bar: Option<ProgressBar>,
    /// What is counted: "step", or e.g. "sample" for an evaluation's answers.
    unit: &'static str,
    total: u64,
    /// Steps done before this process started (a resumed run's checkpoint): the time per step,
    /// hence the ETA, counts only the steps this process has done.
    done_before: u64,
    /// Units this process must have done before an ETA is shown ([`eta_after`]).
    eta_after: u64,
    start: Instant,
    /// Plain-line mode: the tenth of the run last reported, and when.
    last_decile: u64,
    last_line: Instant,
}

impl StepProgress {
    /// A bar over `total` steps on a terminal, periodic lines on stderr otherwise.
    pub fn new(total: u64) -> Self {
        Self::resumed(total, 0)
    }

    /// As [`StepProgress::new`] for a run that had done `done_before` of its steps when it
    /// started here (resumed from a checkpoint).
    pub fn resumed(total: u64, done_before: u64) -> Self {
        Self::with_bar(total, done_before, std::io::stderr().is_terminal(), "step")
    }

    /// As [`StepProgress::new`], counting `unit`s (e.g. "sample") instead of steps. Such units
    /// are worked on together (an evaluation's samples share the engine's batch), so the first
    /// to end took about as long as most: no ETA is shown before a tenth of them (at least
    /// [`MIN_UNITS_FOR_ETA`]) are done.
    pub fn counting(total: u64, unit: &'static str) -> Self {
        let mut p = Self::with_bar(total, 0, std::io::stderr().is_terminal(), unit);
        p.eta_after = eta_after(total);
        if let Some(b) = &p.bar {
            b.set_style(bar_style(0, p.eta_after));
        }
        p
    }

    fn with_bar(total: u64, done_before: u64, bar: bool, unit: &'static str) -> Self {
        let bar = bar.then(|| {
            let b = ProgressBar::new(total);
            b.set_style(bar_style(done_before, 1));
            b.set_prefix(unit);
            // The bar's rate starts from here, not from 0 steps in no time.
            b.set_position(done_before);
            b.reset_eta();
            b
        });
        let now = Instant::now();
        StepProgress {
            bar,
            unit,
            total,
            done_before,
            eta_after: 1,
            start: now,
            last_decile: done_before.saturating_mul(10) / total.max(1),
            last_line: now,
        }
    }

    /// Step `step` (of `total`) is done; `values` are shown beside it, e.g.
    /// `&[("reward", 0.53), ("tok/s", 812.0)]`.
    pub fn update(&mut self, step: u64, values: &[(&str, f64)]) {
        let msg = format_values(values);
        if let Some(b) = &self.bar {
            b.set_position(step);
            b.set_message(msg);
            return;
        }
        if self.line_due(step) {
            let done_here = step.saturating_sub(self.done_before);
            let elapsed = self.start.elapsed();
            let eta = eta_text(step, self.total, done_here, self.eta_after, elapsed);
            let line = log_line(self.unit, step, self.total, elapsed, &eta, &msg);
            eprintln!("{line}");
        }
    }

    /// Plain-line mode: the first step, each new tenth of the run, the last step, and at least
    /// every `LINE_EVERY` between, so a slow run still shows it is alive.
    fn line_due(&mut self, step: u64) -> bool {
        let decile = step.saturating_mul(10) / self.total.max(1);
        let due = step == self.done_before + 1
            || step >= self.total
            || decile > self.last_decile
            || self.last_line.elapsed() >= LINE_EVERY;
        if due {
            self.last_decile = decile;
            self.last_line = Instant::now();
        }
        due
    }

    /// Leaves the finished bar on screen (plain-line mode has already written the last step).
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish();
        }
    }

    /// A line on stderr above a live bar (which a plain `eprintln!` would tear).
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(b) => b.suspend(|| eprintln!("{line}")),
            None => eprintln!("{line}"),
        }
    }
}

fn format_values(values: &[(&str, f64)]) -> String {
    values
        .iter()
        .map(|(k, v)| format!("{k} {}", compact(*v)))
        .collect::<Vec<_>>()
        .join("  ")
}

/// Counted units (see [`StepProgress::counting`]) done before an ETA means something.
pub const MIN_UNITS_FOR_ETA: u64 = 3;

/// The units done here before a counted run shows an ETA: a tenth of `total`, at least
/// [`MIN_UNITS_FOR_ETA`].
fn eta_after(total: u64) -> u64 {
    total.div_ceil(10).max(MIN_UNITS_FOR_ETA)
}

/// The bar's look; its ETA is [`eta_text`]'s, as the plain lines give it.
fn bar_style(done_before: u64, eta_after: u64) -> ProgressStyle {
    let eta = move |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
        let (step, total) = (state.pos(), state.len().unwrap_or(0));
        let done_here = step.saturating_sub(done_before);
        let _ = w.write_str(&eta_text(
            step,
            total,
            done_here,
            eta_after,
            state.elapsed(),
        ));
    };
    ProgressStyle::with_template(
        "{prefix} {pos}/{len} {bar:30.cyan/blue} {elapsed} elapsed, eta {skein_eta}  {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .with_key("skein_eta", eta)
    .progress_chars("█▉▊▋▌▍▎▏ ")
}

/// The time left at `step` of `total`, from the `done_here` units that took `elapsed`; `?`
/// until `eta_after` of them (or all) are done.
fn eta_text(step: u64, total: u64, done_here: u64, eta_after: u64, elapsed: Duration) -> String {
    if done_here == 0 || (done_here < eta_after && step < total) {
        return "?".to_string();
    }
    let per_step = elapsed.as_secs_f64() / done_here as f64;
    duration(per_step * total.saturating_sub(step) as f64)
}

/// `step 40/200 (20%) 1m05s elapsed, eta 4m20s  reward 0.53  tok/s 812` (`unit` "step").
fn log_line(unit: &str, step: u64, total: u64, elapsed: Duration, eta: &str, msg: &str) -> String {
    let pct = (step.min(total) * 100).checked_div(total).unwrap_or(100);
    let line = format!(
        "{unit} {step}/{total} ({pct}%) {} elapsed, eta {eta}",
        duration(elapsed.as_secs_f64())
    );
    if msg.is_empty() {
        line
    } else {
        format!("{line}  {msg}")
    }
}

fn duration(secs: f64) -> String {
    let s = secs.round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_show_step_eta_and_values() {
        let elapsed = Duration::from_secs(65);
        let line = log_line(
            "step",
            40,
            200,
            elapsed,
            &eta_text(40, 200, 40, 1, elapsed),
            &format_values(&[("reward", 0.53), ("tok/s", 812.0)]),
        );
        // 65 s for 40 steps: 1.625 s a step, 160 steps to go.
        assert_eq!(
            line,
            "step 40/200 (20%) 1m05s elapsed, eta 4m20s  reward 0.53  tok/s 812"
        );
        assert_eq!(
            log_line(
                "sample",
                0,
                0,
                Duration::ZERO,
                &eta_text(0, 0, 0, 1, Duration::ZERO),
                ""
            ),
            "sample 0/0 (100%) 0s elapsed, eta ?"
        );
        assert_eq!(duration(7322.0), "2h02m");
    }

    /// A run resumed at step 151 of 200 that took 50 s for its first 10 steps here has 40
    /// steps of 5 s to go, not 40 of 50 s / 160.
    #[test]
    fn a_resumed_run_times_only_the_steps_it_did() {
        let elapsed = Duration::from_secs(50);
        let eta = eta_text(160, 200, 10, 1, elapsed);
        let line = log_line("step", 160, 200, elapsed, &eta, "");
        assert_eq!(line, "step 160/200 (80%) 50s elapsed, eta 3m20s");
        let mut p = StepProgress::with_bar(100, 50, false, "step");
        let reported: Vec<u64> = (51..=100).filter(|&s| p.line_due(s)).collect();
        assert_eq!(reported, vec![51, 60, 70, 80, 90, 100]);
        let mut bar = StepProgress::with_bar(100, 50, true, "step");
        bar.update(51, &[]);
        assert_eq!(bar.bar.as_ref().map(|b| b.position()), Some(51));
        let samples = StepProgress::with_bar(8, 0, true, "sample");
        assert_eq!(samples.bar.map(|b| b.prefix()).as_deref(), Some("sample"));
    }

    /// An evaluation's first sample ended after 1 s of an 11 s batch: 1 s × 99 samples is no
    /// estimate. Counted units show an ETA from a tenth of them on; steps from the first.
    #[test]
    fn counted_units_show_no_eta_from_the_first_few() {
        let second = Duration::from_secs(1);
        assert_eq!(eta_after(100), 10);
        assert_eq!(eta_after(8), MIN_UNITS_FOR_ETA);
        assert_eq!(eta_text(1, 100, 1, eta_after(100), second), "?");
        assert_eq!(eta_text(9, 100, 9, eta_after(100), second * 9), "?");
        assert_eq!(eta_text(10, 100, 10, eta_after(100), second * 10), "1m30s");
        // A run shorter than the threshold still ends with an ETA of 0.
        assert_eq!(eta_text(2, 2, 2, eta_after(2), second), "0s");
        assert_eq!(eta_text(1, 100, 1, 1, second), "1m39s");
        let samples = StepProgress::with_bar(100, 0, false, "sample");
        assert_eq!(samples.eta_after, 1);
        let counted = StepProgress::counting(100, "sample");
        assert_eq!(counted.eta_after, 10);
    }

    #[test]
    fn plain_mode_reports_each_tenth_once() {
        let mut p = StepProgress::with_bar(100, 0, false, "step");
        let reported: Vec<u64> = (1..=100).filter(|&s| p.line_due(s)).collect();
        assert_eq!(reported, vec![1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]);
        // A long quiet stretch is reported even within a tenth.
        p.last_line = Instant::now() - LINE_EVERY;
        assert!(p.line_due(95));
        p.update(100, &[("x", 1.0)]);
        p.finish();
    }
}
