//! `skein view` in a real browser: the binary serves the directory of a finished `skein train`
//! run, headless Chromium loads the page and runs its script, and the DOM it leaves must show
//! the step's trajectories (as many as the step file holds), the colour legend, a failed
//! trajectory's reason, a multi-turn episode's turns and environment replies, the curves of
//! every run given, a run's diagnoses (their steps marked on the curves and an example opened
//! by clicking its link), and a damaged file's error naming its file and line. A screenshot of the
//! multi-turn view is taken too; `SKEIN_VIEW_SCREENSHOT=docs/view.png` (a path from the
//! repository root) keeps it, which is how the README's picture is made.
//!
//! Hostile files in a run directory are served by the binary too, its peak memory measured.
//!
//! Chromium comes from Debian's `chromium` package (`scripts/setup-chromium.sh`, which `make
//! test` runs); without it these tests fail, saying so.

mod common;

use skein_report::trajectories::{list_steps, read_step, Status, TrajectoryRecord};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long Chromium's virtual clock may run the page's script (ms): the page is done long
/// before, but fetches and rendering count against it.
const SCRIPT_BUDGET_MS: &str = "15000";
const BROWSER_TIMEOUT: Duration = Duration::from_secs(90);

fn chromium() -> &'static str {
    let found = Command::new("chromium")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "`chromium` is not installed: run scripts/setup-chromium.sh (make test does)"
    );
    "chromium"
}

/// A `skein view` process, stopped when dropped.
struct Viewer {
    child: Child,
    url: String,
}

impl Viewer {
    fn start(dirs: &[&Path]) -> Viewer {
        let mut child = Command::new(env!("CARGO_BIN_EXE_skein"))
            .arg("view")
            .args(dirs)
            .args(["--port", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("skein view starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        if line.is_empty() {
            let mut err = String::new();
            child.stderr.take().unwrap().read_to_string(&mut err).ok();
            panic!("skein view printed no address: {err}");
        }
        let url = line.trim().to_string();
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        Viewer { child, url }
    }
}

impl Drop for Viewer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs headless Chromium on `url` with `args` (`--dump-dom`, `--screenshot=...`) and returns
/// its stdout.
fn browse(url: &str, args: &[String], profile: &Path) -> String {
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
            &format!("--user-data-dir={}", profile.display()),
            &format!("--virtual-time-budget={SCRIPT_BUDGET_MS}"),
        ])
        .args(args)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chromium starts");
    // Read stdout on a thread: a large DOM would fill the pipe before Chromium exits.
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        stdout.read_to_string(&mut s).map(|_| s)
    });
    let deadline = Instant::now() + BROWSER_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium took more than {BROWSER_TIMEOUT:?} on {url}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).ok();
    assert!(
        status.success(),
        "chromium failed ({status}) on {url}:\n{err}"
    );
    reader.join().unwrap().unwrap()
}

/// The DOM of `url` once the page's script is done with it.
fn dom(url: &str, profile: &Path) -> String {
    let dom = browse(url, &["--dump-dom".into()], profile);
    assert!(
        dom.contains("data-ready=\"1\""),
        "the page's script did not finish on {url}:\n{dom}"
    );
    dom
}

/// The text of the element with `id` (its first child text; enough for the page's own ids).
fn text_of<'a>(dom: &'a str, id: &str) -> &'a str {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in the page"));
    let start = at + dom[at..].find('>').unwrap() + 1;
    let end = start + dom[start..].find('<').unwrap();
    &dom[start..end]
}

/// `text` as it appears in HTML text: `&`, `<` and `>` escaped.
fn html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Chromium lets a page read a frame of another origin (the harness below) only with these.
const FRAME_READING: [&str; 2] = ["--disable-web-security", "--disable-site-isolation-trials"];

