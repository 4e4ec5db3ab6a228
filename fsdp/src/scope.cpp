#include <string>

#include "coshard/fsdp/unit.hpp"

namespace coshard::fsdp {
namespace {

[[noreturn]] void scope_misuse(const char* what, std::size_t i) {
  throw Error(Errc::invalid_argument, std::string(what) + " " + std::to_string(i) +
                                          " used outside its unit's phase (before pre-forward, after post-backward, "
                                          "or a gradient in forward); use Scope only inside forward/backward");
}

const Tensor& checked(const std::vector<Tensor>* views, std::size_t i, const char* what) {
  if (!views || i >= views->size() || !(*views)[i].defined()) scope_misuse(what, i);
  return (*views)[i];
}

std::span<float> span_of(const Tensor& t, const char* what, std::size_t i) {
  if (t.dtype() != DType::f32) {
    throw Error(Errc::invalid_argument,
                std::string(what) + " " + std::to_string(i) + " is " + std::string(to_string(t.dtype())) +
                    ": this unit declares computes_in_f32() false, so it reads param_tensor() in that dtype");
  }
  return {t.data_as<float>(), static_cast<std::size_t>(t.numel())};
}

}  // namespace

Tensor Scope::param_tensor(std::size_t i) const { return checked(params_, i, "parameter"); }

Tensor Scope::grad_tensor(std::size_t i) const { return checked(grads_, i, "gradient of parameter"); }

std::span<float> Scope::param(std::size_t i) const { return span_of(checked(params_, i, "parameter"), "parameter", i); }

std::span<float> Scope::grad(std::size_t i) const {
  return span_of(checked(grads_, i, "gradient of parameter"), "gradient of parameter", i);
}

}  // namespace coshard::fsdp
