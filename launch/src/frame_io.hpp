#pragma once
// Reading and writing length-prefixed frames on a TCP socket from a coshard task.
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "coshard/runtime/asio_await.hpp"
#include "coshard/runtime/task.hpp"

namespace coshard::launch::detail {

enum class FrameError { none, closed, bad_length, io };

struct FrameRead {
  FrameError error = FrameError::none;
  std::uint32_t length = 0;
  std::string body;
  std::error_code ec;
};

// Cancels without throwing: the socket may have been closed meanwhile (evicted, stopping).
inline void cancel_quietly(asio::ip::tcp::socket& s) {
  std::error_code ignored;
  s.cancel(ignored);
}

// `co_await read_exactly(s, b)`: all of `b`, or the error that ended the read.
inline auto read_exactly(asio::ip::tcp::socket& s, asio::mutable_buffer b) {
  return asio_op([&s, b](auto h) { asio::async_read(s, b, std::move(h)); }, [&s] { cancel_quietly(s); });
}

// A read that failed with `ec`: the peer closed, or another error.
inline void read_failed(FrameRead& out, std::error_code ec) {
  out.error = ec == asio::error::eof ? FrameError::closed : FrameError::io;
  out.ec = ec;
}

inline Task<FrameRead> read_frame(asio::ip::tcp::socket& s, std::size_t max_bytes) {
  FrameRead out;
  char header[4];
  if (auto r = co_await read_exactly(s, asio::buffer(header, 4)); r.ec) {
    read_failed(out, r.ec);
    co_return out;
  }
  std::memcpy(&out.length, header, 4);
  if (out.length > max_bytes || out.length == 0) {
    out.error = FrameError::bad_length;
    co_return out;
  }
  // The body grows as its bytes arrive, a chunk at a time: a length alone (a client that announces
  // 16 MiB and sends nothing) holds no more memory than what it sent.
  constexpr std::size_t kChunk = 64 << 10;
  for (std::size_t got = 0; got < out.length;) {
    const std::size_t n = std::min<std::size_t>(kChunk, out.length - got);
    out.body.resize(got + n);
    if (auto r = co_await read_exactly(s, asio::buffer(out.body.data() + got, n)); r.ec) {
      read_failed(out, r.ec);
      break;
    }
    got += n;
  }
  co_return out;
}

inline Task<std::error_code> write_frame(asio::ip::tcp::socket& s, std::vector<char> frame) {
  auto r = co_await asio_op([&](auto h) { asio::async_write(s, asio::buffer(frame), std::move(h)); },
                            [&] { cancel_quietly(s); });
  co_return r.ec;
}

}  // namespace coshard::launch::detail
