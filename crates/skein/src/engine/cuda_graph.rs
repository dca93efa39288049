//! libtorch's CUDA graphs (`csrc/cuda_graph.cpp`): a decode step's kernels captured once and
//! replayed with one launch (`super::graph_decode` decides what to capture).
//!
//! The shim is a plugin of its own, embedded in the binary: it references libtorch's CUDA
//! library, which skein opens only on machines with a GPU (`crate::devices`). The plugin is
//! written to an anonymous in-memory file and opened from there the first time a graph is
//! asked for, after that library, whose symbols it resolves against.

use crate::devices::last_dl_error;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::AssertUnwindSafe;
use std::sync::OnceLock;

/// The plugin build.rs compiled, or an empty file when it could not.
static PLUGIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libskein_cuda_graph.so"));

type New = unsafe extern "C" fn(c_int, *mut c_void, *mut c_char, usize) -> *mut c_void;
type Call = unsafe extern "C" fn(*mut c_void, *mut c_char, usize) -> c_int;
type Free = unsafe extern "C" fn(*mut c_void);

/// The plugin's functions.
struct Plugin {
    new: New,
    enter: Call,
    leave: Call,
    begin: Call,
    end: Call,
    replay: Call,
    free: Free,
}

static LOADED: OnceLock<Result<Plugin, String>> = OnceLock::new();

/// Whether this binary can capture CUDA graphs here, or why not.
pub fn available() -> Result<(), String> {
    plugin().map(|_| ())
}

/// `skein devices`' line about CUDA graphs.
pub fn report() -> String {
    match available() {
        Err(why) => format!("graphs   not available: {why}"),
        Ok(()) if tch::Cuda::device_count() > 0 => {
            "graphs   available: `rollout.cuda_graphs = true` decodes through them".into()
        }
        Ok(()) => "graphs   plugin loaded, no GPU to capture on".into(),
    }
}

fn plugin() -> Result<&'static Plugin, String> {
    LOADED.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Plugin, String> {
    let built = env!("SKEIN_CUDA_GRAPHS");
    if built != "built" {
        return Err(format!("this build has no CUDA graphs: {built}"));
    }
    crate::devices::load_cuda();
    if !crate::devices::cuda_library_loaded() {
        return Err(
            "libtorch's CUDA library is not loaded: no GPU here (`skein devices` says why)".into(),
        );
    }
    let handle = open_in_memory(PLUGIN)?;
    // SAFETY: each name is an extern "C" function of csrc/cuda_graph.cpp with the field's type.
    unsafe {
        Ok(Plugin {
            new: function(handle, "skein_cuda_graph_new")?,
            enter: function(handle, "skein_cuda_graph_enter")?,
            leave: function(handle, "skein_cuda_graph_leave")?,
            begin: function(handle, "skein_cuda_graph_begin")?,
            end: function(handle, "skein_cuda_graph_end")?,
            replay: function(handle, "skein_cuda_graph_replay")?,
            free: function(handle, "skein_cuda_graph_free")?,
        })
    }
}

/// Opens a shared library held in memory: written to an anonymous file (`memfd_create`),
/// opened through its /proc path. The handle stays open for the process.
fn open_in_memory(bytes: &[u8]) -> Result<*mut c_void, String> {
    let name = CString::new("skein-cuda-graph").expect("no NUL in the name");
    // SAFETY: a NUL-terminated name; the descriptor is checked below.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a new descriptor this function owns; File closes it.
    let mut file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    std::io::Write::write_all(&mut file, bytes)
        .map_err(|e| format!("writing the CUDA graph plugin: {e}"))?;
    let path = CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL in a path");
    // SAFETY: a NUL-terminated path; the handle is kept for the process's lifetime.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(format!(
            "the CUDA graph plugin did not load: {}",
            last_dl_error().unwrap_or_default()
        ));
    }
    Ok(handle)
}

/// The plugin's function `name` as a pointer of type `F`.
///
/// # Safety
/// `F` must be an `extern "C" fn` type matching the function's definition.
unsafe fn function<F: Copy>(handle: *mut c_void, name: &str) -> Result<F, String> {
    let c_name = CString::new(name).expect("no NUL in a symbol name");
    // SAFETY: a handle dlopen returned and a NUL-terminated name.
    let f = unsafe { libc::dlsym(handle, c_name.as_ptr()) };
    if f.is_null() {
        return Err(format!("the CUDA graph plugin lacks {name}"));
    }
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: the caller's promise: a function pointer of this type.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&f) })
}

/// Runs `work`, turning a panic into its message (`what` says when it happened).
fn unwound<T>(work: &mut impl FnMut() -> T, what: &str) -> Result<T, String> {
    std::panic::catch_unwind(AssertUnwindSafe(work)).map_err(|panic| {
        format!(
            "{what} failed: {}",
            crate::panic_message::panic_message(&*panic)
        )
    })
}

