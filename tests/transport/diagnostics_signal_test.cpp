// SIGUSR1 runs a rank's diagnostics on a thread of their own, and never kills the process.
#include "coshard/transport/diagnostics_signal.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "coshard/runtime/error.hpp"

namespace {

using namespace coshard;
using namespace std::chrono_literals;

bool eventually(const std::function<bool()>& ok) {
  for (auto until = std::chrono::steady_clock::now() + 5s; std::chrono::steady_clock::now() < until;) {
    if (ok()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return ok();
}

TEST(DiagnosticsSignal, Sigusr1RunsEveryRegisteredWriterUntilRemoved) {
  Runtime rt({});
  std::atomic<int> a{0}, b{0};
  const auto ia = rt.add_diagnostic([&] { ++a; });
  rt.add_diagnostic([&] {
    ++b;
    throw std::runtime_error("a failing writer does not stop the others");
  });
  transport::DiagnosticsSignal signal;
  {
    auto serving = signal.serve(rt);
    ::kill(::getpid(), SIGUSR1);  // to the process: any thread may take it, OpenBLAS's included
    EXPECT_TRUE(eventually([&] { return a == 1 && b == 1; }));
    rt.remove_diagnostic(ia);
    ::kill(::getpid(), SIGUSR1);
    EXPECT_TRUE(eventually([&] { return b == 2; }));
    EXPECT_EQ(a, 1);
  }
  ::kill(::getpid(), SIGUSR1);  // not served: dropped, and the process lives
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(b, 2);
}

TEST(DiagnosticsSignal, ASecondOneIsRefusedAndAfterBothSigusr1IsHarmless) {
  {
    transport::DiagnosticsSignal first;
    EXPECT_THROW(transport::DiagnosticsSignal second, Error);
  }
  transport::DiagnosticsSignal again;  // the first one's end freed the handler
  SUCCEED();
}

TEST(DiagnosticsSignal, AfterItEndsSigusr1IsIgnored) {
  { transport::DiagnosticsSignal s; }
  ::raise(SIGUSR1);  // default action would end the test binary
  SUCCEED();
}

}  // namespace