/// The address of a page that loads the viewer's page `url` in a frame and, once its script is
/// done, clicks in it: each click is a CSS selector and a JavaScript condition on the frame's
/// document `d` and the clicked element `target` that holds once the click has done its work.
/// After the last, the page takes the frame's document for its own, so `--dump-dom` shows the
/// viewer's page after the clicks. Served from a port of its own (another origin than the
/// viewer's), to be browsed with [`FRAME_READING`].
fn clicking(url: &str, clicks: &[(&str, &str)]) -> String {
    let page = format!(
        r#"<!doctype html><html><body><iframe id="f" src="{url}" style="width:1400px;height:1500px"></iframe>
<script>
"use strict";
const frame = document.getElementById("f");
const clicks = {clicks};
function when(holds, then) {{
  const t = setInterval(() => {{
    const d = frame.contentDocument;
    if (d && holds(d)) {{ clearInterval(t); then(d); }}
  }}, 50);
}}
function next(i, d) {{
  if (i === clicks.length) {{
    document.replaceChild(document.importNode(d.documentElement, true), document.documentElement);
    return;
  }}
  const target = d.querySelector(clicks[i][0]);
  const done = new Function("d", "target", "return " + clicks[i][1]);
  target.click();
  when((d) => done(d, target), (d) => next(i + 1, d));
}}
when((d) => d.body && d.body.dataset.ready === "1", (d) => next(0, d));
</script></body></html>"#,
        clicks = serde_json::to_string(clicks).unwrap()
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // Every request (the page, a favicon) gets the page; the thread ends with the test.
    std::thread::spawn(move || {
        for mut tcp in listener.incoming().flatten() {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && tcp.read(&mut byte).is_ok_and(|n| n == 1) {
                head.push(byte[0]);
            }
            let _ = write!(
                tcp,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                page.len()
            );
        }
    });
    format!("http://{addr}/")
}

fn workdir(name: &str) -> PathBuf {
    common::workdir("view", name)
}

/// A reward worker that refuses some responses (those whose length is a multiple of 3), so
/// a real run has failed trajectories, with the trainer's reason, beside trained ones.
const PICKY_WORKER: &str = r#"
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    text = r["response"]
    if len(text) % 3 == 0:
        out = {"id": r["id"], "error": f"refused {text!r}: {len(text)} characters, a multiple of 3"}
    else:
        out = {"id": r["id"], "reward": float(text.strip() == r.get("ground_truth", "").strip())}
    print(json.dumps(out), flush=True)
"#;

/// `skein train` in `dir` with a tiny model, two steps of 4 prompts × 4 samples, `config`
/// (TOML) and `extra` settings; a few seconds.
fn train(dir: &Path, config: &str, extra: &[&str]) {
    std::fs::create_dir_all(dir).unwrap();
    let config_path = dir.with_extension("toml");
    std::fs::write(&config_path, config).unwrap();
    let run_dir = format!("run.dir=\"{}\"", dir.display());
    let small = [
        "sft.batch_size=16",
        "sft.lr=3e-3",
        "trainer.steps=2",
        "rollout.prompts_per_step=4",
        "rollout.samples_per_prompt=4",
        "eval.problems=4",
        run_dir.as_str(),
    ];
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_skein"));
    cmd.args(["train", "--overwrite", "--config"])
        .arg(&config_path);
    for s in common::TINY_RUN.iter().chain(&small).chain(extra) {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("skein train starts");
    assert!(
        out.status.success(),
        "skein train failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The steps of a run's trajectory files, each with its records.
fn steps_of(run: &Path) -> Vec<(usize, Vec<TrajectoryRecord>)> {
    let steps: Vec<_> = list_steps(run)
        .unwrap()
        .into_iter()
        .map(|(s, path)| (s, read_step(&path).unwrap()))
        .collect();
    assert_eq!(steps.len(), 2, "a trajectory file per step");
    steps
}

#[test]
fn the_page_shows_a_steps_trajectories_the_legend_and_a_failed_reason() {
    let root = workdir("arithmetic");
    let worker = root.join("picky.py");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(&worker, PICKY_WORKER).unwrap();
    let run = root.join("run");
    let config = format!(
        "[reward.sources.picky]\nkind = \"worker\"\ncommand = [\"python3\", \"{}\"]\n\
         [reward.default_route]\nsources = [\"picky\"]\n",
        worker.display()
    );
    train(&run, &config, &["task.difficulty=1", "sft.steps=40"]);
    // The newest step with a failed trajectory, and its first one.
    let (step, records) = steps_of(&run)
        .into_iter()
        .rfind(|(_, r)| r.iter().any(|t| t.status == Status::Failed))
        .expect("the worker refuses some responses: a step has a failed trajectory");
    let failed = records.iter().find(|t| t.status == Status::Failed).unwrap();
    let reason = failed
        .reason
        .as_deref()
        .expect("a failed trajectory says why");
    assert!(reason.contains("a multiple of 3"), "{reason}");

    let viewer = Viewer::start(&[&run]);
    let url = format!("{}?step={step}&id={}", viewer.url, failed.id);
    let dom = dom(&url, &root.join("profile"));

    // Every trajectory of the step is a row of the table, and the page says how many.
    assert_eq!(
        dom.matches("<tr class=\"traj").count(),
        records.len(),
        "table rows"
    );
    let count = text_of(&dom, "traj-count");
    assert_eq!(
        count,
        format!("{0} of {0} trajectories of step {step}", records.len())
    );
    // The failed trajectory is open: its reason shows in its own view (and in the table).
    let detail = &dom[dom.find("id=\"traj-view\"").unwrap()..dom.find("id=\"group\"").unwrap()];
    assert!(
        detail.contains(&format!("<span class=\"reason\">{}</span>", html(reason))),
        "the failed trajectory's reason is not shown: {reason}"
    );
    assert!(text_of(&dom, "detail-id").starts_with(&failed.id));
    // It has no reward: none is shown, where a 0 would read as a scored answer.
    assert!(
        detail.contains("no reward (failed)"),
        "a failed trajectory shows a reward"
    );
    // The colour legend of the default mode, and the marks of turns and replies.
    let legend = &dom[dom.find("id=\"legend\"").unwrap()..dom.find("id=\"traj-view\"").unwrap()];
    for part in [
        "sampled and trained (mask 1)",
        "inserted by the environment or a tool (mask 0)",
        "turn boundary",
        "environment reply",
    ] {
        assert!(legend.contains(part), "the legend lacks {part:?}");
    }
    // Every token of the open trajectory is drawn, with its hover title.
    let tokens: usize = failed
        .rows
        .iter()
        .map(|r| r.prompt_ids.len() + r.response_ids.len())
        .sum();
    assert_eq!(
        detail.matches("<span class=\"tok").count(),
        tokens,
        "tokens drawn"
    );
    assert!(detail.contains(&format!(
        "title=\"id {} · log-prob ",
        failed.rows[0].response_ids[0]
    )));
    // Its group side by side: one card per sample of its prompt.
    let group = records.iter().filter(|t| t.group == failed.group).count();
    assert_eq!(dom.matches("class=\"sample").count(), group, "group cards");
    // The group's reward spread is the one the advantages use: failed samples left out.
    let scored = records
        .iter()
        .filter(|t| t.group == failed.group && t.status != Status::Failed)
        .count();
    let facts = text_of(&dom, "group-facts");
    assert!(
        facts.contains(&format!("(of the {scored} that did not fail)")),
        "{facts}"
    );
    // Nothing went wrong on the way.
    assert!(
        dom.contains("<div id=\"error\" hidden=\"\"></div>"),
        "{dom}"
    );
    drop(viewer);
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn a_multi_turn_episode_shows_its_turns_and_the_environments_replies() {
    let root = workdir("guess");
    let run = root.join("run");
    train(
        &run,
        "",
        &[
            "task.name=\"guess\"",
            "task.difficulty=1",
            "sft.steps=80",
            "rollout.sampling.max_new_tokens=40",
            "agent.max_turns=16",
        ],
    );
    // The last step's finished episode with the most turns (at most 6, to fit a screenshot).
    let (step, records) = steps_of(&run).pop().unwrap();
    let shown = records
        .iter()
        .filter(|t| t.status == Status::Finished && t.turns <= 6)
        .max_by_key(|t| t.turns)
        .expect("a finished episode");
    assert!(
        shown.turns >= 2,
        "no multi-turn episode finished: {records:?}"
    );
    let row = &shown.rows[0];
    // Runs of inserted tokens are the environment's replies.
    let replies = row
        .loss_mask
        .iter()
        .enumerate()
        .filter(|&(i, &m)| m == 0 && (i == 0 || row.loss_mask[i - 1] != 0))
        .count();
    assert!(replies >= 1);

    let viewer = Viewer::start(&[&run]);
    let url = format!("{}?step={step}&id={}&mode=advantage", viewer.url, shown.id);
    let dom = dom(&url, &root.join("profile"));
    let detail = &dom[dom.find("id=\"traj-view\"").unwrap()..dom.find("id=\"group\"").unwrap()];
    assert_eq!(
        detail.matches("class=\"tag tag-env\"").count(),
        replies,
        "env replies"
    );
    // A model turn after each reply (the last reply may end the episode).
    let turns = detail.matches("class=\"tag tag-turn\"").count();
    assert!(
        turns == replies || turns + 1 == replies,
        "{turns} turn marks, {replies} replies"
    );
    // The advantage colours are on, with their legend.
    let legend = &dom[dom.find("id=\"legend\"").unwrap()..dom.find("id=\"traj-view\"").unwrap()];
    assert!(legend.contains("advantage from −"), "{legend}");
    let group = records.iter().filter(|t| t.group == shown.group).count();
    assert_eq!(dom.matches("class=\"sample").count(), group, "group cards");
    assert!(
        dom.contains("<div id=\"error\" hidden=\"\"></div>"),
        "{dom}"
    );

    // The README's picture: this view, in a browser window.
    let png = root.join("view.png");
    browse(
        &url,
        &[
            format!("--screenshot={}", png.display()),
            "--window-size=1400,1600".into(),
        ],
        &root.join("profile"),
    );
    let bytes = std::fs::read(&png).expect("chromium wrote the screenshot");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 20_000);
    if let Some(keep) = std::env::var_os("SKEIN_VIEW_SCREENSHOT") {
        let keep = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(keep);
        std::fs::copy(&png, &keep).unwrap();
        eprintln!("screenshot: {}", keep.display());
    }
    drop(viewer);
    std::fs::remove_dir_all(&root).ok();
}

/// A real run whose responses are all cut at one token names `truncation` while it trains:
/// the page's panel lists each diagnosis of `diagnoses.jsonl`; clicking one marks its steps on
/// the curves, with the curve of the metric it reads, and clicking its example opens that
/// trajectory.
#[test]
fn a_runs_diagnoses_are_listed_marked_on_the_curves_and_open_their_examples() {
    let root = workdir("diagnoses");
    let run = root.join("run");
    train(
        &run,
        "",
        &[
            "sft.steps=0",
            "trainer.steps=3",
            "rollout.sampling.max_new_tokens=1",
        ],
    );
    let found = skein_doctor::read_diagnoses(&run.join(skein_doctor::FILE)).unwrap();
    let truncation = found
        .iter()
        .find(|d| d.name == "truncation")
        .unwrap_or_else(|| panic!("no truncation among {found:?}"));
    let example = &truncation.examples[0];

    let viewer = Viewer::start(&[&run]);
    let dom = dom(&viewer.url, &root.join("profile"));
    let panel = &dom[dom.find("id=\"diagnoses\"").unwrap()..dom.find("id=\"curves\"").unwrap()];
    assert_eq!(panel.matches("class=\"diagnosis\"").count(), found.len());
    for d in &found {
        for part in [&d.name, &d.title, &d.evidence] {
            assert!(panel.contains(&html(part)), "the panel lacks {part:?}");
        }
        for e in &d.examples {
            assert!(panel.contains(&format!("data-step=\"{}\" data-id=\"{}\"", e.step, e.id)));
        }
    }
    assert!(!panel.contains("no-diagnosis"), "{panel}");

    let item = ".diagnosis[data-name='truncation']";
    let mark = format!("{item} button.mark");
    let open = format!("{item} a.example");
    // Opened on step 1: the rule needs two steps, so its example is of another, which the
    // click must open.
    assert!(example.step > 1);
    let harness = clicking(
        &format!("{}?step=1", viewer.url),
        &[
            (mark.as_str(), "d.querySelector('.diagnosis-band') !== null"),
            (
                open.as_str(),
                "d.getElementById('detail-id').textContent.startsWith(target.dataset.id + ' ')",
            ),
        ],
    );
    let mut args: Vec<String> = FRAME_READING.iter().map(|f| f.to_string()).collect();
    args.push("--dump-dom".into());
    let dom = browse(&harness, &args, &root.join("profile"));
    assert!(
        dom.contains("data-ready=\"1\""),
        "the clicks did not finish:\n{dom}"
    );
    // Marked: the diagnosis, its steps on every curve, and the curve its rule reads.
    assert!(dom.contains("class=\"diagnosis marked\" data-name=\"truncation\""));
    let charts = dom.matches("<svg class=\"chart\"").count();
    assert!(dom.contains(">response/truncated_fraction</text>"), "{dom}");
    assert!(
        dom.matches("class=\"diagnosis-band\"").count() >= charts,
        "bands on {charts} charts"
    );
    // Its example is open, in the table of its step.
    assert!(
        text_of(&dom, "detail-id").starts_with(&format!("{} (step {},", example.id, example.step)),
        "{}",
        text_of(&dom, "detail-id")
    );
    assert!(text_of(&dom, "traj-count").ends_with(&format!("of step {}", example.step)));
    assert!(dom.contains(&format!(
        "<tr class=\"traj selected\" data-id=\"{}\">",
        example.id
    )));
    assert!(
        dom.contains("<div id=\"error\" hidden=\"\"></div>"),
        "{dom}"
    );
    drop(viewer);
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn several_runs_overlay_their_curves_and_a_damaged_file_names_its_line() {
    let root = workdir("two");
    let (a, b) = (root.join("dp1"), root.join("dp2"));
    // Made-up runs: what is checked here is the drawing of several runs and of a damaged
    // file, which a real run does not produce.
    skein_view::fixture::write_run(&a, 3).unwrap();
    skein_view::fixture::write_run(&b, 2).unwrap();
    // Step 2 of the second run is damaged: not zstd at all.
    let path = skein_report::trajectories::step_path(&b, 2);
    std::fs::write(&path, "{\"step\": 2}\n").unwrap();

    let viewer = Viewer::start(&[&a, &b]);
    let dom = dom(&format!("{}?run=1", viewer.url), &root.join("profile"));
    // The default panels that the runs have (reward/mean, time/step_s), each with a line per run.
    let charts = dom.matches("<svg class=\"chart\"").count();
    assert_eq!(charts, 2, "charts");
    assert_eq!(
        dom.matches("<polyline").count(),
        2 * charts,
        "one line per run"
    );
    for name in ["dp1", "dp2"] {
        assert!(text_of(&dom, "run-names").contains(name));
    }
    // Every metric can be picked.
    for key in ["reward/mean", "loss/policy", "batch/failed_trajectories"] {
        assert!(
            dom.contains(&format!("value=\"{key}\"")),
            "no {key} to pick"
        );
    }
    // Made-up runs have no diagnoses.jsonl: the panel says so for each.
    assert_eq!(
        dom.matches("class=\"no-diagnosis").count(),
        2,
        "no-diagnosis lines"
    );
    // Run 1 opens on its newest step, which is damaged: the page says where.
    let error = text_of(&dom, "error");
    assert!(error.contains("step-2.jsonl.zst:1: unreadable"), "{error}");
    drop(viewer);
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn a_directory_that_is_not_a_run_is_refused_at_once() {
    let root = workdir("not-a-run");
    std::fs::create_dir_all(&root).unwrap();
    for (dir, message) in [
        (root.clone(), "is not a run directory"),
        (root.join("missing"), "missing does not exist"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_skein"))
            .arg("view")
            .arg(&dir)
            .args(["--port", "0"])
            .output()
            .expect("skein view starts");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(message), "{err}");
        assert!(
            out.stdout.is_empty(),
            "no address printed for a refused directory"
        );
    }
    std::fs::remove_dir_all(&root).ok();
}

/// The most resident memory `skein view` may reach serving the hostile runs below: reading
/// them whole took 2.9 GB (the step file), 7 GB (the long line) and without end (/dev/zero).
const HOSTILE_PEAK_MIB: u64 = 400;

/// A plain GET from the viewer at `url`: its status and body.
fn http_get(url: &str, path: &str) -> (u16, String) {
    let addr = url.trim_start_matches("http://").trim_end_matches('/');
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    write!(
        tcp,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    tcp.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    (head[9..12].parse().unwrap(), body.to_string())
}

/// Peak resident memory of process `pid` so far, in MiB (`VmHWM`).
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib >> 10
}

/// Writes `metrics.jsonl` of `run` again with one line of `bytes` bytes after its first.
fn add_long_metrics_line(run: &Path, bytes: usize) {
    let path = run.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let (first, rest) = text.split_once('\n').unwrap();
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    writeln!(out, "{first}").unwrap();
    write!(out, "{{\"step\": 9, \"x\": [").unwrap();
    let chunk = "0,".repeat(1 << 15);
    for _ in 0..bytes / chunk.len() {
        out.write_all(chunk.as_bytes()).unwrap();
    }
    writeln!(out, "0]}}").unwrap();
    out.write_all(rest.as_bytes()).unwrap();
    out.flush().unwrap();
}

/// Hostile files cost the viewer bounded memory and get answers: a step file of a few KB
/// whose five records hold 8M-token prompts, a `metrics.jsonl` with a 100 MB line, one linked
/// to /dev/zero, each asked for six times at once. The viewer answers each, serves on, and its
/// peak resident memory stays under [`HOSTILE_PEAK_MIB`].
#[test]
fn hostile_files_cost_the_viewer_bounded_memory() {
    let root = workdir("hostile");
    let (steps, long, zero) = (root.join("steps"), root.join("long"), root.join("zero"));
    for run in [&steps, &long, &zero] {
        skein_view::fixture::write_run(run, 2).unwrap();
    }
    let bytes = skein_view::fixture::write_hostile_step(&steps, 1, 5, 8 << 20).unwrap();
    assert!(bytes < 64 << 10, "{bytes} bytes");
    add_long_metrics_line(&long, 100 << 20);
    std::fs::remove_file(zero.join("metrics.jsonl")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", zero.join("metrics.jsonl")).unwrap();

    let viewer = Viewer::start(&[&steps, &long, &zero]);
    let asks = [
        (
            "/api/step?run=0&step=1",
            422,
            "more than 4194304 JSON values",
        ),
        (
            "/api/group?run=0&step=1&group=s1-p0",
            422,
            "more than 4194304 JSON values",
        ),
        (
            "/api/metrics?run=1",
            200,
            "skipped 1 line(s) longer than 64 KiB (the first is line 2)",
        ),
        (
            "/api/metrics?run=2",
            422,
            "metrics.jsonl is not a regular file",
        ),
    ];
    for (path, status, says) in asks {
        let replies: Vec<_> = (0..6)
            .map(|_| {
                let url = viewer.url.clone();
                std::thread::spawn(move || http_get(&url, path))
            })
            .collect();
        for reply in replies {
            let (got, body) = reply.join().unwrap();
            assert_eq!(got, status, "{path}: {body}");
            assert!(body.contains(says), "{path}: {body}");
        }
    }
    // It serves on: the run's other step, and the good lines of the long file.
    assert_eq!(http_get(&viewer.url, "/api/step?run=0&step=2").0, 200);
    let (_, body) = http_get(&viewer.url, "/api/metrics?run=1");
    assert!(body.contains("\"step\":2"), "{body}");
    let peak = peak_rss_mib(viewer.child.id());
    eprintln!("skein view peak RSS: {peak} MiB");
    assert!(peak < HOSTILE_PEAK_MIB, "peak RSS {peak} MiB");
    drop(viewer);
    std::fs::remove_dir_all(&root).ok();
}
