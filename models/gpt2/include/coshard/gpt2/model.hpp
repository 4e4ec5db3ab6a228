#pragma once
// GPT-2 (Hugging Face GPT2LMHeadModel without dropout) on coshard::ops kernels.
//
// Activations is the computation, split into the pieces that FSDP units run: the embedding, one
// block, the head (ln_f, logits, mean cross-entropy). It owns the saved activations of a batch
// and the backward scratch, as tensors of the device the model runs on; parameters and gradients
// come in as tensors, and every op goes through ops::Kernels, so the same code runs in the
// single-process Gpt2 below (on the calling thread) and in the FSDP units (units.hpp: on the
// compute stream of the CPU, cpu-discrete or CUDA device), with identical numerics on the CPU.
// Backward pieces accumulate (+=) into parameter gradients; the gradient of the residual stream
// travels between pieces inside Activations (head -> blocks in reverse -> embedding).
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "coshard/gpt2/config.hpp"
#include "coshard/gpt2/params.hpp"
#include "coshard/ops/kernels.hpp"
#include "coshard/runtime/allocator.hpp"
#include "coshard/runtime/tensor.hpp"

namespace coshard::gpt2 {

// A block's 12 parameters, in BlockParam order: f32, or under bf16 compute bf16 (the four GEMM
// weights are read as bf16 by the GEMMs; layernorms and biases, 1% of the block, are widened to
// f32 first). Gradients are f32.
using BlockWeights = std::array<Tensor, block_param_count>;
using BlockGrads = std::array<Tensor, block_param_count>;

class Activations {
 public:
  // Buffers come from `alloc` (device memory where the model's work runs), which must outlive this.
  Activations(Config config, Allocator& alloc);

  // Takes a batch: tokens and targets [B, T] with 1 <= T <= context (targets may be empty for a
  // forward without loss), validated here against the vocabulary (the ops take them as checked)
  // and uploaded by `k`. Buffers are sized on the first batch of a shape.
  void set_batch(ops::Kernels& k, std::vector<std::int32_t> tokens, std::vector<std::int32_t> targets, std::size_t B,
                 std::size_t T);
  // The bytes these buffers hold once a forward and a backward of a [B, T] batch have run on the
  // CPU; they stay for the run. In double: an estimate for any flags, which no product of them overflows.
  static double bytes_for(const Config& c, double B, double T) noexcept;
  // The bytes they hold now.
  std::size_t bytes() const noexcept;

  // The pieces, each enqueued through `k` (the kernels of the stream the model runs on).
  void embedding_forward(ops::Kernels& k, const Tensor& wte, const Tensor& wpe);  // f32 or bf16 tables
  void block_forward(ops::Kernels& k, std::size_t layer, const BlockWeights& w);
  // ln_f, logits = x head^T (head is wte when tied), and the mean loss into loss() when the batch
  // has targets.
  void head_forward(ops::Kernels& k, const Tensor& ln_f_weight, const Tensor& ln_f_bias, const Tensor& head);

  // dloss: gradient of whatever consumes the mean loss (1, or 1/k for k accumulated micro-batches).
  void head_backward(ops::Kernels& k, const Tensor& ln_f_weight, const Tensor& head, const Tensor& d_ln_f_weight,
                     const Tensor& d_ln_f_bias, const Tensor& d_head, float dloss);
  void block_backward(ops::Kernels& k, std::size_t layer, const BlockWeights& w, const BlockGrads& g);
  void embedding_backward(ops::Kernels& k, const Tensor& d_wte, const Tensor& d_wpe);

  bool has_targets() const noexcept { return has_targets_; }
  const Tensor& loss() const noexcept { return loss_; }      // one f32, once head_forward's work ran
  const Tensor& logits() const noexcept { return logits_; }  // [B, T, V]
  std::size_t batch() const noexcept { return B_; }
  std::size_t seq_len() const noexcept { return T_; }
  const Config& config() const noexcept { return c_; }

 private:
  struct Block {
    Tensor ln1, ln1_mean, ln1_rstd, qkv, att_saved, atty, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
  };
  // An f32 tensor of n elements in `t`, allocated (and zeroed by k) when it has another size.
  void size(ops::Kernels& k, Tensor& t, std::size_t n);
  // `p` in f32: itself, or widened from bf16 into a new tensor by k.
  Tensor f32(ops::Kernels& k, const Tensor& p);
  Config c_;
  Allocator& alloc_;
  std::size_t B_ = 0, T_ = 0;
  bool has_targets_ = false;
  Tensor tokens_, targets_;     // i32 [B, T]
  std::vector<Tensor> resid_;  // resid_[l]: input of block l; resid_[L]: input of ln_f
  std::vector<Block> blocks_;
  Tensor lnf_, lnf_mean_, lnf_rstd_, logits_, lse_, dlogits_, loss_;
  // Backward scratch (one set: pieces run one at a time).
  Tensor dresid_, dres2_, dtmp_, dln_, datty_, dqkv_, dfch_, dfch_gelu_, tmp_;
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
  // The last forward's logits [B, T, V] (host memory).
  std::span<const float> logits() const;

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
  BlockGrads block_grads(std::size_t layer);
  Config c_;
  ParamStore params_, grads_;
  std::unique_ptr<Allocator> memory_;  // the activations' (host memory)
  ops::Launcher launch_;               // ops on the calling thread
  Activations acts_;
};

}  // namespace coshard::gpt2
