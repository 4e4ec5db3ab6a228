// The engine's device work (device_work.hpp) on its own: one piece of work never mixes memory the
// host cannot reach with host memory, on the cpu-discrete device as on CUDA, and a mix names the
// work; the staging copy that offload uses instead gives the same bits as the host loop.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "coshard/runtime/copy.hpp"
#include "coshard/runtime/runtime.hpp"
#include "device_work.hpp"

namespace coshard::fsdp::detail {
namespace {

void expect_mix_refused(const std::function<void()>& work, const std::string& what) {
  try {
    work();
    FAIL() << what << " was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::internal);
    EXPECT_NE(std::string(e.what()).find(what + " on stream 'h2d' mixes device and host memory"), std::string::npos)
        << e.what();
  }
}

TEST(DeviceWork, WorkMixingDeviceAndHostMemoryIsRefusedNamingIt) {
  Runtime rt(Runtime::Options{.discrete_memory = true});
  Allocator host(cpu_memory());
  Stream& s = rt.stream("h2d");
  const Tensor dev = Tensor::empty(rt.allocator(), DType::bf16, {4});
  const Tensor dev32 = Tensor::empty(rt.allocator(), DType::f32, {4});
  const Tensor master = Tensor::empty(host, DType::f32, {4});
  expect_mix_refused([&] { cast_scaled(s, dev, master, 1.0f, "h2d"); }, "cast_scaled");
  expect_mix_refused([&] { accumulate_scaled(s, master, dev, 1.0f, DType::f32, "d2h"); }, "accumulate_scaled");
  expect_mix_refused([&] { norm_partial(s, {{master, 0, 4}}, ops::NormType::l2, dev32, std::make_shared<double>(), "n"); },
                     "norm_partial");
  const Tensor none;
  EXPECT_FALSE(runs_as_kernels(s, "optimizer", {&master, &master, &none}));  // an absent buffer does not count
  expect_mix_refused([&] { (void)runs_as_kernels(s, "optimizer", {&master, &dev32}); }, "optimizer");
  s.synchronize();
}

// On the plain CPU device every tensor is host memory: offload casts in one host loop; where the
// host cannot reach device memory it copies in f32 and casts there. Both give the same bits.
TEST(DeviceWork, StagedCastGivesTheBitsOfTheHostLoop) {
  Runtime rt(Runtime::Options{.discrete_memory = true});
  Allocator host(cpu_memory());
  Stream& s = rt.stream("h2d");
  std::vector<float> values{1.0f, -2.5f, 3.14159f, 1e-3f, 65504.5f, -0.0f, 7.77e7f};
  const auto n = static_cast<std::int64_t>(values.size());
  const Tensor master = Tensor::empty(host, DType::f32, {n});
  upload(s, master, values);
  const Tensor up = Tensor::empty(rt.allocator(), DType::f32, {n});
  const Tensor dev = Tensor::empty(rt.allocator(), DType::bf16, {n});
  copy_tensor(s, up, master);
  cast_scaled(s, dev, up, 1.0f, "cast");
  const Tensor direct = Tensor::empty(host, DType::bf16, {n});
  cast_scaled(s, direct, master, 1.0f, "host cast");
  const Tensor got = Tensor::empty(rt.allocator(), DType::f32, {n});
  const Tensor want = Tensor::empty(host, DType::f32, {n});
  widen(s, got, dev, "widen");
  widen(s, want, direct, "widen");
  const auto g = rt.scheduler().sync_wait(download<float>(s, got));
  const auto w = rt.scheduler().sync_wait(download<float>(s, want));
  EXPECT_EQ(g, w);
  EXPECT_NE(w, values);  // bf16 rounded them: the cast ran
}

}  // namespace
}  // namespace coshard::fsdp::detail
