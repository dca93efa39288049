//! Rollouts recorded token-exactly: tasks wait to be handed to agents, each model call an agent
//! makes through its rollout's URL is appended with the exact prompt ids, sampled ids,
//! behavior log-probs and policy versions, and a reward (or a failure) closes the rollout.
//! The trainer takes closed rollouts from here; nothing in a recording came from text.

use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// A task for one rollout, as added by the trainer (or `POST /tasks`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// Unique among the store's rollouts; letters, digits, `-`, `_` and `.` (it goes in URLs).
    pub rollout_id: String,
    /// The advantage group (e.g. the prompt's id, shared by its n samples).
    #[serde(default)]
    pub group: String,
    /// What the agent receives, e.g. `{"prompt": "...", "ground_truth": "..."}`.
    #[serde(default)]
    pub task: serde_json::Value,
}

/// One model call of a rollout, exactly as generated (a request with `n` > 1 records `n`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedCall {
    pub prompt_ids: Vec<u32>,
    pub completion_ids: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub versions: Vec<u64>,
    /// `stop` (a stop token, included in `completion_ids`) or `length`.
    pub finish: String,
}

/// A closed rollout: its calls in the order they finished, and how it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedRollout {
    pub rollout_id: String,
    pub group: String,
    pub calls: Vec<RecordedCall>,
    pub reward: f64,
    pub correct: Option<bool>,
    /// Set when the agent reported a failure instead of a reward.
    pub error: Option<String>,
}

/// Why the store refused something; the routes turn these into 400/404/409.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    BadId(String),
    Duplicate(String),
    /// Never added, or taken so long ago that how it ended is forgotten.
    Unknown(String),
    Closed(String),
    /// Closed (and perhaps taken by the trainer): calls to it are not recorded any more.
    Ended {
        id: String,
        how: String,
    },
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::BadId(id) => write!(
                f,
                "rollout id {id:?} must be 1 to 128 letters, digits, `-`, `_` or `.`"
            ),
            StoreError::Duplicate(id) => write!(f, "rollout `{id}` exists already"),
            StoreError::Unknown(id) => write!(f, "no open rollout `{id}`"),
            StoreError::Closed(id) => write!(f, "rollout `{id}` is closed already"),
            StoreError::Ended { id, how } => write!(f, "rollout `{id}` has ended ({how})"),
        }
    }
}

impl std::error::Error for StoreError {}

/// Where a rollout is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RolloutState {
    /// Added, not handed out yet (its URLs already work).
    Waiting,
    /// Handed to an agent by `GET /tasks/next`.
    Open,
    /// Rewarded or failed, not yet taken by the trainer.
    Closed,
}

struct Entry {
    state: RolloutState,
    task: serde_json::Value,
    rollout: RecordedRollout,
}

#[derive(Default)]
struct Inner {
    rollouts: HashMap<String, Entry>,
    /// Waiting ids in the order they were added.
    waiting: VecDeque<String>,
    /// Closed ids in the order they closed.
    closed: Vec<String>,
    /// How rollouts the trainer took ended, by id, with the order they were taken in (each
    /// with its number, so that an id added again and taken again is forgotten only once):
    /// an agent's late call on a rollout that timed out is told so, not only that it is gone.
    ended: HashMap<String, (u64, String)>,
    ended_order: VecDeque<(u64, String)>,
    taken: u64,
}

/// How many taken rollouts' endings are kept for late calls: about a few steps' worth.
const ENDINGS_KEPT: usize = 1 << 14;

/// How a closed rollout ended, as a late call on it is told.
fn ending(r: &RecordedRollout) -> String {
    match &r.error {
        Some(why) => format!("failed: {why}"),
        None => format!("rewarded {}", r.reward),
    }
}

impl Inner {
    /// The error for a call on `id`, which is not waiting or open.
    fn gone(&self, id: &str) -> StoreError {
        let how = match self.rollouts.get(id) {
            Some(e) => Some(ending(&e.rollout)),
            None => self.ended.get(id).map(|(_, how)| how.clone()),
        };
        match how {
            Some(how) => StoreError::Ended { id: id.into(), how },
            None => StoreError::Unknown(id.into()),
        }
    }

