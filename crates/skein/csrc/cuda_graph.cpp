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
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>

namespace {

// The id of a memory pool of CUDA graphs, whatever this libtorch names its type.
using PoolId = decltype(at::cuda::graph_pool_handle());

// A graph, the side stream it is captured on (libtorch refuses to capture on a device's
// default stream) and the memory pool its capture allocates from.
//
// Graphs that share a pool must share the stream too: libtorch's caching allocator hands a
// freed block only to a request on the stream it was allocated on, in a graph's pool as
// elsewhere, so graphs captured on streams of their own would each keep their own blocks in
// the pool they "share", and each warm-up's memory would stay cached on its own stream.
struct Capture {
  at::cuda::CUDAGraph graph;
  c10::DeviceIndex device;
  c10::cuda::CUDAStream side;
  PoolId pool;
  // While the side stream is current (between enter and leave): the stream it replaced and
  // the guard that keeps `device` current.
  std::optional<c10::cuda::CUDAStream> previous;
  std::optional<c10::cuda::CUDAGuard> device_guard;

  // A graph on `d` with a new side stream and pool, or the stream and pool of `shares`.
  Capture(c10::DeviceIndex d, const Capture* shares)
      : device(d),
        side(shares != nullptr ? shares->side : c10::cuda::getStreamFromPool(false, d)),
        pool(shares != nullptr ? shares->pool : at::cuda::graph_pool_handle()) {}
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

// Ends a capture that an operation not allowed in a capture invalidated, without libtorch's
// capture_end: that throws on such a capture before it tells the allocators the capture
// ended, so they would go on asking the graph (freed with it) about every allocation, and
// the graph's destructor gives back its hold on the pool only for a capture that ended.
void abandon(Capture& c) {
  cudaGraph_t partial = nullptr;
  // Fails with cudaErrorStreamCaptureInvalidated, and the stream stops capturing.
  (void)cudaStreamEndCapture(c.side.stream(), &partial);
  if (partial != nullptr) {
    (void)cudaGraphDestroy(partial);
  }
  (void)cudaGetLastError();
  c10::cuda::CUDACachingAllocator::endAllocateToPool(c.device, c.pool);
  c10::cuda::CUDACachingAllocator::releasePool(c.device, c.pool);
  // Pinned host memory goes to the capture's pool too, where this libtorch's capture_begin
  // told the host allocator of the capture; where it did not, that allocator says so here.
  try {
    auto* host = at::getHostAllocator(at::kCUDA);
    host->end_allocate_to_pool(c.pool);
    host->release_pool(c.pool);
  } catch (const std::exception&) {
  }
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

// A graph to capture on GPU `device`, or null with the reason in `err`. `shares` (or null)
// is a graph on the same GPU whose side stream and memory pool this one shares: graphs that
// are never replayed at once, and whose outputs are read before another one replays, can.
extern "C" void* skein_cuda_graph_new(int device, void* shares, char* err, size_t len) {
  try {
    const auto* other = static_cast<const Capture*>(shares);
    const auto d = static_cast<c10::DeviceIndex>(device);
    if (other != nullptr && other->device != d) {
      throw std::runtime_error("a graph shares the stream and pool of a graph on another GPU");
    }
    return new Capture(d, other);
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

// Starts capturing what this thread enqueues on the side stream (which must be current),
// allocating from the graph's pool.
extern "C" int skein_cuda_graph_begin(void* g, char* err, size_t len) {
  auto* c = static_cast<Capture*>(g);
  return guarded(
      [&] {
        // Thread-local: another thread's allocations (a trainer's, say) do not end the capture.
        c->graph.capture_begin(c->pool, cudaStreamCaptureModeThreadLocal);
      },
      err, len);
}

// Ends the capture and makes the graph ready to replay; a capture that an operation
// invalidated is ended all the same, and fails.
extern "C" int skein_cuda_graph_end(void* g, char* err, size_t len) {
  auto* c = static_cast<Capture*>(g);
  return guarded(
      [&] {
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        check(cudaStreamIsCapturing(c->side.stream(), &status), "cudaStreamIsCapturing");
        if (status == cudaStreamCaptureStatusInvalidated) {
          abandon(*c);
          throw std::runtime_error("an operation not allowed in a capture invalidated it");
        }
        c->graph.capture_end();
      },
      err, len);
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
