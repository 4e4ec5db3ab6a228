// The loops behind cpu_kernels.hpp. Built once per instruction set with COSHARD_ISA_NS naming the
// namespace and COSHARD_ISA_NAME the table's name (ops/CMakeLists.txt); nothing here may depend on
// anything that differs between the builds except the vector width, and nothing here may have
// external linkage but table() (see vec_math.hpp: no std:: templates, only builtins).
#include "../vec_math.hpp"
#include "cpu_kernels.hpp"

#ifndef COSHARD_ISA_NS
#error "COSHARD_ISA_NS must name the namespace of this build (see ops/CMakeLists.txt)"
#endif

#if defined(__AVX512F__)
#include "tile_gemm_avx512.hpp"
#endif

namespace coshard::ops::detail::COSHARD_ISA_NS {
namespace {

// GELU and its derivative are the shared rules (coshard/kernels/elementwise.hpp): one vectorised
// exp per element instead of a libm tanh call, and the same values as the CUDA kernels.
void gelu_forward(const float* __restrict x, float* __restrict y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = kernels::gelu(x[i]);
}

void gelu_backward(const float* __restrict dy, const float* __restrict x, float* __restrict dx, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dx[i] = dy[i] * kernels::gelu_grad(x[i]);
}

void layernorm_forward(const float* __restrict x, const float* __restrict w, const float* __restrict b,
                       float* __restrict y, float* __restrict mean, float* __restrict rstd, std::size_t rows,
                       std::size_t C, float eps) {
  const float inv_c = 1.0f / static_cast<float>(C);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x + r * C;
    float* __restrict yr = y + r * C;
    // Two passes (mean, then the mean of squared deviations): E[x^2] - E[x]^2 cancels
    // catastrophically for rows with a large mean.
    const float m = lane_sum(C, [&](std::size_t i) { return xr[i]; }) * inv_c;
    const float var = lane_sum(C, [&](std::size_t i) { return (xr[i] - m) * (xr[i] - m); }) * inv_c;
    const float s = 1.0f / __builtin_sqrtf(var + eps);
    for (std::size_t i = 0; i < C; ++i) yr[i] = (xr[i] - m) * s * w[i] + b[i];
    mean[r] = m;
    rstd[r] = s;
  }
}

void layernorm_backward(const float* __restrict dy, const float* __restrict x, const float* __restrict w,
                        const float* __restrict mean, const float* __restrict rstd, float* __restrict dx,
                        std::size_t rows, std::size_t C) {
  const float inv_c = 1.0f / static_cast<float>(C);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x + r * C;
    const float* __restrict g = dy + r * C;
    float* __restrict dxr = dx + r * C;
    const float m = mean[r];
    const float s = rstd[r];
    // With n = (x - m) s and dn = dy w: dx = s (dn - mean(dn) - n mean(dn n)).
    const float mean_dn = lane_sum(C, [&](std::size_t i) { return g[i] * w[i]; }) * inv_c;
    const float mean_dn_n = lane_sum(C, [&](std::size_t i) { return g[i] * w[i] * ((xr[i] - m) * s); }) * inv_c;
    for (std::size_t i = 0; i < C; ++i) dxr[i] = s * (g[i] * w[i] - mean_dn - (xr[i] - m) * s * mean_dn_n);
  }
}

void layernorm_param_grads(const float* __restrict dy, const float* __restrict x, const float* __restrict mean,
                           const float* __restrict rstd, float* __restrict dw, float* __restrict db,
                           std::size_t rows, std::size_t cols, std::size_t ld) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x + r * ld;
    const float* __restrict g = dy + r * ld;
    const float m = mean[r];
    const float s = rstd[r];
    if (dw != nullptr) {
      for (std::size_t i = 0; i < cols; ++i) dw[i] += g[i] * (xr[i] - m) * s;
    }
    if (db != nullptr) {
      for (std::size_t i = 0; i < cols; ++i) db[i] += g[i];
    }
  }
}

void rmsnorm_forward(const float* __restrict x, const float* __restrict w, float* __restrict y, float* __restrict rstd,
                     std::size_t rows, std::size_t C, float eps) {
  const float inv_c = 1.0f / static_cast<float>(C);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x + r * C;
    float* __restrict yr = y + r * C;
    const float ms = lane_sum(C, [&](std::size_t i) { return xr[i] * xr[i]; }) * inv_c;
    const float s = 1.0f / __builtin_sqrtf(ms + eps);
    for (std::size_t i = 0; i < C; ++i) yr[i] = w[i] * (xr[i] * s);  // Hugging Face's order
    rstd[r] = s;
  }
}

void rmsnorm_backward(const float* __restrict dy, const float* __restrict x, const float* __restrict w,
                      const float* __restrict rstd, float* __restrict dx, std::size_t rows, std::size_t C) {
  const float inv_c = 1.0f / static_cast<float>(C);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x + r * C;
    const float* __restrict g = dy + r * C;
    float* __restrict dxr = dx + r * C;
    const float s = rstd[r];
    // With n = x s and dn = dy w: dx = s (dn - n mean(dn n)).
    const float mean_dn_n = lane_sum(C, [&](std::size_t i) { return g[i] * w[i] * (xr[i] * s); }) * inv_c;
    for (std::size_t i = 0; i < C; ++i) dxr[i] = s * (g[i] * w[i] - (xr[i] * s) * mean_dn_n);
  }
}

