#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <limits>
#include <random>
#include <thread>

#include "coshard/runtime/error.hpp"
#include "coshard/runtime/timeout.hpp"
#include "coshard/runtime/when_all.hpp"
#include "coshard/launch/store.hpp"
#include "support/loopback.hpp"

using namespace coshard;
using namespace coshard::launch;
using namespace std::chrono_literals;

namespace {

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_sched.start();
    client_sched.start();
  }
  std::unique_ptr<StoreServer> serve(std::string token = "t0k", std::uint16_t port = 0) {
    StoreServer::Options o;
    o.token = std::move(token);
    o.port = port;
    o.handshake_timeout = 100ms;
    o.limits.max_message_bytes = 1 << 20;
    return std::make_unique<StoreServer>(server_sched, o);
  }
  StoreClient::Options client_options(std::uint16_t port, std::string token = "t0k") {
    StoreClient::Options o;
    o.port = port;
    o.token = std::move(token);
    o.connect_timeout = 5s;
    o.op_timeout = 10s;
    o.limits.max_message_bytes = 1 << 20;
    return o;
  }
  Scheduler server_sched;
  Scheduler client_sched;
};

// Sends raw bytes to the server, as a broken or hostile client would; returns what came back.
std::string raw_exchange(std::uint16_t port, const std::string& bytes) {
  return coshard::testing::loopback_exchange(port, bytes, 3);
}

TEST_F(StoreTest, SetGetAddCompareSetErase) {
  auto server = serve();
  auto body = [](StoreClient::Options o) -> Task<bool> {
    auto c = co_await StoreClient::connect(o);
    co_await c->set("a", "1");
    bool ok = (co_await c->get("a")) == std::optional<std::string>("1");
    ok = ok && !(co_await c->get("missing")).has_value();
    ok = ok && co_await c->add("n", 5) == 5 && co_await c->add("n", -2) == 3;
    ok = ok && co_await c->compare_set("leader", "", "rank0") == "rank0";
    ok = ok && co_await c->compare_set("leader", "", "rank1") == "rank0";  // already taken
    ok = ok && co_await c->compare_set("leader", "rank0", "rank2") == "rank2";
    ok = ok && co_await c->erase("a") && !(co_await c->erase("a"));
    std::string big(100000, 'x');
    co_await c->set("big", big);
    ok = ok && (co_await c->get("big")) == big;
    co_return ok;
  };
  EXPECT_TRUE(client_sched.sync_wait(body(client_options(server->port()))));
}

TEST_F(StoreTest, AnAddThatOverflowsIsRefusedAndTheValueKept) {
  auto server = serve();
  auto r = client_sched.sync_wait([](StoreClient::Options o) -> Task<std::string> {
    auto c = co_await StoreClient::connect(o);
    co_await c->add("n", std::numeric_limits<std::int64_t>::max());
    std::string why;
    try {
      co_await c->add("n", 1);
    } catch (const Error& e) {
      why = e.what();
    }
    co_return why + "|" + (co_await c->get("n")).value_or("?");
  }(client_options(server->port())));
  EXPECT_NE(r.find("overflows a 64-bit integer"), std::string::npos) << r;
  EXPECT_NE(r.find("|" + std::to_string(std::numeric_limits<std::int64_t>::max())), std::string::npos) << r;
}

// get_many answers each key as get would, in order, and the connection serves on after it; values
// that would pass the frame bound are refused by name, and the store keeps serving.
TEST_F(StoreTest, GetManyAnswersEachKeyAsGetWouldInOneCall) {
  auto server = serve();
  auto r = client_sched.sync_wait([](StoreClient::Options o) -> Task<std::string> {
    o.key_prefix = "job/";
    auto c = co_await StoreClient::connect(o);
    co_await c->set("a", "1");
    co_await c->set("b", "");
    co_await c->set("big", std::string(600000, 'x'));
    // Named vectors: GCC 12 cannot take a braced list as an argument inside co_await.
    std::vector<std::string> some = {"a", "missing", "b", "a"}, none, twice = {"big", "big"};
    std::string out;
    for (const auto& v : co_await c->get_many(some)) out += v ? "[" + *v + "]" : "-";
    out += (co_await c->get_many(none)).empty() ? " none" : " ?";
    try {
      co_await c->get_many(twice);
      out += " too-big-read";
    } catch (const Error& e) {
      out += std::string(" ") + (e.code() == Errc::invalid_argument ? "refused: " : "?: ") + e.what();
    }
    out += " " + (co_await c->get("a")).value_or("?");
    co_return out;
  }(client_options(server->port())));
  EXPECT_EQ(r.substr(0, 15), "[1]-[][1] none ") << r;
  EXPECT_NE(r.find("refused: coshard invalid_argument: store get of 2 key(s): the values of 2 keys take more than a "
                   "frame's 1048576 bytes: ask for fewer keys"),
            std::string::npos) << r;
  EXPECT_EQ(r.substr(r.size() - 2), " 1") << r;
}

