#pragma once
// Llama (Hugging Face LlamaForCausalLM without dropout) on coshard::ops kernels: RMSNorm, q/k/v
// projections packed into the fused layout, rotary embeddings, grouped-query attention, the
// SwiGLU MLP, and a final RMSNorm and LM head with the mean cross-entropy.
//
// Activations is the computation, split into the pieces FSDP units run (the embedding, one
// decoder layer, the head), as gpt2::Activations is: it owns a batch's saved activations and the
// backward scratch as tensors of the device the model runs on; parameters and gradients come in as
// tensors, and every op goes through ops::Kernels, so the same code runs in the single-process
// Llama below and in the FSDP units (units.hpp) on every device. Backward pieces accumulate into
// parameter gradients; the gradient of the residual stream travels inside Activations.
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "coshard/llama/config.hpp"
#include "coshard/llama/params.hpp"
#include "coshard/ops/kernels.hpp"
#include "coshard/runtime/allocator.hpp"
#include "coshard/runtime/tensor.hpp"

namespace coshard::llama {

// A layer's 9 parameters, in BlockParam order: f32, or bf16 under bf16 compute (the seven GEMM
// weights read as bf16 by the GEMMs; the two RMSNorm weights widened to f32 first). Gradients f32.
using BlockWeights = std::array<Tensor, block_param_count>;
using BlockGrads = std::array<Tensor, block_param_count>;

class Activations {
 public:
  // Buffers come from `alloc` (device memory where the model's work runs), which must outlive this.
  Activations(Config config, Allocator& alloc);

  // Takes a batch: tokens and targets [B, T] with 1 <= T <= context (targets may be empty for a
  // forward without loss), validated here against the vocabulary (the ops take them as checked)
  // and uploaded by `k`, with the rotary table of T positions. Buffers are sized on the first batch
  // of a shape.
  void set_batch(ops::Kernels& k, std::vector<std::int32_t> tokens, std::vector<std::int32_t> targets, std::size_t B,
                 std::size_t T);
  // The bytes these buffers hold once a forward and a backward of a [B, T] batch ran on the CPU.
  static double bytes_for(const Config& c, double B, double T) noexcept;
  std::size_t bytes() const noexcept;

  void embedding_forward(ops::Kernels& k, const Tensor& embed);  // f32 or bf16 table
  void block_forward(ops::Kernels& k, std::size_t layer, const BlockWeights& w);
  // norm, logits = x head^T (head is the embedding when tied), and the mean loss into loss().
  void head_forward(ops::Kernels& k, const Tensor& norm_weight, const Tensor& head);

  // dloss: gradient of whatever consumes the mean loss (1, or 1/k for k accumulated micro-batches).
  void head_backward(ops::Kernels& k, const Tensor& norm_weight, const Tensor& head, const Tensor& d_norm_weight,
                     const Tensor& d_head, float dloss);
  void block_backward(ops::Kernels& k, std::size_t layer, const BlockWeights& w, const BlockGrads& g);
  void embedding_backward(ops::Kernels& k, const Tensor& d_embed);

  bool has_targets() const noexcept { return has_targets_; }
  const Tensor& loss() const noexcept { return loss_; }      // one f32, once head_forward's work ran
  const Tensor& logits() const noexcept { return logits_; }  // [B, T, V]
  const Config& config() const noexcept { return c_; }

 private:
  struct Block {
    Tensor n1, rstd1, qkv, att, att_saved, res2, n2, rstd2, gate, up, act;
  };
  void size(ops::Kernels& k, Tensor& t, std::size_t n);
  Tensor f32(ops::Kernels& k, const Tensor& p);
  ops::AttentionShape shape() const noexcept;
  // The first n elements of a scratch tensor, as a tensor of its own.
  static Tensor first(const Tensor& t, std::size_t n);

  Config c_;
  Allocator& alloc_;
  std::size_t B_ = 0, T_ = 0;
  bool has_targets_ = false;
  Tensor tokens_, targets_, cos_, sin_;
  std::vector<Tensor> resid_;  // resid_[l]: input of layer l; resid_[L]: input of the final norm
  std::vector<Block> blocks_;
  Tensor nf_, rstdf_, logits_, lse_, dlogits_, loss_;
  Tensor proj_, tmp_;  // forward scratch: a q, k or v projection before it is packed; o and down's output
  // Backward scratch (one set: pieces run one at a time).
  Tensor dresid_, dres2_, dtmp_, dn_, dact_, dgate_, dup_, datt_, dqkv_, dproj_;
};

// The whole model in one process on a flat f32 store (the reference for FSDP parity tests).
class Llama {
 public:
  Llama(Config config, std::uint64_t seed);

  const Config& config() const noexcept { return c_; }
  ParamStore& params() noexcept { return params_; }
  const ParamStore& params() const noexcept { return params_; }
  ParamStore& grads() noexcept { return grads_; }
  const ParamStore& grads() const noexcept { return grads_; }
  std::span<const float> logits() const;

  // Forward of a batch (tokens and targets [B, T]); returns the mean cross-entropy.
  float forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, std::size_t B,
                std::size_t T);
  // Backward of the last forward; gradients accumulate into grads().
  void backward(float dloss = 1.0f);
  void zero_grad() { grads_.fill(0.0f); }

  // Index of layer `layer`'s first parameter (and of the head's) in params().
  static std::size_t block_offset(std::size_t layer) noexcept { return 1 + block_param_count * layer; }
  std::size_t head_offset() const noexcept { return block_offset(static_cast<std::size_t>(c_.layers)); }

 private:
  BlockWeights block_weights(std::size_t layer) const;
  BlockGrads block_grads(std::size_t layer);
  Config c_;
  ParamStore params_, grads_;
  std::unique_ptr<Allocator> memory_;
  ops::Launcher launch_;
  Activations acts_;
};

}  // namespace coshard::llama