void rmsnorm_weight_grad(const float* __restrict dy, const float* __restrict x, const float* __restrict rstd,
                         float* __restrict dw, std::size_t rows, std::size_t cols, std::size_t ld) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x + r * ld;
    const float* __restrict g = dy + r * ld;
    const float s = rstd[r];
    for (std::size_t i = 0; i < cols; ++i) dw[i] += g[i] * (xr[i] * s);
  }
}

void swiglu_forward(const float* __restrict gate, const float* __restrict up, float* __restrict y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = kernels::silu(gate[i]) * up[i];
}

void swiglu_backward(const float* __restrict dy, const float* __restrict gate, const float* __restrict up,
                     float* __restrict dgate, float* __restrict dup, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    dgate[i] = dy[i] * up[i] * kernels::silu_grad(gate[i]);
    dup[i] = dy[i] * kernels::silu(gate[i]);
  }
}

void rope_rotate(float* __restrict x, const float* __restrict cos, const float* __restrict sin, std::size_t heads,
                 std::size_t hs, float sign) {
  const std::size_t half = hs / 2;
  for (std::size_t h = 0; h < heads; ++h) {
    float* __restrict a = x + h * hs;
    float* __restrict b = a + half;
    for (std::size_t i = 0; i < half; ++i) {
      const float c = cos[i], s = sign * sin[i];
      const float ai = a[i], bi = b[i];
      a[i] = ai * c - bi * s;
      b[i] = bi * c + ai * s;
    }
  }
}

double cross_entropy_forward(const float* __restrict z, const std::int32_t* targets, float* __restrict lse,
                             std::size_t N, std::size_t V) {
  // The mean of N per-position losses is summed in double: with N in the tens of thousands a
  // float sum would lose the digits the loss curve is read from.
  double total = 0.0;
  for (std::size_t n = 0; n < N; ++n) {
    const float* __restrict zr = z + n * V;
    const float mx = lane_max(zr, V);
    const float l = mx + __builtin_logf(lane_sum(V, [&](std::size_t v) { return exp_approx(zr[v] - mx); }));
    lse[n] = l;
    total += static_cast<double>(l) - static_cast<double>(zr[targets[n]]);
  }
  return total;
}

void cross_entropy_backward(const float* __restrict z, const std::int32_t* targets, const float* __restrict lse,
                            float* __restrict d, std::size_t N, std::size_t V, float scale) {
  for (std::size_t n = 0; n < N; ++n) {
    const float* __restrict zr = z + n * V;
    float* __restrict dr = d + n * V;
    const float l = lse[n];
    for (std::size_t v = 0; v < V; ++v) dr[v] = exp_approx(zr[v] - l) * scale;
    dr[targets[n]] -= scale;
  }
}

void attention_online_softmax(float* __restrict row, std::size_t vis, std::size_t bc, float* m, float* l,
                              float* __restrict acc, std::size_t hs) {
  const float mx = max_of(*m, lane_max(row, vis));
  const float corr = exp_approx(*m - mx);  // 0 on the first tile (m = -inf)
  for (std::size_t j = 0; j < vis; ++j) row[j] = exp_approx(row[j] - mx);
  for (std::size_t j = vis; j < bc; ++j) row[j] = 0.0f;
  *l = *l * corr + lane_sum(vis, [&](std::size_t j) { return row[j]; });
  *m = mx;
  for (std::size_t i = 0; i < hs; ++i) acc[i] *= corr;
}

void attention_probabilities(float* __restrict row, std::size_t vis, std::size_t bc, float lse) {
  for (std::size_t j = 0; j < vis; ++j) row[j] = exp_approx(row[j] - lse);
  for (std::size_t j = vis; j < bc; ++j) row[j] = 0.0f;
}

void attention_score_grad(const float* __restrict p, float* __restrict dp, std::size_t bc, float delta, float scale) {
  for (std::size_t j = 0; j < bc; ++j) dp[j] = p[j] * (dp[j] - delta) * scale;
}

void adamw(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v, std::size_t n,
           const AdamWScalars& s) {
  for (std::size_t i = 0; i < n; ++i) kernels::adamw_update(p[i], g[i], m[i], v[i], s);
}

}  // namespace

const CpuKernels& table() {
  static constexpr CpuKernels k{COSHARD_ISA_NAME,       gelu_forward,          gelu_backward,
                                layernorm_forward,      layernorm_backward,    layernorm_param_grads,
                                rmsnorm_forward,        rmsnorm_backward,      rmsnorm_weight_grad,
                                swiglu_forward,         swiglu_backward,       rope_rotate,
                                cross_entropy_forward,
                                cross_entropy_backward, attention_online_softmax, attention_probabilities,
                                attention_score_grad,
#if defined(__AVX512F__)
                                tile_gemm,
#else
                                nullptr,
#endif
                                adamw};
  return k;
}

}  // namespace coshard::ops::detail::COSHARD_ISA_NS
