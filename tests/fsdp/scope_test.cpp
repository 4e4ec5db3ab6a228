// What a unit's phase sees through Scope: its parameters as tensors in the dtype it computes in,
// f32 spans for host code only where they are f32, and clear errors for misuse.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "coshard/fsdp/unit.hpp"

using namespace coshard;
using namespace coshard::fsdp;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return {};
}

TEST(Scope, HandsTensorsInTheUnitsDtypeAndSpansOnlyOfF32) {
  Runtime rt({});
  const std::vector<Tensor> f32{Tensor::empty(rt.allocator(), DType::f32, {3, 2})};
  const std::vector<Tensor> bf16{Tensor::empty(rt.allocator(), DType::bf16, {3, 2})};
  const std::vector<Tensor> grads{Tensor::empty(rt.allocator(), DType::f32, {3, 2})};

  Scope forward(rt, rt.stream("compute"), &f32, nullptr);
  EXPECT_EQ(forward.param_tensor(0).shape(), (Shape{3, 2}));
  EXPECT_EQ(forward.param(0).size(), 6u);
  EXPECT_NE(error_of([&] { (void)forward.grad(0); }).find("outside its unit's phase"), std::string::npos);
  EXPECT_NE(error_of([&] { (void)forward.param_tensor(1); }).find("parameter 1"), std::string::npos);

  Scope backward(rt, rt.stream("compute"), &bf16, &grads);
  EXPECT_EQ(backward.param_tensor(0).dtype(), DType::bf16);
  EXPECT_EQ(backward.grad_tensor(0).dtype(), DType::f32);
  EXPECT_EQ(backward.grad(0).size(), 6u);
  EXPECT_NE(error_of([&] { (void)backward.param(0); }).find("computes_in_f32() false"), std::string::npos);
}

}  // namespace
