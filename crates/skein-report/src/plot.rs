//! A PNG of a run's curves: one titled panel per metric (or group of metrics), in a grid,
//! against `step`.
//!
//! A panel spec is a metric key, or several joined by `|` to share one panel
//! (`"reward/mean|eval/accuracy"`). Keys are plain strings: `/` has no meaning.

use crate::metrics::read_metrics;
use crate::num;
use crate::record::Record;
use anyhow::{anyhow, bail, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

const PANEL_W: u32 = 460;
const PANEL_H: u32 = 300;
const TITLE_H: u32 = 44;
const FONT: &str = "sans-serif";
/// The most panels one PNG holds: 22 rows of three, about 28 MB of pixels while drawing.
pub const MAX_PANELS: usize = 64;
/// Colour-blind-friendly line colours (the first one for the main series of each panel).
const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// The panels drawn by default; each shows those of its metrics a run has. The warm-up's
/// (`sft/…`, against warm-up steps) come first, then RL's (against RL steps), held-out
/// accuracy leading each. Failures are drawn only by a run that had some
/// ([`FAILURES_PANEL`]); agents' turns and tool calls, and partial rollout's staleness, by
/// runs that log them.
pub const DEFAULT_PANELS: &[&str] = &[
    "sft/eval_accuracy",
    "sft/loss",
    "eval/accuracy",
    "reward/mean|reward/accuracy",
    FAILURES_PANEL,
    "agent/tool_calls_mean|agent/turns_mean|eval/turns_mean",
    "staleness/mean|staleness/max",
    "loss/policy",
    "loss/value",
    "approx_kl|kl_ref",
    "entropy",
    "grad_norm",
    "clip_frac|clip_frac/sequence",
    "is/masked_tokens|is/masked_rows|is/weighted_rows",
    "response_len/mean",
    "throughput/trained_tokens_per_s|throughput/generated_tokens_per_s",
    "time/step_s",
];

/// Failed trajectories of each step and failed answers of each evaluation: logged as 0 by
/// every healthy run, so the default plot draws them only where one is above 0.
pub const FAILURES_PANEL: &str = "batch/failed_trajectories|eval/failed";

/// [`DEFAULT_PANELS`] less [`FAILURES_PANEL`] when nothing in `records` failed.
fn default_panels(records: &[Record]) -> Vec<&'static str> {
    let failed = FAILURES_PANEL.split('|').any(|k| {
        records
            .iter()
            .any(|r| r.get(k).and_then(|v| v.as_f64()).is_some_and(|v| v > 0.0))
    });
    DEFAULT_PANELS
        .iter()
        .copied()
        .filter(|spec| failed || *spec != FAILURES_PANEL)
        .collect()
}

/// One curve: a metric's finite values against the x key.
struct Series {
    key: String,
    points: Vec<(f64, f64)>,
}

/// (x, y) points of `key` against `x_key`, skipping records without either and non-finite
/// values (a NaN loss must not take the plot down with it).
fn series(records: &[Record], x_key: &str, key: &str) -> Vec<(f64, f64)> {
    records
        .iter()
        .filter_map(|r| Some((r.get(x_key)?.as_f64()?, r.get(key)?.as_f64()?)))
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect()
}

/// The panels that have data: each spec's present series, specs with none dropped.
fn panels(records: &[Record], specs: &[&str], x_key: &str) -> Vec<Vec<Series>> {
    specs
        .iter()
        .map(|spec| {
            spec.split('|')
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .map(|k| Series {
                    key: k.to_string(),
                    points: series(records, x_key, k),
                })
                .filter(|s| !s.points.is_empty())
                .collect::<Vec<_>>()
        })
        .filter(|p| !p.is_empty())
        .collect()
}

/// Columns of the panel grid: one row up to three panels, 2×2 for four, then rows of three.
fn grid(n: usize) -> (usize, usize) {
    let cols = match n {
        0..=3 => n.max(1),
        4 => 2,
        _ => 3,
    };
    (n.div_ceil(cols).max(1), cols)
}

