//! Builds what skein needs from libtorch beyond tch's bindings:
//!
//! - **What libtorch has**: its directory and whether it holds `libtorch_cuda.so`, for
//!   `src/devices.rs`, which loads that library at start on a machine with an NVIDIA driver.
//! - **libtorch's directory as an rpath**, so `skein` runs without `LD_LIBRARY_PATH`.
//! - **csrc/varlen_attention.cpp**, a thin C++ shim over libtorch's fused variable-length
//!   attention kernels, which tch does not expose (`src/model/attention.rs` calls it).
//! - **csrc/op_count.cpp**, which counts libtorch operator calls through RecordFunction, the
//!   hook libtorch's profiler uses (`src/op_count.rs`).
//! - **csrc/optimizer.cpp**, AdamW over many tensors at once through libtorch's
//!   multi-tensor ops (`src/trainer/update/optim_ops.rs`).
//! - **csrc/inference_mode.cpp**, libtorch's inference mode for the engine's decoding
//!   (`src/engine/inference_mode.rs`).
//!
//! libtorch is found as torch-sys finds it by default: the `LIBTORCH` directory, which
//! `.cargo/config.toml` points at the project's `.venv/torch`.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=csrc/varlen_attention.cpp");
    println!("cargo:rerun-if-changed=csrc/op_count.cpp");
    println!("cargo:rerun-if-changed=csrc/optimizer.cpp");
    println!("cargo:rerun-if-changed=csrc/inference_mode.cpp");
    let Some(libtorch) = std::env::var_os("LIBTORCH").map(PathBuf::from) else {
        panic!(
            "LIBTORCH is not set: run `make setup` (it installs libtorch into .venv/torch, \
             which .cargo/config.toml names), or set LIBTORCH to a libtorch directory"
        );
    };
    let lib = std::env::var_os("DEP_TCH_LIBTORCH_LIB")
        .map(PathBuf::from)
        .unwrap_or_else(|| libtorch.join("lib"));
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    let cuda = lib.join("libtorch_cuda.so").exists();
    // `skein devices` says what this build was linked against.
    println!("cargo:rustc-env=SKEIN_LIBTORCH_DIR={}", libtorch.display());
    println!("cargo:rustc-env=SKEIN_LIBTORCH_CUDA={}", u8::from(cuda));
    // The C++ ABI of the PyPI wheels (torch ≥ 2.7), as torch-sys assumes by default.
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    cc::Build::new()
        .cpp(true)
        .file("csrc/varlen_attention.cpp")
        .file("csrc/op_count.cpp")
        .file("csrc/optimizer.cpp")
        .file("csrc/inference_mode.cpp")
        .include(libtorch.join("include"))
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .warnings(false)
        .compile("skein_shims");
}
