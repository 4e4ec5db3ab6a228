#pragma once
// GPT-2 (Hugging Face GPT2LMHeadModel without dropout) on fp32 CPU kernels from coshard::ops.
//
// Activations is the computation, split into the pieces that FSDP units run: the embedding, one
// block, the head (ln_f, logits, mean cross-entropy). It owns the saved activations of a batch
// and the backward scratch; parameters and gradients come in as spans, so the same code runs in
// the single-process Gpt2 below and in the FSDP units (units.hpp), with identical numerics.
// Backward pieces accumulate (+=) into parameter gradients; the gradient of the residual stream
// travels between pieces inside Activations (head -> blocks in reverse -> embedding).
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "coshard/gpt2/config.hpp"
#include "coshard/gpt2/params.hpp"

namespace coshard::gpt2 {

// A GEMM weight as a piece reads it: f32, or under bf16 compute the all-gathered bf16 bits (the
// GEMM then rounds its other operand to bf16 and sums in f32, ops/linear.hpp). One is set.
struct GemmWeight {
  GemmWeight() = default;
  GemmWeight(std::span<const float> w) : f32(w) {}           // NOLINT: implicit, as a span is passed
  GemmWeight(std::span<float> w) : f32(w) {}                 // NOLINT
  GemmWeight(std::span<const std::uint16_t> w) : bf16(w) {}  // NOLINT
  std::span<const float> f32;
  std::span<const std::uint16_t> bf16;
};

// A block's 12 parameters: all f32, or under bf16 compute the four GEMM weights in bf16 (bf16[k])
// and the layernorms and biases (1% of the block) widened to f32. gemm(k) gives weight k either way.
struct BlockWeights {
  std::array<std::span<const float>, block_param_count> f32;
  std::array<std::span<const std::uint16_t>, block_param_count> bf16;  // GEMM weights under bf16 compute
  GemmWeight gemm(BlockParam k) const { return bf16[k].empty() ? GemmWeight(f32[k]) : GemmWeight(bf16[k]); }
};
using BlockGrads = std::array<std::span<float>, block_param_count>;

class Activations {
 public:
  explicit Activations(Config config);

  // Takes a batch: tokens and targets [B, T] with 1 <= T <= context (targets may be empty for a
  // forward without loss). Buffers are sized on the first batch of a shape.
  void set_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, std::size_t B,
                 std::size_t T);
  // The bytes these buffers hold once a forward and a backward of a [B, T] batch have run; they
  // stay for the run. In double: an estimate for any flags, which no product of them overflows.
  static double bytes_for(const Config& c, double B, double T) noexcept;
  // The bytes they hold now.
  std::size_t bytes() const noexcept;

  void embedding_forward(std::span<const float> wte, std::span<const float> wpe);
  void embedding_forward(std::span<const std::uint16_t> wte, std::span<const std::uint16_t> wpe);  // bf16 compute
  void block_forward(std::size_t layer, const BlockWeights& w);
  // ln_f, logits = x head^T (head is wte when tied), loss. Returns the loss (NaN without targets).
  float head_forward(std::span<const float> ln_f_weight, std::span<const float> ln_f_bias, GemmWeight head);

  // dloss: gradient of whatever consumes the mean loss (1, or 1/k for k accumulated micro-batches).
  void head_backward(std::span<const float> ln_f_weight, GemmWeight head, std::span<float> d_ln_f_weight,
                     std::span<float> d_ln_f_bias, std::span<float> d_head, float dloss);
  void block_backward(std::size_t layer, const BlockWeights& w, const BlockGrads& g);
  void embedding_backward(std::span<float> d_wte, std::span<float> d_wpe);

  float loss() const noexcept { return loss_; }
  std::span<const float> logits() const noexcept { return logits_; }  // [B, T, V]
  std::size_t batch() const noexcept { return B_; }
  std::size_t seq_len() const noexcept { return T_; }
  const Config& config() const noexcept { return c_; }

 private:
  struct Block {
    std::vector<float> ln1, ln1_mean, ln1_rstd, qkv, att_lse, atty, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
  };
  Config c_;
  std::size_t B_ = 0, T_ = 0;
  std::vector<std::int32_t> tokens_, targets_;
  std::vector<std::vector<float>> resid_;  // resid_[l]: input of block l; resid_[L]: input of ln_f
  std::vector<Block> blocks_;
  std::vector<float> lnf_, lnf_mean_, lnf_rstd_, logits_, lse_, dlogits_;
  // Backward scratch (one set: pieces run one at a time).
  std::vector<float> dresid_, dres2_, dtmp_, dln_, datty_, dqkv_, dfch_, dfch_gelu_, tmp_;
  float loss_ = 0.0f;
};

// The whole model in one process on a flat fp32 store (the reference for FSDP parity tests and the
// single-rank benchmark). Parameter names and layout as params.hpp.
class Gpt2 {
 public:
  Gpt2(Config config, std::uint64_t seed);

  const Config& config() const noexcept { return c_; }
  ParamStore& params() noexcept { return params_; }
  const ParamStore& params() const noexcept { return params_; }
  ParamStore& grads() noexcept { return grads_; }
  const ParamStore& grads() const noexcept { return grads_; }
  Activations& activations() noexcept { return acts_; }

  // Forward of a batch (tokens and targets [B, T]); returns the mean cross-entropy.
  float forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, std::size_t B,
                std::size_t T);
  // Backward of the last forward; gradients accumulate into grads().
  void backward(float dloss = 1.0f);
  // forward then backward.
  float forward_backward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, std::size_t B,
                         std::size_t T);
  void zero_grad() { grads_.fill(0.0f); }

  // Index of block `layer`'s first parameter (and of the head's) in params().
  static std::size_t block_offset(std::size_t layer) noexcept { return 2 + block_param_count * layer; }
  std::size_t head_offset() const noexcept { return block_offset(static_cast<std::size_t>(c_.layers)); }

 private:
  BlockWeights block_weights(std::size_t layer) const;
  Config c_;
  ParamStore params_, grads_;
  Activations acts_;
};

}  // namespace coshard::gpt2
