// The NCCL communicator's own logic over a fake NCCL (fake_nccl.hpp) on CPU ranks: every machine
// runs these, GPU or not. Each test guards one way the communicator broke NCCL's rules or its
// own contract; the fake records every breach, and the tests expect none.
#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "coshard/runtime/copy.hpp"
#include "coshard/runtime/when_all.hpp"
#include "coshard/launch/store.hpp"
#include "fake_nccl.hpp"
#include "refusals.hpp"

using namespace coshard;
using namespace coshard::transport;
using namespace coshard::launch;
using coshard::testing::FakeNccl;
using namespace std::chrono_literals;

namespace {

using Body = std::function<Task<void>(int rank, Runtime& rt, StoreClient* store, std::shared_ptr<FakeNccl> api)>;

// A job of `ranks` threads, each with a CPU Runtime, a client of one store and a FakeNccl of one world.
class FakeJob {
 public:
  FakeJob() {
    server_sched_.start();
    StoreServer::Options o;
    o.token = "nccl";
    server_ = std::make_unique<StoreServer>(server_sched_, o);
  }
  ~FakeJob() { server_->stop(); }

  std::shared_ptr<FakeNccl::World> world = std::make_shared<FakeNccl::World>();

  void run(int ranks, FakeNccl::Knobs knobs, const Body& body) {
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        try {
          Runtime rt({.name = "fake-nccl", .rank = r, .shared_host_memory = false});
          StoreClient::Options so;
          so.port = server_->port();
          so.token = "nccl";
          so.connect_timeout = 5s;
          so.op_timeout = 20s;
          auto store = rt.scheduler().sync_wait(StoreClient::connect(so));
          auto api = std::make_shared<FakeNccl>(world, knobs);
          api->set_split_size(ranks);
          rt.scheduler().sync_wait(body(r, rt, store.get(), api));
        } catch (...) {
          errors[static_cast<std::size_t>(r)] = std::current_exception();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (auto& e : errors) {
      if (e) std::rethrow_exception(e);
    }
  }

  std::vector<std::string> violations() {
    std::lock_guard lock(world->m);
    return world->violations;
  }

 private:
  Scheduler server_sched_;
  std::unique_ptr<StoreServer> server_;
};

CommOptions named(std::string name, std::chrono::milliseconds timeout = 20s) {
  CommOptions o;
  o.name = std::move(name);
  o.timeout = timeout;
  return o;
}

Task<std::unique_ptr<Communicator>> make(std::shared_ptr<FakeNccl> api, Runtime& rt, StoreClient* store, int rank,
                                         int size, CommOptions options) {
  co_return co_await transport::detail::create_nccl_communicator(std::move(api), rt, store, rank, size, std::move(options));
}

// The communicator "world" of `size` ranks over the fake.
Task<std::unique_ptr<Communicator>> world(std::shared_ptr<FakeNccl> api, Runtime& rt, StoreClient* store, int rank,
                                          int size) {
  CommOptions options = named("world");
  co_return co_await make(std::move(api), rt, store, rank, size, std::move(options));
}

Tensor values(Runtime& rt, const std::vector<float>& v) {
  Tensor t = Tensor::empty(rt.allocator(), DType::f32, {static_cast<std::int64_t>(v.size())});
  upload(rt.stream("compute"), t, v);
  return t;
}

// `value` all-reduced over `c`, as the host reads it back.
Task<std::vector<float>> all_reduced(Communicator& c, Runtime& rt, float value, Reduction reduction) {
  Tensor t = values(rt, {value});
  co_await c.all_reduce(t, reduction, rt.stream("compute"));
  co_return co_await download<float>(rt.stream("compute"), t);
}

// Every collective, with in-progress creation and enqueues, against values computed here; all of
// them inside ncclGroupStart/End (the fake flags a collective outside a group).
TEST(NcclLogic, CollectivesOnFourRanksEqualTheHostResult) {
  FakeJob job;
  job.run(4, {.init_polls = 3, .enqueue_polls = 2}, [](int rank, Runtime& rt, StoreClient* store, auto api) -> Task<void> {
    auto c = co_await world(api, rt, store, rank, 4);
    Stream& s = rt.stream("compute");
    const auto r = static_cast<float>(rank);
    Tensor sum = values(rt, {r, 2 * r});
    Tensor avg = values(rt, {r, 1});
    Tensor max = values(rt, {r, -r});
    Tensor pre = values(rt, {r, 1});
    Tensor rs_in = values(rt, {r, r, r, r, r, r, r, r});
    Tensor rs_out = values(rt, {0, 0});
    Tensor ag_in = values(rt, {r});
    Tensor ag_out = values(rt, {0, 0, 0, 0});
    Tensor bc = values(rt, {r + 10});
    co_await c->all_reduce(sum, Reduction::sum(), s);
    co_await c->all_reduce(avg, Reduction::avg(), s);
    co_await c->all_reduce(max, Reduction::max(), s);
    co_await c->all_reduce(pre, Reduction::premul_sum(0.5), s);
    co_await c->reduce_scatter(rs_in, rs_out, Reduction::sum(), s);
    co_await c->all_gather(ag_in, ag_out, s);
    co_await c->broadcast(bc, 2, s);
    co_await c->barrier(s);
    const std::vector<float> got1 = co_await download<float>(s, sum);
    EXPECT_EQ(got1, (std::vector<float>{6, 12}));
    const std::vector<float> got2 = co_await download<float>(s, avg);
    EXPECT_EQ(got2, (std::vector<float>{1.5f, 1}));
    const std::vector<float> got3 = co_await download<float>(s, max);
    EXPECT_EQ(got3, (std::vector<float>{3, 0}));
    const std::vector<float> got4 = co_await download<float>(s, pre);
    EXPECT_EQ(got4, (std::vector<float>{3, 2}));
    const std::vector<float> got5 = co_await download<float>(s, rs_out);
    EXPECT_EQ(got5, (std::vector<float>{6, 6}));
    const std::vector<float> got6 = co_await download<float>(s, ag_out);
    EXPECT_EQ(got6, (std::vector<float>{0, 1, 2, 3}));
    const std::vector<float> got7 = co_await download<float>(s, bc);
    EXPECT_EQ(got7, (std::vector<float>{12}));
  });
  EXPECT_TRUE(job.violations().empty()) << job.violations().front();
}

// The calls every communicator refuses (refusals.hpp) reach no NCCL call, and the group goes on:
// the all-reduce after them is the ranks' first, and sums.
TEST(NcclLogic, BadCallsAreRefusedBeforeNcclAndTheGroupGoesOn) {
  FakeJob job;
  job.run(2, {}, [](int rank, Runtime& rt, StoreClient* store, auto api) -> Task<void> {
    auto c = co_await world(api, rt, store, rank, 2);
    coshard::testing::expect_refusals(*c, rt);
    const std::vector<float> got = co_await all_reduced(*c, rt, static_cast<float>(rank + 1), Reduction::sum());
    EXPECT_EQ(got, (std::vector<float>{3}));
    EXPECT_NE(c->flight_record_json().find("{\"seq\":0,\"op\":\"all_reduce\""), std::string::npos);
  });
  EXPECT_TRUE(job.violations().empty()) << job.violations().front();
}

// A dead peer: the watchdog aborts the communicator, later operations fail with the reason, and
// the destructor does not free it a second time (ncclCommAbort ran twice before).
TEST(NcclLogic, AnAbortedCommunicatorIsFreedOnce) {
  FakeJob job;
  job.run(2, {}, [](int rank, Runtime& rt, StoreClient* store, auto api) -> Task<void> {
    auto c = co_await world(api, rt, store, rank, 2);
    api->fail_peers();
    co_await sleep_for(300ms);  // the watchdog polls every 100 ms
    try {
      c->barrier(rt.stream("compute"));
      ADD_FAILURE() << "an operation on an aborted communicator was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::peer_lost) << e.what();
    }
    c.reset();
  });
  EXPECT_TRUE(job.violations().empty()) << job.violations().front();
  EXPECT_EQ(job.world->aborts, 2);
  EXPECT_EQ(job.world->destroys, 0);
}

// A non-blocking split is done when the new communicator is (the parent was polled before).
TEST(NcclLogic, SplitWaitsForTheNewCommunicator) {
  FakeJob job;
  job.run(2, {.split_polls = 5}, [](int rank, Runtime& rt, StoreClient* store, auto api) -> Task<void> {
    auto c = co_await world(api, rt, store, rank, 2);
    CommOptions shard = named("world.shard");
    auto sub = co_await c->split(0, rank, std::move(shard));
    const std::vector<float> got = co_await all_reduced(*sub, rt, 1, Reduction::sum());
    EXPECT_EQ(got, (std::vector<float>{2}));
  });
  EXPECT_TRUE(job.violations().empty()) << job.violations().front();
}

// A collective issued on the parent while a split of it is in progress (another task of the
// scheduler) is refused with an error that says so, and the parent works once the split is done.
TEST(NcclLogic, ACollectiveDuringASplitIsRefusedAndTheParentStillWorks) {
  FakeJob job;
  job.run(2, {.split_polls = 20}, [](int rank, Runtime& rt, StoreClient* store, auto api) -> Task<void> {
    auto c = co_await world(api, rt, store, rank, 2);
    auto splitting = [](Communicator& parent, int r) -> Task<std::unique_ptr<Communicator>> {
      CommOptions shard = named("world.shard");
      co_return co_await parent.split(0, r, std::move(shard));
    };
    auto meddling = [](Communicator& parent, Runtime& runtime) -> Task<std::string> {
      co_await sleep_for(2ms);  // the split is polling by now
      try {
        parent.barrier(runtime.stream("compute"));
      } catch (const Error& e) {
        co_return e.what();
      }
      co_return "accepted";
    };
    auto split_task = splitting(*c, rank);  // named: GCC 12 and temporaries inside co_await
    auto meddling_task = meddling(*c, rt);
    auto [sub, refused] = co_await when_all(std::move(split_task), std::move(meddling_task));
    EXPECT_NE(refused.find("while a split of this communicator is in progress"), std::string::npos) << refused;
    const std::vector<float> got = co_await all_reduced(*c, rt, 1, Reduction::sum());
    EXPECT_EQ(got, (std::vector<float>{2}));
    const std::vector<float> sub_got = co_await all_reduced(*sub, rt, 1, Reduction::sum());
    EXPECT_EQ(sub_got, (std::vector<float>{2}));
  });
  EXPECT_TRUE(job.violations().empty()) << job.violations().front();
}

// A premul_sum operator is destroyed after its collective ran, not right after the enqueue.
TEST(NcclLogic, APremulSumOperatorLivesUntilItsCollectiveRan) {
  FakeJob job;
  job.run(2, {.collective_delay = 50ms}, [](int rank, Runtime& rt, StoreClient* store, auto api) -> Task<void> {
    auto c = co_await world(api, rt, store, rank, 2);
    const std::vector<float> got = co_await all_reduced(*c, rt, 4, Reduction::premul_sum(0.25));
    EXPECT_EQ(got, (std::vector<float>{2}));
  });
  EXPECT_TRUE(job.violations().empty()) << job.violations().front();
  EXPECT_TRUE(job.world->factors.empty()) << "every operator is destroyed by the end";
}

// Two communicators of one name, one after the other: the second gets its own unique id, even
// when a rank asks for it before rank 0 made it (the store key had no generation).
TEST(NcclLogic, ASecondCommunicatorOfTheSameNameGetsItsOwnId) {
  FakeJob job;
  job.run(2, {}, [](int rank, Runtime& rt, StoreClient* store, auto api) -> Task<void> {
    for (int round = 0; round < 2; ++round) {
      if (rank == 0 && round == 1) co_await sleep_for(200ms);  // rank 1 looks for the id first
      auto c = co_await world(api, rt, store, rank, 2);
      const std::vector<float> got = co_await all_reduced(*c, rt, 1, Reduction::sum());
      EXPECT_EQ(got, (std::vector<float>{2})) << "round " << round;
    }
  });
  EXPECT_TRUE(job.violations().empty()) << job.violations().front();
}

// A caller may drop its tensors once it issued the collective: their blocks are not reused (by
// the next allocation of the size) until the collective completes.
TEST(NcclLogic, TensorsStayAliveUntilTheirCollectiveCompletes) {
  FakeJob job;
  job.run(2, {.collective_delay = 100ms}, [](int rank, Runtime& rt, StoreClient* store, auto api) -> Task<void> {
    auto c = co_await world(api, rt, store, rank, 2);
    Stream& s = rt.stream("compute");
    Event done;
    void* dropped = nullptr;
    {
      Tensor in = Tensor::empty(rt.allocator(), DType::f32, {256});
      Tensor out = Tensor::empty(rt.allocator(), DType::f32, {512});
      fill_zero(s, in);
      dropped = out.data();
      done = c->all_gather(in, out, s);
    }
    Tensor again = Tensor::empty(rt.allocator(), DType::f32, {512});
    EXPECT_NE(again.data(), dropped) << "the output's block was handed out while the collective still wrote it";
    co_await done;
  });
  EXPECT_TRUE(job.violations().empty()) << job.violations().front();
}

// CommOptions::before_op runs on the communicator's stream, right before the operation, as UCX
// runs it (it ran on the issuing thread).
TEST(NcclLogic, BeforeOpRunsOnTheCommunicatorsStream) {
  FakeJob job;
  job.run(2, {}, [](int rank, Runtime& rt, StoreClient* store, auto api) -> Task<void> {
    auto seen = std::make_shared<std::thread::id>();
    CommOptions o = named("world");
    o.before_op = [seen](const OpInfo&) { *seen = std::this_thread::get_id(); };
    auto c = co_await make(api, rt, store, rank, 2, std::move(o));
    co_await c->barrier(rt.stream("compute"));
    auto stream_thread = std::make_shared<std::thread::id>();
    c->stream().enqueue([stream_thread] { *stream_thread = std::this_thread::get_id(); });
    Event e;
    e.record(c->stream());
    co_await e;
    EXPECT_EQ(*seen, *stream_thread);
    EXPECT_NE(*seen, std::this_thread::get_id());
  });
}

// An abort from another thread waits for the watchdog's call on the communicator to return: it
// freed the communicator under it before.
TEST(NcclLogic, AnAbortDoesNotFreeTheCommunicatorUnderTheWatchdog) {
  FakeJob job;
  job.run(1, {.async_error_delay = 150ms}, [](int rank, Runtime& rt, StoreClient* store, auto api) -> Task<void> {
    auto c = co_await world(api, rt, store, rank, 1);
    co_await sleep_for(130ms);  // the watchdog's first poll (at 100 ms) is in async_error until 250 ms
    c->abort(Error(Errc::cancelled, "the test aborts"));
  });
  EXPECT_TRUE(job.violations().empty()) << job.violations().front();
  EXPECT_EQ(job.world->aborts, 1);
}

// An enqueue that NCCL never finishes ends as soon as the communicator is aborted, not at the
// operation timeout (it spun on the issuing thread for the whole timeout).
TEST(NcclLogic, AnEnqueueInProgressEndsWhenTheCommunicatorIsAborted) {
  FakeJob job;
  job.run(1, {.enqueue_polls = 1 << 30}, [](int rank, Runtime& rt, StoreClient* store, auto api) -> Task<void> {
    CommOptions options = named("world", 60s);
    auto c = co_await make(api, rt, store, rank, 1, std::move(options));
    std::thread aborter([&c] {
      std::this_thread::sleep_for(200ms);
      c->abort(Error(Errc::cancelled, "the test aborts"));
    });
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c->barrier(rt.stream("compute"));
      ADD_FAILURE() << "the enqueue completed";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::cancelled) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
    aborter.join();
    co_return;
  });
  EXPECT_TRUE(job.violations().empty()) << job.violations().front();
}

}  // namespace
