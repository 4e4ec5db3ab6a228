// The NCCL backend on one GPU (a world of one rank): collectives on device memory against values
// computed on the host. Skips, naming the reason, where there is no device.
#include <gtest/gtest.h>

#include <vector>

#include "coshard/runtime/cuda.hpp"
#include "coshard/runtime/runtime.hpp"
#include "coshard/transport/nccl_communicator.hpp"

#ifdef COSHARD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

using namespace coshard;
using namespace coshard::transport;

namespace {

TEST(Nccl, WithoutCudaTheFactorySaysHowToGetIt) {
  if (nccl_available()) GTEST_SKIP() << "this build has NCCL";
  Runtime rt({.name = "nccl"});
  try {
    CommOptions o;
    rt.scheduler().sync_wait(create_nccl_communicator(rt, nullptr, 0, 1, o));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::bad_config);
    EXPECT_NE(e.message().find("COSHARD_CUDA=ON"), std::string::npos) << e.what();
  }
}

#ifdef COSHARD_HAVE_CUDA
TEST(Nccl, OneRankCollectivesOnTheDevice) {
  if (auto p = cuda::probe(); p.devices == 0) GTEST_SKIP() << "no CUDA device: " << p.reason;
  Runtime rt({.name = "nccl", .device = Device::cuda(0)});
  CommOptions o;
  o.name = "gpu-world";
  auto comm = rt.scheduler().sync_wait(create_nccl_communicator(rt, nullptr, 0, 1, o));
  std::vector<float> host(1024);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i);
  Tensor buf = Tensor::empty(rt.allocator(), DType::f32, {1024});
  ASSERT_EQ(cudaMemcpy(buf.data(), host.data(), 4096, cudaMemcpyHostToDevice), cudaSuccess);
  rt.scheduler().sync_wait([](Runtime& r, Communicator& c, Tensor t) -> Task<void> {
    co_await c.all_reduce(t, Reduction::premul_sum(2.0), r.stream("compute"));
    co_await c.barrier(r.stream("compute"));
  }(rt, *comm, buf));
  std::vector<float> back(1024);
  ASSERT_EQ(cudaMemcpy(back.data(), buf.data(), 4096, cudaMemcpyDeviceToHost), cudaSuccess);
  for (std::size_t i = 0; i < back.size(); ++i) EXPECT_FLOAT_EQ(back[i], 2.0f * static_cast<float>(i));
}
#endif

}  // namespace
