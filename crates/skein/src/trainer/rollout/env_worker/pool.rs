//! The processes of an environment worker: a fixed number of slots, each holding one running
//! process (a [`LineProcess`]) that hosts many episodes at once.
//!
//! An episode lives in the process that answered its `reset` (its [`Home`]). A process
//! answers one request at a time, so a call holds its slot until the answer comes or its
//! deadline passes. Every request carries an `"id"` its answer must echo. A process that
//! exits, hangs past the deadline, writes a line that is not JSON, or answers with another id
//! (it answered some request twice, so its answers no longer line up with the requests) is
//! killed (with its process group), and every episode it hosted fails when it next calls; the
//! slot starts a new process for the next episode. A `{"error": …}` answer, or a JSON answer
//! of the wrong shape, fails only the request's own episode: the process stays in step and
//! keeps going.

use serde_json::{Map, Value};
use skein_reward::lines::{LineError, LineProcess};
use skein_tasks::EnvError;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// Longest a worker's line is quoted in an error.
const QUOTE_CHARS: usize = 200;

/// The process an episode lives in: a slot and which of its processes (the count of
/// processes the slot had started when the episode began).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Home {
    slot: usize,
    generation: u64,
}

/// A call's answer and where it was answered.
pub struct Answer {
    pub fields: Map<String, Value>,
    pub home: Home,
    /// The answering process's stdin, for lines without an answer (`close`). Sending on it
    /// does nothing once that process is gone.
    pub stdin: Sender<String>,
}

struct Slot {
    process: Option<LineProcess>,
    /// Processes this slot has started.
    generation: u64,
    /// Why its last process ended.
    ended: String,
}

pub struct Pool {
    command: Vec<String>,
    label: String,
    /// Longest one answer may take.
    timeout: Duration,
    /// Extra time a new process gets for its first answer.
    start_timeout: Duration,
    slots: Vec<Mutex<Slot>>,
    /// Where the next episode goes (round robin).
    next: AtomicUsize,
    /// The id of the next request.
    next_id: AtomicU64,
    restarts: AtomicU64,
}

fn lock(m: &Mutex<Slot>) -> MutexGuard<'_, Slot> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `request` with its `"id"`.
fn with_id(request: &Value, id: u64) -> Value {
    let mut request = request.clone();
    if let Some(fields) = request.as_object_mut() {
        fields.insert("id".into(), id.into());
    }
    request
}

/// The fields of `line` when it is the answer to request `id` (its `"id"` removed), else why
/// the process is out of step.
fn in_step(line: &str, id: u64) -> Result<Map<String, Value>, String> {
    let Ok(Value::Object(mut fields)) = serde_json::from_str::<Value>(line) else {
        return Err(format!(
            "it wrote a line that is not a JSON object: {}",
            quote(line)
        ));
    };
    match fields.remove("id") {
        Some(answered) if answered == id => Ok(fields),
        None | Some(Value::Null) => Err(format!(
            "its answer to request {id} has no \"id\" (every answer must echo its \
             request's \"id\"): {}",
            quote(line)
        )),
        Some(other) => Err(format!(
            "it answered request {id} with id {}: its answers no longer line up with the \
             requests (it answered one twice, or out of order)",
            quote(&other.to_string())
        )),
    }
}

fn quote(line: &str) -> String {
    match line.char_indices().nth(QUOTE_CHARS) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line.to_string(),
    }
}

impl Pool {
    /// Starts `processes` processes of `command` and asks each `first` (the `info` request):
    /// their answers, in slot order. Fails, naming the process, when one cannot start or
    /// answer.
    pub fn start(
        command: &[String],
        processes: usize,
        timeout: Duration,
        start_timeout: Duration,
        first: &Value,
    ) -> Result<(Pool, Vec<Map<String, Value>>), String> {
        let pool = Pool {
            command: command.to_vec(),
            label: command.join(" "),
            timeout,
            start_timeout,
            slots: (0..processes)
                .map(|_| {
                    Mutex::new(Slot {
                        process: None,
                        generation: 0,
                        ended: String::new(),
                    })
                })
                .collect(),
            next: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            restarts: AtomicU64::new(0),
        };
        let mut answers = Vec::with_capacity(processes);
        for slot in 0..processes {
            match pool.call_in(slot, None, first) {
                Ok(a) => answers.push(a.fields),
                Err(e) => return Err(e.message),
            }
        }
        // The processes started here are not restarts.
        pool.restarts.store(0, Ordering::Relaxed);
        Ok((pool, answers))
    }

