// GPT-2's pieces (gpt2::Activations) on a CUDA stream, with the parameters, the activations and the
// gradients in GPU memory, against the same pieces run at once on the CPU (ops::Launcher()): the
// loss and every parameter's gradient of one forward and backward, tied and untied head, with f32
// parameters and with bf16 ones (Compute::bf16: the bf16 GEMMs and embedding). Label gpu: skipped,
// naming the reason, where no CUDA device is usable. Bound 1e-4 relative (norm-wise): the CUDA
// ops are within 1e-5 of the CPU ops each (tests/ops/cuda_ops_test.cpp), and a model chains some
// forty of them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include "coshard/gpt2/model.hpp"
#include "coshard/ops/cast.hpp"
#include "coshard/ops/kernels.hpp"
#include "coshard/runtime/copy.hpp"
#include "coshard/runtime/cuda.hpp"
#include "coshard/runtime/runtime.hpp"

namespace {

using namespace coshard;
using namespace coshard::gpt2;

constexpr std::size_t B = 2, T = 16;

std::vector<std::int32_t> ids(std::size_t n, std::int64_t vocab, std::uint64_t seed) {
  std::vector<std::int32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::int32_t>(splitmix64(seed + i) % static_cast<std::uint64_t>(vocab));
  return v;
}

// Where the pieces run: a CUDA runtime's stream, or this thread on host memory.
struct Place {
  Runtime* rt = nullptr;  // null: the host
  Allocator& alloc;
  ops::Launcher launch;
};

// `bytes` into `t`: a stream-ordered copy on CUDA, a plain one on the host.
void put(Place& p, const Tensor& t, std::shared_ptr<std::vector<std::byte>> bytes) {
  if (!p.rt) return static_cast<void>(std::memcpy(t.data(), bytes->data(), bytes->size()));
  copy_to_device(*p.launch.stream(), t, bytes->data(), bytes->size(), bytes, "upload");
}

std::vector<float> get(Place& p, const Tensor& t) {
  if (!p.rt) return {t.data_as<float>(), t.data_as<float>() + t.numel()};
  return p.rt->scheduler().sync_wait(download<float>(*p.launch.stream(), t));
}

struct Result {
  float loss = 0;
  std::vector<std::vector<float>> grads;
};

// One forward and backward of the model with seed 7's parameters in `dtype` (f32, or bf16-rounded).
Result forward_backward(const Config& c, DType dtype, Place& p) {
  const ParamStore init = [&] {
    ParamStore s(all_params(c));
    s.initialize(7);
    return s;
  }();
  std::vector<Tensor> params, grads;
  for (std::size_t i = 0; i < init.size(); ++i) {
    const Shape shape = init.infos()[i].shape;
    const auto v = init.at(i);
    auto bytes = std::make_shared<std::vector<std::byte>>(v.size() * size_of(dtype));
    if (dtype == DType::bf16) {
      ops::cast_f32_to_bf16(v, {reinterpret_cast<std::uint16_t*>(bytes->data()), v.size()});
    } else {
      std::memcpy(bytes->data(), v.data(), bytes->size());
    }
    params.push_back(Tensor::empty(p.alloc, dtype, shape));
    grads.push_back(Tensor::empty(p.alloc, DType::f32, shape));
    put(p, params.back(), bytes);
    put(p, grads.back(), std::make_shared<std::vector<std::byte>>(v.size() * sizeof(float)));
  }
  Activations acts(c, p.alloc);
  const std::size_t L = static_cast<std::size_t>(c.layers), h = Gpt2::block_offset(L), head = c.tie_head ? 0 : h + 2;
  auto block = [&](const std::vector<Tensor>& from, std::size_t l) {
    BlockWeights w;
    std::copy_n(from.begin() + static_cast<std::ptrdiff_t>(Gpt2::block_offset(l)), block_param_count, w.begin());
    return w;
  };
  {
    ops::Kernels k = p.launch.begin("forward and backward");
    acts.set_batch(k, ids(B * T, c.vocab, 1), ids(B * T, c.vocab, 2), B, T);
    acts.embedding_forward(k, params[0], params[1]);
    for (std::size_t l = 0; l < L; ++l) acts.block_forward(k, l, block(params, l));
    acts.head_forward(k, params[h], params[h + 1], params[head]);
    acts.head_backward(k, params[h], params[head], grads[h], grads[h + 1], grads[head], 1.0f);
    for (std::size_t l = L; l-- > 0;) acts.block_backward(k, l, block(params, l), block(grads, l));
    acts.embedding_backward(k, grads[0], grads[1]);
  }
  Result r;
  r.loss = get(p, acts.loss()).at(0);
  for (const Tensor& g : grads) r.grads.push_back(get(p, g));
  return r;
}

double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

void expect_cuda_matches_cpu(const Config& c, DType dtype) {
  Allocator host(cpu_memory());
  Place cpu{nullptr, host, ops::Launcher()};
  const Result want = forward_backward(c, dtype, cpu);

  Runtime rt({.device = Device::cuda(0)});
  Place gpu{&rt, rt.allocator(), ops::Launcher(rt.stream("compute"))};
  const Result got = forward_backward(c, dtype, gpu);
  EXPECT_NEAR(got.loss, want.loss, 1e-5 * want.loss);
  const auto infos = all_params(c);
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (std::size_t i = 0; i < want.grads.size(); ++i) {
    EXPECT_LT(rel_error(got.grads[i], want.grads[i]), 1e-4) << infos[i].name;
  }
}

#define REQUIRE_GPU()                                                \
  if (auto probe_ = ::coshard::cuda::probe(); probe_.devices == 0) { \
    GTEST_SKIP() << "no CUDA device: " << probe_.reason;             \
  }

Config untied() {
  Config c = named_config("tiny");
  c.tie_head = false;
  return c;
}

TEST(Gpt2Cuda, TiedHeadMatchesTheCpuModel) {
  REQUIRE_GPU();
  expect_cuda_matches_cpu(named_config("tiny"), DType::f32);
}

TEST(Gpt2Cuda, UntiedHeadMatchesTheCpuModel) {
  REQUIRE_GPU();
  expect_cuda_matches_cpu(untied(), DType::f32);
}

TEST(Gpt2Cuda, Bf16ParametersMatchTheCpuBf16Compute) {
  REQUIRE_GPU();
  expect_cuda_matches_cpu(named_config("tiny"), DType::bf16);
  expect_cuda_matches_cpu(untied(), DType::bf16);
}

}  // namespace
