// Variable-length causal attention through libtorch's fused CUDA kernels, for packed lines
// (src/model/attention.rs). tch exposes neither kernel: their forwards return symbolic
// integers, which its generated bindings skip. Both ops carry libtorch's own derivatives, so
// the result takes part in autograd like any other op.
//
// Sequence i's queries are rows cu_q[i]..cu_q[i+1] of `q` [total_q, heads, head_dim], its keys
// and values rows cu_k[i]..cu_k[i+1] of `k`, `v` [total_k, kv_heads, head_dim]. A sequence may
// have more keys than queries (a row's suffix reading its shared prefix): query j then sees
// keys 0..=j + (keys - queries), the causal mask aligned at the bottom right.
#include <ATen/core/Tensor.h>
#include <ATen/ops/_efficient_attention_forward.h>
#include <ATen/ops/_flash_attention_forward.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

namespace {

// Flash attention: half precision only, on Ampere or newer, grouped key/value heads
// natively. Its causal mask is bottom-right aligned when a sequence has more keys than
// queries.
at::Tensor flash(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const at::Tensor& cu_q, const at::Tensor& cu_k, int64_t max_q, int64_t max_k) {
  auto out = at::_flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0,
                                          /*is_causal=*/true, /*return_debug_mask=*/false);
  return std::get<0>(out);
}

// Memory-efficient attention: float32 too, one key/value head per query head, batch 1 with
// cumulative lengths. Mask type 2 is causal from the bottom right.
at::Tensor efficient(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& cu_q, const at::Tensor& cu_k, int64_t max_q,
                     int64_t max_k) {
  const int64_t group = q.size(1) / k.size(1);
  auto kk = group > 1 ? k.repeat_interleave(group, 1) : k;
  auto vv = group > 1 ? v.repeat_interleave(group, 1) : v;
  auto out = at::_efficient_attention_forward(
      q.unsqueeze(0), kk.unsqueeze(0), vv.unsqueeze(0), std::nullopt, cu_q, cu_k, max_q, max_k,
      0.0, /*custom_mask_type=*/2, /*compute_log_sumexp=*/true);
  return std::get<0>(out).squeeze(0);
}

// Whether `e` is flash attention refusing the call's GPU or head size ("FlashAttention only
// supports Ampere GPUs or newer", "... only supports head dimension at most 256"): a call
// memory-efficient attention may take. Any other failure is not a refusal and is reported.
bool flash_refusal(const std::exception& e) {
  const std::string what = e.what();
  return what.find("FlashAttention") != std::string::npos &&
         what.find("only support") != std::string::npos;
}

}  // namespace

extern "C" at::Tensor* skein_varlen_attention(const at::Tensor* q, const at::Tensor* k,
                                               const at::Tensor* v, const at::Tensor* cu_q,
                                               const at::Tensor* cu_k, int64_t max_q,
                                               int64_t max_k, char* error, size_t error_len) {
  // Set once flash attention refuses a call (a GPU older than Ampere, a head wider than
  // its kernels): every later call then goes to memory-efficient attention, which takes
  // float16 on those GPUs (bfloat16 needs Ampere for either kernel), instead of paying for
  // flash's refusal every layer.
  static std::atomic<bool> flash_refused{false};
  try {
    const bool half = q->scalar_type() == at::kBFloat16 || q->scalar_type() == at::kHalf;
    if (half && !flash_refused.load(std::memory_order_relaxed)) {
      try {
        return new at::Tensor(flash(*q, *k, *v, *cu_q, *cu_k, max_q, max_k));
      } catch (const std::exception& e) {
        if (!flash_refusal(e)) {
          throw;
        }
        if (!flash_refused.exchange(true)) {
          // The message's first line: libtorch may append a backtrace.
          const std::string what = e.what();
          std::fprintf(stderr,
                       "skein: flash attention refused packed lines (%s); they use "
                       "memory-efficient attention from here on\n",
                       what.substr(0, what.find('\n')).c_str());
        }
      }
    }
    return new at::Tensor(efficient(*q, *k, *v, *cu_q, *cu_k, max_q, max_k));
  } catch (const std::exception& e) {
    if (error_len > 0) {
      std::strncpy(error, e.what(), error_len - 1);
      error[error_len - 1] = '\0';
    }
    return nullptr;
  }
}
