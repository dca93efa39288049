//! Worker processes never outlive the program that started them.
//!
//! Every live worker's process group is recorded in a fixed table that a signal handler can
//! read. The groups still recorded are killed when the program exits normally (an `atexit`
//! hook: a return from `main` or `std::process::exit`), and on SIGTERM, SIGHUP and SIGINT
//! where nothing else handles the signal (the handler kills them, then the signal ends the
//! program as it would have). A handler installed by the program itself, such as the
//! trainer's Ctrl-C handler, is left in place: it ends in a normal exit, which the hook covers.
//!
//! On Linux each worker also gets SIGKILL when skein dies any other way (SIGKILL, a crash):
//! `PR_SET_PDEATHSIG`. That signal follows the *thread* that started the child, so workers
//! are started from one thread that lives as long as the process; a worker started from a
//! short-lived rollout thread would otherwise die with that thread.

use std::process::{Child, Command};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::OnceLock;

/// Worker process groups alive at once that are recorded; beyond that, a worker is still
/// started and killed as usual, with only the parent-death signal as a backstop.
const SLOTS: usize = 1024;

/// Process group ids of live workers; 0 is a free slot.
static GROUPS: [AtomicI32; SLOTS] = [const { AtomicI32::new(0) }; SLOTS];

/// A recorded process group; dropping it forgets the group (do so before reaping its leader,
/// so the id cannot be reused while still recorded).
#[derive(Debug)]
pub struct Recorded(Option<usize>);

impl Recorded {
    /// Records `group` (a child's pid, which leads its own group), installing the hooks the
    /// first time.
    pub fn new(group: u32) -> Recorded {
        install_hooks();
        let Ok(group) = i32::try_from(group) else {
            return Recorded(None);
        };
        let slot = GROUPS.iter().position(|g| {
            g.compare_exchange(0, group, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        });
        Recorded(slot)
    }
}

impl Drop for Recorded {
    fn drop(&mut self) {
        if let Some(slot) = self.0 {
            GROUPS[slot].store(0, Ordering::SeqCst);
        }
    }
}

/// SIGKILL to every recorded group. Only atomics and kill(2): safe in a signal handler.
fn kill_recorded() {
    for g in &GROUPS {
        let group = g.load(Ordering::SeqCst);
        if group > 0 {
            // SAFETY: kill(2) touches no memory of ours; a negative pid names a process group.
            unsafe {
                libc::kill(-group, libc::SIGKILL);
            }
        }
    }
}

extern "C" fn at_exit() {
    kill_recorded();
}

/// Ends the program at once with `code`, from any thread, taking the recorded workers with
/// it. Nothing else runs: no destructor, no exit hook (`_exit(2)`), so a thread still inside a
/// library is not torn down under its feet; what the program was writing is left as a kill
/// would leave it.
pub fn exit_now(code: i32) -> ! {
    kill_recorded();
    // SAFETY: _exit(2) ends the process without touching its memory.
    unsafe { libc::_exit(code) }
}

/// Kills the workers, then lets the signal end the program: the handler was installed with
/// SA_RESETHAND, so the signal raised again here is acted on by default once this returns.
extern "C" fn on_signal(signal: libc::c_int) {
    kill_recorded();
    // SAFETY: raise(3) is async-signal-safe.
    unsafe {
        libc::raise(signal);
    }
}

/// The exit hook, and the signal handler for each ending signal nothing handles yet.
fn install_hooks() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: atexit registers a function that takes no arguments and only kills.
        unsafe {
            libc::atexit(at_exit);
        }
        for signal in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT] {
            install_if_unhandled(signal);
        }
    });
}

fn install_if_unhandled(signal: libc::c_int) {
    // SAFETY: sigaction(2) reads and writes only the structs passed; a zeroed sigaction is a
    // valid value to be filled in.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(signal, std::ptr::null(), &mut old) != 0
            || old.sa_sigaction != libc::SIG_DFL
        {
            return;
        }
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESETHAND;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(signal, &action, std::ptr::null_mut());
    }
}

type SpawnJob = (Command, Sender<std::io::Result<Child>>);

/// Starts `cmd` from the long-lived spawning thread, with the parent-death signal set on
/// Linux; from the calling thread (without it) where that thread cannot be started.
pub fn spawn(cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Option<Sender<SpawnJob>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (jobs, incoming) = channel::<SpawnJob>();
        std::thread::Builder::new()
            .name("skein-worker-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in incoming {
                    die_with_parent(&mut cmd);
                    let _ = reply.send(cmd.spawn());
                }
            })
            .ok()
            .map(|_| jobs)
    });
    let Some(jobs) = spawner else {
        let mut cmd = cmd;
        return cmd.spawn();
    };
    let (reply, answer) = channel();
    match jobs.send((cmd, reply)) {
        Ok(()) => answer
            .recv()
            .unwrap_or_else(|_| Err(std::io::Error::other("the worker-spawning thread ended"))),
        Err(unsent) => {
            let (mut cmd, _) = unsent.0;
            cmd.spawn()
        }
    }
}

#[cfg(target_os = "linux")]
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: getpid(2) before the fork; in the child only prctl(2) and getppid(2), both
    // async-signal-safe.
    let parent = unsafe { libc::getpid() };
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the signal was set: it would never come.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("skein exited while starting it"));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_cmd: &mut Command) {}
