#pragma once
// Optimizers on flat fp32 buffers, matching torch.optim.AdamW and torch.optim.SGD
// (single-tensor path, maximize=False). The caller owns the state. A flat buffer mixes parameters
// that take weight decay (matrices) with ones that do not (biases, layernorm): the low-level step
// works on one range with that range's weight_decay; the *_step overloads with ParamRange lists do
// the slicing, and update only the listed ranges (so FSDP padding is never touched).
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace coshard::ops {

/// A slice of the flat parameter buffer that adamw_step / sgd_step update, with or without decay.
struct ParamRange {
  std::size_t offset = 0;    ///< first element of the range in the flat buffer
  std::size_t size = 0;      ///< elements in the range
  bool weight_decay = true;  ///< false: this range is updated with weight_decay = 0
};

/// AdamW's hyperparameters; the defaults are torch.optim.AdamW's.
struct AdamWOptions {
  double lr = 1e-3;            ///< learning rate
  double beta1 = 0.9;          ///< decay of the running mean of the gradient (exp_avg)
  double beta2 = 0.999;        ///< decay of the running mean of its square (exp_avg_sq)
  double eps = 1e-8;           ///< added to the denominator, for stability
  double weight_decay = 1e-2;  ///< decoupled: p *= 1 - lr * weight_decay before the step
};

/// AdamW's state for one flat buffer, owned by the caller.
struct AdamWState {
  std::vector<float> exp_avg;     ///< zeros, size of the parameter buffer
  std::vector<float> exp_avg_sq;  ///< zeros, size of the parameter buffer
  std::int64_t step = 0;          ///< steps taken so far
  /// Zeroed state for a buffer of `n` elements, before the first step.
  explicit AdamWState(std::size_t n) : exp_avg(n, 0.0f), exp_avg_sq(n, 0.0f) {}
};

/// One AdamW update of one range at step `step` (1 for the first update), with this call's
/// weight_decay: p *= 1 - lr*wd; m = lerp(m, g, 1-b1); v = b2 v + (1-b2) g^2;
/// p -= lr/(1-b1^step) * m / (sqrt(v)/sqrt(1-b2^step) + eps).
void adamw_update(std::span<float> param, std::span<const float> grad, std::span<float> exp_avg,
                  std::span<float> exp_avg_sq, std::int64_t step, double lr, double beta1, double beta2, double eps,
                  double weight_decay);

/// Increments state.step once, then updates each range (all of param, with decay, if ranges is empty).
void adamw_step(std::span<float> param, std::span<const float> grad, AdamWState& state, const AdamWOptions& opt,
                std::span<const ParamRange> ranges = {});

/// SGD's hyperparameters; the defaults are torch.optim.SGD's.
struct SGDOptions {
  double lr = 1e-3;           ///< learning rate
  double momentum = 0.0;      ///< 0: plain SGD, no momentum buffer
  double dampening = 0.0;     ///< the gradient enters the momentum buffer scaled by 1 - dampening
  double weight_decay = 0.0;  ///< L2 penalty: weight_decay * p is added to the gradient
  bool nesterov = false;  ///< needs momentum > 0 and dampening == 0, as in torch
};

/// SGD's state for one flat buffer, owned by the caller.
struct SGDState {
  std::vector<float> momentum_buffer;  ///< used only when momentum != 0
  bool has_buffer = false;             ///< false until the first step: then buffer = d_p, as torch
  /// State for a buffer of `n` elements, before the first step.
  explicit SGDState(std::size_t n) : momentum_buffer(n, 0.0f) {}
};

/// One SGD update of one range. d_p = g + wd p; with momentum: buf = d_p on the first step,
/// else buf = momentum buf + (1 - dampening) d_p; d_p = nesterov ? d_p + momentum buf : buf;
/// p -= lr d_p. momentum_buffer may be empty when momentum == 0.
void sgd_update(std::span<float> param, std::span<const float> grad, std::span<float> momentum_buffer,
                bool first_step, double lr, double momentum, double dampening, double weight_decay, bool nesterov);

/// Updates each range (all of param, with decay, if ranges is empty), then marks the buffer as set.
void sgd_step(std::span<float> param, std::span<const float> grad, SGDState& state, const SGDOptions& opt,
              std::span<const ParamRange> ranges = {});

}  // namespace coshard::ops
