// SIGUSR2 records a stop request while a StopSignal lives, says so to coshard-run through a marker
// file, and never kills the process afterwards.
#include "coshard/launch/stop_signal.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "coshard/runtime/error.hpp"

namespace {

using namespace coshard;
namespace fs = std::filesystem;

bool eventually_requested(const launch::StopSignal& s) {
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5); std::chrono::steady_clock::now() < until;) {
    if (s.requested()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return s.requested();
}

TEST(StopSignal, Sigusr2IsRecordedAndTheMarkerLivesAsLongAsTheHandler) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("stop-signal-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  ::setenv("COSHARD_FLIGHT_DIR", dir.c_str(), 1);
  const fs::path marker = dir / launch::signal_marker_name(SIGUSR2, ::getpid());
  {
    launch::StopSignal stop;
    ::unsetenv("COSHARD_FLIGHT_DIR");
    EXPECT_TRUE(fs::exists(marker));
    EXPECT_FALSE(stop.requested());
    ::kill(::getpid(), SIGUSR2);  // to the process: any thread may take it
    EXPECT_TRUE(eventually_requested(stop));
  }
  EXPECT_FALSE(fs::exists(marker));
  ::raise(SIGUSR2);  // ignored now: the default action would end the test binary
  launch::StopSignal again;  // the first one's end freed the handler, and the request died with it
  EXPECT_FALSE(again.requested());
  fs::remove_all(dir);
}

TEST(StopSignal, ASecondOneIsRefused) {
  launch::StopSignal first;
  EXPECT_THROW(launch::StopSignal second, Error);
  ::raise(SIGUSR2);
  EXPECT_TRUE(eventually_requested(first));  // the refused one did not take the handler
}

TEST(SignalMarker, NamesOnlyTheSignalsCoshardRunSends) {
  EXPECT_EQ(launch::signal_marker_name(SIGUSR1, 42), "coshard-sigusr1-42");
  EXPECT_EQ(launch::signal_marker_name(SIGUSR2, 42), "coshard-sigusr2-42");
  EXPECT_THROW(launch::signal_marker_name(SIGTERM, 42), Error);
}

}  // namespace
