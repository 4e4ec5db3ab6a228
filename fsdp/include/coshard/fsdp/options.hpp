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
std::string_view to_string(Strategy s) noexcept;

enum class BackwardPrefetch { pre, post, none };

struct Prefetch {
  int forward = 1;                             ///< units all-gathered ahead in forward
  BackwardPrefetch backward = BackwardPrefetch::pre;
  /// Explicit lists (unit name -> units to unshard when it starts) override both, as FSDP2's
  /// set_modules_to_forward_prefetch / set_modules_to_backward_prefetch.
  std::map<std::string, std::vector<std::string>> forward_explicit;
  std::map<std::string, std::vector<std::string>> backward_explicit;
};

struct MixedPrecision {
  DType param = DType::f32;                  ///< unsharded parameters (all-gathered in this dtype)
  std::optional<DType> reduce;               ///< gradient reduction; default: param
  bool keep_low_precision_grads = false;     ///< reduced gradients rounded to param dtype
};

struct AdamW {
  ops::AdamWOptions options;
};
struct SGD {
  ops::SGDOptions options;
};
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
  bool any() const noexcept { return params || grads || optimizer; }
};

/// Gradient clipping applied by optimizer_step() (with offload, before the pipelined optimizer).
struct Clip {
  double max_norm = 1.0;
  double p = 2.0;  ///< 2, 1 or inf
};

struct Options {
  Strategy strategy = Strategy::full_shard;
  /// Overrides the strategy's choice: true, false, or a group size (an int) to reshard to after
  /// forward: the backward all-gather then runs inside groups of that many ranks.
  std::optional<std::variant<bool, int>> reshard_after_forward;
  int shard_group_size = 0;  ///< hybrid strategies: ranks per shard group (0: local world size)
  Prefetch prefetch;
  int in_flight = 2;         ///< unsharded units at once (current + prefetched)
  MixedPrecision mixed_precision;
  std::optional<double> gradient_divide_factor;  ///< default: average over data-parallel ranks
  Optimizer optimizer = AdamW{};
  std::optional<Clip> clip;
  Offload offload;
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
