#pragma once
// Element-wise rules shared by the CPU kernels (ops/src/isa, ops/src/optim.cpp) and the CUDA
// kernels (ops/src/cuda): the fast exp behind softmax, GELU and SiLU, GELU and SiLU and their
// derivatives, and one element of the AdamW and SGD updates. Each rule is written once, so both paths compute the same
// thing; tests/kernels/elementwise_test.cpp checks them on the CPU against float64.
//
// Internal linkage and builtins only (no std:: templates): the CPU kernels are compiled once per
// instruction set, and an inline function with external linkage would be emitted as a weak symbol
// in each, the linker keeping one copy, maybe an AVX-512 one, for every caller
// (ops/src/vec_math.hpp, tests/ops/isa_objects.cmake). Every select is a blend, so CPU loops of
// these vectorise.
#include <cstdint>

#include "coshard/kernels/host_device.hpp"

namespace coshard::kernels {

/// The per-call scalars of AdamW, computed in double as torch does and applied in float.
struct AdamWScalars {
  float decay;      ///< 1 - lr * weight_decay
  float w1;         ///< 1 - beta1 (torch's lerp weight)
  float b2;         ///< beta2
  float w2;         ///< 1 - beta2
  float step_size;  ///< lr / (1 - beta1^step)
  float bc2_sqrt;   ///< sqrt(1 - beta2^step)
  float eps;        ///< added to the denominator
};

/// The per-call scalars of SGD.
struct SGDScalars {
  float wd;      ///< weight decay
  float mu;      ///< momentum
  float damp;    ///< 1 - dampening
  float neg_lr;  ///< -lr
  bool first_step;  ///< the momentum buffer starts as the first update
  bool nesterov;    ///< Nesterov momentum
};

namespace {  // NOLINT(cert-dcl59-cpp,google-build-namespaces): per-TU copies on purpose (see above)

constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

/// The float with bit pattern `u`, without std::bit_cast (a std:: template, see above).
COSHARD_HD inline float float_of_bits(std::uint32_t u) noexcept {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return __builtin_bit_cast(float, u);
#endif
}

COSHARD_HD inline float sqrt_of(float x) noexcept {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return __builtin_sqrtf(x);
#endif
}

/// e^x to about 2 ulp for x in [-87, 88] (Cody-Waite range reduction, then Cephes' degree-6
/// polynomial for e^r on |r| <= ln2/2, scaled by 2^n through the exponent bits). Below -87 it
/// returns 0 (the true value is under 1.7e-38), above 88 infinity, and NaN for NaN.
COSHARD_HD inline float exp_approx(float x) noexcept {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;     // ln 2 in its first 9 bits: n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;  // ln 2 - kLn2Hi
  constexpr float kRound = 12582912.0f;      // 1.5 * 2^23: adding and subtracting it rounds
  float xc = x > -87.0f ? x : -87.0f;        // NaN goes to -87 here and is restored below
  xc = xc < 88.0f ? xc : 88.0f;
  const float n = (xc * kLog2e + kRound) - kRound;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const auto biased = static_cast<std::uint32_t>(static_cast<std::int32_t>(n) + 127);
  float y = p * float_of_bits(biased << 23);
  y = x < -87.0f ? 0.0f : y;
  y = x > 88.0f ? float_of_bits(0x7f800000u) : y;
  return x == x ? y : x;
}

/// 1 / (1 + e^-x), saturating to exactly 0 and 1.
COSHARD_HD inline float sigmoid_approx(float x) noexcept { return 1.0f / (1.0f + exp_approx(-x)); }

/// GELU, tanh form (GPT-2's), through 0.5 (1 + tanh(u)) = sigmoid(2u): x sigmoid(2u), with
/// u = sqrt(2/pi) (x + 0.044715 x^3). One exp instead of a tanh.
COSHARD_HD inline float gelu(float x) noexcept {
  const float u = kGeluSqrt2OverPi * (x + kGeluCoeff * x * x * x);
  return x * sigmoid_approx(2.0f * u);
}

/// d gelu(x) / dx = s + 2 x s (1 - s) u', with s = sigmoid(2u) (1 - tanh(u)^2 = 4 s (1 - s)).
COSHARD_HD inline float gelu_grad(float x) noexcept {
  const float u = kGeluSqrt2OverPi * (x + kGeluCoeff * x * x * x);
  const float s = sigmoid_approx(2.0f * u);
  const float du = kGeluSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x * x);
  return s + 2.0f * x * s * (1.0f - s) * du;
}

/// SiLU (torch.nn.functional.silu, Llama's MLP activation): x sigmoid(x).
COSHARD_HD inline float silu(float x) noexcept { return x * sigmoid_approx(x); }

/// d silu(x) / dx = s (1 + x (1 - s)), with s = sigmoid(x).
COSHARD_HD inline float silu_grad(float x) noexcept {
  const float s = sigmoid_approx(x);
  return s * (1.0f + x * (1.0f - s));
}

/// One element of torch's single-tensor AdamW: decoupled decay, moments, then the step.
COSHARD_HD inline void adamw_update(float& p, float g, float& m, float& v, const AdamWScalars& k) noexcept {
  p *= k.decay;
  m += k.w1 * (g - m);  // torch's lerp with weight < 0.5
  v = v * k.b2 + k.w2 * g * g;
  const float denom = sqrt_of(v) / k.bc2_sqrt + k.eps;
  p += -k.step_size * (m / denom);
}

/// One element of torch's SGD; `buf` is null without momentum.
COSHARD_HD inline void sgd_update(float& p, float g, float* buf, const SGDScalars& k) noexcept {
  const float d = g + k.wd * p;
  if (buf == nullptr) {
    p += k.neg_lr * d;
    return;
  }
  *buf = k.first_step ? d : *buf * k.mu + k.damp * d;
  p += k.neg_lr * (k.nesterov ? d + k.mu * *buf : *buf);
}

}  // namespace
}  // namespace coshard::kernels