    fn remember_ending(&mut self, r: &RecordedRollout) {
        self.taken += 1;
        let n = self.taken;
        self.ended.insert(r.rollout_id.clone(), (n, ending(r)));
        self.ended_order.push_back((n, r.rollout_id.clone()));
        while self.ended_order.len() > ENDINGS_KEPT {
            if let Some((n, id)) = self.ended_order.pop_front() {
                if self.ended.get(&id).is_some_and(|(m, _)| *m == n) {
                    self.ended.remove(&id);
                }
            }
        }
    }
}

type ClosedHook = Box<dyn Fn(&RecordedRollout) + Send + Sync>;

/// The rollouts of a server, shared by its routes and the trainer.
#[derive(Default)]
pub struct RolloutStore {
    inner: Mutex<Inner>,
    /// Wakes blocking waiters when a rollout closes.
    closed_cv: Condvar,
    /// Wakes async waiters when a rollout closes.
    notify: Notify,
    on_closed: Mutex<Option<ClosedHook>>,
}

/// A task as handed to an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HandedTask {
    pub rollout_id: String,
    pub group: String,
    pub task: serde_json::Value,
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl RolloutStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere while holding the lock leaves plain data behind: keep serving.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds tasks to hand out, all or none: an invalid or already known id refuses the lot.
    pub fn add_tasks(&self, tasks: Vec<TaskSpec>) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let mut seen = std::collections::HashSet::new();
        for t in &tasks {
            if !valid_id(&t.rollout_id) {
                return Err(StoreError::BadId(t.rollout_id.clone()));
            }
            if inner.rollouts.contains_key(&t.rollout_id) || !seen.insert(&t.rollout_id) {
                return Err(StoreError::Duplicate(t.rollout_id.clone()));
            }
        }
        for t in tasks {
            inner.waiting.push_back(t.rollout_id.clone());
            let rollout = RecordedRollout {
                rollout_id: t.rollout_id.clone(),
                group: t.group,
                calls: Vec::new(),
                reward: 0.0,
                correct: None,
                error: None,
            };
            let entry = Entry {
                state: RolloutState::Waiting,
                task: t.task,
                rollout,
            };
            inner.rollouts.insert(t.rollout_id, entry);
        }
        Ok(())
    }

    /// The next waiting task, now open; `None` when none waits.
    pub fn next_task(&self) -> Option<HandedTask> {
        let mut inner = self.lock();
        while let Some(id) = inner.waiting.pop_front() {
            // A rollout closed before it was handed out is skipped.
            if let Some(e) = inner.rollouts.get_mut(&id) {
                if e.state == RolloutState::Waiting {
                    e.state = RolloutState::Open;
                    return Some(HandedTask {
                        rollout_id: id,
                        group: e.rollout.group.clone(),
                        task: e.task.clone(),
                    });
                }
            }
        }
        None
    }

    /// Fails unless `id` is waiting or open (a call to it may be made).
    pub fn check_open(&self, id: &str) -> Result<(), StoreError> {
        let inner = self.lock();
        match inner.rollouts.get(id).map(|e| e.state) {
            None | Some(RolloutState::Closed) => Err(inner.gone(id)),
            Some(_) => Ok(()),
        }
    }

    /// Appends finished calls to an open rollout.
    pub fn record(&self, id: &str, calls: Vec<RecordedCall>) -> Result<(), StoreError> {
        let mut inner = self.lock();
        match inner.rollouts.get_mut(id) {
            Some(e) if e.state != RolloutState::Closed => {
                e.rollout.calls.extend(calls);
                Ok(())
            }
            _ => Err(inner.gone(id)),
        }
    }

    /// Closes a rollout with its reward (`error` set: failed, reward 0).
    pub fn close(
        &self,
        id: &str,
        reward: f64,
        correct: Option<bool>,
        error: Option<String>,
    ) -> Result<(), StoreError> {
        let snapshot = {
            let mut inner = self.lock();
            let hook_set = self.hook().is_some();
            let e = match inner.rollouts.get_mut(id) {
                // Taken by the trainer already: how it ended, if that is still known.
                None => return Err(inner.gone(id)),
                Some(e) if e.state == RolloutState::Closed => {
                    return Err(StoreError::Closed(id.into()))
                }
                Some(e) => e,
            };
            e.state = RolloutState::Closed;
            e.rollout.reward = reward;
            e.rollout.correct = correct;
            e.rollout.error = error;
            let snapshot = hook_set.then(|| e.rollout.clone());
            inner.closed.push(id.to_string());
            snapshot
        };
        self.closed_cv.notify_all();
        self.notify.notify_waiters();
        if let (Some(rollout), Some(hook)) = (snapshot, self.hook().as_ref()) {
            hook(&rollout);
        }
        Ok(())
    }

    fn hook(&self) -> MutexGuard<'_, Option<ClosedHook>> {
        self.on_closed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Calls `hook` with every rollout that closes from now on (on the closing thread; keep it
    /// short, and do not call back into the store from it).
    pub fn set_on_closed(&self, hook: impl Fn(&RecordedRollout) + Send + Sync + 'static) {
        *self.hook() = Some(Box::new(hook));
    }

    /// Removes and returns the closed rollouts, in the order they closed. A taken rollout is
    /// forgotten but for how it ended: its id answers 404 from then on, saying so, and may be
    /// added again.
    pub fn take_closed(&self) -> Vec<RecordedRollout> {
        let mut inner = self.lock();
        let ids = std::mem::take(&mut inner.closed);
        let taken: Vec<RecordedRollout> = ids
            .into_iter()
            .filter_map(|id| inner.rollouts.remove(&id).map(|e| e.rollout))
            .collect();
        for r in &taken {
            inner.remember_ending(r);
        }
        taken
    }

    /// Closed rollouts not yet taken.
    pub fn closed_count(&self) -> usize {
        self.lock().closed.len()
    }

    /// Rollouts added and not yet closed (waiting or open).
    pub fn pending_count(&self) -> usize {
        let inner = self.lock();
        inner.rollouts.len() - inner.closed.len()
    }

    /// Waits until at least `n` rollouts are closed (not taken) or `timeout` passes; returns
    /// how many are closed.
    pub async fn wait_closed(&self, n: usize, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Registered before the check, so a close in between is not missed.
            let notified = self.notify.notified();
            let count = self.closed_count();
            if count >= n {
                return count;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.closed_count();
            }
        }
    }

    /// [`wait_closed`](Self::wait_closed) for threads outside an async runtime.
    pub fn wait_closed_blocking(&self, n: usize, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        let mut inner = self.lock();
        loop {
            if inner.closed.len() >= n {
                return inner.closed.len();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return inner.closed.len();
            }
            inner = self
                .closed_cv
                .wait_timeout(inner, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// A rollout's recording so far and its state; `None` when unknown.
    pub fn get(&self, id: &str) -> Option<(RolloutState, RecordedRollout)> {
        let inner = self.lock();
        inner.rollouts.get(id).map(|e| (e.state, e.rollout.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn spec(id: &str) -> TaskSpec {
        TaskSpec {
            rollout_id: id.into(),
            group: "g".into(),
            task: serde_json::json!({"prompt": id}),
        }
    }

    fn call(n: u32) -> RecordedCall {
        RecordedCall {
            prompt_ids: vec![n],
            completion_ids: vec![n, n],
            logprobs: vec![-0.5, -0.25],
            versions: vec![0, 0],
            finish: "stop".into(),
        }
    }

    #[test]
    fn tasks_are_handed_out_in_order_then_recorded_and_closed() {
        let store = RolloutStore::new();
        store.add_tasks(vec![spec("a"), spec("b")]).unwrap();
        assert_eq!(store.next_task().unwrap().rollout_id, "a");
        store.record("a", vec![call(1), call(2)]).unwrap();
        store.close("a", 1.0, Some(true), None).unwrap();
        assert_eq!(store.next_task().unwrap().rollout_id, "b");
        assert!(store.next_task().is_none());
        assert_eq!(store.pending_count(), 1);
        let closed = store.take_closed();
        assert_eq!(closed.len(), 1);
        assert_eq!(closed[0].calls, vec![call(1), call(2)]);
        assert_eq!((closed[0].reward, closed[0].correct), (1.0, Some(true)));
        assert!(store.take_closed().is_empty());
    }

    #[test]
    fn bad_duplicate_unknown_and_closed_ids_are_refused() {
        let store = RolloutStore::new();
        assert!(matches!(
            store.add_tasks(vec![spec("a/b")]),
            Err(StoreError::BadId(_))
        ));
        assert!(matches!(
            store.add_tasks(vec![spec("x"), spec("x")]),
            Err(StoreError::Duplicate(_))
        ));
        assert_eq!(store.pending_count(), 0, "a refused batch adds nothing");
        store.add_tasks(vec![spec("a")]).unwrap();
        assert!(matches!(
            store.add_tasks(vec![spec("a")]),
            Err(StoreError::Duplicate(_))
        ));
        assert!(matches!(
            store.record("zz", vec![]),
            Err(StoreError::Unknown(_))
        ));
        store
            .close("a", 0.0, None, Some("env crashed".into()))
            .unwrap();
        assert!(matches!(
            store.close("a", 1.0, None, None),
            Err(StoreError::Closed(_))
        ));
        assert!(matches!(
            store.check_open("a"),
            Err(StoreError::Ended { .. })
        ));
        assert!(
            store.next_task().is_none(),
            "a closed waiting task is skipped"
        );
    }

    /// A call on a rollout that closed, before or after the trainer took it, says how it
    /// ended (a trainer's timeout, an agent's failure, a reward); one added again is open.
    #[test]
    fn late_calls_are_told_how_their_rollout_ended() {
        let store = RolloutStore::new();
        store.add_tasks(vec![spec("slow"), spec("done")]).unwrap();
        let timeout = "not closed within 300s (agent.rollout_timeout_s)";
        store
            .close("slow", 0.0, None, Some(timeout.into()))
            .unwrap();
        store.close("done", 0.5, None, None).unwrap();
        let said = |e: StoreError| e.to_string();
        let late = said(store.record("slow", vec![call(1)]).unwrap_err());
        assert_eq!(
            late,
            format!("rollout `slow` has ended (failed: {timeout})")
        );
        assert_eq!(store.take_closed().len(), 2);
        let late = said(store.close("slow", 1.0, None, None).unwrap_err());
        assert!(late.contains(timeout), "{late}");
        let late = said(store.check_open("done").unwrap_err());
        assert_eq!(late, "rollout `done` has ended (rewarded 0.5)");
        store.add_tasks(vec![spec("slow")]).unwrap();
        store.check_open("slow").unwrap();
        assert!(matches!(
            store.check_open("never"),
            Err(StoreError::Unknown(_))
        ));
    }

    #[test]
    fn waiters_wake_when_rollouts_close_and_the_hook_sees_them() {
        let store = Arc::new(RolloutStore::new());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        store.set_on_closed(move |r| s.lock().unwrap().push(r.rollout_id.clone()));
        store.add_tasks(vec![spec("a"), spec("b")]).unwrap();
        let closer = {
            let store = store.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                store.close("a", 1.0, None, None).unwrap();
                store.close("b", 0.0, None, None).unwrap();
            })
        };
        assert_eq!(store.wait_closed_blocking(2, Duration::from_secs(10)), 2);
        closer.join().unwrap();
        assert_eq!(*seen.lock().unwrap(), vec!["a", "b"]);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        assert_eq!(
            rt.block_on(store.wait_closed(3, Duration::from_millis(10))),
            2
        );
    }
}
