//! The engine as a service: any thread or async task submits a request through an
//! [`EngineHandle`] and awaits its output, while the one thread that owns the model runs the
//! engine loop over everything submitted ([`EngineQueue::run_phase`]), so concurrent callers —
//! agent episodes, HTTP clients — share decode steps (continuous batching).
//!
//! A phase ends on a control message (the trainer's end of rollout, a weight reload) or when
//! every handle is gone; requests submitted meanwhile wait in the queue for the next phase.

use super::continuous::{Engine, EngineStats, Feed, GenOutput, GenRequest};
use crate::model::Model;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use tokio::sync::oneshot;

/// What the owner of the model is asked to do between phases.
#[derive(Debug)]
pub enum Control {
    /// Stop after what is running (the rollout of a training step is complete).
    EndPhase,
    /// Load the weights of this Hugging Face directory, then reply with the new version.
    Reload {
        dir: PathBuf,
        reply: oneshot::Sender<Result<u64, String>>,
    },
}

enum Msg {
    Generate(GenRequest, oneshot::Sender<GenOutput>),
    Control(Control),
}

/// The engine stopped serving (its owner returned or failed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineGone;

impl std::fmt::Display for EngineGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the rollout engine is no longer running")
    }
}

impl std::error::Error for EngineGone {}

/// Submits requests to an engine loop running elsewhere. Cheap to clone.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Msg>,
    /// Requests submitted and not yet answered.
    in_flight: Arc<AtomicUsize>,
    /// Cleared when the queue is dropped: its owner returned, or panicked.
    running: Arc<AtomicBool>,
}

/// The receiving side, owned by the thread that owns the model.
pub struct EngineQueue {
    rx: mpsc::Receiver<Msg>,
    in_flight: Arc<AtomicUsize>,
    running: Arc<AtomicBool>,
}

impl Drop for EngineQueue {
    fn drop(&mut self) {
        self.running.store(false, Ordering::SeqCst);
    }
}

pub fn channel() -> (EngineHandle, EngineQueue) {
    let (tx, rx) = mpsc::channel();
    let in_flight = Arc::new(AtomicUsize::new(0));
    let running = Arc::new(AtomicBool::new(true));
    (
        EngineHandle {
            tx,
            in_flight: in_flight.clone(),
            running: running.clone(),
        },
        EngineQueue {
            rx,
            in_flight,
            running,
        },
    )
}

impl EngineHandle {
    /// Generates one request (its `id` is the caller's own; it comes back unchanged).
    pub async fn generate(&self, req: GenRequest) -> Result<GenOutput, EngineGone> {
        let rx = self.submit(req)?;
        rx.await.map_err(|_| EngineGone)
    }

    /// [`generate`](Self::generate) for threads outside an async runtime.
    pub fn generate_blocking(&self, req: GenRequest) -> Result<GenOutput, EngineGone> {
        self.submit(req)?.blocking_recv().map_err(|_| EngineGone)
    }

    fn submit(&self, req: GenRequest) -> Result<oneshot::Receiver<GenOutput>, EngineGone> {
        let (tx, rx) = oneshot::channel();
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        if self.tx.send(Msg::Generate(req, tx)).is_err() {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(EngineGone);
        }
        Ok(rx)
    }

    pub fn control(&self, c: Control) -> Result<(), EngineGone> {
        self.tx.send(Msg::Control(c)).map_err(|_| EngineGone)
    }

    /// Requests submitted and not yet answered (queued or generating).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Whether the engine loop still serves: false once its owner has returned or died (a
    /// panic in the engine thread), when every request would fail with [`EngineGone`].
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::SeqCst)
    }
}

