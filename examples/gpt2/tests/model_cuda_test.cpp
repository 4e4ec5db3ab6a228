// GPT-2's pieces (gpt2::Activations) on a CUDA stream, with the parameters, the activations and the
// gradients in GPU memory, against the same model in one process on the CPU (gpt2::Gpt2): the loss
// and every parameter's gradient of one forward and backward, tied and untied head. Label gpu:
// skipped, naming the reason, where no CUDA device is usable. Bound 1e-4 relative (norm-wise): the
// CUDA ops are within 1e-5 of the CPU ops each (tests/ops/cuda_ops_test.cpp), and a model chains
// some forty of them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "coshard/gpt2/model.hpp"
#include "coshard/ops/kernels.hpp"
#include "coshard/runtime/copy.hpp"
#include "coshard/runtime/cuda.hpp"
#include "coshard/runtime/runtime.hpp"

namespace {

using namespace coshard;
using namespace coshard::gpt2;

std::vector<std::int32_t> ids(std::size_t n, std::int64_t vocab, std::uint64_t seed) {
  std::vector<std::int32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::int32_t>(splitmix64(seed + i) % static_cast<std::uint64_t>(vocab));
  return v;
}

double rel_error(const std::vector<float>& got, std::span<const float> want) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

void expect_cuda_matches_cpu(const Config& c) {
  constexpr std::size_t B = 2, T = 16;
  const auto tokens = ids(B * T, c.vocab, 1), targets = ids(B * T, c.vocab, 2);
  Gpt2 ref(c, 7);
  const float want_loss = ref.forward_backward(tokens, targets, B, T);

  Runtime rt({.device = Device::cuda(0)});
  Stream& s = rt.stream("compute");
  const ParamStore& host = ref.params();
  std::vector<Tensor> params, grads;
  for (std::size_t i = 0; i < host.size(); ++i) {
    const Shape shape = host.infos()[i].shape;
    params.push_back(Tensor::empty(rt.allocator(), DType::f32, shape));
    grads.push_back(Tensor::empty(rt.allocator(), DType::f32, shape));
    const auto v = host.at(i);
    upload(s, params.back(), std::vector<float>(v.begin(), v.end()));
    fill_zero(s, grads.back());
  }
  ops::Launcher launch(s);
  Activations acts(c, rt.allocator());
  const std::size_t L = static_cast<std::size_t>(c.layers), h = Gpt2::block_offset(L), head = c.tie_head ? 0 : h + 2;
  auto block = [&](const std::vector<Tensor>& from, std::size_t l) {
    BlockWeights w;
    std::copy_n(from.begin() + static_cast<std::ptrdiff_t>(Gpt2::block_offset(l)), block_param_count, w.begin());
    return w;
  };
  {
    ops::Kernels k = launch.begin("forward and backward");
    acts.set_batch(k, tokens, targets, B, T);
    acts.embedding_forward(k, params[0], params[1]);
    for (std::size_t l = 0; l < L; ++l) acts.block_forward(k, l, block(params, l));
    acts.head_forward(k, params[h], params[h + 1], params[head]);
    acts.head_backward(k, params[h], params[head], grads[h], grads[h + 1], grads[head], 1.0f);
    for (std::size_t l = L; l-- > 0;) acts.block_backward(k, l, block(params, l), block(grads, l));
    acts.embedding_backward(k, grads[0], grads[1]);
  }
  const auto loss = rt.scheduler().sync_wait(download<float>(s, acts.loss()));
  ASSERT_EQ(loss.size(), 1u);
  EXPECT_NEAR(loss[0], want_loss, 1e-5 * want_loss);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const auto got = rt.scheduler().sync_wait(download<float>(s, grads[i]));
    EXPECT_LT(rel_error(got, ref.grads().at(i)), 1e-4) << host.infos()[i].name;
  }
}

#define REQUIRE_GPU()                                                \
  if (auto probe_ = ::coshard::cuda::probe(); probe_.devices == 0) { \
    GTEST_SKIP() << "no CUDA device: " << probe_.reason;             \
  }

TEST(Gpt2Cuda, TiedHeadMatchesTheCpuModel) {
  REQUIRE_GPU();
  expect_cuda_matches_cpu(named_config("tiny"));
}

TEST(Gpt2Cuda, UntiedHeadMatchesTheCpuModel) {
  REQUIRE_GPU();
  Config c = named_config("tiny");
  c.tie_head = false;
  expect_cuda_matches_cpu(c);
}

}  // namespace
