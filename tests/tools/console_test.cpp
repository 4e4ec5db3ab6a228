// coshard-run's output queue: written without ever blocking, a page at a time ending at a line's
// end, nothing lost or reordered, and a reader that ended said once.
#include "console.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <string>

#include "coshard/runtime/unique_fd.hpp"

namespace {

using coshard::make_pipe;
using coshard::UniqueFd;
using coshard::run::LineSink;

struct Pipe {
  std::array<UniqueFd, 2> ends = make_pipe(O_CLOEXEC);
  int write() const { return ends[1].get(); }
  Pipe() {
    EXPECT_TRUE(ends[0]) << std::strerror(errno);
    ::fcntl(write(), F_SETPIPE_SZ, 4096);  // one page: the smallest pipe, full after one write
    ::fcntl(ends[0].get(), F_SETFL, O_NONBLOCK);
  }
  std::string take() const {
    std::string got;
    char buf[65536];
    for (ssize_t n; (n = ::read(ends[0].get(), buf, sizeof buf)) > 0;) got.append(buf, static_cast<std::size_t>(n));
    return got;
  }
};

TEST(Console, LinesWaitForAFullPipeWithoutBlockingAndComeOutWholeAndInOrder) {
  Pipe p;
  LineSink sink(p.write(), "stdout");
  std::string all;
  for (int i = 0; i < 2000; ++i) all += "[rank 0] line " + std::to_string(i) + "\n";
  sink.add(all);
  ASSERT_FALSE(sink.write_ready());  // returns although the pipe takes one page of some 40
  EXPECT_FALSE(sink.idle());
  EXPECT_TRUE(sink.has_room());
  std::string got = p.take();
  ASSERT_FALSE(got.empty());
  EXPECT_LE(got.size(), 4096u);
  EXPECT_EQ(got.back(), '\n') << "a write ended inside a line: " << got.substr(got.size() - 40);
  for (int turns = 0; !sink.idle() && turns < 1000; ++turns) {
    ASSERT_FALSE(sink.write_ready());
    const std::string more = p.take();
    if (!more.empty()) {
      EXPECT_EQ(more.back(), '\n');
    }
    got += more;
  }
  EXPECT_TRUE(sink.idle());
  EXPECT_EQ(got, all);
}

TEST(Console, AReaderThatEndedIsSaidOnceAndLaterLinesAreDropped) {
  Pipe p;
  p.ends[0].reset();
  LineSink sink(p.write(), "stdout");
  ::signal(SIGPIPE, SIG_IGN);  // its default would end this test; coshard-run blocks it
  sink.add("[rank 0] first\n");
  const auto said = sink.write_ready();
  ASSERT_TRUE(said);
  EXPECT_NE(said->find("the ranks' stdout is a closed pipe (its reader ended)"), std::string::npos) << *said;
  EXPECT_TRUE(sink.idle());
  sink.add("[rank 0] second\n");
  EXPECT_TRUE(sink.idle());
  EXPECT_FALSE(sink.write_ready());
}

}  // namespace
