// libtorch's inference mode, which tch does not expose (src/engine/inference_mode.rs). Inside
// it an op skips autograd's bookkeeping altogether (not only the recording `no_grad` skips), so
// each op costs the host less: what a decode step, a few thousand small ops, is made of.
#include <c10/core/InferenceMode.h>

// Enters (`enabled`) or leaves inference mode on this thread until the returned guard is
// dropped; guards nest and must be dropped in reverse order, on the same thread.
extern "C" void* skein_inference_mode(bool enabled) { return new c10::InferenceMode(enabled); }

extern "C" void skein_inference_mode_drop(void* guard) {
  delete static_cast<c10::InferenceMode*>(guard);
}

// Whether this thread is in inference mode now.
extern "C" bool skein_inference_mode_enabled() { return c10::InferenceMode::is_enabled(); }
