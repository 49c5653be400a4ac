// A TorchScript module (torch::jit::Module) as C functions for lsgd-train's ScriptModel.
//
// tch's CModule cannot be used: it registers parameters without de-duplicating tied ones,
// renames them (`.` to `_`), and gives no access to buffers (BatchNorm's running statistics),
// which the trainer checkpoints, resumes and compares across ranks. No exception crosses into
// Rust: every function catches everything and returns an error message instead (a malloc'd
// string the caller frees with lsgd_script_free_error), or nullptr on success. Tensors handed
// out are `new at::Tensor(...)`, which is tch's `C_tensor` (torch_api.h: `torch::Tensor *`)
// and which tch frees with `delete`.

#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>

#include "../shim.hpp"

using lsgd_shim::guard;

namespace {

torch::jit::Module *module(void *m) { return static_cast<torch::jit::Module *>(m); }

}  // namespace

extern "C" {

// Called once per tensor with its dotted name, a new at::Tensor the callee owns, and the
// identity of its TensorImpl (tied parameters share one).
typedef void (*lsgd_script_visit)(void *ctx, const char *name, void *tensor, uintptr_t identity);

void lsgd_script_free_error(char *error) { std::free(error); }

// Loads the serialized module in `data` onto device (`device_type`, `device_index`), as
// c10::DeviceType and index (-1: the current one), into `*out`.
char *lsgd_script_load(const char *data, size_t len, int8_t device_type, int8_t device_index,
                       void **out) {
  return guard([&] {
    std::istringstream stream(std::string(data, len));
    c10::Device device(static_cast<c10::DeviceType>(device_type), device_index);
    *out = new torch::jit::Module(torch::jit::load(stream, device));
  });
}

void lsgd_script_free(void *m) { delete module(m); }

// Visits every parameter (`buffers` false) or buffer (`buffers` true) of the module and its
// submodules, in libtorch's order, tied ones under each of their names.
char *lsgd_script_tensors(void *m, bool buffers, void *ctx, lsgd_script_visit visit) {
  return guard([&] {
    auto each = [&](const std::string &name, const at::Tensor &t) {
      visit(ctx, name.c_str(), new at::Tensor(t),
            reinterpret_cast<uintptr_t>(t.unsafeGetTensorImpl()));
    };
    if (buffers) {
      for (const auto &b : module(m)->named_buffers()) each(b.name, b.value);
    } else {
      for (const auto &p : module(m)->named_parameters()) each(p.name, p.value);
    }
  });
}

// Runs forward on `input` (an at::Tensor*); the result must be one tensor, written to `*out`.
char *lsgd_script_forward(void *m, const void *input, void **out) {
  return guard([&] {
    std::vector<torch::jit::IValue> inputs{*static_cast<const at::Tensor *>(input)};
    // The executor's optimised plan runs the forward pass as one differentiable graph, whose
    // backward node hands out every parameter's gradient at once at its very end: no bucket
    // could be exchanged before the backward pass is over. Unoptimised, each op records its
    // own autograd node, as an eager module's do, and the gradients become ready layer by
    // layer (measured equally fast on CPU, where TorchScript fuses nothing by default). The
    // setting is per thread, and read on every call.
    torch::jit::GraphOptimizerEnabledGuard eager_autograd(false);
    torch::jit::IValue output = module(m)->forward(std::move(inputs));
    if (!output.isTensor()) {
      throw std::runtime_error("forward returned " + output.tagKind() +
                               ", not one Tensor");
    }
    const at::Tensor &y = output.toTensor();
    // Checked here, where autograd's mode is known: a training pass whose output does not
    // require grad would fail later in backward, with a message that does not name the model.
    if (at::GradMode::is_enabled() && module(m)->is_training() && !y.requires_grad()) {
      throw std::runtime_error(
          "forward returned a tensor that does not require grad (detached, or computed "
          "without the parameters), so training would have no gradient");
    }
    *out = new at::Tensor(y);
  });
}

// Sets training mode (`on`) or evaluation mode on the module and its submodules.
char *lsgd_script_train(void *m, bool on) {
  return guard([&] { module(m)->train(on); });
}

// Writes the module, with its current parameters and buffers, to `path`.
char *lsgd_script_save(void *m, const char *path) {
  return guard([&] { module(m)->save(path); });
}
}
