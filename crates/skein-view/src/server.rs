//! Binding the viewer to an address and serving it until stopped.

use crate::limits::Limits;
use crate::routes::{guarded_router, Viewer};
use crate::runs::Runs;
use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::oneshot;

/// A viewer serving in the caller's tokio runtime.
pub struct Server {
    addr: SocketAddr,
    viewer: Arc<Viewer>,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// Binds `addr` (port 0: any free port) and serves the runs of `dirs`.
pub async fn bind(addr: &str, dirs: &[PathBuf]) -> Result<Server> {
    bind_within(addr, dirs, Limits::DEFAULT).await
}

/// [`bind`], reading the runs' files within `limits`.
pub async fn bind_within(addr: &str, dirs: &[PathBuf], limits: Limits) -> Result<Server> {
    let viewer = Arc::new(Viewer::new(Runs::open(dirs, limits)?));
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => "the port is in use (port 0 picks a free one)",
            std::io::ErrorKind::PermissionDenied => "ports below 1024 need privileges",
            _ => "is the host an address of this machine? (127.0.0.1 or 0.0.0.0)",
        };
        anyhow::anyhow!("binding {addr}: {hint}: {e}")
    })?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let app = guarded_router(viewer.clone(), addr.ip().is_loopback());
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });
    Ok(Server {
        addr,
        viewer,
        stop,
        task,
    })
}

impl Server {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Memory the decoded step files kept for the next request hold, as the viewer counts it
    /// against [`Limits::step_cache_bytes`].
    pub fn step_cache_bytes(&self) -> usize {
        self.viewer.runs.step_cache_bytes()
    }

    /// The page's address.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Stops accepting, lets requests in flight finish, and returns.
    pub async fn shutdown(self) -> Result<()> {
        let _ = self.stop.send(());
        self.task.await.context("the viewer's task failed")??;
        Ok(())
    }

    /// Serves until the listener fails (or forever).
    pub async fn wait(self) -> Result<()> {
        let _keep_running = self.stop;
        self.task.await.context("the viewer's task failed")??;
        Ok(())
    }
}

