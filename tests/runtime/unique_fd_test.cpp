// The one owner of a file descriptor: closes exactly once, whoever ends up holding it; gives it up
// on release; keeps the errno a caller is about to report; a pipe's ends come with their flags.
#include "coshard/runtime/unique_fd.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <utility>
#include <vector>

namespace {

using coshard::make_pipe;
using coshard::UniqueFd;

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

TEST(UniqueFd, ClosesOnceWhereverItWasMovedTo) {
  const int raw = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(raw, 0);
  {
    UniqueFd a(raw);
    UniqueFd b(std::move(a));
    EXPECT_FALSE(a);  // a moved-from owner holds none
    EXPECT_EQ(b.get(), raw);
    UniqueFd c;
    c = std::move(b);
    EXPECT_TRUE(is_open(raw));
    UniqueFd& same = c;
    c = std::move(same);  // a self-move keeps it
    EXPECT_TRUE(is_open(raw));
  }
  EXPECT_FALSE(is_open(raw));
}

TEST(UniqueFd, AssigningOverAnOwnerClosesWhatItHeld) {
  UniqueFd a(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  const int first = a.get();
  a = UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  EXPECT_NE(a.get(), first);
  EXPECT_FALSE(is_open(first));
  EXPECT_TRUE(is_open(a.get()));
}

TEST(UniqueFd, ReleaseGivesItUpOpen) {
  int raw = -1;
  {
    UniqueFd a(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    raw = a.release();
    EXPECT_FALSE(a);
  }
  EXPECT_TRUE(is_open(raw));
  EXPECT_TRUE(UniqueFd(raw).close());
  EXPECT_FALSE(is_open(raw));
}

TEST(UniqueFd, AFailedOpenIsNone) {
  const UniqueFd missing(::open("/nonexistent/coshard-unique-fd-test", O_RDONLY));
  EXPECT_FALSE(missing);
  EXPECT_EQ(missing.get(), -1);
  UniqueFd none;
  EXPECT_TRUE(none.close());  // nothing to close: no failure
}

// A close that fails (here: the descriptor was closed behind the owner's back, EBADF) leaves the
// errno of what the caller is reporting, and close() says it failed.
TEST(UniqueFd, AFailedCloseKeepsErrnoOnResetAndIsSaidByClose) {
  const int raw = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  UniqueFd a(raw);
  ASSERT_EQ(::close(raw), 0);
  errno = ENOSPC;  // what a failed write left
  a.reset();
  EXPECT_EQ(errno, ENOSPC);
  const int again = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  UniqueFd b(again);
  ASSERT_EQ(::close(again), 0);
  EXPECT_FALSE(b.close());
  EXPECT_EQ(errno, EBADF);
}

TEST(UniqueFd, APipesEndsCarryTheFlagsAndConnect) {
  auto [read, write] = make_pipe(O_CLOEXEC | O_NONBLOCK);
  ASSERT_TRUE(read);
  ASSERT_TRUE(write);
  EXPECT_TRUE(::fcntl(read.get(), F_GETFD) & FD_CLOEXEC);
  EXPECT_TRUE(::fcntl(write.get(), F_GETFL) & O_NONBLOCK);
  char byte = 0;
  EXPECT_EQ(::read(read.get(), &byte, 1), -1);  // empty, and does not block
  EXPECT_EQ(errno, EAGAIN);
  ASSERT_EQ(::write(write.get(), "x", 1), 1);
  ASSERT_EQ(::read(read.get(), &byte, 1), 1);
  EXPECT_EQ(byte, 'x');
}

TEST(UniqueFd, APipeThatCannotBeMadeIsTwoNonesWithErrno) {
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  std::vector<UniqueFd> filler;
  rlimit tight = old;
  tight.rlim_cur = 64;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  const auto open_one = [] { return UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC)); };
  for (UniqueFd fd = open_one(); fd; fd = open_one()) filler.push_back(std::move(fd));
  auto ends = make_pipe(O_CLOEXEC);
  const int err = errno;
  filler.clear();
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  EXPECT_FALSE(ends[0]);
  EXPECT_FALSE(ends[1]);
  EXPECT_EQ(err, EMFILE);
}

}  // namespace
