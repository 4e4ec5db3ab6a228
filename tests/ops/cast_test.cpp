#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "coshard/ops/cast.hpp"

using namespace coshard::ops;

namespace {

// Independent reference for the value of an fp16 bit pattern, computed in double.
double f16_reference(std::uint16_t h) {
  int sign = (h & 0x8000) ? -1 : 1;
  int exp = (h >> 10) & 0x1f;
  int mant = h & 0x3ff;
  if (exp == 0x1f) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

TEST(Cast, EveryF16PatternDecodesAndRoundTrips) {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    auto v = static_cast<std::uint16_t>(h);
    double ref = f16_reference(v);
    float got = f16_to_f32(v);
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
      ASSERT_TRUE(std::isnan(f16_to_f32(f32_to_f16(got))));
      ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0);
      continue;
    }
    ASSERT_EQ(static_cast<double>(got), ref) << std::hex << h;
    ASSERT_EQ(f32_to_f16(got), v) << std::hex << h;
  }
}

TEST(Cast, EveryBf16PatternRoundTrips) {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    auto v = static_cast<std::uint16_t>(h);
    float f = bf16_to_f32(v);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(f), h << 16);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
    } else {
      ASSERT_EQ(f32_to_bf16(f), v) << std::hex << h;
    }
  }
}

// For every pair of neighbouring finite values of a 16-bit format: the midpoint rounds to the one
// with an even pattern, and just either side of it rounds to the nearer one.
template <class Decode, class Encode>
void check_rounding(Decode decode, Encode encode, std::uint16_t max_finite) {
  for (std::uint16_t sign : {std::uint16_t{0}, std::uint16_t{0x8000}}) {
    for (std::uint32_t h = 0; h < max_finite; ++h) {
      auto lo = static_cast<std::uint16_t>(h | sign), hi = static_cast<std::uint16_t>((h + 1) | sign);
      double a = decode(lo), b = decode(hi);
      float mid = static_cast<float>((a + b) / 2);
      ASSERT_EQ(static_cast<double>(mid), (a + b) / 2);  // exactly representable in fp32
      ASSERT_EQ(encode(mid), (h & 1) ? hi : lo) << std::hex << h;
      ASSERT_EQ(encode(std::nextafter(mid, static_cast<float>(a))), lo) << std::hex << h;
      ASSERT_EQ(encode(std::nextafter(mid, static_cast<float>(b))), hi) << std::hex << h;
    }
  }
}

TEST(Cast, F16RoundsToNearestEven) {
  check_rounding([](std::uint16_t h) { return f16_reference(h); }, f32_to_f16, 0x7bff);
}

TEST(Cast, Bf16RoundsToNearestEven) {
  check_rounding([](std::uint16_t h) { return static_cast<double>(bf16_to_f32(h)); }, f32_to_bf16, 0x7f7f);
}

TEST(Cast, OverflowUnderflowInfAndNan) {
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // the tie above the largest finite goes to Inf
  EXPECT_EQ(f32_to_f16(-1e10f), 0xfc00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie with zero: even
  EXPECT_EQ(f32_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up past the largest bf16
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xff80);
  float nan = std::bit_cast<float>(0x7f800001u);  // signalling NaN whose payload would truncate to Inf
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(nan))));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(nan))));
}

TEST(Cast, BufferCastsCheckSizes) {
  std::vector<float> in{1.0f, -2.5f, 3.0e-8f};
  std::vector<std::uint16_t> half(3);
  std::vector<float> back(3);
  cast_f32_to_f16(in, half);
  cast_f16_to_f32(half, back);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -2.5f);
  std::vector<std::uint16_t> wrong(2);
  EXPECT_THROW(cast_f32_to_bf16(in, wrong), std::exception);
}

}  // namespace