TEST_F(StoreTest, WaitReturnsOnceAnotherClientSetsTheKeys) {
  auto server = serve();
  Scheduler other;
  other.start();
  std::thread setter([&] {
    other.sync_wait([](StoreClient::Options o) -> Task<void> {
      auto c = co_await StoreClient::connect(o);
      co_await sleep_for(50ms);
      co_await c->set("addr/1", "B");
      co_await c->set("addr/0", "A");
    }(client_options(server->port())));
  });
  auto values = client_sched.sync_wait([](StoreClient::Options o) -> Task<std::vector<std::string>> {
    auto c = co_await StoreClient::connect(o);
    std::vector<std::string> keys{"addr/0", "addr/1"};
    auto v = co_await c->wait(std::move(keys), 5000ms);
    co_return v;
  }(client_options(server->port())));
  setter.join();
  EXPECT_EQ(values, (std::vector<std::string>{"A", "B"}));
}

TEST_F(StoreTest, WaitTimesOutNamingTheMissingKeys) {
  auto server = serve();
  try {
    client_sched.sync_wait([](StoreClient::Options o) -> Task<void> {
      auto c = co_await StoreClient::connect(o);
      co_await c->set("rank/0", "up");
      std::vector<std::string> keys{"rank/0", "rank/1", "rank/2"};  // GCC 12: no braced temporaries in co_await
      co_await c->wait(std::move(keys), 100ms);
    }(client_options(server->port())));
    FAIL() << "expected a timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
    std::string w = e.what();
    EXPECT_NE(w.find("'rank/1', 'rank/2'"), std::string::npos) << w;
    EXPECT_EQ(w.find("'rank/0'"), std::string::npos) << w;
  }
}

TEST_F(StoreTest, ConcurrentClientsOnSeveralThreads) {
  auto server = serve();
  constexpr int kThreads = 4, kClientsPerThread = 2, kAdds = 50;
  std::vector<std::thread> threads;
  std::atomic<int> winners{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Scheduler s;
      s.start();
      std::vector<Task<void>> clients;
      for (int i = 0; i < kClientsPerThread; ++i) {
        clients.push_back([](StoreClient::Options o, std::string me, std::atomic<int>* w) -> Task<void> {
          auto c = co_await StoreClient::connect(o);
          for (int k = 0; k < kAdds; ++k) co_await c->add("counter", 1);
          if (co_await c->compare_set("winner", "", me) == me) ++*w;
        }(client_options(server->port()), "c" + std::to_string(t * 10 + i), &winners));
      }
      s.sync_wait(when_all(std::move(clients)));
    });
  }
  for (auto& t : threads) t.join();
  auto total = client_sched.sync_wait([](StoreClient::Options o) -> Task<std::int64_t> {
    auto c = co_await StoreClient::connect(o);
    co_return co_await c->add("counter", 0);
  }(client_options(server->port())));
  EXPECT_EQ(total, kThreads * kClientsPerThread * kAdds);
  EXPECT_EQ(winners, 1);
}

// A rank whose MASTER_ADDR names a host not published yet retries it for resolve_timeout (it used
// to fail at once, or to wait the whole connect_timeout as if the store were down), then is told
// the name does not resolve.
TEST_F(StoreTest, AHostNameThatDoesNotResolveIsRetriedForTheResolveTimeoutThenNamed) {
  auto o = client_options(9);
  o.host = "no-such-host.invalid";  // RFC 6761: never resolves
  o.connect_timeout = 30s;
  o.resolve_timeout = 1500ms;
  const auto start = std::chrono::steady_clock::now();
  try {
    client_sched.sync_wait(StoreClient::connect(o));
    FAIL() << "expected the name not to resolve";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::bad_config) << e.what();
    EXPECT_EQ(e.context().op, StoreClient::kResolveOp) << e.what();
    EXPECT_NE(std::string(e.what()).find("cannot resolve the rendezvous store's host 'no-such-host.invalid'"),
              std::string::npos)
        << e.what();
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(waited, 1.4);
  EXPECT_LT(waited, 10);
}

TEST_F(StoreTest, WrongTokenIsRejectedAndTheServerKeepsServing) {
  auto server = serve("right");
  try {
    client_sched.sync_wait(StoreClient::connect(client_options(server->port(), "wrong")));
    FAIL() << "expected the token to be rejected";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::bad_config);
    EXPECT_NE(std::string(e.what()).find("COSHARD_TOKEN"), std::string::npos);
  }
  auto ok = client_sched.sync_wait([](StoreClient::Options o) -> Task<bool> {
    auto c = co_await StoreClient::connect(o);
    co_await c->set("k", "v");
    co_return (co_await c->get("k")).value_or("") == "v";
  }(client_options(server->port(), "right")));
  EXPECT_TRUE(ok);
  EXPECT_GE(server->stats().rejected, 1u);
}

