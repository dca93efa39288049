//! Which devices this build of skein can compute on, and why a GPU is not seen when it is
//! not: `skein devices`, the refusal of a `run.device` this machine lacks, and the device
//! named on a run's first line.
//!
//! libtorch computes on GPUs through `libtorch_cuda.so`, which nothing in skein references
//! by name: a linker that drops unreferenced libraries (`--as-needed`, Debian's and Ubuntu's
//! default) leaves it out, and libtorch then sees no GPU. Linking it unconditionally would
//! cost every process on a machine without a GPU about 0.15 s at start and 130 MiB of
//! relocated pages (measured with the PyPI wheel's CUDA 13 libraries), tests and CPU runs
//! alike. So [`load_cuda`] opens it at the start of every command, before libtorch is first
//! asked about CUDA (it answers once per process), on machines whose NVIDIA driver loads.
//! `SKEIN_LOAD_CUDA=1` opens it whatever the driver check says (to diagnose a GPU machine).

use std::ffi::{CStr, CString};
use std::sync::OnceLock;
use tch::Device;

/// What [`load_cuda`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CudaLibrary {
    /// The libtorch this build links has no CUDA.
    NotInLibtorch,
    /// No NVIDIA driver: `libcuda.so.1` did not load (dlopen's message).
    NoDriver(String),
    /// `libtorch_cuda.so` did not load (dlopen's message: a missing CUDA library, say).
    Failed(String),
    /// Loaded; `driver` holds why the driver did not load when SKEIN_LOAD_CUDA forced it.
    Loaded { driver: Option<String> },
}

static CUDA_LIBRARY: OnceLock<CudaLibrary> = OnceLock::new();

/// Opens libtorch's CUDA library where a driver is installed; once per process, first thing.
pub fn load_cuda() {
    CUDA_LIBRARY.get_or_init(open_cuda_library);
}

fn open_cuda_library() -> CudaLibrary {
    if env!("SKEIN_LIBTORCH_CUDA") != "1" {
        return CudaLibrary::NotInLibtorch;
    }
    let forced = std::env::var("SKEIN_LOAD_CUDA").is_ok_and(|v| v == "1");
    let driver = dlopen("libcuda.so.1", libc::RTLD_LAZY | libc::RTLD_LOCAL).err();
    if let (Some(why), false) = (&driver, forced) {
        return CudaLibrary::NoDriver(why.clone());
    }
    // The name alone finds it on LD_LIBRARY_PATH and the binary's rpath; the path it was
    // built against is the fallback.
    let built = format!("{}/lib/libtorch_cuda.so", env!("SKEIN_LIBTORCH_DIR"));
    let flags = libc::RTLD_NOW | libc::RTLD_GLOBAL;
    match dlopen("libtorch_cuda.so", flags).or_else(|_| dlopen(&built, flags)) {
        Ok(()) => CudaLibrary::Loaded { driver },
        Err(why) => CudaLibrary::Failed(why),
    }
}

/// Whether libtorch's CUDA library is open in this process (its symbols global).
pub fn cuda_library_loaded() -> bool {
    matches!(
        CUDA_LIBRARY.get_or_init(open_cuda_library),
        CudaLibrary::Loaded { .. }
    )
}

/// Opens a shared library for the rest of the process, or says why it could not.
fn dlopen(name: &str, flags: i32) -> Result<(), String> {
    let c_name = CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: a NUL-terminated name; the handle is kept open for the process's lifetime.
    let handle = unsafe { libc::dlopen(c_name.as_ptr(), flags) };
    if !handle.is_null() {
        return Ok(());
    }
    Err(last_dl_error().unwrap_or_else(|| format!("{name} could not be loaded")))
}

/// The dynamic loader's message about the last failed `dlopen` or `dlsym`, if it has one.
pub(crate) fn last_dl_error() -> Option<String> {
    // SAFETY: dlerror returns null or a NUL-terminated message owned by libc.
    let err = unsafe { libc::dlerror() };
    (!err.is_null()).then(|| {
        unsafe { CStr::from_ptr(err) }
            .to_string_lossy()
            .into_owned()
    })
}

/// What the CUDA side of this process found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cuda {
    /// GPUs libtorch can compute on.
    Gpus(usize),
    /// None, and why, in words a user can act on.
    Unavailable(String),
}

/// Asks libtorch for its GPUs and, if none, says which piece is missing.
pub fn cuda() -> Cuda {
    let gpus = tch::Cuda::device_count().max(0) as usize;
    if gpus > 0 {
        return Cuda::Gpus(gpus);
    }
    let why = match CUDA_LIBRARY.get_or_init(open_cuda_library) {
        CudaLibrary::NotInLibtorch => format!(
            "the libtorch this build links ({}) has no CUDA (no lib/libtorch_cuda.so): build \
             against a CUDA libtorch, e.g. the PyPI torch wheel `make setup` installs",
            env!("SKEIN_LIBTORCH_DIR")
        ),
        CudaLibrary::NoDriver(e) | CudaLibrary::Loaded { driver: Some(e) } => format!(
            "no NVIDIA driver: {e} (install the driver, or add the folder of libcuda.so.1 to \
             LD_LIBRARY_PATH)"
        ),
        CudaLibrary::Failed(e) => format!(
            "libtorch's CUDA library did not load: {e} (the CUDA libraries it needs, from the \
             torch wheel's nvidia-* packages, belong on LD_LIBRARY_PATH)"
        ),
        CudaLibrary::Loaded { driver: None } => {
            let visible = std::env::var("CUDA_VISIBLE_DEVICES")
                .map(|v| format!(" (CUDA_VISIBLE_DEVICES={v:?})"))
                .unwrap_or_default();
            format!("the NVIDIA driver is loaded but shows no GPU{visible}")
        }
    };
    Cuda::Unavailable(why)
}

/// `device` in words for a run's first line: `cpu (2 threads)`, `cuda:0 (of 1 GPUs)`.
pub fn describe(device: Device) -> String {
    match device {
        Device::Cuda(n) => format!("cuda:{n} (of {} GPUs)", tch::Cuda::device_count()),
        _ => format!("cpu ({} threads)", tch::get_num_threads()),
    }
}

/// The report of `skein devices`, one line per device kind.
pub fn report() -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = format!(
        "cpu      available: {cores} cores, libtorch uses {} threads",
        tch::get_num_threads()
    );
    let cuda = match cuda() {
        Cuda::Gpus(n) => {
            let names: Vec<String> = (0..n).map(|i| format!("cuda:{i}")).collect();
            format!("cuda     available: {n} GPU(s), {}", names.join(", "))
        }
        Cuda::Unavailable(why) => format!("cuda     not available: {why}"),
    };
    let loaded = matches!(CUDA_LIBRARY.get(), Some(CudaLibrary::Loaded { .. }));
    format!(
        "{cpu}\n{cuda}\nlibtorch {} (with CUDA: {}; libtorch_cuda.so loaded: {})",
        env!("SKEIN_LIBTORCH_DIR"),
        if env!("SKEIN_LIBTORCH_CUDA") == "1" {
            "yes"
        } else {
            "no"
        },
        if loaded { "yes" } else { "no" }
    )
}

/// A dtype's name as `model.dtype` spells it.
pub fn dtype_name(kind: tch::Kind) -> &'static str {
    match kind {
        tch::Kind::Float => "float32",
        tch::Kind::BFloat16 => "bfloat16",
        tch::Kind::Half => "float16",
        tch::Kind::Double => "float64",
        _ => "another dtype",
    }
}
