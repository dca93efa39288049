//! The optimizer's libtorch calls that tch does not expose (`csrc/optimizer.cpp`): AdamW over
//! many tensors at once, copies between lists of tensors of two dtypes, and dropping gradients.
//!
//! AdamW written out tensor by tensor is fourteen kernels for every trainable tensor: on a GPU,
//! thousands of launches from the host a step for a model's few hundred tensors (LoRA's
//! adapters are two per projection). Over a group of tensors it takes one of two forms
//! ([`AdamwForm`]): libtorch's multi-tensor ("foreach") ops, fourteen passes over the group's
//! memory with a few launches each, or libtorch's fused AdamW, one pass and a few launches.

use std::ffi::{c_char, CStr};
use tch::Tensor;
use torch_sys::C_tensor;

/// The scalars of one AdamW step, shared by every tensor (`csrc/optimizer.cpp`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AdamwScalars {
    /// The gradients' factor from clipping; 1 leaves them alone.
    pub clip: f64,
    pub lr: f64,
    /// Decoupled weight decay: each step shrinks the weights by `lr · weight_decay` of
    /// themselves.
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// This step's number, from 1: the moments' bias corrections are `1 - beta^step`.
    pub step: f64,
    /// The same, derived as [`AdamwForm::OpByOp`] reads them: `1 - lr·weight_decay`,
    /// `sqrt(1 - beta2^step)` and `lr / (1 - beta1^step)`.
    pub decay: f64,
    pub bias2_sqrt: f64,
    pub step_size: f64,
}

impl AdamwScalars {
    /// The scalars of step `step` (from 1).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        clip: f64,
        lr: f64,
        weight_decay: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
        step: i32,
    ) -> Self {
        AdamwScalars {
            clip,
            lr,
            weight_decay,
            beta1,
            beta2,
            eps,
            step: step as f64,
            decay: 1.0 - lr * weight_decay,
            bias2_sqrt: (1.0 - beta2.powi(step)).sqrt(),
            step_size: lr / (1.0 - beta1.powi(step)),
        }
    }
}

/// How an AdamW step computes a group ([`AdamwForm::for_device`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdamwForm {
    /// libtorch's fused AdamW: the whole arithmetic in one pass over the group's memory, a
    /// few kernel launches for the group on a GPU. It rounds differently from the op-by-op
    /// form (`optim::tests` holds the two to round-off).
    Fused,
    /// Fourteen multi-tensor ops, each a pass over the group. The CPU runs each as the
    /// per-tensor op in a loop, so CPU runs compute to the bit what a per-tensor AdamW did, as
    /// they always have.
    OpByOp,
}

impl AdamwForm {
    /// Op by op on the CPU, whose runs keep their numbers; fused elsewhere, where each of the
    /// fourteen passes over the weights and moments is memory traffic and a few launches.
    pub fn for_device(device: tch::Device) -> Self {
        match device {
            tch::Device::Cpu => AdamwForm::OpByOp,
            _ => AdamwForm::Fused,
        }
    }
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
/// moments updated and the weights moved (the arithmetic in `csrc/optimizer.cpp`). Every
/// tensor of the group has one dtype and device. `Err` with libtorch's message when the fused
/// form was refused: the step was then taken op by op.
pub fn adamw_step(
    group: &AdamwGroup,
    scalars: &AdamwScalars,
    form: AdamwForm,
) -> Result<(), String> {
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
    let status = unsafe {
        skein_adamw_step(
            p.as_ptr(),
            g.as_ptr(),
            m.as_ptr(),
            v.as_ptr(),
            n,
            scalars,
            form == AdamwForm::Fused,
            error.as_mut_ptr(),
            error.len(),
        )
    };
    match status {
        0 => Ok(()),
        1 => Err(message(&error)),
        _ => failed("the AdamW step", &error),
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
/// gradients the other way). Empty lists copy nothing.
pub fn copy_lists(dst: &[&Tensor], src: &[&Tensor]) {
    assert_eq!(dst.len(), src.len(), "copied lists differ in length");
    if dst.is_empty() {
        return; // libtorch refuses an empty list
    }
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
    panic!("{what} failed: {}", message(error));
}

/// The message the shim wrote into `error`.
fn message(error: &[c_char]) -> String {
    // SAFETY: the shim wrote a NUL-terminated message within the buffer.
    unsafe { CStr::from_ptr(error.as_ptr()) }
        .to_string_lossy()
        .into_owned()
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
        fused: bool,
        error: *mut c_char,
        error_len: usize,
    ) -> i32;
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
