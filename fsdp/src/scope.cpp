#include <string>

#include "coshard/fsdp/unit.hpp"

namespace coshard::fsdp {
namespace {

[[noreturn]] void scope_misuse(const char* what, std::size_t i) {
  throw Error(Errc::invalid_argument, std::string(what) + " " + std::to_string(i) +
                                          " used outside its unit's phase (before pre-forward, after post-backward, "
                                          "or a gradient in forward); use Scope only inside forward/backward");
}

std::span<float> span_of(const Tensor& t) { return {t.data_as<float>(), static_cast<std::size_t>(t.numel())}; }

}  // namespace

std::span<float> Scope::param(std::size_t i) const {
  if (!params_ || i >= params_->size() || !(*params_)[i].defined()) scope_misuse("parameter", i);
  return span_of((*params_)[i]);
}

std::span<float> Scope::grad(std::size_t i) const {
  if (!grads_ || i >= grads_->size() || !(*grads_)[i].defined()) scope_misuse("gradient of parameter", i);
  return span_of((*grads_)[i]);
}

}  // namespace coshard::fsdp
