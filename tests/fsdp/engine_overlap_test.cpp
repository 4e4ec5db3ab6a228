// The overlap test of the engine: timed with sleeps, so it runs in the main build only (label
// timing), not under sanitizers, where everything is several times slower.
#include "engine_run.hpp"

namespace {

using namespace coshard::testing;

// 4. Overlap: prefetch hides the all-gathers behind compute; without prefetch nothing overlaps.
double step_ratio(const std::string& args) {
  auto r = check(2, "--mode overlap --steps 3 --delay-ms 60 --layers 8x8,8x8,8x8,8x4 " + args);
  EXPECT_EQ(r.rc, 0) << r.output;
  auto at = r.output.find("ratio ");
  return at == std::string::npos ? 0 : std::atof(r.output.c_str() + at + 6);
}

// Measured on the 2-core VM: 0.62-0.65 with prefetch on a quiet machine, 0.64-0.73 with both cores
// busy; 1.02-1.03 without prefetch. The limits sit between, clear of the load's spread.
TEST(EngineOverlap, PrefetchHidesTheAllGathers) {
  EXPECT_LT(step_ratio(""), 0.8);
  EXPECT_GT(step_ratio("--forward-prefetch 0 --backward none"), 0.9);
}

}  // namespace
