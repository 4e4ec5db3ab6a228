#include "coshard/ops/columns.hpp"

#include <cstring>

#include "check.hpp"

namespace coshard::ops {

void put_columns(std::span<const float> narrow, std::span<float> wide, std::size_t rows, std::size_t cols,
                 std::size_t ld, std::size_t first) {
  constexpr const char* op = "put_columns";
  detail::check_columns(op, narrow.size(), wide.size(), rows, cols, ld, first);
  detail::check_disjoint(op, "wide", wide, "narrow", narrow);
  for (std::size_t r = 0; r < rows; ++r) std::memcpy(wide.data() + r * ld + first, narrow.data() + r * cols, cols * sizeof(float));
}

void get_columns(std::span<const float> wide, std::span<float> narrow, std::size_t rows, std::size_t cols,
                 std::size_t ld, std::size_t first) {
  constexpr const char* op = "get_columns";
  detail::check_columns(op, narrow.size(), wide.size(), rows, cols, ld, first);
  detail::check_disjoint(op, "narrow", narrow, "wide", wide);
  for (std::size_t r = 0; r < rows; ++r) std::memcpy(narrow.data() + r * cols, wide.data() + r * ld + first, cols * sizeof(float));
}

}  // namespace coshard::ops
