// What lsgd-train's C++ shims (model/script.cpp, overlap/ready.cpp) share: no exception
// crosses into Rust, so every entry point runs its body under `guard`, which turns an exception
// into a malloc'd message (freed by lsgd_script_free_error), or nullptr on success.

#pragma once

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

namespace lsgd_shim {

inline char *message(const std::string &text) {
  char *out = static_cast<char *>(std::malloc(text.size() + 1));
  if (out != nullptr) {
    std::memcpy(out, text.c_str(), text.size() + 1);
  }
  return out;
}

// c10::Error::what() appends a C++ backtrace; what_without_backtrace() is the message a user
// can act on.
template <typename F>
char *guard(F f) {
  try {
    f();
    return nullptr;
  } catch (const c10::Error &e) {
    return message(e.what_without_backtrace());
  } catch (const std::exception &e) {
    return message(e.what());
  } catch (...) {
    return message("unknown C++ exception");
  }
}

}  // namespace lsgd_shim
