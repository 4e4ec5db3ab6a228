// Communicator's own checks on the UCX backend: every call the refusal table holds is refused
// before it is issued, so the group's sequence numbers stay in step and the next good call is its
// first operation; a backend's own rule (host tensors for UCX) is still its own.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "coshard/runtime/copy.hpp"
#include "coshard/transport/process_group.hpp"
#include "refusals.hpp"

using namespace coshard;
using namespace coshard::transport;

namespace {

TEST(CommunicatorChecks, UcxRefusesEveryBadCallBeforeIssuingIt) {
  Runtime rt({});
  auto pg = rt.scheduler().sync_wait(ProcessGroup::create(rt, launch::LaunchEnv{}, ProcessGroupOptions{}));
  Communicator& c = pg->world();
  coshard::testing::expect_refusals(c, rt);
  // None took a sequence number: the first operation issued is #0, and it runs.
  Stream& s = rt.stream("compute");
  Tensor in = Tensor::empty(rt.allocator(), DType::f32, {2});
  Tensor out = Tensor::empty(rt.allocator(), DType::f32, {2});
  upload(s, in, std::vector<float>{3, 4});
  s.wait(c.all_gather(in, out, s));
  EXPECT_EQ(rt.scheduler().sync_wait(download<float>(s, out)), (std::vector<float>{3, 4}));
  const std::string record = c.flight_record_json();
  EXPECT_NE(record.find("{\"seq\":0,\"op\":\"all_gather\""), std::string::npos) << record;
  EXPECT_EQ(record.find("\"seq\":1,"), std::string::npos) << record;
}

}  // namespace
