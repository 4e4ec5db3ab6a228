#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "coshard/fsdp/checkpoint.hpp"
#include "coshard/runtime/error.hpp"
#include "checkpoint_damage.hpp"
#include "coshard/runtime/file_io.hpp"
#include "coshard/runtime/json_integer.hpp"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace coshard::fsdp {
namespace {

using json = nlohmann::json;

constexpr std::uint32_t kCastagnoli = 0x82f63b78u;

std::array<std::uint32_t, 256> crc_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ kCastagnoli : c >> 1;
    t[i] = c;
  }
  return t;
}

std::uint32_t crc32c_portable(const unsigned char* p, std::size_t n, std::uint32_t c) noexcept {
  static const auto table = crc_table();
  for (std::size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xffu] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__)
// SSE 4.2 has CRC-32C in hardware: checksums then cost little next to the disk.
__attribute__((target("sse4.2"))) std::uint32_t crc32c_sse42(const unsigned char* p, std::size_t n,
                                                              std::uint32_t c) noexcept {
  std::uint64_t c64 = c;
  for (; n >= 8; p += 8, n -= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
  }
  auto c32 = static_cast<std::uint32_t>(c64);
  for (; n > 0; ++p, --n) c32 = _mm_crc32_u8(c32, *p);
  return c32;
}
#endif

using detail::checkpoint_damaged;

constexpr std::int64_t kMaxOptimizerStep = std::int64_t{1} << 53;

json piece_json(const CheckpointPiece& p) {
  return {{"param", p.param},   {"kind", p.kind},           {"shape", p.shape}, {"offset", p.offset},
          {"length", p.length}, {"file", p.file},           {"byte_offset", p.byte_offset},
          {"crc32c", p.crc32c}, {"dtype", "f32"}};
}

// A count or offset of the manifest: an integer of T's range, never a cast of whatever number is
// there (a double beyond the range is undefined behaviour).
template <class T>
T integer(const json& j, const char* key) {
  return json_integer<T>(j.at(key), std::string("\"") + key + "\"");
}

Shape shape_of(const json& j) {
  if (!j.at("shape").is_array()) throw std::runtime_error("\"shape\" is not an array");
  Shape shape;
  for (const auto& d : j.at("shape")) {
    shape.push_back(json_integer<std::int64_t>(d, "a dimension of \"shape\""));
    if (shape.back() < 0) throw std::runtime_error("\"shape\" has a negative dimension");
  }
  try {
    (void)numel(shape);  // a zero dimension makes any other size empty: only a count past 2^63 throws
  } catch (const Error&) {
    throw std::runtime_error("\"shape\" " + coshard::to_string(shape) + " has more than 2^63 elements");
  }
  return shape;
}

CheckpointPiece piece_of(const json& j) {
  CheckpointPiece p;
  p.param = j.at("param").get<std::string>();
  p.kind = j.at("kind").get<std::string>();
  p.shape = shape_of(j);
  p.offset = integer<std::int64_t>(j, "offset");
  p.length = integer<std::int64_t>(j, "length");
  p.file = j.at("file").get<std::string>();
  if (p.file.empty() || p.file.find('/') != std::string::npos || p.file == "..") {
    throw std::runtime_error("piece file name '" + p.file + "' is not a file of the checkpoint directory");
  }
  p.byte_offset = integer<std::uint64_t>(j, "byte_offset");
  p.crc32c = integer<std::uint32_t>(j, "crc32c");
  if (j.value("dtype", "f32") != "f32") throw std::runtime_error("piece dtype " + j.at("dtype").get<std::string>());
  const std::int64_t n = numel(p.shape);
  if (p.offset < 0 || p.length < 0 || p.length > n || p.offset > n - p.length) {
    throw std::runtime_error("piece of '" + p.param + "' lies outside its shape");
  }
  return p;
}

// The manifest's own CRC-32C: of its JSON without the checksum as dump(1) prints it. nlohmann's
// objects keep their keys sorted and the manifest holds only integers and strings, so a parsed
// manifest prints the very text that was summed.
constexpr const char* kSelfChecksum = "crc32c";
std::uint32_t self_checksum(const json& without) {
  const std::string text = without.dump(1);
  return crc32c(std::as_bytes(std::span<const char>(text.data(), text.size())));
}

// Format 2 and later carry a checksum of the manifest itself: an edit or a flipped bit in a field
// the pieces' checksums do not cover (an offset, the step) would otherwise load as if it were so.
void check_self_checksum(json& j, int version, const std::string& where) {
  if (!j.contains(kSelfChecksum)) {
    if (version >= 2) throw checkpoint_damaged(where, " has no checksum of its own (its format version " + std::to_string(version) + " writes one)");
    return;
  }
  const auto stored = integer<std::uint32_t>(j, kSelfChecksum);
  j.erase(kSelfChecksum);
  if (self_checksum(j) != stored) throw checkpoint_damaged(where, " fails its checksum: it was changed after it was written");
}

