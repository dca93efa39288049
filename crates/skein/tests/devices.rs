//! The binary sees what its libtorch can do. Built against a libtorch with CUDA, it opens
//! `libtorch_cuda.so` at start where a driver is installed (src/devices.rs); `skein devices`
//! says which devices it sees and why a GPU is not seen when none is. A build that dropped
//! the CUDA library once left every binary blind to GPUs while all CPU tests passed: these
//! load the real library on a machine without a GPU.

use std::path::Path;
use std::process::Command;

const SKEIN: &str = env!("CARGO_BIN_EXE_skein");

fn libtorch_has_cuda() -> bool {
    Path::new(env!("LIBTORCH"))
        .join("lib/libtorch_cuda.so")
        .exists()
}

/// `skein devices`' report, with SKEIN_LOAD_CUDA set or not.
fn devices(force_cuda: bool) -> String {
    let mut cmd = Command::new(SKEIN);
    cmd.arg("devices");
    if force_cuda {
        cmd.env("SKEIN_LOAD_CUDA", "1");
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn line<'a>(report: &'a str, start: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no `{start}` line in {report}"))
}

/// The CPU is listed; CUDA either lists GPUs or gives a reason a user can act on, and that
/// reason matches what the libtorch holds.
#[test]
fn devices_says_which_devices_are_seen_and_why_not() {
    let report = devices(false);
    assert!(line(&report, "cpu ").contains("available:"), "{report}");
    let cuda = line(&report, "cuda ");
    let reasons = ["has no CUDA", "no NVIDIA driver", "shows no GPU"];
    assert!(
        cuda.contains("available: ") && cuda.contains("GPU(s)")
            || reasons.iter().any(|r| cuda.contains(r)),
        "{cuda}"
    );
    assert_eq!(libtorch_has_cuda(), !cuda.contains("has no CUDA"), "{cuda}");
    assert!(!cuda.contains("did not load"), "{cuda}");
}

/// Forced, the binary opens the real `libtorch_cuda.so` of the libtorch it was built against
/// (and with it the CUDA runtime): what happens on every machine with a driver.
#[test]
fn the_cuda_library_of_libtorch_loads() {
    if !libtorch_has_cuda() {
        return;
    }
    let report = devices(true);
    let libtorch = line(&report, "libtorch ");
    assert!(
        libtorch.contains("with CUDA: yes; libtorch_cuda.so loaded: yes"),
        "{report}"
    );
    // The CUDA graph plugin, built into the binary, opens against it: its every symbol
    // resolves in the library just loaded.
    let graphs = line(&report, "graphs ");
    assert!(
        graphs.contains("plugin loaded") || graphs.contains("available: "),
        "{report}"
    );
    // Not forced, on a machine without a driver, nothing is loaded.
    let plain = devices(false);
    if line(&plain, "cuda ").contains("no NVIDIA driver") {
        assert!(line(&plain, "libtorch ").contains("loaded: no"), "{plain}");
        assert!(line(&plain, "graphs ").contains("not available"), "{plain}");
    }
}

/// Asking a machine without a GPU to train on one is refused before anything starts, with
/// the reason `skein devices` gives.
#[test]
fn a_missing_gpu_is_refused_with_its_reason() {
    let report = devices(false);
    let Some(why) = line(&report, "cuda ").strip_prefix("cuda     not available: ") else {
        return; // This machine has a GPU.
    };
    let dir = std::env::temp_dir().join(format!("skein-devices-{}", std::process::id()));
    let out = Command::new(SKEIN)
        .args(["train", "--set", "run.device=cuda", "--set"])
        .arg(format!("run.dir={}", dir.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("`run.device`") && err.contains(why), "{err}");
    assert!(!dir.exists(), "nothing is written for a refused run");
}
