//! What every handler shares: the engine handle, the text side, the rollout store, the
//! settings, the policy version, and the in-flight limit.

use super::config::ServeConfig;
use super::store::RolloutStore;
use super::text::TextSide;
use crate::engine::EngineHandle;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::Semaphore;

/// The state of one server. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct ServeState(pub(super) Arc<Shared>);

pub(super) struct Shared {
    pub engine: EngineHandle,
    pub text: TextSide,
    pub store: Arc<RolloutStore>,
    pub config: ServeConfig,
    pub version: Arc<AtomicU64>,
    /// One permit per request in flight; none left means 503.
    pub permits: Arc<Semaphore>,
    /// For response ids (`chatcmpl-N`, `call_N`).
    pub next_id: AtomicU64,
    /// Whether the server listens on an address other hosts can reach (set when bound).
    pub exposed: AtomicBool,
}

impl ServeState {
    /// A server over `engine` with a fresh rollout store and policy version 0. `config.capacity`
    /// must be the capacity the engine loop runs with (longer prompts are refused here, never
    /// truncated there).
    pub fn new(engine: EngineHandle, text: TextSide, config: ServeConfig) -> Self {
        let store = Arc::new(RolloutStore::new());
        Self::from_parts(engine, text, config, store, Arc::new(AtomicU64::new(0)))
    }

    /// [`new`](Self::new) with a store and a version counter the caller shares (the trainer
    /// takes closed rollouts from `store` and stores the policy version in `version`).
    pub fn from_parts(
        engine: EngineHandle,
        text: TextSide,
        config: ServeConfig,
        store: Arc<RolloutStore>,
        version: Arc<AtomicU64>,
    ) -> Self {
        let permits = Arc::new(Semaphore::new(config.max_concurrent.max(1)));
        ServeState(Arc::new(Shared {
            engine,
            text,
            store,
            config,
            version,
            permits,
            next_id: AtomicU64::new(0),
            exposed: AtomicBool::new(false),
        }))
    }

    /// The rollouts this server records.
    pub fn store(&self) -> Arc<RolloutStore> {
        self.0.store.clone()
    }

    /// The policy version `/health` reports; the engine loop's owner keeps it current.
    pub fn version(&self) -> Arc<AtomicU64> {
        self.0.version.clone()
    }

    pub(super) fn current_version(&self) -> u64 {
        self.0.version.load(Ordering::SeqCst)
    }

    /// Records where the server listens: anything but a loopback address is reachable from
    /// other hosts.
    pub(super) fn bound_to(&self, addr: std::net::SocketAddr) {
        let exposed = !addr.ip().is_loopback();
        self.0.exposed.store(exposed, Ordering::SeqCst);
    }

    /// Reachable from other hosts with no API key: routes that touch the server's files
    /// (`/v1/reload`) are refused.
    pub(super) fn open_to_other_hosts(&self) -> bool {
        self.0.config.api_key.is_none() && self.0.exposed.load(Ordering::SeqCst)
    }

    pub(super) fn fresh_id(&self) -> u64 {
        self.0.next_id.fetch_add(1, Ordering::Relaxed)
    }
}