/// Draws one panel per spec in `keys` (missing metrics skipped, `|` joins several metrics in
/// one panel) against `x_key`, and writes the PNG to `out_png`. An error if no metric has a
/// finite value.
pub fn plot_metrics(
    records: &[Record],
    keys: &[&str],
    x_key: &str,
    title: &str,
    out_png: &Path,
) -> Result<()> {
    let panels = panels(records, keys, x_key);
    if panels.is_empty() {
        bail!("none of the metrics {keys:?} has a finite value against `{x_key}` to plot");
    }
    if panels.len() > MAX_PANELS {
        bail!(
            "{} panels have data to draw; one plot holds at most {MAX_PANELS}: pass fewer `--keys`",
            panels.len()
        );
    }
    crate::font::register()?;
    let (rows, cols) = grid(panels.len());
    let (w, h) = (cols as u32 * PANEL_W, TITLE_H + rows as u32 * PANEL_H);
    let mut rgb = vec![255u8; (w * h * 3) as usize];
    draw(&mut rgb, (w, h), &panels, (rows, cols), x_key, title)
        .map_err(|e| anyhow!("drawing {}: {e}", out_png.display()))?;
    write_png(out_png, (w, h), &rgb)
}

fn draw(
    rgb: &mut [u8],
    size: (u32, u32),
    panels: &[Vec<Series>],
    grid: (usize, usize),
    x_key: &str,
    title: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::with_buffer(rgb, size).into_drawing_area();
    root.fill(&WHITE)?;
    let (head, body) = root.split_vertically(TITLE_H);
    head.draw_text(
        title,
        &TextStyle::from((FONT, 22).into_font().style(FontStyle::Bold)).color(&BLACK),
        (14, 12),
    )?;
    let cells = body.split_evenly(grid);
    for (cell, panel) in cells.iter().zip(panels) {
        draw_panel(cell, panel, x_key)?;
    }
    root.present()?;
    Ok(())
}

/// A range that always has width: a single point or a flat curve gets a margin around it.
fn padded(lo: f64, hi: f64, frac: f64) -> (f64, f64) {
    let span = hi - lo;
    if span > 0.0 {
        (lo - span * frac, hi + span * frac)
    } else {
        let m = (lo.abs() * 0.1).max(0.5);
        (lo - m, hi + m)
    }
}

/// One axis of a panel: values are drawn divided by `scale`, and tick labels multiply it back.
/// The scale is 1 unless the axis range would not fit in an f64 (values such as ±9e307, whose
/// difference overflows): plotters needs a finite width to place its ticks.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Axis {
    lo: f64,
    hi: f64,
    scale: f64,
}

/// The drawing range of finite values `lo..=hi`, widened by `widen` (a margin).
fn axis(lo: f64, hi: f64, widen: impl Fn(f64, f64) -> (f64, f64)) -> Axis {
    let fits = |(a, b): (f64, f64)| a.is_finite() && b.is_finite() && (b - a).is_finite();
    let (a, b) = widen(lo, hi);
    if fits((a, b)) {
        return Axis {
            lo: a,
            hi: b,
            scale: 1.0,
        };
    }
    // A power of two divides exactly, and a quarter of the largest f64 leaves room for any
    // margin below half the width.
    let scale = 4.0;
    let (a, b) = widen(lo / scale, hi / scale);
    debug_assert!(fits((a, b)), "{lo}..{hi} widened to {a}..{b}");
    Axis {
        lo: a,
        hi: b,
        scale,
    }
}

impl Axis {
    fn place(&self, v: f64) -> f64 {
        v / self.scale
    }

    fn width(&self) -> f64 {
        self.hi - self.lo
    }
}

fn bounds<'a>(pts: impl Iterator<Item = &'a f64>) -> (f64, f64) {
    pts.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| {
        (a.min(v), b.max(v))
    })
}

