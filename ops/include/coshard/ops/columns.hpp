#pragma once
// A block of columns of a row-major matrix: how a model packs separate projections (Llama's q, k
// and v) into the fused layout attention.hpp reads, and takes their gradients back out. Exact
// copies, row by row.
#include <cstddef>
#include <span>

namespace coshard::ops {

/// wide[r, first .. first + cols) = narrow[r, :] for r < rows: narrow [rows, cols], wide [rows, ld].
void put_columns(std::span<const float> narrow, std::span<float> wide, std::size_t rows, std::size_t cols,
                 std::size_t ld, std::size_t first);

/// narrow[r, :] = wide[r, first .. first + cols) for r < rows.
void get_columns(std::span<const float> wide, std::span<float> narrow, std::size_t rows, std::size_t cols,
                 std::size_t ld, std::size_t first);

}  // namespace coshard::ops
