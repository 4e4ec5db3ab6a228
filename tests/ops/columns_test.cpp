#include "coshard/ops/columns.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "ops/gradcheck.hpp"

using namespace coshard::ops;
using namespace coshard::testing;

namespace {

// q, k and v [rows, 5], [rows, 3], [rows, 3] into one [rows, 11], as Llama's units pack them.
TEST(OpsColumns, BlocksPackIntoTheWideRowsAndComeBackExactly) {
  const std::size_t rows = 7, widths[] = {5, 3, 3}, ld = 11;
  std::vector<std::vector<float>> parts;
  for (std::size_t p = 0; p < 3; ++p) parts.push_back(random_floats(rows * widths[p], 1 + p));
  std::vector<float> wide(rows * ld, -1.0f);
  std::size_t first = 0;
  for (std::size_t p = 0; p < 3; ++p) {
    put_columns(parts[p], wide, rows, widths[p], ld, first);
    first += widths[p];
  }
  for (std::size_t r = 0; r < rows; ++r) {
    std::size_t c = 0;
    for (std::size_t p = 0; p < 3; ++p)
      for (std::size_t i = 0; i < widths[p]; ++i, ++c) ASSERT_EQ(wide[r * ld + c], parts[p][r * widths[p] + i]);
  }
  first = 0;
  for (std::size_t p = 0; p < 3; ++p) {
    std::vector<float> back(rows * widths[p]);
    get_columns(wide, back, rows, widths[p], ld, first);
    EXPECT_EQ(back, parts[p]);
    first += widths[p];
  }
}

TEST(OpsColumns, ABlockOutsideTheRowsOrOfTheWrongSizeIsRefused) {
  std::vector<float> narrow(4 * 3), wide(4 * 8);
  expect_invalid([&] { put_columns(narrow, wide, 4, 3, 8, 6); }, {"put_columns", "columns [6, 9) lie outside the 8"});
  expect_invalid([&] { get_columns(wide, narrow, 4, 3, 7, 0); }, {"get_columns", "wide has 32", "expected 28"});
  expect_invalid([&] { put_columns(std::span<const float>(wide).first(12), wide, 4, 3, 8, 0); },
                 {"wide and narrow must not overlap"});
}

}  // namespace
