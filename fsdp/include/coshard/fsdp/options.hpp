#pragma once
// Engine options, named after PyTorch FSDP's (FSDP1's ShardingStrategy, BackwardPrefetch and
// MixedPrecision; FSDP2's reshard_after_forward and explicit prefetch lists).
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "coshard/ops/optim.hpp"
#include "coshard/runtime/dtype.hpp"
#include "coshard/transport/communicator.hpp"

namespace coshard::fsdp {

enum class Strategy {
  full_shard,          ///< ZeRO-3: parameters resharded after forward, gradients reduce-scattered
  shard_grad_op,       ///< ZeRO-2: parameters stay unsharded from forward to the end of backward
  no_shard,            ///< DDP: every rank holds everything, gradients all-reduced
  hybrid_shard,        ///< full_shard inside a shard group, gradient shards all-reduced across replicas
  hybrid_shard_zero2,  ///< shard_grad_op inside a shard group, likewise
};
/// The strategy's name, as checkpoints record it, e.g. "full_shard".
std::string_view to_string(Strategy s) noexcept;

/// When backward all-gathers the next unit (FSDP's BackwardPrefetch): `pre` before the current
/// unit's gradient compute, `post` after it, `none` only when that unit's backward begins.
enum class BackwardPrefetch { pre, post, none };

/// Which units are all-gathered before they are needed, to overlap the all-gathers with compute.
struct Prefetch {
  int forward = 1;                             ///< units all-gathered ahead in forward
  BackwardPrefetch backward = BackwardPrefetch::pre;  ///< when backward prefetches the next unit
  /// Explicit lists (unit name -> units to unshard when it starts) override both, as FSDP2's
  /// set_modules_to_forward_prefetch / set_modules_to_backward_prefetch. This one is forward's.
  std::map<std::string, std::vector<std::string>> forward_explicit;
  /// Backward's list: a unit named here prefetches its list before its gradient compute.
  std::map<std::string, std::vector<std::string>> backward_explicit;
};

/// The dtypes of the all-gather and the gradient reduction (FSDP's MixedPrecision); master shards,
/// gradient shards and optimizer state stay f32.
struct MixedPrecision {
  DType param = DType::f32;                  ///< unsharded parameters (all-gathered in this dtype)
  std::optional<DType> reduce;               ///< gradient reduction; default: param
  bool keep_low_precision_grads = false;     ///< reduced gradients rounded to param dtype
};

/// Selects AdamW (decoupled weight decay) as the optimizer.
struct AdamW {
  ops::AdamWOptions options;  ///< learning rate, betas, eps, weight decay
};
/// Selects SGD (momentum optional, as torch's) as the optimizer.
struct SGD {
  ops::SGDOptions options;  ///< learning rate, momentum, dampening, weight decay, nesterov
};
/// The optimizer the engine steps on the shards, with its hyperparameters.
using Optimizer = std::variant<AdamW, SGD>;

/// CPU offload: sharded state in host memory (pinned on CUDA; on the CPU backend a separate host
/// pool, still copied through the h2d/d2h streams so the same ordering is exercised).
struct Offload {
  bool params = false;     ///< f32 master shards: copied (cast to param_dtype) host-to-device before each all-gather
  bool grads = false;      ///< gradient shards: each reduced shard copied device-to-host and accumulated there
  bool optimizer = false;  ///< optimizer state, and the optimizer step on the host
  /// Step each unit's optimizer as soon as its gradient arrived on the host, while backward goes on
  /// with the other units (PyTorch steps every unit after backward). Not during a backward that
  /// is not the step's last (set_is_last_backward), and after the norm when `clip` is set.
  bool pipelined_optimizer = true;
  std::size_t host_memory_cap_bytes = 0;  ///< 0: no cap; too small for the shards: error at creation
  /// True when any sharded state is offloaded.
  bool any() const noexcept { return params || grads || optimizer; }
};

/// Gradient clipping applied by optimizer_step() (with offload, before the pipelined optimizer).
struct Clip {
  double max_norm = 1.0;  ///< the total gradient norm is scaled down to at most this
  double p = 2.0;  ///< 2, 1 or inf
};

/// Everything Engine::create takes besides the units; the defaults are FSDP's (full_shard, f32,
/// backward prefetch pre), with AdamW.
struct Options {
  Strategy strategy = Strategy::full_shard;  ///< how parameters, gradients and optimizer state are sharded
  /// Overrides the strategy's choice: true, false, or a group size (an int) to reshard to after
  /// forward: the backward all-gather then runs inside groups of that many ranks.
  std::optional<std::variant<bool, int>> reshard_after_forward;
  int shard_group_size = 0;  ///< hybrid strategies: ranks per shard group (0: the ranks of a host; every host must hold as many, consecutive)
  Prefetch prefetch;         ///< what is all-gathered ahead of need
  int in_flight = 2;         ///< unsharded units at once (current + prefetched)
  MixedPrecision mixed_precision;  ///< dtypes of the all-gather and the gradient reduction
  std::optional<double> gradient_divide_factor;  ///< default: average over data-parallel ranks
  Optimizer optimizer = AdamW{};  ///< stepped on the shards by optimizer_step()
  std::optional<Clip> clip;       ///< gradient clipping in every optimizer_step(); unset: none
  Offload offload;                ///< sharded state kept in host memory; default: none
  std::chrono::milliseconds timeout{300000};  ///< per collective
  /// How long a checkpoint's collectives wait for the slowest rank's file I/O (a rank that writes
  /// nothing waits for the one writing the most).
  std::chrono::milliseconds checkpoint_timeout{3600000};
  /// How parameters get their first values: from each spec's init (default), or from rank 0's
  /// values, broadcast to the others after rank 0 initialised the whole unit.
  bool sync_module_states = false;
  /// Seen before every collective the engine issues (comm is "all_gather", "reduce_scatter",
  /// "all_reduce" or "control"): for tests (counting, injecting delays) and tracing.
  std::function<void(const std::string& comm, const transport::OpInfo&)> comm_hook;
};

}  // namespace coshard::fsdp
