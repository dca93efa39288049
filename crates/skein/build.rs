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
//! - **csrc/cuda_graph.cpp**, libtorch's CUDA graphs for the decode step, as a plugin of its
//!   own (`OUT_DIR/libskein_cuda_graph.so`, which `src/engine/cuda_graph.rs` embeds and opens
//!   once libtorch's CUDA library is loaded): it references that library's symbols, which the
//!   binary itself must not need. It compiles against CUDA's runtime headers, which the torch
//!   wheel's `nvidia-*` packages hold (`make setup` adds `nvidia-cuda-crt`, the part they
//!   lack). Without CUDA in libtorch or without the headers the plugin is empty and
//!   `SKEIN_CUDA_GRAPHS` says why.
//!
//! libtorch is found as torch-sys finds it by default: the `LIBTORCH` directory, which
//! `.cargo/config.toml` points at the project's `.venv/torch`.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=csrc/varlen_attention.cpp");
    println!("cargo:rerun-if-changed=csrc/op_count.cpp");
    println!("cargo:rerun-if-changed=csrc/optimizer.cpp");
    println!("cargo:rerun-if-changed=csrc/inference_mode.cpp");
    println!("cargo:rerun-if-changed=csrc/cuda_graph.cpp");
    println!("cargo:rerun-if-env-changed=CUDA_INCLUDE");
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
    let plugin = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("libskein_cuda_graph.so");
    let built = if cuda {
        build_cuda_graph_plugin(&libtorch, &abi, &plugin)
    } else {
        Err("the libtorch this build links has no CUDA".to_string())
    };
    let status = match built {
        Ok(()) => "built".to_string(),
        Err(why) => {
            std::fs::write(&plugin, b"").expect("OUT_DIR is writable");
            why
        }
    };
    println!("cargo:rustc-env=SKEIN_CUDA_GRAPHS={status}");
}

/// Compiles csrc/cuda_graph.cpp into the shared library `plugin`, or says why it cannot.
/// It names no library it needs: its symbols resolve against libtorch's CUDA library, which
/// is open (globally) before the plugin is.
fn build_cuda_graph_plugin(libtorch: &Path, abi: &str, plugin: &Path) -> Result<(), String> {
    let include = cuda_include(libtorch).ok_or_else(|| {
        "CUDA's runtime headers were not found (cuda_runtime_api.h with crt/host_defines.h, \
         beside libtorch in nvidia/cu13/include, or in CUDA_INCLUDE): `make setup` installs them"
            .to_string()
    })?;
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .file("csrc/cuda_graph.cpp")
        .include(libtorch.join("include"))
        .include(&include)
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .warnings(false)
        // The binary carries it: no debug information (1.2 MB with, 57 KB without).
        .debug(false)
        .cargo_metadata(false);
    let objects = build
        .try_compile_intermediates()
        .map_err(|e| e.to_string())?;
    let compiler = build.try_get_compiler().map_err(|e| e.to_string())?;
    let status = std::process::Command::new(compiler.path())
        .arg("-shared")
        .arg("-o")
        .arg(plugin)
        .args(&objects)
        .status()
        .map_err(|e| format!("linking the CUDA graph plugin: {e}"))?;
    if !status.success() {
        return Err(format!("linking the CUDA graph plugin failed ({status})"));
    }
    Ok(())
}

/// CUDA's runtime headers: `CUDA_INCLUDE`, or those the torch wheel's `nvidia-*` packages put
/// beside it (CUDA 13's layout, then CUDA 12's), or a system CUDA's.
fn cuda_include(libtorch: &Path) -> Option<PathBuf> {
    let site = std::fs::canonicalize(libtorch)
        .ok()
        .and_then(|t| t.parent().map(Path::to_path_buf));
    let mut candidates: Vec<PathBuf> = std::env::var_os("CUDA_INCLUDE")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    if let Some(site) = site {
        candidates.push(site.join("nvidia/cu13/include"));
        candidates.push(site.join("nvidia/cuda_runtime/include"));
    }
    candidates.push(PathBuf::from("/usr/local/cuda/include"));
    // Headers installed after a first build (`make setup` adds crt/) build the plugin then.
    for dir in candidates.iter().filter(|d| d.is_dir()) {
        println!("cargo:rerun-if-changed={}", dir.display());
    }
    candidates.into_iter().find(|dir| {
        dir.join("cuda_runtime_api.h").exists() && dir.join("crt/host_defines.h").exists()
    })
}
