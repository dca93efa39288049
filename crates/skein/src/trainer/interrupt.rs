//! Ctrl-C during training: the first press lets the current step finish, writes a resumable
//! checkpoint and exits cleanly; the second exits at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;

static PRESSES: AtomicUsize = AtomicUsize::new(0);
static INSTALL: Once = Once::new();

/// Installs the handler (once per process; later calls do nothing).
pub fn install() {
    INSTALL.call_once(|| {
        let installed = ctrlc::set_handler(|| {
            if PRESSES.fetch_add(1, Ordering::SeqCst) == 0 {
                eprintln!(
                    "\nskein: interrupt: finishing this step, then writing a checkpoint \
                     (Ctrl-C again to exit at once)"
                );
            } else {
                eprintln!("\nskein: second interrupt: exiting now");
                std::process::exit(130);
            }
        });
        if let Err(e) = installed {
            eprintln!("skein: Ctrl-C will stop the run at once ({e})");
        }
    });
}

/// Whether Ctrl-C was pressed since the process started.
pub fn requested() -> bool {
    PRESSES.load(Ordering::SeqCst) > 0
}
