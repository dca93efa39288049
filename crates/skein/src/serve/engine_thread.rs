//! The thread that owns the served model: it runs the engine loop over whatever the handlers
//! submit, and between phases loads new weights when asked (`POST /v1/reload`).

use crate::engine::{Control, Engine, EngineQueue};
use crate::model::{peft, Model, ModelOptions};
use anyhow::{bail, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Starts the engine loop on its own thread. `version` is the policy version of the weights
/// (bumped by each reload; share it with [`ServeState::from_parts`](super::ServeState)). The
/// thread ends when every `EngineHandle` is dropped.
pub fn spawn_engine_thread(
    mut model: Model,
    engine: Engine,
    mut queue: EngineQueue,
    capacity: i64,
    version: Arc<AtomicU64>,
) -> std::io::Result<JoinHandle<()>> {
    // The base directory of the adapters last loaded, if any.
    let mut base = None;
    std::thread::Builder::new()
        .name("skein-engine".into())
        .spawn(move || loop {
            let v = version.load(Ordering::SeqCst);
            match queue
                .run_phase(&engine, &model, v, capacity, engine.max_slots)
                .1
            {
                None => return,
                Some(Control::EndPhase) => {}
                Some(Control::Reload { dir, reply }) => {
                    let answer = reload(&mut model, &mut base, &dir)
                        .map(|()| version.fetch_add(1, Ordering::SeqCst) + 1)
                        .map_err(|e| format!("{e:#}"));
                    // The caller may have gone: the weights are loaded all the same.
                    let _ = reply.send(answer);
                }
            }
        })
}

/// Replaces the weights with those of the HF directory `dir`, which must describe a model of
/// the same vocabulary (the tokenizer stays). A LoRA adapter directory (PEFT's layout) is
/// applied to the base it names: loaded once, then only the adapters change.
fn reload(model: &mut Model, base: &mut Option<BaseId>, dir: &Path) -> Result<()> {
    if dir.join(peft::CONFIG_FILE).is_file() {
        return reload_adapter(model, base, dir);
    }
    // In the served dtype: the KV cache was sized for it.
    let options = ModelOptions {
        dtype: model.options.dtype,
        ..Default::default()
    };
    let fresh = Model::load_dir_with(dir, &options, model.vs.device())?;
    replace(model, fresh, dir)?;
    *base = None;
    Ok(())
}

/// A base directory as last loaded: its path and when its weights were written (a new run
/// may write another base at the same path).
type BaseId = (PathBuf, Option<std::time::SystemTime>);

fn reload_adapter(model: &mut Model, base: &mut Option<BaseId>, dir: &Path) -> Result<()> {
    let lora = peft::read_config(dir)?;
    let named = peft::base_of(dir)?;
    let written = std::fs::metadata(named.join("model.safetensors"))
        .and_then(|m| m.modified())
        .ok();
    let id = (named.clone(), written);
    if base.as_ref() != Some(&id) || model.options.lora != lora {
        let options = ModelOptions {
            lora,
            dtype: model.options.dtype,
        };
        // The new base takes its adapters before it is served: a failure serves the old.
        let fresh = Model::load_dir_with(&named, &options, model.vs.device())?;
        fresh.load_adapter(dir)?;
        replace(model, fresh, &named)?;
        *base = Some(id);
        return Ok(());
    }
    model.load_adapter(dir)
}

fn replace(model: &mut Model, fresh: Model, dir: &Path) -> Result<()> {
    let (had, has) = (model.net.config.vocab_size, fresh.net.config.vocab_size);
    if had != has {
        bail!(
            "{}: its vocabulary has {has} ids, the served model's {had}; serve it with `skein serve --model {}` instead",
            dir.display(),
            dir.display()
        );
    }
    // The server admits prompts by the context it started with; a shorter one would cut them
    // off inside the engine and answer empty completions.
    let (had, has) = (model.net.max_positions(), fresh.net.max_positions());
    if has < had {
        bail!(
            "{}: its context is {has} positions, shorter than the served model's {had}; serve it \
             with `skein serve --model {}` instead",
            dir.display(),
            dir.display()
        );
    }
    // The KV cache was sized to the memory at start-up, for the served model's layers, heads
    // and dtype; a model needing more per token would overflow it at the next request and
    // stop the engine, after this reload had answered success.
    let (had, has) = (kv_bytes_per_token(model), kv_bytes_per_token(&fresh));
    if has > had {
        bail!(
            "{}: its KV cache takes {has} bytes per token, more than the served model's {had}, \
             which the server's cache was sized for at start-up; serve it with `skein serve \
             --model {}` instead",
            dir.display(),
            dir.display()
        );
    }
    *model = fresh;
    Ok(())
}

fn kv_bytes_per_token(model: &Model) -> u64 {
    let bytes = model
        .net
        .config
        .kv_cache_bytes(1, 1, model.options.dtype.bytes());
    bytes as u64
}
