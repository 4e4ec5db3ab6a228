#include "coshard/ops/grad_norm.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "check.hpp"

namespace coshard::ops {

double norm_partial(std::span<const std::span<const float>> buffers, NormType type) {
  double acc = 0.0;
  for (auto buf : buffers) {
    const float* __restrict p = buf.data();
    const std::size_t n = buf.size();
    switch (type) {
      case NormType::l2: {
        double s = 0.0;
        for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(p[i]) * static_cast<double>(p[i]);
        acc += s;
        break;
      }
      case NormType::l1: {
        double s = 0.0;
        for (std::size_t i = 0; i < n; ++i) s += std::fabs(static_cast<double>(p[i]));
        acc += s;
        break;
      }
      case NormType::inf: {
        // max is taken in float (exact) and NaN tracked apart: std::max drops a NaN operand,
        // while torch's norm returns NaN when any element is NaN.
        float m = 0.0f;
        bool nan = false;
        for (std::size_t i = 0; i < n; ++i) {
          const float a = std::fabs(p[i]);
          nan |= a != a;
          m = a > m ? a : m;
        }
        if (nan) return std::numeric_limits<double>::quiet_NaN();
        acc = std::max(acc, static_cast<double>(m));
        break;
      }
    }
  }
  return acc;
}

double norm_finish(double reduced, NormType type) { return type == NormType::l2 ? std::sqrt(reduced) : reduced; }

double grad_norm(std::span<const std::span<const float>> buffers, NormType type) {
  return norm_finish(norm_partial(buffers, type), type);
}

double clip_coefficient(double total_norm, double max_norm) {
  return std::min(1.0, max_norm / (total_norm + 1e-6));
}

void scale_inplace(std::span<float> buffer, float s) {
  float* __restrict p = buffer.data();
  for (std::size_t i = 0; i < buffer.size(); ++i) p[i] *= s;
}

}  // namespace coshard::ops
