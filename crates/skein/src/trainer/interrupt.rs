//! Ctrl-C during training, handled from start-up to exit. For the first two presses the
//! handler only counts; the main thread acts on them at safe points (a `process::exit` from
//! the handler's thread, running exit hooks while the main thread is inside libtorch, crashed
//! the process). The first press lets the
//! current step finish, writes a resumable checkpoint and exits cleanly (during the warm-up,
//! which has nothing to resume, it stops after the current warm-up step); the second stops
//! at the end of the current stage of the step (rollout, preparation, update), without a
//! checkpoint. A stage can be long (an evaluation of many problems, a hung environment
//! waiting out its timeout), so the third press stops at once, from the handler's thread,
//! with `_exit`, which runs no exit hook: as a kill would, but with skein's worker processes
//! taken along. A run's files are already
//! safe against a kill: checkpoints are written aside and renamed, and a resume cuts the
//! records back to its checkpoint.
//!
//! SIGTERM is a press too: schedulers preempting a job (SLURM, Kubernetes), `docker stop` and
//! `timeout` send it before they kill, and a run they stop should keep its step. Its handler
//! only sends this process a SIGINT. (ctrlc's own `termination` feature would also take
//! SIGHUP, and refuses to install anything where SIGHUP is ignored, as under `nohup`.)

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;

static PRESSES: AtomicUsize = AtomicUsize::new(0);
static INSTALL: Once = Once::new();
/// Whether the warm-up runs, which a first press stops without a checkpoint.
static IN_WARM_UP: AtomicBool = AtomicBool::new(false);

/// Held while the warm-up runs, for what a first press says it will do.
pub struct WarmUpPhase(());

impl WarmUpPhase {
    pub fn enter() -> WarmUpPhase {
        IN_WARM_UP.store(true, Ordering::SeqCst);
        WarmUpPhase(())
    }
}

impl Drop for WarmUpPhase {
    fn drop(&mut self) {
        IN_WARM_UP.store(false, Ordering::SeqCst);
    }
}

/// The exit status of a run stopped by a second Ctrl-C (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: i32 = 130;

/// Installs the handler (once per process; later calls do nothing).
pub fn install() {
    INSTALL.call_once(|| {
        let installed = ctrlc::set_handler(|| match PRESSES.fetch_add(1, Ordering::SeqCst) {
            0 if IN_WARM_UP.load(Ordering::SeqCst) => eprintln!(
                "\nskein: interrupt: stopping after this warm-up step, without a checkpoint (a \
                 run has nothing to resume before its first RL step; Ctrl-C again to stop sooner)"
            ),
            0 => eprintln!(
                "\nskein: interrupt: finishing this step, then writing a checkpoint \
                 (Ctrl-C again to stop sooner, without one)"
            ),
            1 => eprintln!(
                "\nskein: second interrupt: stopping at the end of this stage (Ctrl-C a third \
                 time to stop at once)"
            ),
            _ => {
                eprintln!(
                    "\nskein: third interrupt: stopped at once; this step is lost and no \
                     checkpoint was written"
                );
                skein_reward::lines::reaper::exit_now(EXIT_INTERRUPTED)
            }
        });
        if let Err(e) = installed {
            eprintln!("skein: Ctrl-C will stop the run at once ({e})");
            return;
        }
        forward_sigterm();
    });
}

/// Makes SIGTERM a Ctrl-C press, unless something already handles or ignores it.
fn forward_sigterm() {
    extern "C" fn as_sigint(_: libc::c_int) {
        // kill(2) is async-signal-safe; the Ctrl-C handler does the rest on its own thread.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGINT);
        }
    }
    // SAFETY: plain sigaction calls on zeroed structs; the handler only calls kill(2).
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = as_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGTERM, &action, &mut old) != 0 {
            eprintln!("skein: SIGTERM will stop the run at once (its handler did not install)");
            return;
        }
        if old.sa_sigaction != libc::SIG_DFL {
            libc::sigaction(libc::SIGTERM, &old, std::ptr::null_mut());
        }
    }
}

/// Whether Ctrl-C was pressed (or SIGTERM sent) since the process started.
pub fn requested() -> bool {
    PRESSES.load(Ordering::SeqCst) > 0
}

/// A safe point of the main thread: after a second Ctrl-C the process exits here, saying
/// where it stopped.
pub fn exit_if_urgent(after: &str) {
    if PRESSES.load(Ordering::SeqCst) > 1 {
        eprintln!("skein: stopped after {after} (second interrupt); no checkpoint was written");
        std::process::exit(EXIT_INTERRUPTED);
    }
}
