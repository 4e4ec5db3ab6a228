#pragma once
// A fake NCCL behind the communicator's NcclApi seam: ranks are threads of one process, each with a
// CPU Runtime; a collective is work on the communicator's CPU stream that meets the other ranks'
// work of the same sequence number and computes the result (f32 reductions). It follows NCCL's
// non-blocking rules and records every breach of them as a violation, which the tests assert
// empty: a call on a freed (aborted or destroyed) communicator, an abort while another call on it
// runs, a collective outside ncclGroupStart/End, a communicator used before its initialisation
// (or split) completed, a premul_sum operator destroyed before its collective ran, a rank joining a
// communicator that already has all its ranks (a stale unique id).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "nccl/nccl_api.hpp"

namespace coshard::testing {

using transport::detail::NcclApi;

class FakeNccl final : public NcclApi {
 public:
  /// Timing and faults, the same for every rank of a world.
  struct Knobs {
    int init_polls = 0;     ///< a new communicator reports in_progress this many times
    int split_polls = 0;    ///< the child of a split reports in_progress this many times
    int enqueue_polls = 0;  ///< group_end returns in_progress, then async_error reports it this many times
    std::chrono::milliseconds async_error_delay{0};  ///< each async_error takes this long
    std::chrono::milliseconds collective_delay{0};   ///< each collective's work sleeps this long first
  };

  struct Group;
  struct FakeComm {
    Group* group = nullptr;
    int rank = 0;
    int polls_left = 0;             // reports in_progress while > 0
    bool freed = false;             // aborted or destroyed
    bool remote_error = false;      // async_error reports a dead peer
    std::atomic<int> in_call{0};
    std::uint64_t seq = 0;          // collectives issued
  };
  struct Slot {
    std::vector<const void*> in;  // by rank
    int arrived = 0, left = 0;
  };
  struct Group {
    int size = 0, joined = 0;
    std::mutex m;
    std::condition_variable cv;
    std::map<std::uint64_t, Slot> slots;
  };
  /// What the ranks of one test share.
  struct World {
    std::mutex m;
    std::map<std::string, std::unique_ptr<Group>> groups;  // by unique id
    std::vector<std::unique_ptr<FakeComm>> comms;          // never freed: a freed one is detected
    std::vector<std::string> violations;
    std::map<int, double> factors;  // premul_sum operators alive, by id
    int next_op = 100;
    int next_id = 0;
    int aborts = 0, destroys = 0;
    void violation(std::string what) {
      std::lock_guard lock(m);
      violations.push_back(std::move(what));
    }
  };

  FakeNccl(std::shared_ptr<World> world, Knobs knobs) : world_(std::move(world)), knobs_(knobs) {}

  std::string describe(Status s) override { return "fake NCCL status " + std::to_string(static_cast<int>(s)); }
  void use_device(Device) override {}

  Status unique_id(Id* id) override {
    std::lock_guard lock(world_->m);
    const std::string key = "fake-id-" + std::to_string(world_->next_id++);
    id->fill(0);
    std::memcpy(id->data(), key.data(), key.size());
    return Status::success;
  }
  Status init_rank(Comm* comm, int size, const Id& id, int rank) override {
    std::lock_guard lock(world_->m);
    auto& g = world_->groups[std::string(id.data())];
    if (!g) {
      g = std::make_unique<Group>();
      g->size = size;
    }
    if (g->joined == g->size) world_->violations.push_back("a rank joined a communicator that has all its ranks: stale id");
    ++g->joined;
    *comm = make_comm(g.get(), rank, knobs_.init_polls);
    return knobs_.init_polls > 0 ? Status::in_progress : Status::success;
  }
  Status split(Comm comm, int color, int key, Comm* out) override {
    Call call(*this, comm, "split");
    FakeComm* c = of(comm);
    // Ranks split in rank order here (key = rank): one child group per (parent, color).
    std::lock_guard lock(world_->m);
    const std::string name = "split-" + std::to_string(reinterpret_cast<std::uintptr_t>(c->group)) + "-" +
                             std::to_string(color);
    auto& g = world_->groups[name];
    if (!g) {
      g = std::make_unique<Group>();
      g->size = split_size_;
    }
    *out = color < 0 ? nullptr : make_comm(g.get(), key % split_size_, knobs_.split_polls);
    c->polls_left = knobs_.split_polls;  // the parent is in progress too, as long as the child
    return Status::in_progress;
  }
  Status async_error(Comm comm, Status* state) override {
    Call call(*this, comm, "async_error");
    if (knobs_.async_error_delay.count() > 0) std::this_thread::sleep_for(knobs_.async_error_delay);
    FakeComm* c = of(comm);
    std::lock_guard lock(world_->m);
    if (c->remote_error) {
      *state = Status::remote_error;
    } else if (c->polls_left > 0) {
      --c->polls_left;
      *state = Status::in_progress;
    } else {
      *state = Status::success;
    }
    return Status::success;
  }
  Status user_rank(Comm comm, int* rank) override {
    Call call(*this, comm, "user_rank");
    *rank = of(comm)->rank;
    return Status::success;
  }
  Status count(Comm comm, int* size) override {
    Call call(*this, comm, "count");
    *size = of(comm)->group->size;
    return Status::success;
  }
  Status finalize(Comm comm) override {
    Call call(*this, comm, "finalize");
    return Status::success;
  }
  Status destroy(Comm comm) override { return free(comm, false); }
  Status abort(Comm comm) override { return free(comm, true); }

