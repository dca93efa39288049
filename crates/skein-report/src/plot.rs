//! A PNG of a run's curves: one titled panel per metric, in a grid, against `step`.

use crate::canvas::{Canvas, Rgb};
use crate::metrics::{read_metrics, Record};
use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

const PANEL_W: i64 = 420;
const PANEL_H: i64 = 260;
const COLS: i64 = 3;
const WHITE: Rgb = [255, 255, 255];
const INK: Rgb = [40, 40, 40];
const GRID: Rgb = [225, 225, 225];
const LINE: Rgb = [31, 119, 180];

/// The curves drawn by default, those a run has.
pub const DEFAULT_KEYS: &[&str] = &[
    "reward/mean",
    "eval/accuracy",
    "reward/accuracy",
    "loss/policy",
    "loss/value",
    "sft/loss",
    "approx_kl",
    "kl_ref",
    "entropy",
    "clip_frac",
    "grad_norm",
    "response_len/mean",
    "throughput/generated_tokens_per_s",
    "time/step_s",
];

/// (x, y) points of `key` against `x_key`, skipping records without it and non-finite values.
fn series(records: &[Record], x_key: &str, key: &str) -> Vec<(f64, f64)> {
    records
        .iter()
        .filter_map(|r| Some((r.get(x_key)?.as_f64()?, r.get(key)?.as_f64()?)))
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect()
}

pub fn plot_metrics(
    records: &[Record],
    keys: &[&str],
    x_key: &str,
    title: &str,
    out_png: &Path,
) -> Result<()> {
    let panels: Vec<(&str, Vec<(f64, f64)>)> = keys
        .iter()
        .map(|k| (*k, series(records, x_key, k)))
        .filter(|(_, s)| !s.is_empty())
        .collect();
    if panels.is_empty() {
        bail!("none of the metrics {keys:?} has a finite value to plot");
    }
    let rows = (panels.len() as i64 + COLS - 1) / COLS;
    let cols = COLS.min(panels.len() as i64);
    let top = 40;
    let mut c = Canvas::new(
        (cols * PANEL_W) as usize,
        (top + rows * PANEL_H) as usize,
        WHITE,
    );
    c.text(12, 12, title, INK, 2);
    for (i, (key, pts)) in panels.iter().enumerate() {
        let (px, py) = (
            (i as i64 % COLS) * PANEL_W,
            top + (i as i64 / COLS) * PANEL_H,
        );
        draw_panel(&mut c, px, py, key, x_key, pts);
    }
    c.save_png(out_png)
}

fn draw_panel(c: &mut Canvas, px: i64, py: i64, key: &str, x_key: &str, pts: &[(f64, f64)]) {
    let (l, r, t, b) = (px + 70, px + PANEL_W - 16, py + 28, py + PANEL_H - 36);
    c.text(
        px + (PANEL_W - Canvas::text_width(key, 1)) / 2,
        py + 10,
        key,
        INK,
        1,
    );
    let (mut x0, mut x1) = min_max(pts.iter().map(|p| p.0));
    let (mut y0, mut y1) = min_max(pts.iter().map(|p| p.1));
    if x1 - x0 < 1e-12 {
        x0 -= 0.5;
        x1 += 0.5;
    }
    let pad = ((y1 - y0) * 0.08).max(y1.abs().max(1e-6) * 0.02);
    y0 -= pad;
    y1 += pad;
    for k in 0..=4 {
        let y = b - (b - t) * k / 4;
        for x in l..=r {
            c.set(x, y, GRID);
        }
        let v = y0 + (y1 - y0) * k as f64 / 4.0;
        let label = fmt_num(v);
        c.text(l - 6 - Canvas::text_width(&label, 1), y - 4, &label, INK, 1);
    }
    c.rect(l, t, r, b, INK);
    let (xl, xr) = (fmt_num(x0), fmt_num(x1));
    c.text(l, b + 6, &xl, INK, 1);
    c.text(r - Canvas::text_width(&xr, 1), b + 6, &xr, INK, 1);
    c.text(
        (l + r - Canvas::text_width(x_key, 1)) / 2,
        b + 20,
        x_key,
        INK,
        1,
    );
    let map = |(x, y): (f64, f64)| {
        (
            l + ((x - x0) / (x1 - x0) * (r - l) as f64).round() as i64,
            b - ((y - y0) / (y1 - y0) * (b - t) as f64).round() as i64,
        )
    };
    for w in pts.windows(2) {
        c.line(map(w[0]), map(w[1]), LINE, 2);
    }
    if pts.len() <= 2 {
        for &p in pts {
            let (x, y) = map(p);
            c.line((x - 2, y), (x + 2, y), LINE, 4);
        }
    }
}

fn min_max(it: impl Iterator<Item = f64>) -> (f64, f64) {
    it.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
        (a.min(v), b.max(v))
    })
}

fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(1e-3..1e5).contains(&a) {
        format!("{v:.1e}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

/// Reads `dir/metrics.jsonl` and writes `dir/plot.png` (default keys: those of `DEFAULT_KEYS`
/// the run has).
pub fn plot_run_dir(dir: &Path, keys: Option<&[&str]>) -> Result<PathBuf> {
    let records = read_metrics(&dir.join("metrics.jsonl"))?;
    let out = dir.join("plot.png");
    let title = format!("skein run: {}", dir.display());
    plot_metrics(&records, keys.unwrap_or(DEFAULT_KEYS), "step", &title, &out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn writes_a_png_with_one_panel_per_present_metric() {
        let records: Vec<Record> = (0..20)
            .map(|s| {
                let serde_json::Value::Object(m) = json!({"step": s, "reward/mean": (s as f64 / 5.0).sin(), "loss/policy": f64::NAN}) else { unreachable!() };
                m
            })
            .collect();
        let out = std::env::temp_dir().join(format!("skein-plot-{}.png", std::process::id()));
        plot_metrics(
            &records,
            &["reward/mean", "loss/policy", "missing"],
            "step",
            "test",
            &out,
        )
        .unwrap();
        let decoder =
            png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&out).unwrap()));
        let reader = decoder.read_info().unwrap();
        let info = reader.info();
        // Only reward/mean has finite values: one panel.
        assert_eq!(
            (info.width, info.height),
            (PANEL_W as u32, 40 + PANEL_H as u32)
        );
        std::fs::remove_file(&out).ok();
        let mut c = Canvas::new(50, 50, WHITE);
        c.line((0, 0), (49, 49), LINE, 1);
        assert_eq!(c.pixel(25, 25), LINE);
        assert_eq!(c.pixel(10, 40), WHITE);
    }

    #[test]
    fn nothing_to_plot_is_an_error() {
        let out = std::env::temp_dir().join("skein-never.png");
        assert!(plot_metrics(&[], &["x"], "step", "t", &out).is_err());
    }
}
