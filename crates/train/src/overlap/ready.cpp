// Gradient-ready hooks for lsgd-train's overlap (overlap/ready.rs): tch has no autograd hooks
// (tch-rs issue 769), so this shim registers them on libtorch's side.
//
// The hook is a post hook on each parameter's gradient accumulator (AccumulateGrad), as DDP's
// reducer registers its own, not a Tensor::register_hook: a tensor hook runs before the
// gradient is accumulated into `.grad` (it sees the incoming gradient only), a post hook of the
// accumulator after, when `.grad` holds the parameter's whole gradient of this backward pass,
// micro-batches accumulated included. A tensor only holds its accumulator weakly, so the handle
// keeps each one alive for as long as the hooks are registered (DDP's reducer does the same).

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <unordered_set>
#include <vector>

#include "../shim.hpp"

using lsgd_shim::guard;

extern "C" {
// Called on autograd's thread with the index of the tensor whose gradient is ready.
typedef void (*lsgd_ready_fn)(void *ctx, size_t index);
}

namespace {

struct ReadyHook : torch::autograd::FunctionPostHook {
  ReadyHook(lsgd_ready_fn ready, void *ctx, size_t index) : ready(ready), ctx(ctx), index(index) {}

  torch::autograd::variable_list operator()(const torch::autograd::variable_list &outputs,
                                            const torch::autograd::variable_list &) override {
    ready(ctx, index);
    return outputs;
  }

  lsgd_ready_fn ready;
  void *ctx;
  size_t index;
};

struct Hooks {
  // Each accumulator and the key of the hook registered on it.
  std::vector<std::pair<c10::intrusive_ptr<torch::autograd::Node>, uintptr_t>> hooks;
};

}  // namespace

extern "C" {

// Registers a ready hook on the gradient accumulator of each of the `n` leaf tensors (tch's
// C_tensor, an at::Tensor*) that require grad; `ready(ctx, i)` runs once tensor i's gradient is
// accumulated. `*out` receives a handle for lsgd_ready_free, which removes the hooks.
char *lsgd_ready_register(void **tensors, size_t n, lsgd_ready_fn ready, void *ctx, void **out) {
  return guard([&] {
    auto hooks = std::make_unique<Hooks>();
    for (size_t i = 0; i < n; ++i) {
      const at::Tensor &t = *static_cast<at::Tensor *>(tensors[i]);
      TORCH_CHECK(t.is_leaf() && t.requires_grad(), "tensor ", i,
                  " is not a leaf that requires grad: it has no gradient accumulator");
      auto acc = torch::autograd::impl::grad_accumulator(t);
      TORCH_CHECK(acc, "tensor ", i, " has no gradient accumulator");
      uintptr_t key = acc->add_post_hook(std::make_unique<ReadyHook>(ready, ctx, i));
      hooks->hooks.emplace_back(std::move(acc), key);
    }
    *out = hooks.release();
  });
}

// Which of the hooked tensors the graph behind `loss` (an at::Tensor*) reaches: out[i] is 1
// when tensor i's accumulator is on a path from the loss, so that its gradient will become
// ready in the backward pass (DDP's search for unused parameters walks the graph likewise).
char *lsgd_ready_reached(void *handle, void *loss, uint8_t *out) {
  return guard([&] {
    const auto *hooks = static_cast<const Hooks *>(handle);
    const at::Tensor &l = *static_cast<at::Tensor *>(loss);
    std::unordered_set<const torch::autograd::Node *> seen;
    std::vector<torch::autograd::Node *> todo;
    if (auto fn = l.grad_fn()) {
      todo.push_back(fn.get());
    }
    while (!todo.empty()) {
      torch::autograd::Node *node = todo.back();
      todo.pop_back();
      if (!seen.insert(node).second) {
        continue;
      }
      for (const auto &edge : node->next_edges()) {
        if (edge.function) {
          todo.push_back(edge.function.get());
        }
      }
    }
    for (size_t i = 0; i < hooks->hooks.size(); ++i) {
      out[i] = seen.count(hooks->hooks[i].first.get()) ? 1 : 0;
    }
  });
}

// Leaves each of the `n` tensors without a gradient (`.grad` undefined, as before any backward
// pass), which tch cannot do: a gradient zeroed in place would still count as one.
char *lsgd_ready_forget(void **tensors, size_t n) {
  return guard([&] {
    for (size_t i = 0; i < n; ++i) {
      static_cast<at::Tensor *>(tensors[i])->mutable_grad().reset();
    }
  });
}

// Removes the hooks and releases the accumulators.
void lsgd_ready_free(void *handle) {
  auto *hooks = static_cast<Hooks *>(handle);
  for (auto &[acc, key] : hooks->hooks) {
    acc->del_post_hook(key);
  }
  delete hooks;
}

}  // extern "C"
