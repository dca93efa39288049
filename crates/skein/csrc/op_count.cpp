// Counts the libtorch operator calls the calling thread makes between a start and a stop,
// through libtorch's RecordFunction callbacks (the hook its own profiler uses). Everything is
// the thread's own, so work on other threads (tests running beside) is not counted. Each call is one dispatch on the
// host, and on a GPU each call that computes launches a kernel: for a decode step, whose
// kernels are tiny, those counts are what bound its speed, and they are the same on every
// device for the same ops, so they can be measured where no GPU is (src/op_count.rs).
//
// Counted: every call; by name, the calls the program made itself (the top level); and by
// name, the computing calls: the lowest calls that compute, those that are not views,
// metadata, allocations or backward nodes and made no computing call of their own. A linear
// is not one (its matmul is), a cast that copies counts its copy, a cast to the same dtype
// nothing. A computing call inside another is named after the top-level call it serves as well
// ("aten::linear > aten::mm"). A multi-tensor op (`aten::_foreach_*`, and the fused optimizer
// steps `aten::_fused_adam*`) is one computing call,
// whatever it calls inside: on a GPU it launches one kernel for a whole list of tensors (a few
// for a list of very many or very large ones), while the CPU runs it as a per-tensor loop,
// whose calls would count what a GPU does not launch.
#include <ATen/record_function.h>

#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <string>
#include <unordered_set>
#include <vector>

namespace {

// Operators that compute nothing themselves: views, metadata, allocations, and casts or
// copies that may return their input (their copies, when they make one, are counted).
const std::unordered_set<std::string> not_computing = {
    "aten::_reshape_alias", "aten::_unsafe_view", "aten::alias",       "aten::as_strided",
    "aten::contiguous",     "aten::detach",       "aten::empty",       "aten::empty_like",
    "aten::empty_strided",  "aten::expand",       "aten::lift_fresh",  "aten::narrow",
    "aten::permute",        "aten::reshape",      "aten::resolve_conj", "aten::resolve_neg",
    "aten::result_type",    "aten::scalar_tensor", "aten::select",     "aten::slice",
    "aten::split",          "aten::split_with_sizes", "aten::squeeze", "aten::t",
    "aten::to",             "aten::transpose",    "aten::unsqueeze",   "aten::view",
    "aten::expand_as",      "aten::view_as",      "aten::chunk",       "aten::unbind",
    "aten::detach_",
    // Autograd's own calls of them, recorded without the namespace.
    "detach",               "detach_",
};

thread_local int64_t all_calls = 0;
thread_local std::map<std::string, int64_t> top_level;
thread_local std::map<std::string, int64_t> computing;
// Per open call, whether a computing call was made inside it.
thread_local std::vector<bool> open_calls;
// The top-level call open now, which computing calls are attributed to.
thread_local std::string open_top_level;
thread_local at::CallbackHandle handle = 0;
// Multi-tensor calls open now: the calls inside them are counted as theirs.
thread_local int64_t open_multi_tensor = 0;

bool is_multi_tensor(const char* name) {
  return std::strncmp(name, "aten::_foreach_", 15) == 0 ||
         std::strncmp(name, "aten::_fused_adam", 17) == 0;
}

// A backward node's call: what it computes is the calls inside it. One with none (a view's
// or a sum's backward passing its gradient on, autograd taking a result as a gradient)
// launches nothing.
bool is_backward_node(const char* name) {
  static const char prefix[] = "autograd::engine::evaluate_function: ";
  return std::strncmp(name, prefix, sizeof(prefix) - 1) == 0;
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  all_calls += 1;
  if (open_calls.empty()) {
    top_level[fn.name()] += 1;
    open_top_level = fn.name();
  }
  open_calls.push_back(false);
  if (is_multi_tensor(fn.name())) open_multi_tensor += 1;
  return nullptr;
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext*) {
  // A call that began before counting started has no entry here.
  if (open_calls.empty()) return;
  bool computed = open_calls.back();
  open_calls.pop_back();
  const bool multi_tensor_call = is_multi_tensor(fn.name());
  if (multi_tensor_call) open_multi_tensor -= 1;
  if (open_multi_tensor > 0) {
    // Inside a multi-tensor call, which counts itself.
    if (!open_calls.empty()) open_calls.back() = true;
    return;
  }
  const bool leaf = !computed && !not_computing.count(fn.name()) && !is_backward_node(fn.name());
  if (multi_tensor_call || leaf) {
    const bool top = open_calls.empty();
    computing[top ? fn.name() : open_top_level + " > " + fn.name()] += 1;
    computed = true;
  }
  if (computed && !open_calls.empty()) open_calls.back() = true;
}

}  // namespace

extern "C" {

// Starts counting from zero; a no-op while counting already.
void skein_op_count_start() {
  if (handle != 0) return;
  all_calls = 0;
  top_level.clear();
  computing.clear();
  open_calls.clear();
  open_multi_tensor = 0;
  handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(on_enter, on_exit).scopes({at::RecordScope::FUNCTION}));
}

// Stops counting and returns every call counted; the counts by name stay readable until the
// next start.
int64_t skein_op_count_stop() {
  if (handle != 0) {
    at::removeCallback(handle);
    handle = 0;
  }
  return all_calls;
}

// The number of distinct operators counted at the top level (`top` true) or as computing.
int64_t skein_op_count_names(bool top) {
  return static_cast<int64_t>((top ? top_level : computing).size());
}

// The i-th operator (in name order) counted at the top level (`top` true) or as computing:
// its calls, and its name copied into `name` (truncated to fit, NUL-terminated). -1 when i is
// out of range.
int64_t skein_op_count_entry(bool top, int64_t i, char* name, size_t name_len) {
  const auto& counts = top ? top_level : computing;
  if (i < 0 || i >= static_cast<int64_t>(counts.size()) || name_len == 0) return -1;
  auto it = counts.begin();
  std::advance(it, i);
  std::strncpy(name, it->first.c_str(), name_len - 1);
  name[name_len - 1] = '\0';
  return it->second;
}

}  // extern "C"