TEST_F(StoreTest, GarbageHugeFramesAndSilentClientsAreDropped) {
  auto server = serve();
  std::mt19937 rng(7);
  for (int i = 0; i < 20; ++i) {
    std::string junk(1 + rng() % 64, '\0');
    for (auto& ch : junk) ch = static_cast<char>(rng());
    raw_exchange(server->port(), junk);
  }
  raw_exchange(server->port(), std::string("\xff\xff\xff\x7f", 4) + "x");  // a 2 GiB frame header
  std::string hello_then_garbage = std::string("\x08\x00\x00\x00\x01\x03\x00\x00\x00t0k", 12) + "\x02\x00\x00\x00\x63\x63";
  raw_exchange(server->port(), hello_then_garbage);
  raw_exchange(server->port(), "");  // connects and says nothing: dropped at the handshake deadline
  EXPECT_GE(server->stats().rejected, 20u);
  auto ok = client_sched.sync_wait([](StoreClient::Options o) -> Task<bool> {
    auto c = co_await StoreClient::connect(o);
    co_await c->set("still", "serving");
    co_return (co_await c->get("still")).value_or("") == "serving";
  }(client_options(server->port())));
  EXPECT_TRUE(ok);
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (server->stats().connections > 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(server->stats().connections, 0u);
}

TEST_F(StoreTest, OversizedValueIsRefusedBeforeSending) {
  auto server = serve();
  try {
    client_sched.sync_wait([](StoreClient::Options o) -> Task<void> {
      auto c = co_await StoreClient::connect(o);
      co_await c->set("huge", std::string(2 << 20, 'x'));
    }(client_options(server->port())));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("bound"), std::string::npos);
  }
}

TEST_F(StoreTest, ClientRetriesUntilTheServerComesUp) {
  std::uint16_t port;
  { port = serve()->port(); }  // find a free port, then release it
  std::unique_ptr<StoreServer> late;
  std::thread starter([&] {
    std::this_thread::sleep_for(300ms);
    late = serve("t0k", port);
  });
  auto ok = client_sched.sync_wait([](StoreClient::Options o) -> Task<bool> {
    auto c = co_await StoreClient::connect(o);
    co_await c->set("k", "v");
    co_return true;
  }(client_options(port)));
  starter.join();
  EXPECT_TRUE(ok);
}

TEST_F(StoreTest, UnreachableStoreFailsWithinTheDeadline) {
  std::uint16_t port;
  { port = serve()->port(); }
  auto o = client_options(port);
  o.connect_timeout = 300ms;
  auto start = std::chrono::steady_clock::now();
  try {
    client_sched.sync_wait(StoreClient::connect(o));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("MASTER_ADDR"), std::string::npos);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
}

// A store whose accept queue is full drops new SYNs, so a connect attempt hangs in the kernel
// (which retries for about two minutes); the client's deadline must still hold.
TEST_F(StoreTest, AStoreThatDropsConnectionsFailsWithinTheDeadline) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 0), 0);  // never accepted: fills at once
  socklen_t len = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  std::vector<int> fillers;
  for (int i = 0; i < 4; ++i) {  // fill the queue (non-blocking: the later ones stay pending)
    int s = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    (void)::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    fillers.push_back(s);
  }
  std::this_thread::sleep_for(50ms);
  auto o = client_options(ntohs(addr.sin_port));
  o.connect_timeout = 1500ms;
  auto start = std::chrono::steady_clock::now();
  try {
    client_sched.sync_wait(StoreClient::connect(o));
    ADD_FAILURE() << "connected to a store that never accepts";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("cannot reach the rendezvous store"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4s);
  for (int s : fillers) ::close(s);
  ::close(listener);
}

TEST_F(StoreTest, PortInUseNamesThePort) {
  auto server = serve();
  try {
    serve("t0k", server->port());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::io);
    EXPECT_NE(std::string(e.what()).find(std::to_string(server->port())), std::string::npos);
  }
}

// ... and says whose store it was: that process's own output says why it stopped.
TEST_F(StoreTest, StoppingTheServerFailsAPendingWaitQuickly) {
  auto server = serve();
  auto options = client_options(server->port());
  options.served_by = "rank 0";
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);
    server->stop();
  });
  auto start = std::chrono::steady_clock::now();
  try {
    client_sched.sync_wait([](StoreClient::Options o) -> Task<void> {
      auto c = co_await StoreClient::connect(o);
      std::vector<std::string> keys{"never"};
      co_await c->wait(std::move(keys), 60000ms);
    }(options));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::peer_lost) << e.what();
    EXPECT_NE(e.message().find("The store's host (rank 0) may have exited: its own output says why"), std::string::npos)
        << e.what();
  }
  stopper.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

}  // namespace

TEST(StoreServerBind, MasterNamesBindWhatTheirClientsReach) {
  EXPECT_EQ(StoreServer::bind_address_for("10.1.2.3"), "10.1.2.3");
  EXPECT_EQ(StoreServer::bind_address_for("::1"), "::1");
  EXPECT_EQ(StoreServer::bind_address_for("localhost"), "127.0.0.1");
  EXPECT_EQ(StoreServer::bind_address_for("node1"), "0.0.0.0");  // a name cannot be bound
}
