// CUDA graphs for the engine's decode step (src/engine/cuda_graph.rs): libtorch's
// at::cuda::CUDAGraph, which tch does not expose, behind a C interface.
//
// This file is built into a plugin of its own (libskein_cuda_graph.so, build.rs), not into the
// binary: it references libtorch_cuda's symbols, and the binary opens that library only on
// machines with a GPU (src/devices.rs). The plugin names no library it needs; it is opened
// after libtorch_cuda.so, whose symbols (and those of the CUDA runtime it loads) are then
// global.
//
// Every function catches what libtorch throws and returns -1 (or null) with the message in
// `err` (a buffer of `len` bytes), so no C++ exception crosses into Rust.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>

namespace {

// A graph and the side stream it is captured on: libtorch refuses to capture on a device's
// default stream.
struct Capture {
  at::cuda::CUDAGraph graph;
  c10::DeviceIndex device;
  c10::cuda::CUDAStream side;
  // While the side stream is current (between enter and leave): the stream it replaced and
  // the guard that keeps `device` current.
  std::optional<c10::cuda::CUDAStream> previous;
  std::optional<c10::cuda::CUDAGuard> device_guard;

  explicit Capture(c10::DeviceIndex d)
      : device(d), side(c10::cuda::getStreamFromPool(false, d)) {}
};

int fail(const char* what, char* err, size_t len) {
  if (len > 0) {
    std::strncpy(err, what, len - 1);
    err[len - 1] = '\0';
  }
  return -1;
}

void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(status));
  }
}

// `waiting` runs nothing enqueued after this call before all `first` has enqueued so far.
void order(c10::cuda::CUDAStream first, c10::cuda::CUDAStream waiting) {
  cudaEvent_t done;
  check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaEventRecord(done, first.stream()), "cudaEventRecord");
  check(cudaStreamWaitEvent(waiting.stream(), done, 0), "cudaStreamWaitEvent");
  // Destroying an event that streams still wait on is allowed: the wait stands.
  check(cudaEventDestroy(done), "cudaEventDestroy");
}

template <typename F>
int guarded(F f, char* err, size_t len) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what(), err, len);
  }
}

}  // namespace

// A graph to capture on GPU `device`, or null with the reason in `err`.
extern "C" void* skein_cuda_graph_new(int device, char* err, size_t len) {
  try {
    return new Capture(static_cast<c10::DeviceIndex>(device));
  } catch (const std::exception& e) {
    fail(e.what(), err, len);
    return nullptr;
  }
}

// Makes the graph's side stream current on its device, after all the current stream has
// enqueued: what runs next (a warm-up, a capture) runs there.
extern "C" int skein_cuda_graph_enter(void* g, char* err, size_t len) {
  auto* c = static_cast<Capture*>(g);
  return guarded(
      [&] {
        if (c->previous) {
          throw std::runtime_error("the side stream is current already");
        }
        c->device_guard.emplace(c->device);
        auto current = c10::cuda::getCurrentCUDAStream(c->device);
        order(current, c->side);
        c->previous = current;
        c10::cuda::setCurrentCUDAStream(c->side);
      },
      err, len);
}

// Makes the stream `enter` replaced current again; it runs nothing enqueued from now on
// before all the side stream has enqueued.
extern "C" int skein_cuda_graph_leave(void* g, char* err, size_t len) {
  auto* c = static_cast<Capture*>(g);
  return guarded(
      [&] {
        if (!c->previous) {
          throw std::runtime_error("the side stream is not current");
        }
        order(c->side, *c->previous);
        c10::cuda::setCurrentCUDAStream(*c->previous);
        c->previous.reset();
        c->device_guard.reset();
      },
      err, len);
}

// Starts capturing what this thread enqueues on the side stream (which must be current).
// `pool_of` (or null) is a graph whose memory pool this one shares: graphs that are never
// replayed at once, and whose outputs are read before another one replays, can share one.
extern "C" int skein_cuda_graph_begin(void* g, void* pool_of, char* err, size_t len) {
  auto* c = static_cast<Capture*>(g);
  return guarded(
      [&] {
        // The pool's id type, whatever this libtorch names it: {0, 0} is a pool of its own.
        decltype(c->graph.pool()) pool = {0, 0};
        if (pool_of != nullptr) {
          pool = static_cast<Capture*>(pool_of)->graph.pool();
        }
        // Thread-local: another thread's allocations (a trainer's, say) do not end the capture.
        c->graph.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
      },
      err, len);
}

// Ends the capture and makes the graph ready to replay.
extern "C" int skein_cuda_graph_end(void* g, char* err, size_t len) {
  auto* c = static_cast<Capture*>(g);
  return guarded([&] { c->graph.capture_end(); }, err, len);
}

// Enqueues the captured work once on the current stream.
extern "C" int skein_cuda_graph_replay(void* g, char* err, size_t len) {
  auto* c = static_cast<Capture*>(g);
  return guarded([&] { c->graph.replay(); }, err, len);
}

extern "C" void skein_cuda_graph_free(void* g) {
  auto* c = static_cast<Capture*>(g);
  if (c->previous) {
    c10::cuda::setCurrentCUDAStream(*c->previous);
  }
  delete c;
}