/// A spacing no wider than the one plotters gives `n` ticks over `span`, to choose label
/// decimals. Plotters may space ticks up to 2.5 times closer than `span / n` (0.005 where 0.04
/// is split six ways), and labels with too few decimals then repeat ("-0.01, -0.01").
fn tick_step(span: f64, n: usize) -> f64 {
    let raw = span / n as f64 / 2.5;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

fn draw_panel(
    area: &DrawingArea<BitMapBackend, Shift>,
    panel: &[Series],
    x_key: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let (x0, x1) = bounds(panel.iter().flat_map(|s| s.points.iter().map(|p| &p.0)));
    let (y0, y1) = bounds(panel.iter().flat_map(|s| s.points.iter().map(|p| &p.1)));
    // One step on its own gets a whole step either side, so the axis keeps whole-step ticks.
    let x = axis(x0, x1, |lo, hi| {
        if hi > lo {
            (lo, hi)
        } else {
            (lo - 1.0, hi + 1.0)
        }
    });
    let y = axis(y0, y1, |lo, hi| padded(lo, hi, 0.06));
    let (x_step, y_step) = (tick_step(x.width(), 6), tick_step(y.width(), 6));
    let placed: Vec<Vec<(f64, f64)>> = panel
        .iter()
        .map(|s| {
            s.points
                .iter()
                .map(|&(px, py)| (x.place(px), y.place(py)))
                .collect()
        })
        .collect();
    let caption = match panel {
        [only] => format!("{}  (last {})", only.key, last(only)),
        // Several runs' lines of one metric (`key (run)`) are captioned once, by the metric.
        _ => {
            let mut names: Vec<&str> = Vec::new();
            for s in panel {
                let metric = s.key.split(" (").next().unwrap_or(&s.key);
                if !names.contains(&metric) {
                    names.push(metric);
                }
            }
            names.join(", ")
        }
    };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 16).into_font().color(&BLACK))
        .margin(10)
        .margin_right(20)
        .x_label_area_size(38)
        .y_label_area_size(56)
        .build_cartesian_2d(x.lo..x.hi, y.lo..y.hi)?;
    chart
        .configure_mesh()
        .x_labels(6)
        .y_labels(6)
        .x_desc(x_desc(panel, x_key))
        .x_label_formatter(&|v| num::tick(*v * x.scale, x_step * x.scale))
        .y_label_formatter(&|v| num::tick(*v * y.scale, y_step * y.scale))
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .bold_line_style(RGBColor(228, 228, 228))
        .light_line_style(TRANSPARENT)
        .axis_style(RGBColor(90, 90, 90))
        .draw()?;
    for (i, (s, points)) in panel.iter().zip(&placed).enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let line = chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                colour.stroke_width(2),
            ))?
            .label(format!("{} ({})", s.key, last(s)));
        line.legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], colour.stroke_width(2)));
        // Sparse series (evaluations every N steps, a single point) are unreadable as lines alone.
        if points.len() <= 40 {
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled())))?;
        }
    }
    if panel.len() > 1 {
        chart
            .configure_series_labels()
            .label_font((FONT, 12))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 200, 200))
            .position(emptiest_corner(&placed, x, y))
            .draw()?;
    }
    Ok(())
}

/// The x axis's name: a run logs its warm-up (`sft/…` metrics) and its RL steps with their own
/// step numbers, so a panel says which it counts.
fn x_desc(panel: &[Series], x_key: &str) -> String {
    if x_key != "step" {
        x_key.to_string()
    } else if panel.iter().all(|s| s.key.starts_with("sft/")) {
        "warm-up step".into()
    } else {
        "RL step".into()
    }
}

/// The legend goes in the corner with the fewest points under it, so it hides little data.
fn emptiest_corner(placed: &[Vec<(f64, f64)>], x: Axis, y: Axis) -> SeriesLabelPosition {
    use SeriesLabelPosition::*;
    let mut counts = [
        (0usize, UpperRight),
        (0, LowerRight),
        (0, UpperLeft),
        (0, LowerLeft),
    ];
    for &(px, py) in placed.iter().flatten() {
        let (fx, fy) = ((px - x.lo) / x.width(), (py - y.lo) / y.width());
        // A legend covers roughly the outer 45% by 35% of a panel.
        let (right, left, top, bottom) = (fx > 0.55, fx < 0.45, fy > 0.65, fy < 0.35);
        for (hit, slot) in [
            (right && top, 0),
            (right && bottom, 1),
            (left && top, 2),
            (left && bottom, 3),
        ] {
            counts[slot].0 += hit as usize;
        }
    }
    counts
        .into_iter()
        .min_by_key(|(n, _)| *n)
        .map(|(_, pos)| pos)
        .unwrap_or(UpperRight)
}

fn last(s: &Series) -> String {
    s.points
        .last()
        .map(|p| num::compact(p.1))
        .unwrap_or_default()
}

