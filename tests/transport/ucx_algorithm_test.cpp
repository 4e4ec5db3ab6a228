// The UCX communicator's one choice of schedule (transport/src/ucx/algorithm.hpp), every branch
// of its order: p2p, mesh, direct, hierarchical, ring.
#include <gtest/gtest.h>

#include <string>

#include "ucx/algorithm.hpp"

namespace coshard::transport::detail {
namespace {

OpInfo op(CollectiveOp kind, std::int64_t floats) { return OpInfo::of(kind, 0, DType::f32, floats); }

// Four ranks on two hosts, every schedule set up: direct from 1 KiB per rank, the two-level
// schedule from 64 KiB of buffer.
Paths all_paths() {
  return {.size = 4, .mesh_takes = false, .direct = true, .direct_min_bytes = 1024, .hierarchy = true,
          .hierarchy_min_bytes = 64 * 1024};
}

struct Row {
  std::string what;
  OpInfo info;
  Paths paths;
  Algorithm want;
};

Paths with(Paths p, auto change) {
  change(p);
  return p;
}

TEST(UcxAlgorithm, EveryRowOfTheOrder) {
  const Paths all = all_paths();
  const Paths no_direct = with(all, [](Paths& p) { p.direct = false; });
  const Paths meshed = with(all, [](Paths& p) { p.mesh_takes = true; });
  const Row rows[] = {
      {"send is point to point", op(CollectiveOp::send, 1 << 20), meshed, Algorithm::p2p},
      {"recv is point to point", op(CollectiveOp::recv, 4), all, Algorithm::p2p},
      {"broadcast takes the ring", op(CollectiveOp::broadcast, 1 << 20), meshed, Algorithm::ring},
      {"barrier takes the ring", op(CollectiveOp::barrier, 0), all, Algorithm::ring},
      {"one rank takes the ring", op(CollectiveOp::all_reduce, 1 << 20), with(meshed, [](Paths& p) { p.size = 1; }),
       Algorithm::ring},
      {"the mesh comes first", op(CollectiveOp::all_gather, 1 << 20), meshed, Algorithm::mesh},
      {"all-gather: direct from its block per rank", op(CollectiveOp::all_gather, 256), all, Algorithm::direct},
      {"all-gather: under the direct minimum", op(CollectiveOp::all_gather, 255), all, Algorithm::ring},
      {"reduce-scatter: direct from its block per rank", op(CollectiveOp::reduce_scatter, 256), all,
       Algorithm::direct},
      // all-reduce's part per rank is a quarter of its buffer
      {"all-reduce: direct from its part per rank", op(CollectiveOp::all_reduce, 1024), all, Algorithm::direct},
      {"all-reduce: a part under the direct minimum", op(CollectiveOp::all_reduce, 1023), all, Algorithm::ring},
      // the two-level schedule counts the whole buffer: all-gather's output is size x the block
      {"all-gather: two levels from its output", op(CollectiveOp::all_gather, 4096), no_direct,
       Algorithm::hierarchical},
      {"all-gather: an output under the two-level minimum", op(CollectiveOp::all_gather, 4095), no_direct,
       Algorithm::ring},
      {"all-reduce: two levels from its buffer", op(CollectiveOp::all_reduce, 16384), no_direct,
       Algorithm::hierarchical},
      {"all-reduce: a buffer under the two-level minimum", op(CollectiveOp::all_reduce, 16383), no_direct,
       Algorithm::ring},
      {"direct before two levels", op(CollectiveOp::reduce_scatter, 1 << 20), all, Algorithm::direct},
      {"nothing set up: the ring", op(CollectiveOp::all_gather, 1 << 20), Paths{.size = 4}, Algorithm::ring},
  };
  for (const Row& r : rows) EXPECT_EQ(to_string(choose(r.info, r.paths)), to_string(r.want)) << r.what;
}

// A direct try that gives up asks again without the direct path: the next choice is the one the
// operation would have taken had direct never been set up.
TEST(UcxAlgorithm, AFailedDirectTryFallsToTheNextChoice) {
  const Paths all = all_paths();
  const Paths after = with(all, [](Paths& p) { p.direct = false; });
  EXPECT_EQ(choose(op(CollectiveOp::all_gather, 1 << 20), all), Algorithm::direct);
  EXPECT_EQ(choose(op(CollectiveOp::all_gather, 1 << 20), after), Algorithm::hierarchical);
  EXPECT_EQ(choose(op(CollectiveOp::all_gather, 512), after), Algorithm::ring);
}

TEST(UcxAlgorithm, NamesAreTheFlightRecordsAndTheMetricsLabels) {
  EXPECT_EQ(to_string(Algorithm::p2p), "p2p");
  EXPECT_EQ(to_string(Algorithm::mesh), "mesh");
  EXPECT_EQ(to_string(Algorithm::direct), "direct");
  EXPECT_EQ(to_string(Algorithm::hierarchical), "hierarchical");
  EXPECT_EQ(to_string(Algorithm::ring), "ring");
}

TEST(UcxAlgorithm, BufferBytesIsTheWholeBuffer) {
  EXPECT_EQ(buffer_bytes(op(CollectiveOp::all_gather, 10), 4), 160u);
  EXPECT_EQ(buffer_bytes(op(CollectiveOp::reduce_scatter, 10), 4), 160u);
  EXPECT_EQ(buffer_bytes(op(CollectiveOp::all_reduce, 10), 4), 40u);
}

}  // namespace
}  // namespace coshard::transport::detail
