//! The optimizer's libtorch calls that tch does not expose (`csrc/optimizer.cpp`): its
//! arithmetic over many tensors at once, through libtorch's multi-tensor ("foreach") ops,
//! copies between lists of tensors of two dtypes, and dropping gradients.
//!
//! A per-tensor AdamW step is fourteen kernels for every trainable tensor: on a GPU, thousands
//! of launches from the host a step for a model's few hundred tensors (LoRA's adapters are two
//! per projection). A foreach op computes the same arithmetic over a whole list in a few
//! launches. On the CPU libtorch runs it as the per-tensor op in a loop, so the CPU computes
//! to the bit what it computed before (`optim::tests`).

use std::ffi::{c_char, CStr};
use tch::Tensor;
use torch_sys::C_tensor;

/// The scalars of one AdamW step, shared by every tensor (`csrc/optimizer.cpp`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AdamwScalars {
    /// The gradients' factor from clipping; 1 leaves them alone.
    pub clip: f64,
    /// The weights' factor from decoupled weight decay, `1 - lr·weight_decay`; 1 skips it.
    pub decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    /// `sqrt(1 - beta2^t)`, the second moment's bias correction.
    pub bias2_sqrt: f64,
    pub eps: f64,
    /// `lr / (1 - beta1^t)`.
    pub step_size: f64,
}

/// One tensor group of an AdamW step: parameters with their gradients and moments, all the
/// same length.
pub struct AdamwGroup<'a> {
    pub params: &'a [&'a Tensor],
    pub grads: &'a [&'a Tensor],
    pub m: &'a [&'a Tensor],
    pub v: &'a [&'a Tensor],
}

/// Each gradient's sum of squares in float32, as a tensor [n] on their device; `grads` is not
/// empty.
pub fn square_sums(grads: &[&Tensor]) -> Tensor {
    let ptrs = pointers(grads);
    let mut error = [0 as c_char; 512];
    // SAFETY: `ptrs` holds `grads.len()` live tensors for the call; the shim returns a new
    // tensor (owned here) or null with a message in `error`.
    let out =
        unsafe { skein_square_sums(ptrs.as_ptr(), ptrs.len(), error.as_mut_ptr(), error.len()) };
    if out.is_null() {
        failed("the gradients' norm", &error);
    }
    // SAFETY: a tensor allocated by the shim, not referenced elsewhere.
    unsafe { Tensor::from_ptr(out) }
}

/// One AdamW step of a group, in place: the gradients clipped, the weights decayed, the
/// moments updated and the weights moved (the arithmetic in `csrc/optimizer.cpp`).
pub fn adamw_step(group: &AdamwGroup, scalars: &AdamwScalars) {
    let n = group.params.len();
    assert!(
        [group.grads.len(), group.m.len(), group.v.len()] == [n; 3],
        "an AdamW group's lists differ in length"
    );
    let (p, g, m, v) = (
        pointers(group.params),
        pointers(group.grads),
        pointers(group.m),
        pointers(group.v),
    );
    let mut error = [0 as c_char; 512];
    // SAFETY: each list holds `n` live tensors for the call and `scalars` is a live struct of
    // the shim's layout.
    let ok = unsafe {
        skein_adamw_step(
            p.as_ptr(),
            g.as_ptr(),
            m.as_ptr(),
            v.as_ptr(),
            n,
            scalars,
            error.as_mut_ptr(),
            error.len(),
        )
    };
    if !ok {
        failed("the AdamW step", &error);
    }
}

/// Drops the gradients of `params`: the next backward writes each one afresh (autograd takes
/// its result as the gradient) instead of adding it to zeros, one kernel fewer per parameter.
pub fn forget_grads(params: &[&Tensor]) {
    let ptrs = pointers(params);
    let mut error = [0 as c_char; 512];
    // SAFETY: `ptrs` holds live tensors for the call.
    let ok =
        unsafe { skein_forget_grads(ptrs.as_ptr(), ptrs.len(), error.as_mut_ptr(), error.len()) };
    if !ok {
        failed("dropping the gradients", &error);
    }
}

/// Copies each tensor of `src` into the one of `dst` at its place, cast to `dst`'s dtype
/// (float32 master weights into the low-precision weights a model computes with, and
/// gradients the other way).
pub fn copy_lists(dst: &[&Tensor], src: &[&Tensor]) {
    assert_eq!(dst.len(), src.len(), "copied lists differ in length");
    let (d, s) = (pointers(dst), pointers(src));
    let mut error = [0 as c_char; 512];
    // SAFETY: both lists hold `d.len()` live tensors for the call.
    let ok = unsafe {
        skein_copy_lists(
            d.as_ptr(),
            s.as_ptr(),
            d.len(),
            error.as_mut_ptr(),
            error.len(),
        )
    };
    if !ok {
        failed("copying a list of tensors", &error);
    }
}

fn pointers(tensors: &[&Tensor]) -> Vec<*const C_tensor> {
    tensors.iter().map(|t| t.as_ptr()).collect()
}

/// libtorch threw inside the shim: as a failing tch op does, this panics with its message.
fn failed(what: &str, error: &[c_char]) -> ! {
    // SAFETY: the shim wrote a NUL-terminated message within the buffer.
    let msg = unsafe { CStr::from_ptr(error.as_ptr()) };
    panic!("{what} failed: {}", msg.to_string_lossy());
}

extern "C" {
    fn skein_square_sums(
        grads: *const *const C_tensor,
        n: usize,
        error: *mut c_char,
        error_len: usize,
    ) -> *mut C_tensor;
    fn skein_adamw_step(
        params: *const *const C_tensor,
        grads: *const *const C_tensor,
        m: *const *const C_tensor,
        v: *const *const C_tensor,
        n: usize,
        scalars: *const AdamwScalars,
        error: *mut c_char,
        error_len: usize,
    ) -> bool;
    fn skein_copy_lists(
        dst: *const *const C_tensor,
        src: *const *const C_tensor,
        n: usize,
        error: *mut c_char,
        error_len: usize,
    ) -> bool;
    fn skein_forget_grads(
        tensors: *const *const C_tensor,
        n: usize,
        error: *mut c_char,
        error_len: usize,
    ) -> bool;
}