fn write_png(path: &Path, (w, h): (u32, u32), rgb: &[u8]) -> Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc
        .write_header()
        .with_context(|| format!("writing {}", path.display()))?;
    writer
        .write_image_data(rgb)
        .and_then(|_| writer.finish())
        .with_context(|| format!("writing {}", path.display()))
}

/// Reads `dir/metrics.jsonl` and writes `dir/plot.png` beside it. `keys` are panel specs as for
/// [`plot_metrics`]; `None` draws those of [`DEFAULT_PANELS`] the run has ([`default_panels`]).
pub fn plot_run_dir(dir: &Path, keys: Option<&[&str]>) -> Result<PathBuf> {
    let out = dir.join("plot.png");
    plot_run_to(dir, keys, &out)?;
    Ok(out)
}

/// [`plot_run_dir`]'s figure of the run in `dir`, written to `out` instead.
pub fn plot_run_to(dir: &Path, keys: Option<&[&str]>, out: &Path) -> Result<()> {
    let records = read_metrics(&dir.join("metrics.jsonl"))?;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| dir.display().to_string());
    let warm_up = records
        .iter()
        .filter(|r| r.contains_key("sft/loss"))
        .count();
    let rl = records
        .iter()
        .filter(|r| !r.contains_key("sft/loss"))
        .filter_map(|r| r.get("step")?.as_u64())
        .max()
        .unwrap_or(0);
    let title = format!("skein run {name}  ({warm_up} warm-up steps, {rl} RL steps)");
    let defaults = default_panels(&records);
    plot_metrics(&records, keys.unwrap_or(&defaults), "step", &title, out)
}

/// Panels `compare_runs` draws when given none.
pub const COMPARE_PANELS: &[&str] = &["reward/mean", "eval/accuracy", "time/step_s"];

/// Overlays several runs: one panel per metric in `keys`, one line per run (named by its
/// directory, or where two share a name by their paths: [`run_names`]), written to
/// `out_png`. Records are matched by step; a run without a metric simply has no line in that
/// panel.
pub fn compare_runs(dirs: &[PathBuf], keys: &[&str], out_png: &Path) -> Result<()> {
    let (records, names) = merge_runs(dirs, keys)?;
    let panels: Vec<String> = keys
        .iter()
        .map(|k| {
            names
                .iter()
                .map(|n| format!("{k} ({n})"))
                .collect::<Vec<_>>()
                .join("|")
        })
        .collect();
    let panels: Vec<&str> = panels.iter().map(String::as_str).collect();
    let title = format!("{} runs: {}", names.len(), names.join(", "));
    plot_metrics(&records, &panels, "step", &title, out_png)
}

/// Of the metrics `keys` name (`|` joins several in one panel), those no run in `dirs` has a
/// finite value of, each with the numeric keys the runs do have: a key the user typed that
/// matches nothing is said, where a default panel's is simply left out.
pub fn missing_keys(dirs: &[PathBuf], keys: &[&str]) -> Result<(Vec<String>, Vec<String>)> {
    let mut present = std::collections::BTreeSet::new();
    for dir in dirs {
        for r in read_metrics(&dir.join("metrics.jsonl"))? {
            let finite = r
                .into_iter()
                .filter(|(_, v)| v.as_f64().is_some_and(f64::is_finite));
            present.extend(finite.map(|(k, _)| k));
        }
    }
    let missing = keys
        .iter()
        .flat_map(|spec| spec.split('|').map(str::trim))
        .filter(|k| !k.is_empty() && !present.contains(*k))
        .map(String::from)
        .collect();
    Ok((missing, present.into_iter().collect()))
}

