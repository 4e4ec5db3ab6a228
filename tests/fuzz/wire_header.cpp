// What a UCX peer sends before an operation, as received (any bytes): the operation header every
// collective starts with, and the direct path's reference to the peer's shared segment.
#include <cstring>

#include "coshard/runtime/error.hpp"
#include "fuzz_input.hpp"
#include "ucx/direct.hpp"
#include "ucx/ring.hpp"

using namespace coshard;
using namespace coshard::transport;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  transport::detail::Header theirs;
  SegmentRef ref;
  if (size < 1 + sizeof theirs + sizeof ref) return 0;
  const bool p2p = data[0] & 1;
  std::memcpy(&theirs, data + 1, sizeof theirs);
  std::memcpy(&ref, data + 1 + sizeof theirs, sizeof ref);
  OpInfo mine = OpInfo::of(p2p ? CollectiveOp::recv : CollectiveOp::all_reduce, 7, DType::f32, 1000);
  mine.peer = p2p ? 0 : -1;
  try {
    transport::detail::check_header(1, p2p, mine, transport::detail::header_of(mine), theirs, 0);
  } catch (const Error&) {
  }
  try {
    transport::detail::check_segment_ref(mine, 0, ref, static_cast<std::size_t>(data[0]) << 12);
  } catch (const Error&) {
  }
  return 0;
}
