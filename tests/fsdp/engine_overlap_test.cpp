// The overlap test of the engine: timed with sleeps, so it runs in the main build only (label
// timing), not under sanitizers, where everything is several times slower.
#include "engine_run.hpp"

namespace {

using namespace coshard::testing;

// 4. Overlap: prefetch hides the all-gathers behind compute; without prefetch nothing overlaps.
double step_ratio(const std::string& args) {
  auto r = check(2, "--mode overlap --steps 2 --delay-ms 60 --layers 8x8,8x8,8x8,8x4 " + args);
  EXPECT_EQ(r.rc, 0) << r.output;
  auto at = r.output.find("ratio ");
  return at == std::string::npos ? 0 : std::atof(r.output.c_str() + at + 6);
}

TEST(EngineOverlap, PrefetchHidesTheAllGathers) {
  EXPECT_LT(step_ratio(""), 0.75);
  EXPECT_GT(step_ratio("--forward-prefetch 0 --backward none"), 0.9);
}

}  // namespace
