#pragma once
// The calls every Communicator refuses before issuing anything, whatever its backend or size: one
// table, run against the UCX communicator (communicator_checks_test.cpp) and the NCCL one over
// the fake (nccl_logic_test.cpp).
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "coshard/runtime/runtime.hpp"
#include "coshard/transport/communicator.hpp"

namespace coshard::testing {

struct Refusal {
  std::string call;                     // what the test asks for, in its own words
  std::function<void()> issue;          // makes the call
  std::vector<std::string> named;       // what the error must say
};

// The refused calls on `c`, tensors on `rt`'s device: sizes are the group's, so the table holds
// for any size. Each must throw Errc::invalid_argument naming the operation, the communicator and
// what is wrong, and say that nothing was issued.
inline std::vector<Refusal> refusals(transport::Communicator& c, Runtime& rt) {
  using transport::Reduction;
  // The calls run after this returns: they hold pointers and copies, nothing of this frame.
  const auto n = static_cast<std::int64_t>(c.size());
  transport::Communicator* comm = &c;
  Allocator* alloc = &rt.allocator();
  Stream* s = &rt.stream("compute");
  auto f32 = [alloc](std::int64_t count) { return Tensor::empty(*alloc, DType::f32, {count}); };
  const std::string where = "on communicator '" + c.name() + "'";
  return {
      {"an all-gather whose output is one element short",
       [=] { comm->all_gather(f32(2), f32(2 * n - 1), *s); },
       {"all_gather (f32 x 2 per rank) " + where, "output has " + std::to_string(2 * n - 1) + " elements",
        "size() x input = " + std::to_string(n) + " x 2", "nothing was issued"}},
      {"an all-gather from bf16 to f32",
       [=] { comm->all_gather(Tensor::empty(*alloc, DType::bf16, {2}), f32(2 * n), *s); },
       {"all_gather", "input is bf16 but output is f32"}},
      {"an all-gather of an empty tensor", [=] { comm->all_gather(Tensor(), f32(n), *s); },
       {"all_gather " + where, "input is an empty tensor"}},
      {"a reduce-scatter of i64",
       [=] {
         comm->reduce_scatter(Tensor::empty(*alloc, DType::i64, {n}),
                              Tensor::empty(*alloc, DType::i64, {1}), Reduction::sum(), *s);
       },
       {"reduce_scatter (i64 x 1 per rank) " + where, "reductions take f32, bf16 or f16, not i64"}},
      {"a reduce-scatter whose input is one element long",
       [=] { comm->reduce_scatter(f32(n + 1), f32(1), Reduction::sum(), *s); },
       {"reduce_scatter", "input has " + std::to_string(n + 1) + " elements"}},
      {"an all-reduce with a premul_sum factor that is NaN",
       [=] { comm->all_reduce(f32(1), Reduction::premul_sum(std::numeric_limits<double>::quiet_NaN()), *s); },
       {"all_reduce (f32 x 1) " + where, "premul_sum factor", "not a finite number"}},
      {"a broadcast from a root past the group",
       [=] { comm->broadcast(f32(1), static_cast<int>(n), *s); },
       {"broadcast", "root " + std::to_string(n) + " is not a rank of this communicator"}},
      {"a send to this rank", [=] { comm->send(f32(1), comm->rank(), *s); },
       {"send", "peer " + std::to_string(c.rank()) + " is this rank"}},
      {"a receive from rank -1", [=] { comm->recv(f32(1), -1, *s); },
       {"recv", "peer -1 is not a rank of this communicator"}},
  };
}

// Runs the table on `c`: every call is refused as it says.
inline void expect_refusals(transport::Communicator& c, Runtime& rt) {
  for (const Refusal& r : refusals(c, rt)) {
    try {
      r.issue();
      ADD_FAILURE() << r.call << " was issued on " << c.backend();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument) << r.call << ": " << e.what();
      for (const std::string& part : r.named) {
        EXPECT_NE(e.message().find(part), std::string::npos) << r.call << ": '" << part << "' is not in: " << e.what();
      }
    }
  }
}

}  // namespace coshard::testing