// What the pieces must be for any reader to trust their offsets: one shape per parameter, each
// (parameter, kind) tiled exactly once, every piece inside a listed file.
void check_pieces(const Manifest& m, const std::string& where) {
  std::map<std::string, const CheckpointFile*> files;
  for (const auto& f : m.files) {
    if (!files.emplace(f.name, &f).second) throw checkpoint_damaged(where, " lists the file '" + f.name + "' twice");
  }
  std::map<std::string, Shape> shapes;
  std::map<std::pair<std::string, std::string>, std::vector<const CheckpointPiece*>> groups;
  for (const auto& p : m.pieces) {
    const auto [it, fresh] = shapes.emplace(p.param, p.shape);
    if (!fresh && it->second != p.shape) {
      throw checkpoint_damaged(where, " gives '" + p.param + "' two shapes, " + coshard::to_string(it->second) + " and " + coshard::to_string(p.shape));
    }
    const auto f = files.find(p.file);
    if (f == files.end() || p.byte_offset > f->second->bytes ||
        static_cast<std::uint64_t>(p.length) > (f->second->bytes - p.byte_offset) / sizeof(float)) {
      throw checkpoint_damaged(where, " places a piece of '" + p.param + "' outside the files it lists");
    }
    groups[{p.param, p.kind}].push_back(&p);
  }
  for (auto& [key, pieces] : groups) {
    std::sort(pieces.begin(), pieces.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    std::int64_t next = 0;
    for (const auto* p : pieces) {
      if (p->offset != next) {
        throw checkpoint_damaged(where, std::string(p->offset > next ? " leaves elements " : " stores elements twice from ") +
                                            std::to_string(std::min(next, p->offset)) + " of '" + key.first + "' (" +
                                            key.second + ")" + (p->offset > next ? " unstored" : ""));
      }
      next += p->length;
    }
    if (next != numel(pieces.front()->shape)) {
      throw checkpoint_damaged(where, " stores " + std::to_string(next) + " of the " +
                                          std::to_string(numel(pieces.front()->shape)) + " elements of '" + key.first +
                                          "' (" + key.second + ")");
    }
  }
}

}  // namespace

std::uint32_t crc32c(std::span<const std::byte> data, std::uint32_t crc) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  crc = ~crc;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("sse4.2")) return ~crc32c_sse42(p, data.size(), crc);
#endif
  return ~crc32c_portable(p, data.size(), crc);
}

std::string to_json(const Manifest& m) {
  json units = json::array(), files = json::array(), pieces = json::array();
  for (const auto& u : m.units) {
    units.push_back({{"name", u.name}, {"optimizer_step", u.optimizer_step}, {"sgd_started", u.sgd_started}});
  }
  for (const auto& f : m.files) files.push_back({{"name", f.name}, {"rank", f.rank}, {"bytes", f.bytes}, {"crc32c", f.crc32c}});
  for (const auto& p : m.pieces) pieces.push_back(piece_json(p));
  json j = {{"format", "coshard-sharded-checkpoint"},
            {"version", m.version},
            {"world_size", m.world_size},
            {"strategy", m.strategy},
            {"shard_group_size", m.shard_group_size},
            {"optimizer", m.optimizer},
            {"param_dtype", m.param_dtype},
            {"units", units},
            {"files", files},
            {"pieces", pieces},
            {"metadata", m.metadata}};
  if (m.version >= 2) j[kSelfChecksum] = self_checksum(j);
  return j.dump(1) + "\n";
}

Manifest manifest_from_json(const std::string& text, const std::string& where) {
  Manifest m;
  try {
    json j = json::parse(text);
    if (j.value("format", "") != "coshard-sharded-checkpoint") throw std::runtime_error("not a coshard checkpoint manifest");
    m.version = integer<int>(j, "version");
    if (m.version > kCheckpointFormatVersion) {
      throw Error(Errc::bad_config, "'" + where + "' was written in checkpoint format version " +
                                        std::to_string(m.version) + ", newer than the " +
                                        std::to_string(kCheckpointFormatVersion) +
                                        " this build reads: load it with a newer coshard");
    }
    check_self_checksum(j, m.version, where);
    m.world_size = integer<int>(j, "world_size");
    m.strategy = j.at("strategy").get<std::string>();
    m.shard_group_size = integer<int>(j, "shard_group_size");
    m.optimizer = j.at("optimizer").get<std::string>();
    m.param_dtype = j.at("param_dtype").get<std::string>();
    for (const auto& u : j.at("units")) {
      m.units.push_back({u.at("name").get<std::string>(), integer<std::int64_t>(u, "optimizer_step"),
                         u.at("sgd_started").get<bool>()});
      // The next step adds one to it, and Adam's bias correction raises betas to it as a double.
      if (const auto step = m.units.back().optimizer_step; step < 0 || step > kMaxOptimizerStep) {
        throw std::runtime_error("unit '" + m.units.back().name + "' has optimizer step " + std::to_string(step) +
                                 ", not one from 0 to 2^53");
      }
    }
    for (const auto& f : j.at("files")) {
      const auto name = f.at("name").get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name == "..") {
        throw std::runtime_error("file name '" + name + "' is not a file of the checkpoint directory");
      }
      m.files.push_back({name, integer<int>(f, "rank"), integer<std::uint64_t>(f, "bytes"), integer<std::uint32_t>(f, "crc32c")});
    }
    for (const auto& p : j.at("pieces")) m.pieces.push_back(piece_of(p));
    m.metadata = j.at("metadata").get<CheckpointMetadata>();
    check_pieces(m, where);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(Errc::corrupt_file, "'" + where + "' is not a valid checkpoint manifest (" + e.what() +
                                        "): the checkpoint is damaged; resume from an earlier one");
  }
  return m;
}

