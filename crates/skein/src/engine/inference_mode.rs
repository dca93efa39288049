//! libtorch's inference mode (`csrc/inference_mode.cpp`), in which ops skip autograd's
//! bookkeeping altogether. `no_grad` only stops the recording: each op still passes through
//! autograd's dispatch and bumps version counters. A decode step is a few thousand small ops,
//! on a GPU each one host time before its launch, so the engine decodes in inference mode.
//!
//! Tensors made inside it cannot later take part in autograd, nor be changed in place outside
//! it. The engine's tensors (KV cache, decoding copy, sampling state) live and die inside one
//! run; callbacks into the caller's code leave the mode ([`InferenceMode::off`]).

use std::ffi::c_void;

/// Inference mode on or off for this thread until the value drops. Guards nest; each must be
/// dropped on the thread that made it, in reverse order (which owning it in a scope gives).
pub struct InferenceMode {
    guard: *mut c_void,
}

impl InferenceMode {
    /// Enters inference mode.
    pub fn on() -> Self {
        // SAFETY: the shim allocates a guard that only `drop` frees.
        InferenceMode {
            guard: unsafe { skein_inference_mode(true) },
        }
    }

    /// Leaves it, for code that is not the engine's (a caller's callback).
    pub fn off() -> Self {
        // SAFETY: as in `on`.
        InferenceMode {
            guard: unsafe { skein_inference_mode(false) },
        }
    }

    /// Whether this thread is in inference mode now.
    pub fn is_enabled() -> bool {
        // SAFETY: reads a thread-local flag.
        unsafe { skein_inference_mode_enabled() }
    }
}

impl Drop for InferenceMode {
    fn drop(&mut self) {
        // SAFETY: a guard from the shim, dropped once, on its thread (the raw pointer keeps
        // this type from leaving it).
        unsafe { skein_inference_mode_drop(self.guard) }
    }
}

extern "C" {
    fn skein_inference_mode(enabled: bool) -> *mut c_void;
    fn skein_inference_mode_drop(guard: *mut c_void);
    fn skein_inference_mode_enabled() -> bool;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Kind, Tensor};

    /// The guards nest and restore what was before them; a tensor made inside is an
    /// inference tensor, which autograd refuses.
    #[test]
    fn guards_nest_and_restore() {
        assert!(!InferenceMode::is_enabled());
        {
            let _on = InferenceMode::on();
            assert!(InferenceMode::is_enabled());
            {
                let _off = InferenceMode::off();
                assert!(!InferenceMode::is_enabled());
            }
            assert!(InferenceMode::is_enabled());
        }
        assert!(!InferenceMode::is_enabled());
        let made_inside = {
            let _on = InferenceMode::on();
            Tensor::ones([2], (Kind::Float, tch::Device::Cpu)) * 2.0
        };
        let w = Tensor::ones([2], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        assert!(made_inside.f_mul(&w).is_err());
    }
}
