#include "coshard/fsdp/options.hpp"

namespace coshard::fsdp {

std::string_view to_string(Strategy s) noexcept {
  switch (s) {
    case Strategy::full_shard: return "full_shard";
    case Strategy::shard_grad_op: return "shard_grad_op";
    case Strategy::no_shard: return "no_shard";
    case Strategy::hybrid_shard: return "hybrid_shard";
    case Strategy::hybrid_shard_zero2: return "hybrid_shard_zero2";
  }
  return "?";
}

}  // namespace coshard::fsdp
