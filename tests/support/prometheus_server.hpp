#pragma once
// Test helper: a real Prometheus server (Debian's /usr/bin/prometheus) on loopback, scraping the
// given targets every second, with its storage in a temporary directory that goes away with it.
//
//   coshard::testing::PrometheusServer prom(std::vector<std::string>{"127.0.0.1:9400", "127.0.0.1:9401"});
//   auto up = prom.wait_for("up == 1", [](const nlohmann::json& r) { return r.size() == 2; },
//                           std::chrono::seconds(20));
//   nlohmann::json result = prom.query("coshard_tokens_total");   // data.result, an array
//   prom.stop();                                                  // also done by the destructor
//
// Every wait has a deadline. The server is stopped by stop() or the destructor (POST /-/quit,
// then SIGTERM, then SIGKILL), and dies with the test process (PR_SET_PDEATHSIG) if the test
// crashes. New targets show their first sample about 6 s after the start (Prometheus applies
// targets on a 5 s tick): poll with wait_for, never sleep a fixed time.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "support/loopback.hpp"

namespace coshard::testing {

// Debian's prometheus binary, or "" when it is not installed.
inline std::string find_prometheus() {
  if (const char* env = std::getenv("COSHARD_PROMETHEUS"); env && *env && ::access(env, X_OK) == 0) return env;
  for (const char* p : {"/usr/bin/prometheus", "/usr/local/bin/prometheus"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

inline std::string url_encode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

struct HttpResponse {
  int status = 0;  // 0: no answer
  std::string body;
};

// One HTTP/1.0 request to 127.0.0.1:port (the server closes the connection after the answer).
inline HttpResponse http_request(std::uint16_t port, const std::string& method, const std::string& target,
                                 int timeout_s = 5) {
  const std::string raw =
      loopback_exchange(port, method + " " + target + " HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n",
                        timeout_s);
  HttpResponse r;
  if (raw.rfind("HTTP/", 0) != 0) return r;
  const auto sp = raw.find(' ');
  r.status = std::atoi(raw.c_str() + sp + 1);
  const auto body = raw.find("\r\n\r\n");
  if (body != std::string::npos) r.body = raw.substr(body + 4);
  return r;
}

class PrometheusServer {
 public:
  struct Options {
    std::vector<std::string> targets;        // "127.0.0.1:PORT", one per rank
    std::string job = "coshard";
    std::string scrape_interval = "1s";
    std::string scrape_timeout = "900ms";    // must not exceed scrape_interval
    std::chrono::seconds ready_timeout{20};  // until /-/ready answers 200
    std::string binary;                      // empty: find_prometheus()
  };

  // Starts the server and waits until it is ready. Throws std::runtime_error with the server's
  // log when it cannot start (a port taken between probing and binding is retried).
  explicit PrometheusServer(Options options) : options_(std::move(options)) {
    if (options_.binary.empty()) options_.binary = find_prometheus();
    if (options_.binary.empty()) {
      throw std::runtime_error("prometheus not found: install Debian's prometheus package (scripts/setup does it)");
    }
    char tmpl[] = "/tmp/coshard-prometheus-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("cannot create a temporary directory under /tmp");
    dir_ = tmpl;
    write_config();
    std::string why;
    for (int attempt = 0; attempt < 3; ++attempt) {
      if (launch(why)) return;
      kill_and_reap();
    }
    const std::string log_text = log();
    std::filesystem::remove_all(dir_);
    throw std::runtime_error("prometheus did not become ready: " + why + "\n--- prometheus log ---\n" + log_text);
  }

  // Scrapes `targets` ("127.0.0.1:PORT", one per rank) as job "coshard" every second.
  explicit PrometheusServer(std::vector<std::string> targets) : PrometheusServer(with_targets(std::move(targets))) {}

  ~PrometheusServer() { stop(); }
  PrometheusServer(const PrometheusServer&) = delete;
  PrometheusServer& operator=(const PrometheusServer&) = delete;

  std::uint16_t port() const noexcept { return port_; }
  const std::string& dir() const noexcept { return dir_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // GET /api/v1/query?query=PROMQL; returns data.result (an array for vector results). Throws
  // std::runtime_error when the server does not answer or says the query failed.
  nlohmann::json query(const std::string& promql) const {
    const auto r = http_request(port_, "GET", "/api/v1/query?query=" + url_encode(promql));
    if (r.status != 200) {
      throw std::runtime_error("prometheus query '" + promql + "' answered HTTP " + std::to_string(r.status) + ": " +
                               r.body);
    }
    auto j = nlohmann::json::parse(r.body, nullptr, false);
    if (j.is_discarded() || j.value("status", "") != "success") {
      throw std::runtime_error("prometheus query '" + promql + "' failed: " + r.body);
    }
    return j["data"]["result"];
  }

  // Polls `promql` about every 250 ms until done(result) or `deadline` passes; returns the last
  // result either way (check it with the same predicate).
  nlohmann::json wait_for(const std::string& promql, const std::function<bool(const nlohmann::json&)>& done,
                          std::chrono::milliseconds deadline) const {
    const auto until = std::chrono::steady_clock::now() + deadline;
    nlohmann::json last = nlohmann::json::array();
    for (;;) {
      last = query(promql);
      if (done(last) || std::chrono::steady_clock::now() >= until) return last;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  }

  // The scrape state of every target (/api/v1/targets), for failure messages.
  std::string targets_report() const { return http_request(port_, "GET", "/api/v1/targets").body; }

  std::string log() const {
    std::ifstream f(dir_ + "/prometheus.log");
    std::ostringstream s;
    s << f.rdbuf();
    return s.str();
  }

  // POST /-/quit, wait up to 5 s, then SIGTERM and up to 5 s, then SIGKILL. Removes the storage.
  // Idempotent.
  void stop() noexcept {
    if (pid_ > 0) {
      (void)http_request(port_, "POST", "/-/quit", 2);
      if (!reap_within(std::chrono::seconds(5))) {
        ::kill(pid_, SIGTERM);
        if (!reap_within(std::chrono::seconds(5))) kill_and_reap();
      }
    }
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
      dir_.clear();
    }
  }

 private:
  static Options with_targets(std::vector<std::string> targets) {
    Options o;
    o.targets = std::move(targets);
    return o;
  }

  void write_config() const {
    std::ofstream f(dir_ + "/prometheus.yml");
    f << "global:\n  scrape_interval: " << options_.scrape_interval << "\n  evaluation_interval: "
      << options_.scrape_interval << "\nscrape_configs:\n  - job_name: " << options_.job
      << "\n    scrape_interval: " << options_.scrape_interval << "\n    scrape_timeout: " << options_.scrape_timeout
      << "\n    static_configs:\n      - targets: [";
    for (std::size_t i = 0; i < options_.targets.size(); ++i) f << (i ? ", " : "") << "'" << options_.targets[i] << "'";
    f << "]\n";
    if (!f) throw std::runtime_error("cannot write " + dir_ + "/prometheus.yml");
  }

  // Forks the server on a fresh port and waits for /-/ready; false (with `why`) when it exited
  // or did not become ready in time.
  bool launch(std::string& why) {
    port_ = free_loopback_port();
    if (port_ == 0) {
      why = "no free loopback port";
      return false;
    }
    // Everything the child needs is made before fork: after it only async-signal-safe calls.
    std::vector<std::string> args = {options_.binary,
                                     "--config.file=" + dir_ + "/prometheus.yml",
                                     "--storage.tsdb.path=" + dir_ + "/tsdb",
                                     "--web.listen-address=127.0.0.1:" + std::to_string(port_),
                                     "--web.enable-lifecycle",
                                     "--log.level=info"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log_path = dir_ + "/prometheus.log";
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) {
      why = "fork failed";
      return false;
    }
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    const auto until = std::chrono::steady_clock::now() + options_.ready_timeout;
    while (std::chrono::steady_clock::now() < until) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        why = "it exited with status " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
        return false;
      }
      if (http_request(port_, "GET", "/-/ready", 1).status == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    why = "/-/ready did not answer 200 within " + std::to_string(options_.ready_timeout.count()) + " s";
    return false;
  }

  bool reap_within(std::chrono::seconds limit) noexcept {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (pid_ > 0) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_ || r < 0) {
        pid_ = -1;
        return true;
      }
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }

  void kill_and_reap() noexcept {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  Options options_;
  std::string dir_;
  std::uint16_t port_ = 0;
  pid_t pid_ = -1;
};

// The value of each rank's series in an instant-query result: rank label -> value.
inline std::map<std::string, double> by_rank(const nlohmann::json& result) {
  std::map<std::string, double> out;
  for (const auto& s : result) {
    if (s.contains("metric") && s["metric"].contains("rank") && s.contains("value")) {
      out[s["metric"]["rank"].get<std::string>()] = std::stod(s["value"][1].get<std::string>());
    }
  }
  return out;
}

}  // namespace coshard::testing