  Status group_start() override {
    std::lock_guard lock(world_->m);
    ++depth_[std::this_thread::get_id()];
    return Status::success;
  }
  Status group_end() override {
    std::lock_guard lock(world_->m);
    const auto me = std::this_thread::get_id();
    --depth_[me];
    FakeComm* last = std::exchange(last_in_group_[me], nullptr);
    if (knobs_.enqueue_polls == 0 || !last) return Status::success;
    last->polls_left = knobs_.enqueue_polls;  // NCCL is still enqueuing: poll async_error
    return Status::in_progress;
  }

  Status premul_sum(RedOp* op, double factor, DType, Comm comm) override {
    Call call(*this, comm, "premul_sum");
    std::lock_guard lock(world_->m);
    *op = world_->next_op++;
    world_->factors[*op] = factor;
    return Status::success;
  }
  Status op_destroy(RedOp op, Comm comm) override {
    Call call(*this, comm, "op_destroy");
    std::lock_guard lock(world_->m);
    if (world_->factors.erase(op) == 0) world_->violations.push_back("an operator destroyed twice");
    return Status::success;
  }
  RedOp builtin(Red red) override { return static_cast<RedOp>(red); }

  // Each rank computes its result from every rank's input, and writes it only once every rank has
  // read: outputs may alias inputs (in-place all-reduce, the engine's in-place all-gather).
  Status all_gather(const void* in, void* out, std::size_t count, DType dtype, Comm comm, Stream& stream) override {
    const std::size_t bytes = count * size_of(dtype);
    return collective(comm, stream, in, out, "all_gather", [bytes](const Slot& s, int, int n) {
      std::vector<char> r(bytes * static_cast<std::size_t>(n));
      for (int k = 0; k < n; ++k) std::memcpy(r.data() + k * bytes, s.in[static_cast<std::size_t>(k)], bytes);
      return r;
    });
  }
  Status reduce_scatter(const void* in, void* out, std::size_t count, DType, RedOp op, Comm comm,
                        Stream& stream) override {
    return collective(comm, stream, in, out, "reduce_scatter", [this, count, op](const Slot& s, int rank, int n) {
      return reduce(s, n, op, count, static_cast<std::size_t>(rank) * count);
    });
  }
  Status all_reduce(const void* in, void* out, std::size_t count, DType, RedOp op, Comm comm, Stream& stream) override {
    return collective(comm, stream, in, out, "all_reduce",
                      [this, count, op](const Slot& s, int, int n) { return reduce(s, n, op, count, 0); });
  }
  Status broadcast(const void* in, void* out, std::size_t count, DType dtype, int root, Comm comm,
                   Stream& stream) override {
    const std::size_t bytes = count * size_of(dtype);
    return collective(comm, stream, in, out, "broadcast", [bytes, root](const Slot& s, int, int) {
      const char* from = static_cast<const char*>(s.in[static_cast<std::size_t>(root)]);
      return std::vector<char>(from, from + bytes);
    });
  }
  Status send(const void*, std::size_t, DType, int, Comm comm, Stream&) override {
    Call call(*this, comm, "send");
    return Status::invalid_usage;  // not needed by these tests
  }
  Status recv(void*, std::size_t, DType, int, Comm comm, Stream&) override {
    Call call(*this, comm, "recv");
    return Status::invalid_usage;
  }

  /// Ranks of the children a split makes (all ranks of the parent take part).
  void set_split_size(int n) { split_size_ = n; }
  /// From now on async_error of every live communicator reports a dead peer.
  void fail_peers() {
    std::lock_guard lock(world_->m);
    for (auto& c : world_->comms) c->remote_error = true;
  }

