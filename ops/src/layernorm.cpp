#include "coshard/ops/layernorm.hpp"

#include <cmath>
#include <string>

#include "check.hpp"

namespace coshard::ops {

void layernorm_forward(std::span<const float> x, std::span<const float> weight, std::span<const float> bias,
                       std::span<float> y, std::span<float> mean, std::span<float> rstd, std::size_t rows,
                       std::size_t C, float eps) {
  constexpr const char* op = "layernorm_forward";
  detail::check_positive(op, "C", C);
  const std::string rc = "[rows, C] = " + detail::dims({rows, C});
  detail::check_size(op, "x", x, rows * C, rc);
  detail::check_size(op, "weight", weight, C, "[C] = " + detail::dims({C}));
  detail::check_size(op, "bias", bias, C, "[C] = " + detail::dims({C}));
  detail::check_size(op, "y", y, rows * C, rc);
  detail::check_size(op, "mean", mean, rows, "[rows] = " + detail::dims({rows}));
  detail::check_size(op, "rstd", rstd, rows, "[rows] = " + detail::dims({rows}));
  detail::check_disjoint(op, "y", y, "x", x);

  const float inv_c = 1.0f / static_cast<float>(C);
  const float* __restrict w = weight.data();
  const float* __restrict bb = bias.data();
  for (std::size_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x.data() + r * C;
    float* __restrict yr = y.data() + r * C;
    // Two passes (mean, then the mean of squared deviations): E[x^2] - E[x]^2 cancels
    // catastrophically for rows with a large mean.
    float m = 0.0f;
    for (std::size_t i = 0; i < C; ++i) m += xr[i];
    m *= inv_c;
    float var = 0.0f;
    for (std::size_t i = 0; i < C; ++i) {
      const float dlt = xr[i] - m;
      var += dlt * dlt;
    }
    var *= inv_c;
    const float s = 1.0f / std::sqrt(var + eps);
    for (std::size_t i = 0; i < C; ++i) yr[i] = (xr[i] - m) * s * w[i] + bb[i];
    mean[r] = m;
    rstd[r] = s;
  }
}

void layernorm_backward(std::span<const float> dy, std::span<const float> x, std::span<const float> weight,
                        std::span<const float> mean, std::span<const float> rstd, std::span<float> dx,
                        std::span<float> dweight, std::span<float> dbias, std::size_t rows, std::size_t C) {
  constexpr const char* op = "layernorm_backward";
  detail::check_positive(op, "C", C);
  const std::string rc = "[rows, C] = " + detail::dims({rows, C});
  detail::check_size(op, "dy", dy, rows * C, rc);
  detail::check_size(op, "x", x, rows * C, rc);
  detail::check_size(op, "weight", weight, C, "[C] = " + detail::dims({C}));
  detail::check_size(op, "mean", mean, rows, "[rows] = " + detail::dims({rows}));
  detail::check_size(op, "rstd", rstd, rows, "[rows] = " + detail::dims({rows}));
  detail::check_size(op, "dx", dx, rows * C, rc);
  detail::check_optional_size(op, "dweight", dweight, C, "[C] = " + detail::dims({C}));
  detail::check_optional_size(op, "dbias", dbias, C, "[C] = " + detail::dims({C}));
  detail::check_disjoint(op, "dx", dx, "dy", dy);
  detail::check_disjoint(op, "dx", dx, "x", x);
  detail::check_disjoint(op, "dweight", dweight, "dy", dy);
  detail::check_disjoint(op, "dbias", dbias, "dy", dy);

  const float inv_c = 1.0f / static_cast<float>(C);
  const float* __restrict w = weight.data();
  for (std::size_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x.data() + r * C;
    const float* __restrict g = dy.data() + r * C;
    float* __restrict dxr = dx.data() + r * C;
    const float m = mean[r];
    const float s = rstd[r];
    // With n = (x - m) s and dn = dy w: dx = s (dn - mean(dn) - n mean(dn n)).
    float sum_dn = 0.0f;
    float sum_dn_n = 0.0f;
    for (std::size_t i = 0; i < C; ++i) {
      const float n = (xr[i] - m) * s;
      const float dn = g[i] * w[i];
      sum_dn += dn;
      sum_dn_n += dn * n;
    }
    const float mean_dn = sum_dn * inv_c;
    const float mean_dn_n = sum_dn_n * inv_c;
    for (std::size_t i = 0; i < C; ++i) {
      const float n = (xr[i] - m) * s;
      dxr[i] = s * (g[i] * w[i] - mean_dn - n * mean_dn_n);
    }
    if (!dweight.empty()) {
      float* __restrict dw = dweight.data();
      for (std::size_t i = 0; i < C; ++i) dw[i] += g[i] * (xr[i] - m) * s;
    }
    if (!dbias.empty()) {
      float* __restrict db = dbias.data();
      for (std::size_t i = 0; i < C; ++i) db[i] += g[i];
    }
  }
}

}  // namespace coshard::ops