bool is_checkpoint(const std::filesystem::path& dir) {
  std::error_code ec;
  const auto manifest = std::filesystem::status(dir / kManifestName, ec);
  if (ec && manifest.type() != std::filesystem::file_type::not_found) {
    throw Error(Errc::io, "cannot look at " + (dir / kManifestName).string() + ": " + ec.message() +
                              "; the checkpoint may be intact: make it readable to this job");
  }
  return std::filesystem::is_regular_file(manifest);
}

Manifest read_manifest(const std::filesystem::path& dir) {
  const auto path = dir / kManifestName;
  if (!is_checkpoint(dir)) {
    // A directory of checkpoints (gpt2-train's --checkpoint-dir) is the likeliest mix-up.
    std::error_code ec;
    std::string newest;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      if (is_checkpoint(e.path()) && e.path().string() > newest) newest = e.path().string();
    }
    throw Error(Errc::io, "'" + dir.string() + "' is not a checkpoint: it has no " + kManifestName +
                              (newest.empty() ? " (a save that did not finish leaves none); give a complete checkpoint "
                                                "directory"
                                              : ", but holds checkpoints: give one of them, such as '" + newest +
                                                    "' (the last by name)"));
  }
  return manifest_from_json(read_text(path), path.string());
}

void write_manifest(const std::filesystem::path& dir, const Manifest& m) { write_atomic(dir / kManifestName, to_json(m)); }

std::vector<float> read_piece(const std::filesystem::path& dir, const CheckpointPiece& piece) {
  const auto path = dir / piece.file;
  detail::require_piece_file(path);
  std::vector<float> out(static_cast<std::size_t>(piece.length));
  read_at(path, piece.byte_offset, std::as_writable_bytes(std::span<float>(out)));
  if (crc32c(std::as_bytes(std::span<const float>(out))) != piece.crc32c) {
    throw checkpoint_damaged(path, ": the bytes of '" + piece.param + "' (" + piece.kind + ", elements " + std::to_string(piece.offset) +
                            ".." + std::to_string(piece.offset + piece.length) + ") fail their checksum");
  }
  return out;
}

std::vector<float> read_full(const std::filesystem::path& dir, const Manifest& m, const std::string& param,
                             const std::string& kind) {
  std::vector<float> out;
  std::int64_t covered = 0;
  for (const auto& p : m.pieces) {
    if (p.param != param || p.kind != kind) continue;
    if (out.empty()) out.assign(static_cast<std::size_t>(numel(p.shape)), 0.0f);
    const auto v = read_piece(dir, p);
    std::copy(v.begin(), v.end(), out.begin() + p.offset);
    covered += p.length;
  }
  if (out.empty() || covered != static_cast<std::int64_t>(out.size())) {
    throw checkpoint_damaged(dir / kManifestName, ": '" + param + "' (" + kind + ") is " + (out.empty() ? "not stored" : "incomplete"));
  }
  return out;
}

void write_checkpoint(const std::filesystem::path& dir, const std::vector<FullTensor>& params,
                      CheckpointMetadata metadata) {
  if (is_checkpoint(dir)) {
    throw Error(Errc::bad_config, "'" + dir.string() + "' already holds a checkpoint: write to a new directory");
  }
  Manifest m;
  m.strategy = "no_shard";
  m.optimizer = "adamw";
  m.param_dtype = "f32";
  m.metadata = std::move(metadata);
  const std::string file = "rank-00000.bin";
  std::vector<float> data;
  for (const char* kind : {"param", "exp_avg", "exp_avg_sq"}) {
    for (const auto& p : params) {
      if (static_cast<std::int64_t>(p.values.size()) != numel(p.shape)) {
        throw Error(Errc::invalid_argument, "write_checkpoint: '" + p.name + "' has " + std::to_string(p.values.size()) +
                                                " values for shape " + coshard::to_string(p.shape));
      }
      const std::size_t at = data.size();
      if (std::string(kind) == "param") {
        data.insert(data.end(), p.values.begin(), p.values.end());
      } else {
        data.resize(at + p.values.size(), 0.0f);
      }
      const auto bytes = std::as_bytes(std::span<const float>(data.data() + at, p.values.size()));
      m.pieces.push_back({p.name, kind, p.shape, 0, numel(p.shape), file, at * sizeof(float), crc32c(bytes)});
    }
  }
  const auto all = std::as_bytes(std::span<const float>(data));
  std::filesystem::create_directories(dir);
  write_atomic(dir / file, std::span<const std::span<const std::byte>>(&all, 1));
  m.files.push_back({file, 0, all.size(), crc32c(all)});
  write_manifest(dir, m);
}

}  // namespace coshard::fsdp