 private:
  // Marks a call on `comm` in flight for its duration; a call on a freed communicator is a violation.
  struct Call {
    Call(FakeNccl& f, Comm comm, const char* what) : c(static_cast<FakeComm*>(comm)) {
      if (!c) {
        f.world_->violation(std::string(what) + " on a null communicator");
        return;
      }
      ++c->in_call;
      std::lock_guard lock(f.world_->m);
      if (c->freed) f.world_->violations.push_back(std::string(what) + " on a freed communicator");
    }
    ~Call() {
      if (c) --c->in_call;
    }
    FakeComm* c;
  };

  static FakeComm* of(Comm comm) { return static_cast<FakeComm*>(comm); }

  // Under world_->m.
  FakeComm* make_comm(Group* g, int rank, int polls) {
    auto c = std::make_unique<FakeComm>();
    c->group = g;
    c->rank = rank;
    c->polls_left = polls;
    world_->comms.push_back(std::move(c));
    return world_->comms.back().get();
  }

  Status free(Comm comm, bool abort) {
    FakeComm* c = of(comm);
    if (abort && c->in_call.load() > 0) world_->violation("an abort while another call on the communicator ran");
    Call call(*this, comm, abort ? "abort" : "destroy");
    std::lock_guard lock(world_->m);
    c->freed = true;
    ++(abort ? world_->aborts : world_->destroys);
    return Status::success;
  }

  template <class Compute>
  Status collective(Comm comm, Stream& stream, const void* in, void* out, const char* what, Compute compute) {
    Call call(*this, comm, what);
    FakeComm* c = of(comm);
    {
      std::lock_guard lock(world_->m);
      if (depth_[std::this_thread::get_id()] <= 0) world_->violations.push_back(std::string(what) + " outside a group");
      if (c->polls_left > 0) world_->violations.push_back(std::string(what) + " before the communicator was ready");
      last_in_group_[std::this_thread::get_id()] = c;
    }
    const std::uint64_t seq = c->seq++;
    stream.enqueue([g = c->group, rank = c->rank, seq, in, out, compute, delay = knobs_.collective_delay] {
      if (delay.count() > 0) std::this_thread::sleep_for(delay);
      std::unique_lock lock(g->m);
      Slot& s = g->slots[seq];
      if (s.in.empty()) s.in.assign(static_cast<std::size_t>(g->size), nullptr);
      s.in[static_cast<std::size_t>(rank)] = in;
      ++s.arrived;
      g->cv.notify_all();
      if (!g->cv.wait_for(lock, std::chrono::seconds(20), [&] { return s.arrived == g->size; })) {
        throw Error(Errc::timeout, "fake collective: not every rank arrived");
      }
      const std::vector<char> result = compute(s, rank, g->size);
      ++s.left;
      g->cv.notify_all();
      g->cv.wait_for(lock, std::chrono::seconds(20), [&] { return s.left == g->size; });
      lock.unlock();
      std::memcpy(out, result.data(), result.size());
    });
    return Status::success;
  }

  // Element i < count: op over the ranks of in_r[offset + i] (f32), as bytes.
  std::vector<char> reduce(const Slot& s, int n, RedOp op, std::size_t count, std::size_t offset) {
    double factor = 1.0;
    {
      std::lock_guard lock(world_->m);
      if (op >= 100) {
        auto it = world_->factors.find(op);
        if (it == world_->factors.end()) {
          world_->violations.push_back("a premul_sum operator was destroyed before its collective ran");
        } else {
          factor = it->second;
        }
      }
    }
    std::vector<char> bytes(count * sizeof(float));
    auto* out = reinterpret_cast<float*>(bytes.data());
    for (std::size_t i = 0; i < count; ++i) {
      double acc = op == static_cast<RedOp>(Red::max) ? -1e300 : 0.0;
      for (int r = 0; r < n; ++r) {
        const double v = static_cast<const float*>(s.in[static_cast<std::size_t>(r)])[offset + i];
        acc = op == static_cast<RedOp>(Red::max) ? std::max(acc, v) : acc + v * factor;
      }
      if (op == static_cast<RedOp>(Red::avg)) acc /= n;
      out[i] = static_cast<float>(acc);
    }
    return bytes;
  }

  std::shared_ptr<World> world_;
  Knobs knobs_;
  int split_size_ = 1;
  std::map<std::thread::id, int> depth_;  // ncclGroupStart nesting, per calling thread
  std::map<std::thread::id, FakeComm*> last_in_group_;
};

}  // namespace coshard::testing
