// coshard::parse_whole: the one reader of numbers handed in as text.
#include "coshard/runtime/parse_whole.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <optional>

namespace {

using coshard::parse_whole;

TEST(ParseWhole, TakesAllOfADecimalNumberWithinTheType) {
  EXPECT_EQ(parse_whole<int>("42"), 42);
  EXPECT_EQ(parse_whole<int>("-7"), -7);
  EXPECT_EQ(parse_whole<int>("010"), 10);  // decimal, not octal (CLI11 and strtol(s, 0) read 8)
  EXPECT_EQ(parse_whole<int>("2147483647"), std::numeric_limits<int>::max());
  EXPECT_EQ(parse_whole<std::uint64_t>("18446744073709551615"), std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(parse_whole<std::int64_t>("-9223372036854775808"), std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(parse_whole<double>("0.5"), 0.5);
  EXPECT_EQ(parse_whole<double>("1e-3"), 1e-3);
}

TEST(ParseWhole, RefusesTextThatIsNotJustANumber) {
  for (const char* text : {"", " 5", "5 ", "+5", "0x10", "5MiB", "1e3", "1.0", "abc", "-", "5\n"}) {
    EXPECT_EQ(parse_whole<int>(text), std::nullopt) << "'" << text << "'";
  }
  for (const char* text : {"", " 0.5", "0.5s", "1,5", "abc"}) {
    EXPECT_EQ(parse_whole<double>(text), std::nullopt) << "'" << text << "'";
  }
}

TEST(ParseWhole, RefusesANumberBeyondTheTypeInsteadOfWrapping) {
  EXPECT_EQ(parse_whole<int>("2147483648"), std::nullopt);  // stoi's long was 4294967296 -> rank 0
  EXPECT_EQ(parse_whole<int>("4294967296"), std::nullopt);
  EXPECT_EQ(parse_whole<std::uint64_t>("18446744073709551616"), std::nullopt);
  EXPECT_EQ(parse_whole<std::uint64_t>("-1"), std::nullopt);  // CLI11 read it as 2^64 - 1
  EXPECT_EQ(parse_whole<std::uint16_t>("65536"), std::nullopt);
  EXPECT_EQ(parse_whole<double>("1e400"), std::nullopt);
}

}  // namespace
