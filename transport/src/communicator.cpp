#include "coshard/transport/communicator.hpp"

#include <cmath>
#include <string>
#include <utility>

namespace coshard::transport {
namespace {

// "all_gather (f32 x 4096 per rank) on communicator 'world' (rank 1 of 4)": what was asked, of
// whom. No sequence number: a refused call takes none.
std::string asked(const Communicator& c, CollectiveOp op, const Tensor& t) {
  std::string s(to_string(op));
  if (t.defined()) {
    s += " (" + std::string(to_string(t.dtype())) + " x " + std::to_string(t.numel());
    if (op == CollectiveOp::all_gather || op == CollectiveOp::reduce_scatter) s += " per rank";
    s += ")";
  }
  return s + " on communicator '" + c.name() + "' (rank " + std::to_string(c.rank()) + " of " +
         std::to_string(c.size()) + ")";
}

// The checks of one call: each fails it with the call and what is wrong named.
class Checks {
 public:
  Checks(const Communicator& c, CollectiveOp op, const Tensor& shown) : c_(c), op_(op), shown_(shown) {}

  [[noreturn]] void refuse(const std::string& why) const {
    throw Error(Errc::invalid_argument, asked(c_, op_, shown_) + ": " + why + "; nothing was issued",
                op_context(std::string(to_string(op_))));
  }
  void allocated(const Tensor& t, const char* role) const {
    if (!t.defined()) refuse(std::string(role) + " is an empty tensor (not allocated)");
  }
  void same_dtype(const Tensor& input, const Tensor& output) const {
    if (input.dtype() != output.dtype()) {
      refuse("input is " + std::string(to_string(input.dtype())) + " but output is " +
             std::string(to_string(output.dtype())));
    }
  }
  // `whole` must hold size() times `part`'s elements.
  void group_times(const Tensor& whole, const char* whole_role, const Tensor& part, const char* part_role) const {
    if (whole.numel() != part.numel() * c_.size()) {
      refuse(std::string(whole_role) + " has " + std::to_string(whole.numel()) + " elements; it needs size() x " +
             part_role + " = " + std::to_string(c_.size()) + " x " + std::to_string(part.numel()));
    }
  }
  void reduces(const Tensor& t, const Reduction& r) const {
    if (!reducible(t.dtype())) refuse("reductions take f32, bf16 or f16, not " + std::string(to_string(t.dtype())));
    if (r.op == ReduceOp::premul_sum && !std::isfinite(r.factor)) {
      refuse("the premul_sum factor is " + std::to_string(r.factor) + ", not a finite number");
    }
  }
  void in_group(int who, const char* role) const {
    if (who < 0 || who >= c_.size()) {
      refuse(std::string(role) + " " + std::to_string(who) + " is not a rank of this communicator (0.." +
             std::to_string(c_.size() - 1) + ")");
    }
  }
  void another(int peer) const {
    in_group(peer, "peer");
    if (peer == c_.rank()) refuse("peer " + std::to_string(peer) + " is this rank: send and recv pair two ranks");
  }

 private:
  const Communicator& c_;
  CollectiveOp op_;
  const Tensor& shown_;
};

}  // namespace

bool reducible(DType dtype) noexcept { return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16; }

Event Communicator::all_gather(Tensor input, Tensor output, Stream& after, std::string label) {
  const Checks check(*this, CollectiveOp::all_gather, input);
  check.allocated(input, "input");
  check.allocated(output, "output");
  check.same_dtype(input, output);
  check.group_times(output, "output", input, "input");
  return issue_all_gather(std::move(input), std::move(output), after, std::move(label));
}

Event Communicator::reduce_scatter(Tensor input, Tensor output, Reduction reduction, Stream& after,
                                   std::string label) {
  const Checks check(*this, CollectiveOp::reduce_scatter, output);
  check.allocated(input, "input");
  check.allocated(output, "output");
  check.same_dtype(input, output);
  check.reduces(output, reduction);
  check.group_times(input, "input", output, "output");
  return issue_reduce_scatter(std::move(input), std::move(output), reduction, after, std::move(label));
}

Event Communicator::all_reduce(Tensor inout, Reduction reduction, Stream& after, std::string label) {
  const Checks check(*this, CollectiveOp::all_reduce, inout);
  check.allocated(inout, "inout");
  check.reduces(inout, reduction);
  return issue_all_reduce(std::move(inout), reduction, after, std::move(label));
}

Event Communicator::broadcast(Tensor inout, int root, Stream& after, std::string label) {
  const Checks check(*this, CollectiveOp::broadcast, inout);
  check.allocated(inout, "inout");
  check.in_group(root, "root");
  return issue_broadcast(std::move(inout), root, after, std::move(label));
}

Event Communicator::send(Tensor input, int peer, Stream& after) {
  const Checks check(*this, CollectiveOp::send, input);
  check.allocated(input, "input");
  check.another(peer);
  return issue_send(std::move(input), peer, after);
}

Event Communicator::recv(Tensor output, int peer, Stream& after) {
  const Checks check(*this, CollectiveOp::recv, output);
  check.allocated(output, "output");
  check.another(peer);
  return issue_recv(std::move(output), peer, after);
}

}  // namespace coshard::transport
