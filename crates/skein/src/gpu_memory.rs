//! The memory in use on an NVIDIA GPU, read from the driver's management library (NVML, the
//! one `nvidia-smi` reads), loaded at run time so that a build without a driver still runs.
//!
//! What it reads is the device's whole memory in use: the CUDA context, and what libtorch's
//! caching allocator has reserved, which it keeps until the process ends (freed tensors go
//! back to its cache, not to the driver). Read after a workload, it is that workload's peak
//! reservation, what an out-of-memory error is about. Other processes on the same GPU count
//! too, so measure on a GPU nothing else uses.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

/// `nvmlMemory_t`: bytes of the device.
#[repr(C)]
#[derive(Default)]
struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}

const NVML_SUCCESS: c_int = 0;
const LIBRARY: &str = "libnvidia-ml.so.1";

/// Bytes in use on CUDA device `cuda_index` (as libtorch numbers it), or why they could not be
/// read (no driver, no such device).
pub fn used_bytes(cuda_index: usize) -> Result<u64, String> {
    let index = nvml_index(
        cuda_index,
        std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
    )?;
    let lib = Library::open(LIBRARY)?;
    type Init = unsafe extern "C" fn() -> c_int;
    type Handle = unsafe extern "C" fn(c_uint, *mut *mut c_void) -> c_int;
    type Memory = unsafe extern "C" fn(*mut c_void, *mut NvmlMemory) -> c_int;
    type ErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
    // SAFETY: each symbol is NVML's, with the C signature of its header (nvml.h).
    unsafe {
        let init: Init = lib.symbol("nvmlInit_v2")?;
        let handle_of: Handle = lib.symbol("nvmlDeviceGetHandleByIndex_v2")?;
        let memory_of: Memory = lib.symbol("nvmlDeviceGetMemoryInfo")?;
        let error: ErrorString = lib.symbol("nvmlErrorString")?;
        let check = |what: &str, code: c_int| -> Result<(), String> {
            if code == NVML_SUCCESS {
                return Ok(());
            }
            let text = error(code);
            let text = if text.is_null() {
                format!("error {code}")
            } else {
                CStr::from_ptr(text).to_string_lossy().into_owned()
            };
            Err(format!("NVML {what}: {text}"))
        };
        check("init", init())?;
        let mut handle = std::ptr::null_mut();
        check(
            &format!("device {index}"),
            handle_of(index as c_uint, &mut handle),
        )?;
        let mut memory = NvmlMemory::default();
        check("memory info", memory_of(handle, &mut memory))?;
        Ok(memory.used)
    }
}

/// The NVML index of CUDA device `cuda_index`: CUDA numbers only the devices
/// `CUDA_VISIBLE_DEVICES` lists, in its order, where NVML numbers every device.
fn nvml_index(cuda_index: usize, visible: Option<&str>) -> Result<usize, String> {
    let Some(visible) = visible.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(cuda_index);
    };
    let listed: Vec<&str> = visible.split(',').map(str::trim).collect();
    let Some(entry) = listed.get(cuda_index) else {
        return Err(format!(
            "CUDA device {cuda_index} is not among CUDA_VISIBLE_DEVICES={visible}"
        ));
    };
    entry.parse().map_err(|_| {
        format!(
            "CUDA_VISIBLE_DEVICES={visible} names device {entry:?} by UUID; the memory in use \
             is read by index: list devices by index"
        )
    })
}

/// A shared library opened with `dlopen`, closed when dropped.
struct Library(*mut c_void);

impl Library {
    fn open(name: &str) -> Result<Library, String> {
        let c_name = CString::new(name).map_err(|e| e.to_string())?;
        // SAFETY: a NUL-terminated name.
        let handle = unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(format!(
                "{name} did not load ({}): the GPU's memory is read through the NVIDIA \
                 driver's management library",
                dl_error()
            ));
        }
        Ok(Library(handle))
    }

    /// The function `name` of this library.
    ///
    /// # Safety
    /// `F` must be the C function type the library defines for `name`.
    unsafe fn symbol<F: Copy>(&self, name: &str) -> Result<F, String> {
        let c_name = CString::new(name).map_err(|e| e.to_string())?;
        let ptr = libc::dlsym(self.0, c_name.as_ptr());
        if ptr.is_null() {
            return Err(format!("{LIBRARY} has no {name} ({})", dl_error()));
        }
        Ok(std::mem::transmute_copy(&ptr))
    }
}

fn dl_error() -> String {
    crate::devices::last_dl_error().unwrap_or_else(|| "no message".into())
}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: a handle dlopen returned, closed once.
        unsafe { libc::dlclose(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_indices_follow_cuda_visible_devices() {
        assert_eq!(nvml_index(1, None), Ok(1));
        assert_eq!(nvml_index(0, Some("")), Ok(0));
        assert_eq!(nvml_index(0, Some("3,1")), Ok(3));
        assert_eq!(nvml_index(1, Some("3, 1")), Ok(1));
        let e = nvml_index(2, Some("3,1")).unwrap_err();
        assert!(e.contains("not among CUDA_VISIBLE_DEVICES=3,1"), "{e}");
        let e = nvml_index(0, Some("GPU-8a1b")).unwrap_err();
        assert!(e.contains("UUID"), "{e}");
    }

    /// Without an NVIDIA driver the reading fails with a message naming the library, rather
    /// than a crash; with one, device 0 has its context's memory in use at least.
    #[test]
    fn reading_without_a_driver_says_what_is_missing() {
        match used_bytes(0) {
            Ok(used) => assert!(used > 0),
            Err(e) => assert!(e.contains("libnvidia-ml.so.1") || e.contains("NVML"), "{e}"),
        }
    }
}
