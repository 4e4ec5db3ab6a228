#pragma once
// Where each parameter of a unit lives in its flat parameter: concatenated in params() order,
// each start aligned to 16 bytes of the unsharded dtype, the end padded so the total divides by
// the number of shards. Padding never reaches a gradient or the optimizer.
#include <cstdint>
#include <string>
#include <vector>

#include "coshard/fsdp/unit.hpp"
#include "coshard/ops/optim.hpp"

namespace coshard::fsdp::detail {

struct ParamSlot {
  ParamSpec spec;
  std::int64_t offset = 0;
  std::int64_t numel = 0;
};

struct FlatLayout {
  std::vector<ParamSlot> params;
  std::int64_t padded = 0;  // total, divisible by the shard count
  std::int64_t chunk = 0;   // padded / shards

  // Validates the specs (names, shapes) and errors naming the unit and parameter.
  static FlatLayout build(const std::string& unit, std::vector<ParamSpec> specs, int shards, std::int64_t align);
  // The parameter elements inside [begin, begin + count) of the flat parameter, relative to begin.
  std::vector<ops::ParamRange> ranges(std::int64_t begin, std::int64_t count) const;
  // Calls each parameter's init for its elements inside [begin, begin + out.size()).
  void init(std::span<float> out, std::int64_t begin) const;
};

}  // namespace coshard::fsdp::detail