    /// Processes started again after one ended.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    fn name(&self, slot: usize) -> String {
        format!(
            "environment worker `{}` (process {} of {})",
            self.label,
            slot + 1,
            self.slots.len()
        )
    }

    /// `request` to the process of the next slot in turn (a new episode's `reset`), starting
    /// one there if it has none.
    pub fn call_new(&self, request: &Value) -> Result<Answer, EnvError> {
        let slot = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        self.call_in(slot, None, request)
    }

    /// `request` to the process an episode lives in; fails when that process is gone.
    pub fn call_home(&self, home: Home, request: &Value) -> Result<Answer, EnvError> {
        self.call_in(home.slot, Some(home.generation), request)
    }

    fn call_in(
        &self,
        slot_index: usize,
        generation: Option<u64>,
        request: &Value,
    ) -> Result<Answer, EnvError> {
        let name = self.name(slot_index);
        let mut slot = lock(&self.slots[slot_index]);
        let alive = slot.process.as_mut().is_some_and(|p| p.running());
        if let (false, Some(p)) = (alive, slot.process.as_mut()) {
            // It exited on its own, between requests: what its episodes' errors quote.
            let status = p.exit_status().unwrap_or_else(|| "status unknown".into());
            slot.ended = format!("it exited between requests, {status}");
            slot.process = None;
        }
        if let Some(g) = generation {
            if g != slot.generation || !alive {
                return Err(EnvError::worker(format!(
                    "{name} ended while it hosted this episode ({})",
                    slot.ended
                )));
            }
        }
        if !alive {
            // Which slot it is, for a worker that logs or picks a device by it.
            let env = [("SKEIN_WORKER", slot_index.to_string())];
            match LineProcess::spawn_with_env(&self.command, "skein-env-worker", &env) {
                Ok(p) => {
                    slot.process = Some(p);
                    slot.generation += 1;
                    self.restarts.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    slot.process = None;
                    return Err(EnvError::worker(format!("{name} could not start: {e}")));
                }
            }
        }
        let home = Home {
            slot: slot_index,
            generation: slot.generation,
        };
        let Some(process) = slot.process.as_mut() else {
            return Err(EnvError::worker(format!("{name} is not running")));
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        process.send(format!("{}\n", with_id(request, id)));
        let allowed = if process.answered() {
            self.timeout
        } else {
            self.timeout + self.start_timeout
        };
        let line = match process.recv(allowed) {
            Ok(line) => line,
            Err(LineError::Closed(detail)) => {
                let why = format!("it died: {detail}; its stderr says why");
                return Err(self.end(&mut slot, &name, why));
            }
            Err(LineError::Timeout) => {
                let why = format!(
                    "it did not answer within {:.1}s (agent.env_timeout_s) and was killed",
                    allowed.as_secs_f64()
                );
                let e = self.end(&mut slot, &name, why);
                return Err(EnvError::timed_out(e.message));
            }
        };
        let stdin = process.sender();
        match in_step(&line, id) {
            Ok(fields) => self.answer(fields, &name, home, stdin),
            // Its output may no longer line up with the requests: start it again.
            Err(why) => Err(self.end(&mut slot, &name, why)),
        }
    }

    /// An answer in step with its request: the fields, or the error it reports.
    fn answer(
        &self,
        fields: Map<String, Value>,
        name: &str,
        home: Home,
        stdin: Sender<String>,
    ) -> Result<Answer, EnvError> {
        match fields.get("error") {
            None | Some(Value::Null) => Ok(Answer {
                fields,
                home,
                stdin,
            }),
            Some(e) => {
                let e = e.as_str().map_or_else(|| e.to_string(), str::to_string);
                Err(EnvError::new(format!(
                    "{name} reported an error: {}",
                    quote(&e)
                )))
            }
        }
    }

    /// Kills the slot's process for `why`; the error of the call that found out.
    fn end(&self, slot: &mut Slot, name: &str, why: String) -> EnvError {
        if let Some(p) = slot.process.take() {
            p.kill();
        }
        slot.ended = why.clone();
        EnvError::worker(format!("{name}: {why}"))
    }

    /// The answer's message, for an answer that has the wrong shape: names the worker.
    pub fn shape_error(&self, home: Home, op: &str, problem: &str) -> EnvError {
        EnvError::worker(format!(
            "{} answered `{op}` wrongly: {problem}",
            self.name(home.slot)
        ))
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pool({} × {})", self.label, self.slots.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    /// Answers each request with a fixed JSON line echoing its id, or misbehaves on a marker.
    const ECHO: &str = r#"while read -r line; do
        id=$(printf '%s' "$line" | sed 's/.*"id":\([0-9]*\).*/\1/')
        case "$line" in
          *die*) exit 3 ;;
          *quit*) echo '{"id":'$id',"ok":true}'; exit 4 ;;
          *hang*) sleep 30 ;;
          *garbage*) echo 'not json' ;;
          *oops*) echo '{"id":'$id',"error":"bad move"}' ;;
          *twice*) echo '{"id":'$id'}'; echo '{"id":'$id'}' ;;
          *anonymous*) echo '{"ok":true}' ;;
          *) echo '{"id":'$id',"ok":true,"pid":'$$',"slot":'$SKEIN_WORKER'}' ;;
        esac
      done"#;

    fn pool(n: usize) -> Pool {
        Pool::start(&sh(ECHO), n, secs(0.5), secs(5.0), &json!({"op": "info"}))
            .unwrap()
            .0
    }

    #[test]
    fn episodes_are_spread_over_the_processes_and_stay_home() {
        let p = pool(2);
        let a = p.call_new(&json!({"op": "reset"})).unwrap();
        let b = p.call_new(&json!({"op": "reset"})).unwrap();
        assert_ne!(a.home, b.home);
        assert_ne!(a.fields["pid"], b.fields["pid"]);
        assert_eq!(
            (&a.fields["slot"], &b.fields["slot"]),
            (&json!(0), &json!(1))
        );
        let again = p.call_home(a.home, &json!({"op": "step"})).unwrap();
        assert_eq!(again.fields["pid"], a.fields["pid"]);
        assert_eq!(p.restarts(), 0);
    }

    /// A crash, a hang and garbage each fail the call that met them and every episode of that
    /// process, naming the worker; the slot starts a new process for the next episode. An
    /// error answer fails only its own request.
    #[test]
    fn a_broken_process_fails_its_episodes_and_is_replaced() {
        let p = pool(1);
        for (marker, says) in [
            ("die", "it died"),
            ("hang", "did not answer within"),
            ("garbage", "not a JSON object: not json"),
        ] {
            let home = p.call_new(&json!({"op": "reset"})).unwrap().home;
            let other = p.call_new(&json!({"op": "reset"})).unwrap().home;
            let e = p.call_home(home, &json!({ "op": marker })).err().unwrap();
            assert!(e.worker_failed, "{marker}");
            assert!(e.message.contains(says), "{marker}: {}", e.message);
            assert!(e.message.contains("process 1 of 1"), "{}", e.message);
            let lost = p.call_home(other, &json!({"op": "step"})).err().unwrap();
            assert!(lost.worker_failed && lost.message.contains("ended while it hosted"));
            assert!(p.call_new(&json!({"op": "reset"})).is_ok(), "{marker}");
        }
        assert_eq!(p.restarts(), 3);
        let home = p.call_new(&json!({"op": "reset"})).unwrap().home;
        let e = p.call_home(home, &json!({"op": "oops"})).err().unwrap();
        assert!(!e.worker_failed && e.message.contains("bad move"), "{e}");
        assert!(p.call_home(home, &json!({"op": "step"})).is_ok());
        assert_eq!(p.restarts(), 3);
    }

    /// A process that exits on its own between requests fails its episodes with how it
    /// ended, not with an empty reason (or the reason an earlier process of the slot ended).
    #[test]
    fn a_process_that_exits_between_requests_is_named_with_its_status() {
        let p = pool(1);
        let home = p.call_new(&json!({"op": "reset"})).unwrap().home;
        let killed = p.call_new(&json!({"op": "hang"})).err().unwrap();
        assert!(killed.message.contains("did not answer within"), "{killed}");
        let home = p
            .call_new(&json!({"op": "reset"}))
            .map(|a| a.home)
            .unwrap_or(home);
        assert!(p.call_home(home, &json!({"op": "quit"})).is_ok());
        std::thread::sleep(Duration::from_millis(300));
        let e = p.call_home(home, &json!({"op": "step"})).err().unwrap();
        assert!(e.worker_failed);
        assert!(
            e.message.contains(
                "ended while it hosted this episode (it exited between requests, exit status: 4)"
            ),
            "{}",
            e.message
        );
    }

    /// A process that answers a request twice, or without its id, is out of step: the next
    /// request it gets (or that one) fails its episode, the process is replaced, and the
    /// next episode gets answers of its own.
    #[test]
    fn answers_that_do_not_echo_their_request_s_id_restart_the_process() {
        let p = pool(1);
        let home = p.call_new(&json!({"op": "reset"})).unwrap().home;
        let first = p.call_home(home, &json!({"op": "twice"})).unwrap();
        assert!(!first.fields.contains_key("id"), "the id is the pool's");
        let e = p.call_home(home, &json!({"op": "step"})).err().unwrap();
        assert!(e.worker_failed, "{e}");
        assert!(
            e.message.contains("answered request") && e.message.contains("answered one twice"),
            "{}",
            e.message
        );
        let fresh = p.call_new(&json!({"op": "reset"})).unwrap();
        assert_eq!(fresh.fields["ok"], json!(true));
        assert_eq!(p.restarts(), 1);
        let e = p
            .call_home(fresh.home, &json!({"op": "anonymous"}))
            .err()
            .unwrap();
        assert!(
            e.worker_failed && e.message.contains("has no \"id\""),
            "{e}"
        );
        assert!(p.call_new(&json!({"op": "reset"})).is_ok());
        assert_eq!(p.restarts(), 2);
    }

    #[test]
    fn a_command_that_cannot_start_or_answer_fails_the_start_naming_it() {
        let info = json!({"op": "info"});
        let e =
            Pool::start(&["/nonexistent/env".into()], 1, secs(1.0), secs(1.0), &info).unwrap_err();
        assert!(
            e.contains("/nonexistent/env") && e.contains("could not start"),
            "{e}"
        );
        let e = Pool::start(&sh("exit 2"), 1, secs(1.0), secs(1.0), &info).unwrap_err();
        assert!(e.contains("it died"), "{e}");
    }
}
