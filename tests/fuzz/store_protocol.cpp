// A real store server fed any bytes over loopback, as a broken or hostile client would send them:
// it must answer or drop the client, never crash or hang, and keep serving.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "coshard/runtime/scheduler.hpp"
#include "coshard/launch/store.hpp"
#include "fuzz_input.hpp"
#include "store_protocol.hpp"

using namespace coshard;
using namespace std::chrono_literals;

namespace {

constexpr const char* kToken = "fuzz";

struct Server {
  Scheduler sched;
  std::unique_ptr<launch::StoreServer> server;
  Server() {
    sched.start();
    launch::StoreServer::Options o;
    o.token = kToken;
    o.port = 0;
    o.bind_address = "127.0.0.1";
    o.handshake_timeout = 100ms;
    o.limits.max_message_bytes = 1 << 16;
    o.limits.max_wait = 20ms;  // a fuzzed wait must not hold its session for long
    server = std::make_unique<launch::StoreServer>(sched, o);
  }
};

// connect(), which libFuzzer's once-a-second SIGALRM may interrupt: the connection then goes on in
// the background, so wait until it is writable (EINTR again a retry, within 5 s) and read how it
// ended.
bool connect_to(int fd, const sockaddr_in& a) {
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0) return true;
  if (errno != EINTR) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  pollfd p{fd, POLLOUT, 0};
  int r;
  while ((r = ::poll(&p, 1, 5000)) < 0 && errno == EINTR && std::chrono::steady_clock::now() < deadline) {
  }
  if (r <= 0) return false;
  int err = 0;
  socklen_t len = sizeof err;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return false;
  errno = err;
  return err == 0;
}

// Sends `bytes`, closes the sending side and reads until the server closes. The server answers a
// wait within 20 ms and drops a silent client within 100 ms, so a connection still open after 5 s
// (or a refused one) is a hung or dead server: abort, which libFuzzer reports with the input.
void exchange(std::uint16_t port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect_to(fd, a)) {
    for (std::size_t sent = 0; sent < bytes.size();) {
      const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      sent += static_cast<std::size_t>(n);
    }
    ::shutdown(fd, SHUT_WR);
    // libFuzzer's once-a-second SIGALRM (its -timeout check) interrupts recv: EINTR is a retry,
    // bounded by the same 5 s overall, not a hung server.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0 ||
           (n < 0 && errno == EINTR && std::chrono::steady_clock::now() < deadline)) {
    }
    if (n < 0 && errno != ECONNRESET) {
      std::fprintf(stderr, "the store kept the connection open for 5 s: %s\n", std::strerror(errno));
      std::abort();
    }
  } else {
    std::fprintf(stderr, "the store refused a connection: %s\n", std::strerror(errno));
    std::abort();
  }
  ::close(fd);
}

// The handshake frame, laid out as store_protocol.hpp's Writer does (u32 frame length, op, u32
// token length, token); written out here because GCC 12 misreads the Writer inlined into this file.
std::string hello_frame() {
  std::string body(1, static_cast<char>(launch::wire::Op::hello));
  const std::uint32_t n = static_cast<std::uint32_t>(std::strlen(kToken));
  body.append(reinterpret_cast<const char*>(&n), 4).append(kToken);
  const std::uint32_t len = static_cast<std::uint32_t>(body.size());
  return std::string(reinterpret_cast<const char*>(&len), 4) + body;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Server s;  // one per process: libFuzzer calls this many times
  std::string bytes;
  if (size > 0 && (data[0] & 1)) {  // past the handshake, so that the requests are parsed
    bytes = hello_frame();
  }
  if (size > 0) bytes.append(reinterpret_cast<const char*>(data) + 1, size - 1);
  exchange(s.server->port(), bytes);
  return 0;
}
