#pragma once
// Test helpers on 127.0.0.1: a port that is free, and one raw TCP exchange with a server, as an
// HTTP scraper or a broken client would do it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <random>
#include <string>

namespace coshard::testing {

// A port nobody listens on right now (bound once, then released; 0 if none could be had), for
// an address that several processes must be told in advance. Drawn at random below the kernel's
// ephemeral range (32768-60999), where it was drawn before: any connection another test opened
// meanwhile could take it as its local port, and the listener told it then found it in use.
// (Below 29000: the cluster tests' masters listen on 29400.)
inline std::uint16_t free_loopback_port() {
  std::mt19937 draw(std::random_device{}());
  for (int attempt = 0; attempt < 200; ++attempt) {
    const auto port = static_cast<std::uint16_t>(std::uniform_int_distribution<int>(20000, 28999)(draw));
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (free) return port;
  }
  return 0;
}

// Sends `request`, then reads until the server closes or `timeout_s` passes.
inline std::string loopback_exchange(std::uint16_t port, const std::string& request, int timeout_s = 5) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{timeout_s, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return "connect failed";
  }
  (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return out;
}

}  // namespace coshard::testing
