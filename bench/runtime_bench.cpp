// Runtime micro-benchmarks. Each coshard figure is printed beside a baseline measured in the same
// run, so ratios survive a noisy machine:
//   TaskAwait        vs DirectCall          (coroutine create + await + resume vs a function call)
//   EventRoundTrip   vs AsioPostRoundTrip   (work to a stream, the awaiting task resumed after it;
//                                            what a user writes without coshard: asio::post to a
//                                            worker io_context and the completion posted back)
//                    vs CondvarPingPong     (the bare cost of two thread hand-offs)
//   EventResumeLatency                      (stream finishes the work -> awaiting task resumes)
//   StreamEnqueue    vs AsioPost            (host-side cost of handing work to another thread:
//                                            asio::post to a worker io_context)
//                    vs MutexDequePush      (a locked queue push, no thread behind it)
// Times are per operation (the "per_op" counter, in seconds; benchmark prints it scaled).
#include <benchmark/benchmark.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <future>

#include "coshard/runtime/scheduler.hpp"
#include "coshard/runtime/stream.hpp"

using namespace coshard;

namespace {

constexpr int kBatch = 10'000;

void per_op(benchmark::State& state, int ops_per_iteration) {
  state.counters["per_op"] = benchmark::Counter(static_cast<double>(state.iterations()) * ops_per_iteration,
                                                benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

Task<int> leaf(int v) { co_return v + 1; }

Task<long> await_many(int n) {
  long sum = 0;
  for (int i = 0; i < n; ++i) sum += co_await leaf(i);
  co_return sum;
}

void BM_TaskAwait(benchmark::State& state) {
  Scheduler sched;
  sched.start();
  for (auto _ : state) benchmark::DoNotOptimize(sched.sync_wait(await_many(kBatch)));
  per_op(state, kBatch);
}

__attribute__((noinline)) int leaf_fn(int v) { return v + 1; }

void BM_DirectCall_baseline(benchmark::State& state) {
  for (auto _ : state) {
    long sum = 0;
    for (int i = 0; i < kBatch; ++i) {
      sum += leaf_fn(i);
      benchmark::ClobberMemory();
    }
    benchmark::DoNotOptimize(sum);
  }
  per_op(state, kBatch);
}

constexpr int kRoundTrips = 1000;

Task<void> event_round_trips(Stream& stream, int n) {
  for (int i = 0; i < n; ++i) {
    stream.enqueue([] {});
    Event e;
    e.record(stream);
    co_await e;
  }
}

void BM_EventRoundTrip(benchmark::State& state) {
  Scheduler sched;
  sched.start();
  auto stream = Stream::cpu(Device::cpu(), "compute");
  for (auto _ : state) sched.sync_wait(event_round_trips(stream, kRoundTrips));
  per_op(state, kRoundTrips);
}

// The figure the runtime promises: from the moment a stream finishes the work before an event to
// the moment the awaiting task runs again on its scheduler (one cross-thread hand-off).
void BM_EventResumeLatency(benchmark::State& state) {
  Scheduler sched;
  sched.start();
  auto stream = Stream::cpu(Device::cpu(), "compute");
  for (auto _ : state) {
    auto seconds = sched.sync_wait([](Stream& s) -> Task<double> {
      double total = 0;
      for (int i = 0; i < kRoundTrips; ++i) {
        std::chrono::steady_clock::time_point done;
        s.enqueue([&done] { done = std::chrono::steady_clock::now(); });
        Event e;
        e.record(s);
        co_await e;
        total += std::chrono::duration<double>(std::chrono::steady_clock::now() - done).count();
      }
      co_return total;
    }(stream));
    state.SetIterationTime(seconds);
  }
  per_op(state, kRoundTrips);
}

// Two threads handing a token back and forth: the floor for any cross-thread completion.
void BM_CondvarPingPong_baseline(benchmark::State& state) {
  std::mutex m;
  std::condition_variable cv;
  int turn = 0;  // 0: main's turn, 1: worker's turn, 2: stop
  std::thread worker([&] {
    std::unique_lock lock(m);
    for (;;) {
      cv.wait(lock, [&] { return turn != 0; });
      if (turn == 2) return;
      turn = 0;
      cv.notify_all();
    }
  });
  for (auto _ : state) {
    for (int i = 0; i < kRoundTrips; ++i) {
      std::unique_lock lock(m);
      turn = 1;
      cv.notify_all();
      cv.wait(lock, [&] { return turn == 0; });
    }
  }
  {
    std::lock_guard lock(m);
    turn = 2;
  }
  cv.notify_all();
  worker.join();
  per_op(state, kRoundTrips);
}

// An io_context run by a worker thread, as a user would set one up for background work.
struct AsioWorker {
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> guard = asio::make_work_guard(io);
  std::thread thread{[this] { io.run(); }};
  ~AsioWorker() {
    guard.reset();
    thread.join();
  }
  void drain() {  // returns once everything posted so far has run
    std::promise<void> done;
    asio::post(io, [&done] { done.set_value(); });
    done.get_future().wait();
  }
};

void BM_AsioPostRoundTrip_baseline(benchmark::State& state) {
  AsioWorker worker;
  asio::io_context caller;
  auto guard = asio::make_work_guard(caller);
  for (auto _ : state) {
    for (int i = 0; i < kRoundTrips; ++i) {
      asio::post(worker.io, [&caller] { asio::post(caller, [] {}); });
      caller.run_one();  // the completion, back on the caller's thread
    }
  }
  per_op(state, kRoundTrips);
}

void BM_AsioPost_baseline(benchmark::State& state) {
  AsioWorker worker;
  for (auto _ : state) {
    for (int i = 0; i < kBatch; ++i) asio::post(worker.io, [] {});
    state.PauseTiming();
    worker.drain();
    state.ResumeTiming();
  }
  per_op(state, kBatch);
}

void BM_StreamEnqueue(benchmark::State& state) {
  auto stream = Stream::cpu(Device::cpu(), "compute");
  for (auto _ : state) {
    for (int i = 0; i < kBatch; ++i) stream.enqueue([] {});
    state.PauseTiming();
    stream.synchronize();
    state.ResumeTiming();
  }
  per_op(state, kBatch);
}

void BM_MutexDequePush_baseline(benchmark::State& state) {
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::function<void()>> q;
  for (auto _ : state) {
    for (int i = 0; i < kBatch; ++i) {
      {
        std::lock_guard lock(m);
        q.emplace_back([] {});
      }
      cv.notify_one();
    }
    state.PauseTiming();
    q.clear();
    state.ResumeTiming();
  }
  per_op(state, kBatch);
}

BENCHMARK(BM_TaskAwait)->UseRealTime();
BENCHMARK(BM_DirectCall_baseline)->UseRealTime();
BENCHMARK(BM_EventRoundTrip)->UseRealTime();
BENCHMARK(BM_AsioPostRoundTrip_baseline)->UseRealTime();
BENCHMARK(BM_EventResumeLatency)->UseManualTime();
BENCHMARK(BM_CondvarPingPong_baseline)->UseRealTime();
BENCHMARK(BM_StreamEnqueue)->UseRealTime();
BENCHMARK(BM_AsioPost_baseline)->UseRealTime();
BENCHMARK(BM_MutexDequePush_baseline)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
