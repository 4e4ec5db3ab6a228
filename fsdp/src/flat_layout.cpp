#include "flat_layout.hpp"

#include <algorithm>
#include <set>

namespace coshard::fsdp::detail {

FlatLayout FlatLayout::build(const std::string& unit, std::vector<ParamSpec> specs, int shards, std::int64_t align) {
  if (specs.empty()) {
    throw Error(Errc::invalid_argument, "unit '" + unit + "' has no parameters: a unit is a group of parameters to "
                                                          "shard; fold it into a neighbouring unit",
                ErrorContext{.rank = {}, .op = "create", .unit = unit});
  }
  FlatLayout l;
  std::set<std::string> seen;
  std::int64_t at = 0;
  for (auto& s : specs) {
    if (s.name.empty() || !seen.insert(s.name).second) {
      throw Error(Errc::invalid_argument, "unit '" + unit + "': parameter name '" + s.name +
                                              "' is empty or used twice; names must be unique",
                  ErrorContext{.rank = {}, .op = "create", .unit = unit});
    }
    std::int64_t n = 1;
    for (auto d : s.shape) {
      if (d <= 0) {
        throw Error(Errc::invalid_argument, "unit '" + unit + "': parameter '" + s.name + "' has shape " +
                                                coshard::to_string(s.shape) + "; every dimension must be positive",
                    ErrorContext{.rank = {}, .op = "create", .unit = unit});
      }
      n *= d;
    }
    at = (at + align - 1) / align * align;
    l.params.push_back({std::move(s), at, n});
    at += n;
  }
  l.chunk = (at + shards - 1) / shards;
  l.chunk = (l.chunk + align - 1) / align * align;  // every shard starts aligned as well
  l.padded = l.chunk * shards;
  return l;
}

std::vector<ops::ParamRange> FlatLayout::ranges(std::int64_t begin, std::int64_t count) const {
  std::vector<ops::ParamRange> out;
  for (const auto& p : params) {
    std::int64_t lo = std::max(begin, p.offset), hi = std::min(begin + count, p.offset + p.numel);
    if (lo < hi) {
      out.push_back({static_cast<std::size_t>(lo - begin), static_cast<std::size_t>(hi - lo), p.spec.weight_decay});
    }
  }
  return out;
}

void FlatLayout::init(std::span<float> out, std::int64_t begin) const {
  std::fill(out.begin(), out.end(), 0.0f);
  const auto count = static_cast<std::int64_t>(out.size());
  for (const auto& p : params) {
    std::int64_t lo = std::max(begin, p.offset), hi = std::min(begin + count, p.offset + p.numel);
    if (lo < hi && p.spec.init) {
      p.spec.init(out.subspan(static_cast<std::size_t>(lo - begin), static_cast<std::size_t>(hi - lo)), lo - p.offset);
    }
  }
}

}  // namespace coshard::fsdp::detail
