// libtorch's autocast switches, per device type, as C functions for lsgd-train.
//
// tch exposes only the deprecated CUDA-only `at::autocast::set_enabled`; CPU autocast (bf16,
// fp16) needs the per-device-type functions below. They are declared here rather than taken
// from <ATen/autocast_mode.h> so that this file compiles in a moment without libtorch's
// headers; the declarations match libtorch 2.x's (the linker checks the mangled names, which
// encode every parameter type). No exception crosses into Rust: each call is wrapped.

#include <cstdint>

namespace c10 {
enum class DeviceType : int8_t;
enum class ScalarType : int8_t;
}  // namespace c10

namespace at::autocast {
bool is_autocast_enabled(c10::DeviceType device_type);
void set_autocast_enabled(c10::DeviceType device_type, bool enabled);
c10::ScalarType get_autocast_dtype(c10::DeviceType device_type);
void set_autocast_dtype(c10::DeviceType device_type, c10::ScalarType dtype);
int increment_nesting();
int decrement_nesting();
void clear_cache();
}  // namespace at::autocast

extern "C" {

// Enables or disables autocast for `device_type` (c10::DeviceType) with `dtype`
// (c10::ScalarType); writes the previous state to `*was_enabled` and `*was_dtype` and returns
// 0, or returns 1 if libtorch refused.
int lsgd_autocast_set(int8_t device_type, bool enabled, int8_t dtype, bool *was_enabled,
                      int8_t *was_dtype) {
  try {
    auto device = static_cast<c10::DeviceType>(device_type);
    *was_enabled = at::autocast::is_autocast_enabled(device);
    *was_dtype = static_cast<int8_t>(at::autocast::get_autocast_dtype(device));
    at::autocast::set_autocast_dtype(device, static_cast<c10::ScalarType>(dtype));
    at::autocast::set_autocast_enabled(device, enabled);
    return 0;
  } catch (...) {
    return 1;
  }
}

// Enters (`enter` true) or leaves an autocast region; leaving the outermost clears the cache of
// lower-precision weight copies, as torch.autocast's __exit__ does.
int lsgd_autocast_nest(bool enter) {
  try {
    if (enter) {
      at::autocast::increment_nesting();
    } else if (at::autocast::decrement_nesting() == 0) {
      at::autocast::clear_cache();
    }
    return 0;
  } catch (...) {
    return 1;
  }
}
}
