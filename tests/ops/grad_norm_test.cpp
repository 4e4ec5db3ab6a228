#include "coshard/ops/grad_norm.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ops/gradcheck.hpp"

using namespace coshard::ops;
using namespace coshard::testing;

namespace {

// Bound: 1e-12 relative (the sums are taken in double over float inputs; only summation order differs).
constexpr double kTol = 1e-12;

struct Buffers {
  std::vector<float> a = random_floats(7, 1, -3.0f, 3.0f);
  std::vector<float> empty;
  std::vector<float> b = random_floats(1013, 2);
  std::vector<std::span<const float>> spans() const { return {a, empty, b}; }
};

double ref_norm(const Buffers& bufs, NormType type) {
  double acc = 0.0;
  for (const auto& v : {bufs.a, bufs.empty, bufs.b}) {
    for (float x : v) {
      const double d = std::fabs(static_cast<double>(x));
      if (type == NormType::l2) acc += d * d;
      if (type == NormType::l1) acc += d;
      if (type == NormType::inf) acc = std::max(acc, d);
    }
  }
  return type == NormType::l2 ? std::sqrt(acc) : acc;
}

TEST(OpsGradNorm, MatchesDoubleForEachNorm) {
  Buffers bufs;
  bufs.b[500] = -4.5f;  // the inf norm's element, negative
  const auto spans = bufs.spans();
  for (auto type : {NormType::l2, NormType::l1, NormType::inf}) {
    const double ref = ref_norm(bufs, type);
    EXPECT_NEAR(grad_norm(spans, type), ref, kTol * ref) << static_cast<int>(type);
  }
  EXPECT_EQ(grad_norm(spans, NormType::inf), 4.5);
}

TEST(OpsGradNorm, PartialsReduceAcrossShards) {
  // Two "ranks" each hold some buffers; sum (l2, l1) or max (inf) of partials, then finish.
  Buffers bufs;
  const std::vector<std::span<const float>> rank0{bufs.a}, rank1{bufs.empty, bufs.b};
  for (auto type : {NormType::l2, NormType::l1, NormType::inf}) {
    const double p0 = norm_partial(rank0, type), p1 = norm_partial(rank1, type);
    const double reduced = type == NormType::inf ? std::max(p0, p1) : p0 + p1;
    const double ref = ref_norm(bufs, type);
    EXPECT_NEAR(norm_finish(reduced, type), ref, kTol * ref);
  }
}

TEST(OpsGradNorm, NanAndInfPropagate) {
  Buffers bufs;
  bufs.b[3] = std::numeric_limits<float>::quiet_NaN();
  for (auto type : {NormType::l2, NormType::l1, NormType::inf}) EXPECT_TRUE(std::isnan(grad_norm(bufs.spans(), type)));
  Buffers inf_bufs;
  inf_bufs.a[0] = -INFINITY;
  for (auto type : {NormType::l2, NormType::l1, NormType::inf}) EXPECT_EQ(grad_norm(inf_bufs.spans(), type), INFINITY);
}

TEST(OpsGradNorm, EmptySetIsZero) {
  EXPECT_EQ(grad_norm({}, NormType::l2), 0.0);
  EXPECT_EQ(grad_norm({}, NormType::inf), 0.0);
}

TEST(OpsGradNorm, ClipCoefficientAndScale) {
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_NEAR(clip_coefficient(4.0, 1.0), 1.0 / (4.0 + 1e-6), 1e-15);
  auto v = random_floats(33, 3);
  const auto v0 = v;
  scale_inplace(v, 0.25f);
  for (std::size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], v0[i] * 0.25f);
}

}  // namespace
