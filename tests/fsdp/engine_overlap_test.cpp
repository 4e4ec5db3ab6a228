// The overlap test of the engine: timed with sleeps, so it runs in the main build only (label
// timing), not under sanitizers, where everything is several times slower.
#include <cstdlib>

#include "engine_run.hpp"

namespace {

using namespace coshard::testing;

constexpr double kDelayMs = 60;    // each all-gather
constexpr int kComputeMs = 80;     // each unit's compute: longer, so a prefetched all-gather has slack

struct Overlap {
  double ratio = 0;               // fastest step / the serialised schedule
  double exposed_ms = -1;         // the compute stream's wait for all-gathers, least over the steps
  double predicted_ms = -1;       // what the schedule predicts (engine_check's overlap mode)
  double reduce_ms = -1;          // the compute stream's wait for reductions in the worst step
};

double number_after(const std::string& text, const std::string& key) {
  const auto at = text.find(key);
  return at == std::string::npos ? -1 : std::atof(text.c_str() + at + key.size());
}

Overlap measure(const std::string& args) {
  auto r = check(2, "--mode overlap --steps 4 --delay-ms " + std::to_string(static_cast<int>(kDelayMs)) +
                        " --compute-ms " + std::to_string(kComputeMs) + " --layers 8x8,8x8,8x8,8x4 " + args);
  EXPECT_EQ(r.rc, 0) << r.output;
  return {number_after(r.output, "ratio "), number_after(r.output, "all-gather wait "), number_after(r.output, "predicted "),
          number_after(r.output, "reduce wait ")};
}

// 4. Overlap: prefetch hides the all-gathers behind compute; without prefetch nothing overlaps.
// The step ratio, measured on the 2-core VM with 8 other ranks running: 0.69 with prefetch, 1.05
// without (with compute as long as an all-gather, on a quiet machine: 0.60-0.65 and 1.02).
// The compute stream's wait for all-gathers is checked against the schedule's prediction (one
// all-gather per step with prefetch, 2n - 1 = 7 without), within a fifth of an all-gather per
// all-gather waited for: a prefetch that comes one unit late, or a wait for the optimizer
// counted as one for an all-gather, is off by a whole all-gather.
TEST(EngineOverlap, PrefetchHidesTheAllGathers) {
  const Overlap with = measure("");
  EXPECT_LT(with.ratio, 0.8);
  EXPECT_EQ(with.predicted_ms, kDelayMs);
  EXPECT_NEAR(with.exposed_ms, with.predicted_ms, with.predicted_ms / 5);
  const Overlap without = measure("--forward-prefetch 0 --backward none");
  EXPECT_GT(without.ratio, 0.9);
  EXPECT_EQ(without.predicted_ms, 7 * kDelayMs);
  EXPECT_NEAR(without.exposed_ms, without.predicted_ms, without.predicted_ms / 5);
}

// Reduce-scatters of 40 ms, shorter than a unit's backward: they hide behind the next unit's
// compute, which takes the gradient buffer of the unit before (two buffers). With one buffer the
// compute waited for the previous unit's reduction every time: 160 ms in a step here (0 now), and
// the step took 895 ms instead of 760.
TEST(EngineOverlap, ReduceScattersHideBehindTheNextBackward) {
  const Overlap o = measure("--rs-delay-ms 40");
  EXPECT_GE(o.reduce_ms, 0);
  EXPECT_LT(o.reduce_ms, kDelayMs / 5);
}

}  // namespace