/// The runs' records of `keys` merged by step, each value under `"{key} ({run name})"`, and
/// the runs' names.
fn merge_runs(dirs: &[PathBuf], keys: &[&str]) -> Result<(Vec<Record>, Vec<String>)> {
    let mut by_step: std::collections::BTreeMap<i64, Record> = Default::default();
    let canonical: Vec<PathBuf> = dirs
        .iter()
        .map(|d| d.canonicalize().unwrap_or_else(|_| d.clone()))
        .collect();
    let names = crate::run_names(&canonical);
    for (dir, name) in dirs.iter().zip(&names) {
        for r in read_metrics(&dir.join("metrics.jsonl"))? {
            let Some(step) = r.get("step").and_then(|v| v.as_i64()) else {
                continue;
            };
            for key in keys {
                if let Some(v) = r.get(*key) {
                    let merged = by_step.entry(step).or_default();
                    merged.insert("step".into(), step.into());
                    merged.insert(format!("{key} ({name})"), v.clone());
                }
            }
        }
    }
    Ok((by_step.into_values().collect(), names))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn tick_labels_keep_the_decimals_of_the_finest_spacing_plotters_picks() {
        // The default run's policy loss (-0.021 to 0.014) got ticks 0.005 apart, and its
        // reward (0.66 to 0.94) ticks 0.05 apart.
        assert!(tick_step(0.041, 6) <= 0.005);
        assert!(tick_step(0.31, 6) <= 0.05);
        let labels: Vec<String> = (-4..=2)
            .map(|i| num::tick(i as f64 * 0.005, tick_step(0.041, 6)))
            .collect();
        let mut distinct = labels.clone();
        distinct.dedup();
        assert_eq!(distinct, labels);
    }

    /// Two runs overlaid: each run's metric becomes its own line of the panel.
    #[test]
    fn compare_runs_overlays_each_run() {
        let base = std::env::temp_dir().join(format!("skein-compare-{}", std::process::id()));
        let mut dirs = Vec::new();
        for (name, scale) in [("a", 1.0), ("b", 2.0)] {
            let dir = base.join(name);
            std::fs::create_dir_all(&dir).unwrap();
            let lines: Vec<String> = (1..=5)
                .map(|s| json!({"step": s, "reward/mean": scale * s as f64}).to_string())
                .collect();
            std::fs::write(dir.join("metrics.jsonl"), lines.join("\n")).unwrap();
            dirs.push(dir);
        }
        let out = base.join("compare.png");
        compare_runs(&dirs, &["reward/mean", "absent"], &out).unwrap();
        let (w, h, _) = decode(&out);
        assert!(w > 0 && h > 0);
        let e = compare_runs(&dirs, &["absent"], &out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("absent"), "{e}");
        let (missing, present) = missing_keys(&dirs, &["reward/mean|absent", "gone"]).unwrap();
        assert_eq!(missing, ["absent", "gone"]);
        assert_eq!(present, ["reward/mean", "step"]);
    }

    /// Two runs in folders of the same name (`x/default`, `y/default`) stay two lines, named
    /// by their paths: they used to share one key, the second run's values over the first's.
    #[test]
    fn runs_of_the_same_name_stay_apart() {
        let base = std::env::temp_dir().join(format!("skein-same-name-{}", std::process::id()));
        let mut dirs = Vec::new();
        for (parent, reward) in [("x", 1.0), ("y", 2.0)] {
            let dir = base.join(parent).join("default");
            std::fs::create_dir_all(&dir).unwrap();
            let line = json!({"step": 1, "reward/mean": reward}).to_string();
            std::fs::write(dir.join("metrics.jsonl"), line + "\n").unwrap();
            dirs.push(dir);
        }
        let (records, names) = merge_runs(&dirs, &["reward/mean"]).unwrap();
        assert_eq!(names, ["x/default", "y/default"]);
        assert_eq!(records[0]["reward/mean (x/default)"], 1.0);
        assert_eq!(records[0]["reward/mean (y/default)"], 2.0);
        std::fs::remove_dir_all(&base).ok();
    }

    fn rec(v: Value) -> Record {
        match v {
            Value::Object(m) => m,
            _ => unreachable!("test records are objects"),
        }
    }

    /// Width, height and RGB bytes of a PNG, decoded independently of how it was written.
    fn decode(path: &Path) -> (u32, u32, Vec<u8>) {
        let file = std::fs::File::open(path).unwrap();
        let mut reader = png::Decoder::new(std::io::BufReader::new(file))
            .read_info()
            .unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        buf.truncate(info.buffer_size());
        (info.width, info.height, buf)
    }

    fn tmp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("skein-plot-{}-{name}.png", std::process::id()))
    }

    #[test]
    fn draws_a_grid_of_present_panels_with_ink_in_each() {
        let records: Vec<Record> = (0..50)
            .map(|s| {
                let mut r = json!({
                    "step": s,
                    "reward/mean": (s as f64 / 8.0).sin() * 0.4 + 0.5,
                    "loss/policy": if s == 7 { Value::Null } else { json!(1.0 / (1.0 + s as f64)) },
                    "kl": s as f64 * 1e-4,
                    "grad_norm": 3.0,
                });
                if s % 10 == 0 {
                    r["eval/accuracy"] = json!(s as f64 / 60.0);
                }
                rec(r)
            })
            .collect();
        let out = tmp("grid");
        plot_metrics(
            &records,
            &[
                "reward/mean|eval/accuracy",
                "loss/policy",
                "missing",
                "kl",
                "grad_norm",
            ],
            "step",
            "test run",
            &out,
        )
        .unwrap();
        let (w, h, rgb) = decode(&out);
        // Four panels with data: a 2×2 grid.
        assert_eq!((w, h), (2 * PANEL_W, TITLE_H + 2 * PANEL_H));
        // Every panel has its line colour somewhere inside it.
        let blue = [31u8, 119, 180];
        for (r, c) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
            let found = (0..PANEL_H).any(|y| {
                (0..PANEL_W).any(|x| {
                    let (px, py) = (c * PANEL_W + x, TITLE_H + r * PANEL_H + y);
                    let i = ((py * w + px) * 3) as usize;
                    rgb[i..i + 3] == blue
                })
            });
            assert!(found, "panel ({r}, {c}) has no curve");
        }
        // The second series of the shared panel is drawn too.
        let orange = [255u8, 127, 14];
        assert!(rgb.chunks(3).any(|p| p == orange));
        // The title is text in the header band: dark pixels there.
        let header = &rgb[..(TITLE_H * w * 3) as usize];
        assert!(header.chunks(3).any(|p| p.iter().all(|&c| c < 80)));
        std::fs::remove_file(&out).ok();
    }

    #[test]
    fn a_single_point_and_flat_curves_still_plot() {
        let records = vec![rec(json!({"step": 3, "reward/mean": 0.25}))];
        let out = tmp("single");
        plot_metrics(&records, &["reward/mean"], "step", "one", &out).unwrap();
        let (w, h, rgb) = decode(&out);
        assert_eq!((w, h), (PANEL_W, TITLE_H + PANEL_H));
        assert!(rgb.chunks(3).any(|p| p == [31, 119, 180]));
        std::fs::remove_file(&out).ok();
    }

    #[test]
    fn nothing_finite_to_plot_is_an_error_naming_the_keys() {
        let records = vec![rec(json!({"step": 1, "loss/policy": null}))];
        let out = tmp("never");
        let err = plot_metrics(&records, &["loss/policy"], "step", "t", &out)
            .unwrap_err()
            .to_string();
        assert!(err.contains("loss/policy"), "{err}");
        assert!(!out.exists());
    }

    #[test]
    fn run_dir_plot_uses_the_default_panels_it_has() {
        let dir = std::env::temp_dir().join(format!("skein-plot-run-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lines: Vec<String> = (0..5)
            .map(|s| json!({"step": s, "reward/mean": s as f64, "entropy": 1.0}).to_string())
            .collect();
        std::fs::write(dir.join("metrics.jsonl"), lines.join("\n")).unwrap();
        let out = plot_run_dir(&dir, None).unwrap();
        assert_eq!(out, dir.join("plot.png"));
        let (w, h, _) = decode(&out);
        assert_eq!((w, h), (2 * PANEL_W, TITLE_H + PANEL_H));
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Failures get a panel of their own by default only in a run that had some.
    #[test]
    fn the_failures_panel_is_drawn_only_where_something_failed() {
        let records = |failed: f64| -> Vec<Record> {
            (1..4)
                .map(|s| {
                    let r =
                        json!({"step": s, "reward/mean": 0.5, "batch/failed_trajectories": 0.0});
                    serde_json::from_value(r).unwrap()
                })
                .chain(std::iter::once(
                    serde_json::from_value(json!({"step": 3, "eval/failed": failed})).unwrap(),
                ))
                .collect()
        };
        assert!(!default_panels(&records(0.0)).contains(&FAILURES_PANEL));
        assert!(default_panels(&records(2.0)).contains(&FAILURES_PANEL));
        let drawn = panels(&records(2.0), &default_panels(&records(2.0)), "step");
        let keys: Vec<&str> = drawn.iter().flatten().map(|s| s.key.as_str()).collect();
        assert!(keys.contains(&"batch/failed_trajectories") && keys.contains(&"eval/failed"));
    }

    /// The warm-up and RL number their steps apart: each panel names the count it is against.
    #[test]
    fn warm_up_panels_count_warm_up_steps_and_the_rest_rl_steps() {
        let s = |k: &str| Series {
            key: k.into(),
            points: vec![(1.0, 1.0)],
        };
        let warm_up = [s("sft/loss"), s("sft/eval_accuracy")];
        assert_eq!(x_desc(&warm_up, "step"), "warm-up step");
        assert_eq!(x_desc(&[s("eval/accuracy")], "step"), "RL step");
        assert_eq!(x_desc(&[s("sft/loss"), s("entropy")], "step"), "RL step");
        assert_eq!(x_desc(&warm_up, "time"), "time");
    }

    /// Plots on a thread and waits a bounded time: a range plotters cannot split into ticks
    /// used to loop forever.
    fn plot_within_a_minute(records: Vec<Record>, name: &str) -> Result<(u32, u32, Vec<u8>)> {
        let out = tmp(name);
        let path = out.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(plot_metrics(
                &records,
                &["reward/mean"],
                "step",
                "edge",
                &path,
            ));
        });
        let drawn = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("plotting {name} still runs after a minute"));
        drawn.map(|()| {
            let png = decode(&out);
            std::fs::remove_file(&out).ok();
            png
        })
    }

    /// Values whose range overflows f64 (9e307 − (−9e307), 1.7e308 plus its margin), in either
    /// axis, and a range narrow beside its magnitude are drawn, with the curve visible.
    #[test]
    fn values_whose_range_overflows_are_drawn() {
        let cases: [(&str, &[(f64, f64)]); 6] = [
            ("opposite-huge", &[(1.0, 9e307), (2.0, -9e307)]),
            ("max-twice", &[(1.0, 1.7e308), (2.0, 1.7e308)]),
            ("extremes", &[(1.0, f64::MAX), (2.0, -f64::MAX)]),
            ("huge-steps", &[(-1.7e308, 0.5), (1.7e308, 0.25)]),
            ("one-huge-step", &[(1e300, 0.5)]),
            (
                "narrow",
                &[(1.0, 1e300), (2.0, 1e300 * (1.0 + 4.0 * f64::EPSILON))],
            ),
        ];
        for (name, points) in cases {
            let records = points
                .iter()
                .map(|&(step, v)| rec(json!({"step": step, "reward/mean": v})))
                .collect();
            let (w, h, rgb) =
                plot_within_a_minute(records, name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!((w, h), (PANEL_W, TITLE_H + PANEL_H), "{name}");
            assert!(
                rgb.chunks(3).any(|p| p == [31, 119, 180]),
                "{name}: no curve"
            );
        }
    }

    #[test]
    fn an_axis_is_scaled_only_when_its_range_overflows() {
        let plain = axis(0.0, 1.0, |lo, hi| padded(lo, hi, 0.06));
        assert_eq!(plain.scale, 1.0);
        assert!(plain.lo < 0.0 && plain.hi > 1.0);
        for (lo, hi) in [(-9e307, 9e307), (1.7e308, 1.7e308), (-f64::MAX, f64::MAX)] {
            let a = axis(lo, hi, |lo, hi| padded(lo, hi, 0.06));
            assert!(
                a.width().is_finite() && a.width() > 0.0,
                "{lo}..{hi}: {a:?}"
            );
            assert!(
                a.lo <= a.place(lo) && a.place(hi) <= a.hi,
                "{lo}..{hi}: {a:?}"
            );
            assert_eq!(a.place(hi) * a.scale, hi);
        }
    }

    #[test]
    fn more_panels_than_a_plot_holds_is_an_error() {
        let mut r = json!({"step": 1});
        let keys: Vec<String> = (0..=MAX_PANELS).map(|i| format!("m{i}")).collect();
        for k in &keys {
            r[k] = json!(1.0);
        }
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let out = tmp("many");
        let err = plot_metrics(&[rec(r)], &keys, "step", "t", &out)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--keys") && err.contains("65 panels"), "{err}");
        assert!(!out.exists());
    }

    #[test]
    fn grid_shapes() {
        assert_eq!(grid(1), (1, 1));
        assert_eq!(grid(3), (1, 3));
        assert_eq!(grid(4), (2, 2));
        assert_eq!(grid(7), (3, 3));
    }
}