impl EngineQueue {
    /// Runs the engine loop at `version` over submitted requests until a control message
    /// arrives (returned, for the caller to act on) or every handle is dropped (`None`).
    /// Requests already admitted finish first. At most `concurrent` requests run at once (the
    /// engine's `max_slots` bound it too): the KV cache holds that many slots of `capacity`
    /// positions, so a caller that knows how many requests it has sizes the cache to them.
    pub fn run_phase(
        &mut self,
        engine: &Engine,
        model: &Model,
        version: u64,
        capacity: i64,
        concurrent: usize,
    ) -> (EngineStats, Option<Control>) {
        // Engine-side id → the caller's id and where its output goes.
        let waiting: RefCell<HashMap<u64, (u64, oneshot::Sender<GenOutput>)>> = RefCell::default();
        let mut next_id = 0u64;
        let mut control = None;
        let mut closed = false;
        let (rx, in_flight) = (&self.rx, &self.in_flight);
        let mut feed = |block: bool| {
            if closed || control.is_some() {
                return Feed::Closed;
            }
            let mut reqs = Vec::new();
            let mut next = if block {
                rx.recv().map_err(|_| mpsc::TryRecvError::Disconnected)
            } else {
                rx.try_recv()
            };
            loop {
                match next {
                    Ok(Msg::Generate(mut req, reply)) => {
                        waiting.borrow_mut().insert(next_id, (req.id, reply));
                        req.id = next_id;
                        next_id += 1;
                        reqs.push(req);
                    }
                    Ok(Msg::Control(c)) => {
                        control = Some(c);
                        break;
                    }
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        closed = true;
                        break;
                    }
                }
                next = rx.try_recv();
            }
            if reqs.is_empty() && (closed || control.is_some()) {
                Feed::Closed
            } else {
                Feed::Requests(reqs)
            }
        };
        let stats = engine.run(
            model,
            version,
            capacity,
            concurrent,
            &mut feed,
            |mut out| {
                if let Some((id, reply)) = waiting.borrow_mut().remove(&out.id) {
                    out.id = id;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    // The caller may have given up (a disconnected client): nothing to do.
                    let _ = reply.send(out);
                }
            },
        );
        (stats, control)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::SamplingParams;
    use crate::model::ModelConfig;
    use tch::Device;

    fn request(id: u64, prompt: Vec<u32>) -> GenRequest {
        GenRequest {
            id,
            prompt,
            resumed: vec![],
            params: SamplingParams {
                temperature: 0.0,
                max_new_tokens: 5,
                ..Default::default()
            },
            budget: None,
            session: None,
            watch: None,
        }
    }

    /// Callers on many threads share one engine loop and each gets exactly what a direct
    /// `generate` of its request gives (greedy), under its own id.
    #[test]
    fn concurrent_callers_get_their_own_outputs() {
        let cfg = ModelConfig::tiny_qwen2(30, 32, 1, 2, 1, 64, 64);
        let model = Model::random(&cfg, Device::Cpu, 5).unwrap();
        let engine = Engine::new(8);
        let prompts: Vec<Vec<u32>> = (0..12u32).map(|i| vec![1 + i % 7, 2, 3 + i]).collect();
        let mut direct = Vec::new();
        engine.generate(
            &model,
            0,
            prompts
                .iter()
                .enumerate()
                .map(|(i, p)| request(i as u64, p.clone()))
                .collect(),
            |o| direct.push(o),
        );
        direct.sort_by_key(|o| o.id);

        let (handle, mut queue) = channel();
        let outs = std::thread::scope(|s| {
            let callers: Vec<_> = prompts
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let h = handle.clone();
                    let p = p.clone();
                    s.spawn(move || h.generate_blocking(request(100 + i as u64, p)))
                })
                .collect();
            drop(handle);
            let (stats, control) = queue.run_phase(&engine, &model, 7, 64, engine.max_slots);
            assert!(control.is_none(), "every handle dropped ends the phase");
            assert_eq!(stats.generated_tokens, 12 * 5);
            callers
                .into_iter()
                .map(|c| c.join().unwrap().unwrap())
                .collect::<Vec<_>>()
        });
        for (i, (out, want)) in outs.iter().zip(&direct).enumerate() {
            assert_eq!(out.id, 100 + i as u64);
            assert_eq!(out.tokens, want.tokens);
            assert!(out.versions.iter().all(|&v| v == 7));
        }
    }

    /// A control message ends the phase; requests sent after it wait for the next one.
    #[test]
    fn a_control_message_ends_the_phase_and_later_requests_wait() {
        let cfg = ModelConfig::tiny_qwen2(30, 32, 1, 2, 1, 64, 64);
        let model = Model::random(&cfg, Device::Cpu, 5).unwrap();
        let engine = Engine::new(4);
        let (handle, mut queue) = channel();
        let first = handle.submit(request(1, vec![1, 2])).unwrap();
        handle.control(Control::EndPhase).unwrap();
        let second = handle.submit(request(2, vec![3, 4])).unwrap();
        assert_eq!(handle.in_flight(), 2);
        let (_, control) = queue.run_phase(&engine, &model, 0, 64, engine.max_slots);
        assert!(matches!(control, Some(Control::EndPhase)));
        assert_eq!(first.blocking_recv().unwrap().id, 1);
        assert_eq!(handle.in_flight(), 1);
        drop(handle);
        let (_, control) = queue.run_phase(&engine, &model, 1, 64, engine.max_slots);
        assert!(control.is_none());
        let out = second.blocking_recv().unwrap();
        assert_eq!((out.id, out.versions[0]), (2, 1));
    }
}