/// Runs a plugin call with an error buffer; its message when it returns non-zero.
fn checked(call: impl FnOnce(*mut c_char, usize) -> c_int) -> Result<(), String> {
    let mut err = vec![0 as c_char; 1024];
    if call(err.as_mut_ptr(), err.len()) == 0 {
        return Ok(());
    }
    // SAFETY: the plugin writes a NUL-terminated message into the buffer.
    Err(unsafe { CStr::from_ptr(err.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

/// One CUDA graph, the side stream it is captured on and the memory pool it allocates from.
pub struct CudaGraph {
    raw: *mut c_void,
    plugin: &'static Plugin,
}

impl CudaGraph {
    /// A graph to capture on GPU `device`, with a side stream and memory pool of its own or
    /// those of `shares` (a graph on the same GPU): graphs that are never replayed at once,
    /// and whose outputs are read before another one replays, can share them. Sharing the
    /// pool takes sharing the stream, which libtorch's allocator reuses memory within.
    pub fn new(device: usize, shares: Option<&CudaGraph>) -> Result<Self, String> {
        let plugin = plugin()?;
        let shared = shares.map_or(std::ptr::null_mut(), |g| g.raw);
        let mut raw = std::ptr::null_mut();
        // SAFETY: the plugin's constructor, with a live graph of this plugin or null and an
        // error buffer of the length passed.
        checked(|err, len| {
            raw = unsafe { (plugin.new)(device as c_int, shared, err, len) };
            if raw.is_null() {
                -1
            } else {
                0
            }
        })?;
        Ok(CudaGraph { raw, plugin })
    }

    /// Runs `work` twice on the graph's side stream: once uncaptured, as a warm-up (libtorch
    /// and cuBLAS set up what a stream needs on its first use, which a capture must not), then
    /// captured. Returns both results: the warm-up's holds computed values, the capture's the
    /// tensors each replay writes.
    pub fn capture<T>(&mut self, mut work: impl FnMut() -> T) -> Result<(T, T), String> {
        let p = self.plugin;
        // SAFETY (every call below): `self.raw` is a live graph of this plugin, and the error
        // buffer's length is passed with it.
        checked(|err, len| unsafe { (p.enter)(self.raw, err, len) })?;
        // A libtorch error inside `work` panics (tch's calls unwrap it). The capture is ended
        // and the side stream left whatever `work` did, or every later call would run on a
        // stream still capturing; the caller then decodes without graphs.
        let warm = unwound(&mut work, "warming up");
        let captured = warm.and_then(|warm| {
            checked(|err, len| unsafe { (p.begin)(self.raw, err, len) })?;
            let out = unwound(&mut work, "capturing");
            let ended = checked(|err, len| unsafe { (p.end)(self.raw, err, len) });
            let out = out?;
            ended.map(|()| (warm, out))
        });
        let left = checked(|err, len| unsafe { (p.leave)(self.raw, err, len) });
        let both = captured?;
        left?;
        Ok(both)
    }

    /// Enqueues the captured work once on the current stream.
    pub fn replay(&self) -> Result<(), String> {
        let p = self.plugin;
        // SAFETY: a live graph of this plugin and the buffer's length.
        checked(|err, len| unsafe { (p.replay)(self.raw, err, len) })
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: the graph is live and freed once.
        unsafe { (self.plugin.free)(self.raw) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A libtorch error inside a capture panics; the capture turns it into an error with its
    /// message (and ends the capture), so the engine decodes on without graphs.
    #[test]
    fn a_panic_in_captured_work_becomes_its_message() {
        let mut calls = 0;
        let mut fine = || {
            calls += 1;
            calls
        };
        assert_eq!(unwound(&mut fine, "capturing"), Ok(1));
        let mut failing = || -> i32 { panic!("operation not permitted when stream is capturing") };
        assert_eq!(
            unwound(&mut failing, "capturing"),
            Err("capturing failed: operation not permitted when stream is capturing".into())
        );
        let mut formatted = || -> i32 { panic!("{} of {}", 1, 2) };
        assert_eq!(
            unwound(&mut formatted, "warming up"),
            Err("warming up failed: 1 of 2".into())
        );
    }

    /// On a GPU: graphs that share a stream and pool replay what they captured; a capture
    /// that a read back to the host invalidates fails with a message; and the next graph
    /// sharing that stream and pool still captures and replays, which it could not with the
    /// allocator left recording into the failed capture. Without a GPU there is nothing to run.
    #[test]
    fn an_invalidated_capture_fails_and_graphs_after_it_replay() {
        if tch::Cuda::device_count() == 0 || available().is_err() {
            return;
        }
        let device = tch::Device::Cuda(0);
        let x = tch::Tensor::ones([4], (tch::Kind::Float, device));
        let mut first = CudaGraph::new(0, None).expect("a graph");
        let (_, doubled) = first.capture(|| &x * 2.0).expect("a capture");
        let mut reading = CudaGraph::new(0, Some(&first)).expect("a graph");
        let failed = reading.capture(|| (&x * 3.0).sum(tch::Kind::Float).double_value(&[]));
        assert!(failed.is_err(), "a host read was captured");
        drop(reading);
        let mut next = CudaGraph::new(0, Some(&first)).expect("a graph");
        let (_, plus_one) = next
            .capture(|| &x + 1.0)
            .expect("a capture after a failed one");
        // The graphs read `x` where it was captured: fill it in place.
        let _ = x.shallow_clone().fill_(5.0);
        first.replay().expect("a replay");
        next.replay().expect("a replay");
        let sum = |t: &tch::Tensor| t.sum(tch::Kind::Float).double_value(&[]);
        assert_eq!((sum(&doubled), sum(&plus_one)), (40.0, 24.0));
    }

    /// The plugin is built wherever libtorch has CUDA (the PyPI wheel `make setup` installs),
    /// and on a machine without a GPU it says so instead of capturing.
    #[test]
    fn the_plugin_is_built_and_says_why_it_cannot_capture_without_a_gpu() {
        if env!("SKEIN_LIBTORCH_CUDA") != "1" {
            assert!(available().is_err());
            return;
        }
        assert_eq!(env!("SKEIN_CUDA_GRAPHS"), "built");
        assert!(!PLUGIN.is_empty());
        if tch::Cuda::device_count() > 0 {
            assert!(available().is_ok());
            return;
        }
        let why = match CudaGraph::new(0, None) {
            Ok(_) => panic!("a graph on a GPU this machine lacks"),
            Err(why) => why,
        };
        assert!(!why.is_empty());
    }
}