/// Serves the runs of `dirs` on `host:port` until the process ends, on a small runtime of its
/// own; `ready` is given the page's address once it accepts connections.
pub fn serve(dirs: &[PathBuf], host: &str, port: u16, ready: impl FnOnce(&str)) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the viewer's runtime")?;
    // An IPv6 host needs brackets to be an address with a port.
    let addr = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    runtime.block_on(async move {
        let server = bind(&addr, dirs).await?;
        if !server.addr().ip().is_loopback() {
            eprintln!(
                "skein view: listening on {}, which other machines can reach: anyone who can \
                 connect reads these runs (their configs, metrics and every trajectory); \
                 without --host it listens on 127.0.0.1 only",
                server.addr()
            );
        }
        ready(&server.url());
        server.wait().await
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture;
    use serde_json::Value;
    use std::io::{Read, Write};

    fn tmp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("skein-view-{}-{name}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        dir
    }

    /// A viewer of `dirs` on a free loopback port, on a runtime the test keeps.
    fn start(dirs: &[PathBuf]) -> (tokio::runtime::Runtime, Server) {
        start_within(dirs, Limits::DEFAULT)
    }

    fn start_within(dirs: &[PathBuf], limits: Limits) -> (tokio::runtime::Runtime, Server) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let server = rt
            .block_on(bind_within("127.0.0.1:0", dirs, limits))
            .unwrap();
        (rt, server)
    }

    /// A plain HTTP/1.1 GET: status, content type and body.
    fn get(server: &Server, path: &str) -> (u16, String, String) {
        get_for(server, path, "localhost")
    }

    /// A GET that names `host` in its `Host` header.
    fn get_for(server: &Server, path: &str, host: &str) -> (u16, String, String) {
        let mut tcp = std::net::TcpStream::connect(server.addr()).unwrap();
        write!(
            tcp,
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut reply = String::new();
        tcp.read_to_string(&mut reply).unwrap();
        let (head, body) = reply.split_once("\r\n\r\n").unwrap();
        let status = head[9..12].parse().unwrap();
        let content_type = head
            .lines()
            .find_map(|l| l.strip_prefix("content-type: "))
            .unwrap_or("")
            .to_string();
        (status, content_type, body.to_string())
    }

    fn get_json(server: &Server, path: &str) -> (u16, Value) {
        let (status, content_type, body) = get(server, path);
        assert_eq!(content_type, "application/json", "{path}: {body}");
        (status, serde_json::from_str(&body).unwrap())
    }

    /// On loopback, a request for another site's name (DNS rebinding) is refused.
    #[test]
    fn on_loopback_only_requests_for_this_machine_are_answered() {
        let dir = tmp("host");
        fixture::write_run(&dir, 1).unwrap();
        let (_rt, server) = start(std::slice::from_ref(&dir));
        let port = server.addr().port();
        for host in [
            format!("localhost:{port}"),
            format!("127.0.0.1:{port}"),
            "LOCALHOST".into(),
            format!("[::1]:{port}"),
        ] {
            assert_eq!(get_for(&server, "/api/runs", &host).0, 200, "{host}");
        }
        for host in [
            format!("evil.example:{port}"),
            "127.0.0.1.evil.example".into(),
        ] {
            let (status, _, body) = get_for(&server, "/api/runs", &host);
            assert_eq!(status, 403, "{host}: {body}");
            assert!(body.contains("Host"), "{body}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn serves_one_self_contained_page() {
        let dir = tmp("page");
        fixture::write_run(&dir, 1).unwrap();
        let (_rt, server) = start(std::slice::from_ref(&dir));
        let (status, content_type, body) = get(&server, "/");
        assert_eq!(status, 200);
        assert_eq!(content_type, "text/html; charset=utf-8");
        for part in [
            "id=\"legend\"",
            "id=\"traj-table\"",
            "id=\"group-view\"",
            "id=\"diagnoses\"",
            "/api/step",
            "/api/diagnoses",
        ] {
            assert!(body.contains(part), "the page lacks {part}");
        }
        // Nothing fetched from elsewhere: the page works offline.
        for external in ["<script src", "<link ", "@import", "//cdn", "https://"] {
            assert!(!body.contains(external), "the page loads {external}");
        }
        assert_eq!(get_json(&server, "/nothing").0, 404);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn apis_give_metrics_steps_summaries_records_and_groups() {
        let (a, b) = (tmp("api-a"), tmp("api-b"));
        let counts = fixture::write_run(&a, 2).unwrap();
        fixture::write_run(&b, 3).unwrap();
        let (_rt, server) = start(&[a.clone(), b.clone()]);

        let (_, runs) = get_json(&server, "/api/runs");
        let names: Vec<&str> = runs["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, [name_of(&a), name_of(&b)]);

        let (status, m) = get_json(&server, "/api/metrics?run=1");
        assert_eq!(status, 200);
        let keys = m["metrics"]["keys"].as_array().unwrap();
        assert!(keys.contains(&"reward/mean".into()) && !keys.contains(&"step".into()));
        assert_eq!(m["metrics"]["records"].as_array().unwrap().len(), 3);

        assert_eq!(
            get_json(&server, "/api/steps?run=0").1["steps"],
            serde_json::json!([1, 2])
        );

        let (_, step) = get_json(&server, "/api/step?run=0&step=2");
        let list = step["trajectories"].as_array().unwrap();
        assert_eq!(list.len(), counts[1]);
        let failed: Vec<&Value> = list.iter().filter(|t| t["status"] == "failed").collect();
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0]["reason"], fixture::FAILED_REASON);
        // It did not train: no advantage, nothing trained.
        assert_eq!(failed[0]["advantage"], Value::Null);
        assert_eq!(failed[0]["trained"], 0);

        let (status, t) = get_json(&server, "/api/trajectory?run=0&step=2&id=s2-tools-0");
        assert_eq!(status, 200);
        assert_eq!(t["trajectory"]["id"], "s2-tools-0");
        let kinds: Vec<&str> = t["marks"][0]["segments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["model", "tool", "model"]);
        assert_eq!(t["marks"][0]["tool_calls"], serde_json::json!([[3, 6]]));
        // Its call was sampled two versions back, but step 2's policy is only version 1.
        assert_eq!(t["summary"]["max_staleness"], 1);

        let (_, g) = get_json(&server, "/api/group?run=0&step=2&group=s2-p0");
        let members = g["trajectories"].as_array().unwrap();
        assert_eq!(members.len(), 4);
        let rewards: Vec<f64> = members
            .iter()
            .map(|s| s["trajectory"]["reward"].as_f64().unwrap())
            .collect();
        assert_eq!(rewards, [1.0, 0.0, 1.0, 0.0]);
        // The advantages of a group are what GRPO compared: above the mean up, below down.
        let adv: Vec<f64> = members
            .iter()
            .map(|s| s["summary"]["advantage"].as_f64().unwrap())
            .collect();
        assert!(adv[0] > 0.0 && adv[1] < 0.0, "{adv:?}");
        for d in [a, b] {
            std::fs::remove_dir_all(&d).ok();
        }
    }

    #[test]
    fn bad_requests_and_bad_files_are_json_errors_naming_what() {
        let dir = tmp("errors");
        fixture::write_run(&dir, 2).unwrap();
        let (_rt, server) = start(std::slice::from_ref(&dir));
        let cases = [
            ("/api/steps?run=3", 404, "no run 3"),
            ("/api/steps", 400, "missing `run`"),
            ("/api/step?run=0&step=x", 400, "`step` must be a number"),
            ("/api/step?run=0&step=9", 404, "no trajectories of step 9"),
            (
                "/api/trajectory?run=0&step=1&id=nope",
                404,
                "no trajectory \"nope\"",
            ),
            (
                "/api/group?run=0&step=1&group=nope",
                404,
                "no group \"nope\"",
            ),
        ];
        for (path, status, message) in cases {
            let (got, body) = get_json(&server, path);
            assert_eq!(got, status, "{path}: {body}");
            let error = body["error"].as_str().unwrap();
            assert!(error.contains(message), "{path}: {error}");
        }

        // A damaged step file: the error names the file and the line.
        let path = skein_report::trajectories::step_path(&dir, 1);
        let mut records = fixture::step_records(1);
        records.truncate(1);
        let good = serde_json::to_string(&records[0]).unwrap();
        let text = format!("{good}\n{{\"id\": \"half a record\"}}\n");
        std::fs::write(&path, zstd_bytes(&text)).unwrap();
        let (status, body) = get_json(&server, "/api/step?run=0&step=1");
        assert_eq!(status, 500);
        let error = body["error"].as_str().unwrap();
        assert!(
            error.contains("step-1.jsonl.zst:2: not a trajectory record"),
            "{error}"
        );
        // The other step still reads.
        assert_eq!(get_json(&server, "/api/step?run=0&step=2").0, 200);

        // A bad line of metrics.jsonl, likewise.
        let metrics = dir.join("metrics.jsonl");
        let mut text = std::fs::read_to_string(&metrics).unwrap();
        text.push_str("{\"step\": 3, \"reward/mean\": \n");
        std::fs::write(&metrics, text).unwrap();
        let (status, body) = get_json(&server, "/api/metrics?run=0");
        assert_eq!(status, 500);
        assert!(
            body["error"].as_str().unwrap().contains("metrics.jsonl:3"),
            "{body}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    fn zstd_bytes(text: &str) -> Vec<u8> {
        zstd::encode_all(text.as_bytes(), 1).unwrap()
    }

    #[test]
    fn a_step_rewritten_while_serving_is_read_again() {
        let dir = tmp("reread");
        fixture::write_run(&dir, 1).unwrap();
        let (_rt, server) = start(std::slice::from_ref(&dir));
        let count = |s: &Server| {
            get_json(s, "/api/step?run=0&step=1").1["trajectories"]
                .as_array()
                .unwrap()
                .len()
        };
        let all = count(&server);
        let mut records = fixture::step_records(1);
        records.truncate(3);
        skein_report::trajectories::write_step(&dir, 1, &records).unwrap();
        assert_eq!((all, count(&server)), (10, 3));
        std::fs::remove_dir_all(&dir).ok();
    }

    fn name_of(dir: &std::path::Path) -> String {
        dir.file_name().unwrap().to_string_lossy().into_owned()
    }

    /// Runs are named by their directories, or where names repeat by their paths from the
    /// folder they share; neither the list nor a message shows where they are on the machine.
    #[test]
    fn runs_and_their_files_are_named_without_the_machines_paths() {
        let root = tmp("names");
        let (a, b) = (root.join("a").join("run"), root.join("b").join("run"));
        for d in [&a, &b] {
            fixture::write_run(d, 1).unwrap();
        }
        let (_rt, server) = start(&[a.clone(), b.clone()]);
        let (_, _, body) = get(&server, "/api/runs");
        let runs: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            runs["runs"],
            serde_json::json!([{"run": 0, "name": "a/run"}, {"run": 1, "name": "b/run"}])
        );
        let machine = [
            root.display().to_string(),
            root.canonicalize().unwrap().display().to_string(),
        ];
        let hides_paths = |text: &str| machine.iter().all(|m| !text.contains(m.as_str()));
        assert!(hides_paths(&body), "{body}");
        std::fs::write(skein_report::trajectories::step_path(&b, 1), "not zstd").unwrap();
        for (path, status, start) in [
            (
                "/api/step?run=1&step=1",
                500,
                "b/run/trajectories/step-1.jsonl.zst:1: unreadable",
            ),
            (
                "/api/step?run=1&step=9",
                404,
                "no trajectories of step 9 in b/run",
            ),
        ] {
            let (got, body) = get_json(&server, path);
            let error = body["error"].as_str().unwrap();
            assert_eq!(got, status, "{error}");
            assert!(error.starts_with(start) && hides_paths(error), "{error}");
        }
        std::fs::remove_dir_all(&root).ok();
    }

    /// A step file of a few KB whose records decode to 40M tokens (gigabytes once parsed) is
    /// refused at the limit on values, every API that reads it says so, and nothing of it is
    /// kept; the run's other steps read as before.
    #[test]
    fn a_tiny_step_file_of_huge_records_is_refused_not_held() {
        let dir = tmp("hostile-step");
        fixture::write_run(&dir, 2).unwrap();
        let bytes = fixture::write_hostile_step(&dir, 1, 5, 8 << 20).unwrap();
        assert!(bytes < 64 << 10, "{bytes} bytes");
        let (_rt, server) = start(std::slice::from_ref(&dir));
        for path in [
            "/api/step?run=0&step=1",
            "/api/trajectory?run=0&step=1&id=s1-p0-0",
            "/api/group?run=0&step=1&group=s1-p0",
        ] {
            let (status, body) = get_json(&server, path);
            let error = body["error"].as_str().unwrap();
            assert_eq!(status, 422, "{path}: {error}");
            let limit = format!(
                "step-1.jsonl.zst:1: more than {} JSON values",
                Limits::DEFAULT.step_file_values
            );
            assert!(error.contains(&limit), "{error}");
        }
        assert_eq!(server.step_cache_bytes(), 0);
        assert_eq!(get_json(&server, "/api/step?run=0&step=2").0, 200);
        assert!(server.step_cache_bytes() > 0);
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Each bound on step files answers 422 naming it, and the steps kept stay within theirs.
    #[test]
    fn step_files_are_read_and_kept_within_the_limits() {
        let dir = tmp("step-limits");
        fixture::write_run(&dir, 3).unwrap();
        let one_step = {
            let (_rt, server) = start(std::slice::from_ref(&dir));
            get_json(&server, "/api/step?run=0&step=1");
            server.step_cache_bytes()
        };
        assert!(one_step > 0);
        let tight = |limits: Limits| start_within(std::slice::from_ref(&dir), limits);
        let refusal = |limits: Limits| {
            let (_rt, server) = tight(limits);
            let (status, body) = get_json(&server, "/api/step?run=0&step=1");
            assert_eq!(status, 422, "{body}");
            body["error"].as_str().unwrap().to_string()
        };
        let error = refusal(Limits {
            step_file_bytes: 1 << 10,
            ..Limits::DEFAULT
        });
        assert!(
            error.contains("step-1.jsonl.zst decodes to more than 1 KiB"),
            "{error}"
        );
        let error = refusal(Limits {
            step_file_values: 100,
            ..Limits::DEFAULT
        });
        // Counted over the file: the fixture's first line holds fewer, its second passes 100.
        assert!(
            error.contains("step-1.jsonl.zst:2: more than 100 JSON values"),
            "{error}"
        );
        // Room for one and a half steps: each read is answered, and what is kept fits.
        let cap = one_step * 3 / 2;
        let (_rt, server) = tight(Limits {
            step_cache_bytes: cap,
            ..Limits::DEFAULT
        });
        for step in [1, 2, 3, 1] {
            let (status, _) = get_json(&server, &format!("/api/step?run=0&step={step}"));
            assert_eq!(status, 200);
            let held = server.step_cache_bytes();
            assert!(
                held > 0 && held <= cap,
                "{held} bytes kept, more than {cap}"
            );
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    /// `metrics.jsonl` linked to /dev/zero is refused rather than read without end, and a
    /// line past the limit is skipped and named while the rest is drawn; the viewer answers on.
    #[test]
    fn hostile_metrics_files_are_answered_within_the_limits() {
        let (zero, long) = (tmp("metrics-zero"), tmp("metrics-long"));
        fixture::write_run(&zero, 1).unwrap();
        fixture::write_run(&long, 2).unwrap();
        let metrics = zero.join("metrics.jsonl");
        std::fs::remove_file(&metrics).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &metrics).unwrap();
        let path = long.join("metrics.jsonl");
        let text = std::fs::read_to_string(&path).unwrap();
        let (first, rest) = text.split_once('\n').unwrap();
        let huge = format!("{{\"step\": 5, \"x\": [{}0]}}", "0,".repeat(1 << 19));
        std::fs::write(&path, format!("{first}\n{huge}\n{rest}")).unwrap();

        let (_rt, server) = start(&[zero.clone(), long.clone()]);
        let (status, body) = get_json(&server, "/api/metrics?run=0");
        let error = body["error"].as_str().unwrap();
        assert_eq!(status, 422, "{error}");
        assert!(
            error.contains("metrics.jsonl is not a regular file"),
            "{error}"
        );

        let (status, body) = get_json(&server, "/api/metrics?run=1");
        assert_eq!(status, 200, "{body}");
        let steps: Vec<&Value> = body["metrics"]["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| &r["step"])
            .collect();
        assert_eq!(steps, [1, 2]);
        let skipped = body["metrics"]["skipped"].as_str().unwrap();
        assert!(
            skipped.contains(
                "metrics.jsonl: skipped 1 line(s) longer than 64 KiB (the first is line 2)"
            ),
            "{skipped}"
        );
        assert_eq!(get_json(&server, "/api/steps?run=0").0, 200);
        for d in [zero, long] {
            std::fs::remove_dir_all(&d).ok();
        }
    }

    /// A run's diagnoses are its `diagnoses.jsonl`'s, a line still being written skipped, and
    /// their examples are trajectories the API opens; a run without the file answers an empty
    /// list, and one whose file is a link to a device is refused, naming the file from its run.
    #[test]
    fn diagnoses_are_read_from_the_runs_file() {
        let (found, none, zero) = (tmp("diag"), tmp("diag-none"), tmp("diag-zero"));
        for dir in [&found, &none, &zero] {
            fixture::write_run(dir, 2).unwrap();
        }
        let written = fixture::write_diagnoses(&found).unwrap();
        let file = found.join(skein_doctor::FILE);
        let mut log = std::fs::OpenOptions::new()
            .append(true)
            .open(&file)
            .unwrap();
        log.write_all(b"{\"name\": \"entropy-col").unwrap();
        std::os::unix::fs::symlink("/dev/zero", zero.join(skein_doctor::FILE)).unwrap();
        let (_rt, server) = start(&[found.clone(), none.clone(), zero.clone()]);

        let (status, body) = get_json(&server, "/api/diagnoses?run=0");
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["missing"], false);
        let list: Vec<skein_doctor::Diagnosis> =
            serde_json::from_value(body["diagnoses"].clone()).unwrap();
        assert_eq!(list, written);
        for e in &list[0].examples {
            let path = format!("/api/trajectory?run=0&step={}&id={}", e.step, e.id);
            let (status, t) = get_json(&server, &path);
            assert_eq!(
                (status, &t["trajectory"]["status"]),
                (200, &"truncated".into())
            );
        }

        let (status, body) = get_json(&server, "/api/diagnoses?run=1");
        assert_eq!(status, 200);
        assert_eq!(
            (&body["diagnoses"], &body["missing"]),
            (&serde_json::json!([]), &true.into())
        );

        let (status, body) = get_json(&server, "/api/diagnoses?run=2");
        let error = body["error"].as_str().unwrap();
        assert_eq!(status, 422, "{error}");
        let named = format!("{}/diagnoses.jsonl is not a regular file", name_of(&zero));
        assert!(error.starts_with(&named), "{error}");

        for (path, status, message) in [
            ("/api/diagnoses?run=3", 404, "no run 3"),
            ("/api/diagnoses", 400, "missing `run`"),
        ] {
            let (got, body) = get_json(&server, path);
            assert_eq!(got, status, "{path}: {body}");
            assert!(body["error"].as_str().unwrap().contains(message), "{body}");
        }
        for dir in [found, none, zero] {
            std::fs::remove_dir_all(&dir).ok();
        }
    }

    /// Metrics are read once per version of the file: the same length and time, written in
    /// place, is answered from what was kept; a new time is read again.
    #[test]
    fn metrics_are_read_once_per_version_of_the_file() {
        let dir = tmp("metrics-cache");
        fixture::write_run(&dir, 2).unwrap();
        let (_rt, server) = start(std::slice::from_ref(&dir));
        let last_step = |s: &Server| {
            let (_, body) = get_json(s, "/api/metrics?run=0");
            body["metrics"]["records"][1]["step"].clone()
        };
        assert_eq!(last_step(&server), 2);
        let path = dir.join("metrics.jsonl");
        let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"step\":2"), "{text}");
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        (&file)
            .write_all(text.replace("\"step\":2", "\"step\":7").as_bytes())
            .unwrap();
        file.set_modified(modified).unwrap();
        assert_eq!(last_step(&server), 2);
        file.set_modified(modified + std::time::Duration::from_secs(1))
            .unwrap();
        assert_eq!(last_step(&server), 7);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn directories_that_are_not_runs_are_refused() {
        let empty = tmp("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let err = |dirs: &[PathBuf]| {
            format!(
                "{:#}",
                rt.block_on(bind("127.0.0.1:0", dirs)).err().unwrap()
            )
        };
        assert!(err(std::slice::from_ref(&empty)).contains("is not a run directory"));
        let missing = empty.join("missing");
        assert!(err(&[missing]).contains("missing does not exist"));
        assert!(err(&[]).contains("no run directory"));
        std::fs::remove_dir_all(&empty).ok();
    }
}
