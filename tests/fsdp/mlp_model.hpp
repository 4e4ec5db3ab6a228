#pragma once
// A small MLP for the engine's tests: each layer is one FSDP unit (Linear with bias, Conv1D layout
// W[in, out]), ReLU between layers, mean-squared-error loss. The same maths runs sharded (as units
// on the engine) and in one process without sharding (Reference), from the same initial values:
// a counter-based function of (parameter name, element index), so shards initialise themselves.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "coshard/fsdp/unit.hpp"
#include "coshard/kernels/cast.hpp"
#include "coshard/ops/linear.hpp"
#include "coshard/ops/optim.hpp"

namespace coshard::testing {

inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline std::uint64_t name_hash(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// Uniform in [-bound, bound), a function of (seed, index) only.
inline float uniform(std::uint64_t seed, std::uint64_t i, float bound) {
  double u = static_cast<double>(mix(seed ^ mix(i)) >> 11) * 0x1.0p-53;
  return static_cast<float>((2 * u - 1) * bound);
}

struct Layer {
  std::int64_t in, out;
};

// Batch of one step: inputs [rows, in0] and targets [rows, outN] for `rows` global rows; rank r of
// n takes rows [r * rows / n, (r + 1) * rows / n).
struct Batch {
  std::vector<float> x, y;
};
inline Batch make_batch(const std::vector<Layer>& layers, std::int64_t rows, std::int64_t first_row, int step) {
  Batch b;
  const auto in = layers.front().in, out = layers.back().out;
  for (std::int64_t r = first_row; r < first_row + rows; ++r) {
    for (std::int64_t j = 0; j < in; ++j) b.x.push_back(uniform(1000 + step, static_cast<std::uint64_t>(r * in + j), 1.0f));
    for (std::int64_t j = 0; j < out; ++j) b.y.push_back(uniform(5000 + step, static_cast<std::uint64_t>(r * out + j), 1.0f));
  }
  return b;
}

inline std::vector<fsdp::ParamSpec> layer_params(std::size_t i, const Layer& l) {
  const std::string w = "layers." + std::to_string(i) + ".weight", b = "layers." + std::to_string(i) + ".bias";
  const float bound = 1.0f / std::sqrt(static_cast<float>(l.in));
  auto init = [bound](std::string name) {
    return [bound, seed = name_hash(name)](std::span<float> out, std::int64_t first) {
      for (std::size_t k = 0; k < out.size(); ++k) out[k] = uniform(seed, static_cast<std::uint64_t>(first) + k, bound);
    };
  };
  return {{w, {l.in, l.out}, init(w), true}, {b, {l.out}, init(b), false}};
}

// Activations shared by the units of one rank.
struct MlpState {
  std::vector<Layer> layers;
  std::int64_t rows = 0;
  std::vector<std::vector<float>> acts;  // acts[i]: input of layer i; acts[n]: output
  std::vector<std::vector<float>> pre;   // pre-activation of layer i
  std::vector<std::vector<float>> dacts;
  std::vector<float> target;
  float loss = 0;
  int compute_ms = 0;  // test hook: each kernel also occupies the stream this long
  bool skip_compute = false;  // benchmark hook: run the schedule without the kernels
  // The units read Scope::param_tensor in param_dtype (Unit::computes_in_f32 false) and widen it
  // inside their work, as a kernel reading bf16 weights would: the engine keeps no f32 copy.
  bool param_tensors = false;

  void set_batch(const Batch& b) {
    rows = static_cast<std::int64_t>(b.x.size()) / layers.front().in;
    const std::size_t n = layers.size();
    acts.assign(n + 1, {});
    pre.assign(n, {});
    dacts.assign(n + 1, {});
    acts[0] = b.x;
    target = b.y;
    for (std::size_t i = 0; i < n; ++i) {
      pre[i].assign(static_cast<std::size_t>(rows * layers[i].out), 0.0f);
      acts[i + 1].assign(pre[i].size(), 0.0f);
      dacts[i + 1].assign(pre[i].size(), 0.0f);
    }
    dacts[0].assign(acts[0].size(), 0.0f);
  }
  void occupy() const {
    if (compute_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(compute_ms));
  }

  // Layer i forward with parameters w, b (spans): on whatever thread runs it.
  void forward(std::size_t i, std::span<const float> w, std::span<const float> b) {
    if (skip_compute) return;
    const auto& l = layers[i];
    const auto r = static_cast<std::size_t>(rows);
    ops::linear_forward(acts[i], w, b, pre[i], r, static_cast<std::size_t>(l.in), static_cast<std::size_t>(l.out));
    const bool last = i + 1 == layers.size();
    for (std::size_t k = 0; k < pre[i].size(); ++k) acts[i + 1][k] = last ? pre[i][k] : std::max(0.0f, pre[i][k]);
    if (last) {
      double s = 0;
      const auto count = static_cast<double>(pre[i].size());
      for (std::size_t k = 0; k < pre[i].size(); ++k) {
        double d = acts[i + 1][k] - target[k];
        s += d * d;
        dacts[i + 1][k] = static_cast<float>(2 * d / count);
      }
      loss = static_cast<float>(s / count);
    }
    occupy();
  }
  void backward(std::size_t i, std::span<const float> w, std::span<float> dw, std::span<float> db) {
    if (skip_compute) return;
    const auto& l = layers[i];
    const bool last = i + 1 == layers.size();
    std::vector<float> dy = dacts[i + 1];
    if (!last) {
      for (std::size_t k = 0; k < dy.size(); ++k) dy[k] = pre[i][k] > 0 ? dy[k] : 0.0f;
    }
    ops::linear_backward(dy, acts[i], w, i == 0 ? std::span<float>{} : std::span<float>(dacts[i]), dw, db,
                         static_cast<std::size_t>(rows), static_cast<std::size_t>(l.in), static_cast<std::size_t>(l.out));
    occupy();
  }
};

// Parameter values as the host maths reads them: the tensor's own f32 memory, or (param_dtype)
// widened into `copy`. Called inside the unit's work, where device memory may be read.
inline std::span<const float> f32_values(const Tensor& t, std::vector<float>& copy) {
  const auto n = static_cast<std::size_t>(t.numel());
  if (t.dtype() == DType::f32) return {t.data_as<float>(), n};
  const auto* h = static_cast<const std::uint16_t*>(t.data());
  copy.resize(n);
  for (std::size_t k = 0; k < n; ++k) copy[k] = t.dtype() == DType::bf16 ? kernels::bf16_to_f32(h[k]) : kernels::f16_to_f32(h[k]);
  return copy;
}

// Enqueues layer `layer`'s forward or backward with parameters k, k + 1 of `scope`: f32 spans, or
// param_dtype tensors widened in the work (MlpState::param_tensors).
inline void enqueue_layer(MlpState& s, fsdp::Scope& scope, std::size_t layer, std::size_t k, bool backward,
                          std::string span) {
  if (!s.param_tensors) {
    auto w = scope.param(k), b = scope.param(k + 1);
    if (!backward) {
      scope.enqueue([&s, layer, w, b] { s.forward(layer, w, b); }, std::move(span));
      return;
    }
    auto dw = scope.grad(k), db = scope.grad(k + 1);
    scope.enqueue([&s, layer, w, dw, db] { s.backward(layer, w, dw, db); }, std::move(span));
    return;
  }
  Tensor w = scope.param_tensor(k), b = scope.param_tensor(k + 1);
  if (!backward) {
    scope.enqueue([&s, layer, w, b] {
      std::vector<float> wc, bc;
      s.forward(layer, f32_values(w, wc), f32_values(b, bc));
    }, std::move(span));
    return;
  }
  auto dw = scope.grad(k), db = scope.grad(k + 1);
  scope.enqueue([&s, layer, w, dw, db] {
    std::vector<float> wc;
    s.backward(layer, f32_values(w, wc), dw, db);
  }, std::move(span));
}

class MlpUnit final : public fsdp::Unit {
 public:
  MlpUnit(MlpState& state, std::size_t index) : s_(state), i_(index) {}
  std::string name() const override { return "layers." + std::to_string(i_); }
  std::vector<fsdp::ParamSpec> params() const override { return layer_params(i_, s_.layers[i_]); }
  bool computes_in_f32() const override { return !s_.param_tensors; }
  Task<void> forward(fsdp::Scope& scope) override {
    enqueue_layer(s_, scope, i_, 0, false, "forward " + name());
    co_return;
  }
  Task<void> backward(fsdp::Scope& scope) override {
    enqueue_layer(s_, scope, i_, 0, true, "backward " + name());
    co_return;
  }

 private:
  MlpState& s_;
  std::size_t i_;
};

// The first and last layers as one unit with two phases, the way a tied embedding and LM head
// share FSDP's root: phase 0 runs layer 0, phase 1 the last layer, the units between run between.
class MlpRootUnit final : public fsdp::Unit {
 public:
  explicit MlpRootUnit(MlpState& state) : s_(state) {}
  std::string name() const override { return "root"; }
  int phases() const override { return 2; }
  std::vector<fsdp::ParamSpec> params() const override {
    auto p = layer_params(0, s_.layers.front());
    auto last = layer_params(s_.layers.size() - 1, s_.layers.back());
    p.insert(p.end(), last.begin(), last.end());
    return p;
  }
  bool computes_in_f32() const override { return !s_.param_tensors; }
  Task<void> forward(fsdp::Scope& scope) override {
    const std::size_t k = scope.phase() == 0 ? 0 : 2, layer = scope.phase() == 0 ? 0 : s_.layers.size() - 1;
    enqueue_layer(s_, scope, layer, k, false, "forward root");
    co_return;
  }
  Task<void> backward(fsdp::Scope& scope) override {
    const std::size_t k = scope.phase() == 0 ? 0 : 2, layer = scope.phase() == 0 ? 0 : s_.layers.size() - 1;
    enqueue_layer(s_, scope, layer, k, true, "backward root");
    co_return;
  }

 private:
  MlpState& s_;
};

// The same model in one process, unsharded, f32, with the same optimizer maths.
struct Reference {
  MlpState state;
  std::vector<std::vector<float>> w, b, dw, db, mw, vw, mb, vb;
  std::int64_t step = 0;

  explicit Reference(std::vector<Layer> layers) {
    state.layers = std::move(layers);
    for (std::size_t i = 0; i < state.layers.size(); ++i) {
      auto specs = layer_params(i, state.layers[i]);
      for (int k = 0; k < 2; ++k) {
        auto& p = (k == 0 ? w : b);
        std::int64_t n = 1;
        for (auto d : specs[static_cast<std::size_t>(k)].shape) n *= d;
        p.emplace_back(static_cast<std::size_t>(n));
        specs[static_cast<std::size_t>(k)].init(p.back(), 0);
      }
      dw.emplace_back(w.back().size());
      db.emplace_back(b.back().size());
      mw.emplace_back(w.back().size());
      vw.emplace_back(w.back().size());
      mb.emplace_back(b.back().size());
      vb.emplace_back(b.back().size());
    }
  }
  // Forward and backward of a batch; gradients accumulate.
  float forward_backward(const Batch& batch) {
    state.set_batch(batch);
    for (std::size_t i = 0; i < w.size(); ++i) state.forward(i, w[i], b[i]);
    for (std::size_t i = w.size(); i-- > 0;) state.backward(i, w[i], dw[i], db[i]);
    return state.loss;
  }
  void scale_grads(float s) {
    for (auto* set : {&dw, &db}) {
      for (auto& g : *set) {
        for (auto& x : g) x *= s;
      }
    }
  }
  void adamw(const ops::AdamWOptions& o) {
    ++step;
    for (std::size_t i = 0; i < w.size(); ++i) {
      ops::adamw_update(w[i], dw[i], mw[i], vw[i], step, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay);
      ops::adamw_update(b[i], db[i], mb[i], vb[i], step, o.lr, o.beta1, o.beta2, o.eps, 0.0);
      std::fill(dw[i].begin(), dw[i].end(), 0.0f);
      std::fill(db[i].begin(), db[i].end(), 0.0f);
    }
  }
};

}  // namespace coshard::testing
