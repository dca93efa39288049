// The optimizer's libtorch calls that tch does not expose (src/trainer/update/optim_ops.rs):
//
// - AdamW over a group of tensors at once, in one of two forms. Fused: libtorch's fused AdamW,
//   one pass over the group's memory and a few launches for the whole group on a GPU. Op by op:
//   libtorch's multi-tensor ("foreach") ops, fourteen of them, each a pass and a few launches;
//   on the CPU libtorch runs each as the per-tensor op in a loop, so the CPU computes exactly
//   what a per-tensor loop would.
// - Dropping parameters' gradients, so the next backward writes them instead of adding to
//   zeros.
// - Copying a list of tensors into another of another dtype (float32 master weights and the
//   low-precision weights a model computes with).
//
// Every function takes arrays of `n` live tensors; when libtorch throws it returns false (or
// null) with the message in `error`.
#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/_foreach_div.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_foreach_sqrt.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/full.h>
#include <ATen/ops/square.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/sum.h>

#include <cstring>
#include <exception>
#include <vector>

namespace {

std::vector<at::Tensor> list(const at::Tensor* const* tensors, size_t n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(*tensors[i]);
  return out;
}

bool fail(const std::exception& e, char* error, size_t error_len) {
  if (error_len > 0) {
    std::strncpy(error, e.what(), error_len - 1);
    error[error_len - 1] = '\0';
  }
  return false;
}

}  // namespace

// The scalars of one step, computed by the caller (src/trainer/update/optim_ops.rs).
struct SkeinAdamwScalars {
  double clip;           // the gradients' factor; 1 leaves them as they are
  double lr;
  double weight_decay;   // decoupled: the weights shrink by lr * weight_decay of themselves
  double beta1;
  double beta2;
  double eps;
  double step;           // t, this step's number from 1, for the bias corrections
  // The same, derived as the op-by-op form reads them:
  double decay;          // the weights' factor, 1 - lr * weight_decay; 1 skips it
  double bias2_sqrt;     // sqrt(1 - beta2^t)
  double step_size;      // lr / (1 - beta1^t)
};

// The sum of squares of each gradient in float32, as a tensor [n]: the global norm's parts.
// On the CPU each is the float32 square summed, as a per-tensor loop computes it; elsewhere
// each is its multi-tensor norm squared, which rounds differently and launches a few kernels
// for the group instead of two per tensor.
extern "C" at::Tensor* skein_square_sums(const at::Tensor* const* grads, size_t n, char* error,
                                         size_t error_len) {
  try {
    auto g = list(grads, n);
    std::vector<at::Tensor> sums;
    if (n > 0 && g[0].is_cpu()) {
      sums.reserve(n);
      for (const auto& t : g) sums.push_back(t.to(at::kFloat).square().sum(at::kFloat));
    } else {
      sums = at::_foreach_norm(g, 2, at::kFloat);
      at::_foreach_mul_(sums, sums);
    }
    return new at::Tensor(at::stack(sums, 0));
  } catch (const std::exception& e) {
    fail(e, error, error_len);
    return nullptr;
  }
}

namespace {

// The fused form: element by element, in one pass,
//   p *= 1 - lr * weight_decay;  m = lerp(m, g, 1 - b1);  v = v * b2 + g * g * (1 - b2);
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
void fused_step(std::vector<at::Tensor>& p, std::vector<at::Tensor>& g,
                std::vector<at::Tensor>& mm, std::vector<at::Tensor>& vv,
                const SkeinAdamwScalars* s) {
  // The step number as the fused op reads it: a float32 scalar on the group's device, the same
  // one for every tensor (the op reads it and leaves it).
  auto step = at::full({}, s->step, p[0].options().dtype(at::kFloat));
  std::vector<at::Tensor> steps(p.size(), step);
  at::_fused_adamw_(p, g, mm, vv, {}, steps, s->lr, s->beta1, s->beta2, s->weight_decay, s->eps,
                    /*amsgrad=*/false, /*maximize=*/false);
}

// The op-by-op form, in the order of a per-tensor step:
//   p *= decay;  m = m * b1 + g * (1 - b1);  v = v * b2 + (g * g) * (1 - b2);
//   p -= m / (sqrt(v) / bias2_sqrt + eps) * step_size
void op_by_op_step(std::vector<at::Tensor>& p, std::vector<at::Tensor>& g,
                   std::vector<at::Tensor>& mm, std::vector<at::Tensor>& vv,
                   const SkeinAdamwScalars* s) {
  if (s->decay != 1.0) at::_foreach_mul_(p, s->decay);
  at::_foreach_mul_(mm, s->beta1);
  at::_foreach_add_(mm, at::_foreach_mul(g, 1.0 - s->beta1));
  at::_foreach_mul_(vv, s->beta2);
  {
    auto squares = at::_foreach_mul(g, g);
    at::_foreach_mul_(squares, 1.0 - s->beta2);
    at::_foreach_add_(vv, squares);
  }
  auto update = [&] {
    auto denom = at::_foreach_sqrt(vv);
    at::_foreach_div_(denom, s->bias2_sqrt);
    at::_foreach_add_(denom, s->eps);
    return at::_foreach_div(mm, denom);
  }();
  at::_foreach_mul_(update, s->step_size);
  at::_foreach_sub_(p, update);
}

}  // namespace

// One AdamW step of every parameter in the group, the gradients first clipped in place (when
// clip is not 1; the next step drops them), in the fused form or op by op. Every tensor of the
// group has one dtype and device. Returns 0 when done; 1 when the fused op was refused (its
// checks run before it changes anything) and the step was taken op by op, its message in
// `error`; -1 when the step failed, its message in `error`.
extern "C" int skein_adamw_step(const at::Tensor* const* params, const at::Tensor* const* grads,
                                const at::Tensor* const* m, const at::Tensor* const* v, size_t n,
                                const SkeinAdamwScalars* s, bool fused, char* error,
                                size_t error_len) {
  try {
    auto p = list(params, n), g = list(grads, n), mm = list(m, n), vv = list(v, n);
    if (n == 0) return 0;
    if (s->clip != 1.0) at::_foreach_mul_(g, s->clip);
    int status = 0;
    if (fused) {
      try {
        fused_step(p, g, mm, vv, s);
        return 0;
      } catch (const std::exception& e) {
        fail(e, error, error_len);
        status = 1;
      }
    }
    op_by_op_step(p, g, mm, vv, s);
    return status;
  } catch (const std::exception& e) {
    fail(e, error, error_len);
    return -1;
  }
}

// Drops the gradient of every tensor of the list (PyTorch's `zero_grad(set_to_none=True)`).
extern "C" bool skein_forget_grads(const at::Tensor* const* tensors, size_t n, char* error,
                                   size_t error_len) {
  try {
    for (size_t i = 0; i < n; ++i) {
      at::Tensor t = *tensors[i];
      t.mutable_grad().reset();
    }
    return true;
  } catch (const std::exception& e) {
    return fail(e, error, error_len);
  }
}

// Copies each of `src` into `dst` of the same shape, casting to `dst`'s dtype (rounding to
// nearest): a few launches for the list on CUDA, a per-tensor copy in a loop on the CPU.
extern "C" bool skein_copy_lists(const at::Tensor* const* dst, const at::Tensor* const* src,
                                 size_t n, char* error, size_t error_len) {
  try {
    auto d = list(dst, n);
    at::_foreach_copy_(d, list(src, n));
    return true;
  } catch (const std::exception& e) {
    return fail(e, error, error_len);
  }
}
