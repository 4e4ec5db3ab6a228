#include "coshard/models/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>

#include "coshard/ops/cast.hpp"
#include "coshard/runtime/error.hpp"
#include "coshard/runtime/file_io.hpp"

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace coshard::models {
std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

Error safetensors_error(const std::filesystem::path& path, const std::string& msg) {
  return Error(Errc::corrupt_file, "safetensors file '" + path.string() + "': " + msg);
}

namespace {

using json = nlohmann::json;

Error corrupt(const std::filesystem::path& path, const std::string& msg) { return safetensors_error(path, msg); }

// Element sizes of the safetensors dtypes (coshard converts only F32, BF16, F16).
int dtype_size(const std::string& d) {
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "BOOL" || d == "U8" || d == "I8" || d == "F8_E5M2" || d == "F8_E4M3") return 1;
  return 0;
}

std::optional<DType> coshard_dtype(const std::string& d) {
  if (d == "F32") return DType::f32;
  if (d == "BF16") return DType::bf16;
  if (d == "F16") return DType::f16;
  return std::nullopt;
}

const char* dtype_name(DType d) {
  switch (d) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    default: return nullptr;
  }
}

// The 8-byte header length N, checked against the limit and the file's size.
std::uint64_t header_length(const std::filesystem::path& path, std::uint64_t size) {
  if (size < 8) throw corrupt(path, "the file has " + std::to_string(size) + " bytes, fewer than the 8-byte header length");
  std::array<std::byte, 8> len_bytes{};
  read_at(path, 0, len_bytes);
  std::uint64_t n = 0;
  std::memcpy(&n, len_bytes.data(), 8);
  if (n > kSafetensorsMaxHeader) {
    throw corrupt(path, "header length " + std::to_string(n) + " exceeds the limit of " +
                            std::to_string(kSafetensorsMaxHeader) + " bytes (not a safetensors file?)");
  }
  if (n > size - 8) {
    throw corrupt(path, "header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(size) +
                            " bytes): truncated or not a safetensors file");
  }
  return n;
}

json read_header(const std::filesystem::path& path, std::uint64_t n) {
  std::string header(static_cast<std::size_t>(n), '\0');
  read_at(path, 8, std::as_writable_bytes(std::span<char>(header)));
  json h;
  try {
    h = json::parse(header);
  } catch (const json::exception& e) {
    throw corrupt(path, std::string("the header is not valid JSON: ") + e.what());
  }
  if (!h.is_object()) throw corrupt(path, "the header is not a JSON object");
  return h;
}

void read_metadata(const std::filesystem::path& path, const json& v, std::map<std::string, std::string>& metadata) {
  if (!v.is_object()) throw corrupt(path, "__metadata__ is not an object of strings");
  for (auto m = v.begin(); m != v.end(); ++m) {
    if (!m.value().is_string()) throw corrupt(path, "__metadata__ entry '" + m.key() + "' is not a string");
    metadata[m.key()] = m.value().get<std::string>();
  }
}

// Fills e.shape and returns the element count, bounded so that byte sizes cannot overflow.
std::uint64_t read_shape(const std::filesystem::path& path, const std::string& where, const json& shape,
                         TensorEntry& e) {
  if (!shape.is_array()) throw corrupt(path, where + "shape is not an array");
  std::uint64_t numel = 1;
  for (const auto& d : shape) {
    if (!d.is_number_unsigned()) throw corrupt(path, where + "shape " + shape.dump() + " has an entry that is not a non-negative integer");
    const auto dim = d.get<std::uint64_t>();
    if (dim > (1ull << 40) || (dim != 0 && numel > (1ull << 40) / dim)) throw corrupt(path, where + "shape " + shape.dump() + " is too large");
    numel *= dim;
    e.shape.push_back(static_cast<std::int64_t>(dim));
  }
  return numel;
}

void read_offsets(const std::filesystem::path& path, const std::string& where, const json& off,
                  std::uint64_t data_size, TensorEntry& e) {
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
    throw corrupt(path, where + "data_offsets " + off.dump() + " is not a pair of non-negative integers");
  }
  e.begin = off[0].get<std::uint64_t>();
  e.end = off[1].get<std::uint64_t>();
  if (e.begin > e.end || e.end > data_size) {
    throw corrupt(path, where + "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                            "] are out of range: the data section has " + std::to_string(data_size) + " bytes" +
                            (e.end > data_size ? " (truncated file?)" : ""));
  }
}

TensorEntry read_entry(const std::filesystem::path& path, const std::string& name, const json& v,
                       std::uint64_t data_size) {
  const std::string where = "tensor '" + name + "': ";
  if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
    throw corrupt(path, where + "needs an object with dtype, shape and data_offsets");
  }
  if (!v["dtype"].is_string()) throw corrupt(path, where + "dtype is not a string");
  const std::string dt = v["dtype"].get<std::string>();
  const int esize = dtype_size(dt);
  if (esize == 0) throw corrupt(path, where + "unknown dtype '" + dt + "'");
  TensorEntry e;
  e.name = name;
  const std::uint64_t numel = read_shape(path, where, v["shape"], e);
  read_offsets(path, where, v["data_offsets"], data_size, e);
  if (e.end - e.begin != numel * static_cast<std::uint64_t>(esize)) {
    throw corrupt(path, where + "shape " + shape_str(e.shape) + " of " + dt + " needs " +
                            std::to_string(numel * static_cast<std::uint64_t>(esize)) + " bytes but data_offsets [" +
                            std::to_string(e.begin) + ", " + std::to_string(e.end) + "] span " +
                            std::to_string(e.end - e.begin));
  }
  e.dtype_name = dt;
  if (auto d = coshard_dtype(dt)) e.dtype = *d;
  return e;
}

// No two tensors may share bytes.
void check_disjoint(const std::filesystem::path& path, const std::vector<TensorEntry>& tensors) {
  std::vector<const TensorEntry*> by_offset;
  for (const auto& t : tensors) {
    if (t.end > t.begin) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    const auto* a = by_offset[i - 1];
    const auto* b = by_offset[i];
    if (b->begin < a->end) {
      throw corrupt(path, "tensors '" + a->name + "' [" + std::to_string(a->begin) + ", " + std::to_string(a->end) +
                              ") and '" + b->name + "' [" + std::to_string(b->begin) + ", " + std::to_string(b->end) +
                              ") overlap");
    }
  }
}

}  // namespace

std::int64_t TensorEntry::numel() const noexcept {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

// Entries with a dtype coshard cannot convert are validated (size, range, overlap) like the
// others and only fail when read.
SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  SafetensorsFile f;
  f.path_ = path;
  const std::uint64_t size = coshard::file_size(path);
  const std::uint64_t n = header_length(path, size);
  const json h = read_header(path, n);
  f.data_start_ = 8 + n;
  const std::uint64_t data_size = size - f.data_start_;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      read_metadata(path, it.value(), f.metadata_);
    } else {
      f.tensors_.push_back(read_entry(path, it.key(), it.value(), data_size));
    }
  }
  check_disjoint(path, f.tensors_);
  return f;
}

const TensorEntry* SafetensorsFile::find(const std::string& name) const noexcept {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

void SafetensorsFile::read(const TensorEntry& t, std::span<float> out) const {
  if (!t.convertible()) {
    throw corrupt(path_, "tensor '" + t.name + "' has dtype " + t.dtype_name + "; coshard reads F32, BF16 and F16");
  }
  if (out.size() != static_cast<std::size_t>(t.numel())) {
    throw Error(Errc::invalid_argument, "safetensors read of '" + t.name + "': output has " + std::to_string(out.size()) +
                                            " elements, the tensor " + std::to_string(t.numel()));
  }
  if (t.dtype == DType::f32) {
    read_at(path_, data_start_ + t.begin, std::as_writable_bytes(out));
    return;
  }
  std::vector<std::uint16_t> raw(out.size());
  read_at(path_, data_start_ + t.begin, std::as_writable_bytes(std::span<std::uint16_t>(raw)));
  if (t.dtype == DType::bf16) ops::cast_bf16_to_f32(raw, out);
  else ops::cast_f16_to_f32(raw, out);
}

std::vector<float> SafetensorsFile::read(const TensorEntry& t) const {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  read(t, v);
  return v;
}

void write_safetensors(const std::filesystem::path& path, std::span<const TensorRef> tensors, DType dtype,
                       const std::map<std::string, std::string>& metadata) {
  const char* dname = dtype_name(dtype);
  if (!dname) throw Error(Errc::invalid_argument, "write_safetensors: dtype must be f32, bf16 or f16");
  const std::size_t esize = size_of(dtype);
  json h = json::object();
  std::set<std::string> names;
  std::uint64_t at = 0;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second) {
      throw Error(Errc::invalid_argument, "write_safetensors: tensor name '" + t.name + "' is empty, reserved or repeated");
    }
    std::int64_t numel = 1;
    for (auto d : t.shape) numel *= d;
    if (static_cast<std::size_t>(numel) != t.data.size()) {
      throw Error(Errc::invalid_argument, "write_safetensors: tensor '" + t.name + "' has shape " + shape_str(t.shape) +
                                              " but " + std::to_string(t.data.size()) + " values");
    }
    const std::uint64_t bytes = static_cast<std::uint64_t>(numel) * esize;
    h[t.name] = {{"dtype", dname}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // data aligned to 8 bytes, as the reference writer
  const std::uint64_t hlen = header.size();
  std::array<std::byte, 8> len{};
  std::memcpy(len.data(), &hlen, 8);
  std::vector<std::vector<std::uint16_t>> converted;
  std::vector<std::span<const std::byte>> parts{len, std::as_bytes(std::span<const char>(header))};
  for (const auto& t : tensors) {
    if (dtype == DType::f32) {
      parts.push_back(std::as_bytes(t.data));
      continue;
    }
    converted.emplace_back(t.data.size());
    if (dtype == DType::bf16) ops::cast_f32_to_bf16(t.data, converted.back());
    else ops::cast_f32_to_f16(t.data, converted.back());
  }
  if (dtype != DType::f32) {
    for (const auto& c : converted) parts.push_back(std::as_bytes(std::span<const std::uint16_t>(c)));
  }
  write_atomic(path, parts);
}

void save_params(const std::filesystem::path& path, const ParamStore& params, DType dtype,
                 const std::map<std::string, std::string>& metadata) {
  std::vector<TensorRef> refs;
  for (std::size_t i = 0; i < params.size(); ++i) refs.push_back({params.infos()[i].name, params.infos()[i].shape, params.at(i)});
  write_safetensors(path, refs, dtype, metadata);
}

void save_state_dict(const std::filesystem::path& path, const std::vector<ParamInfo>& infos,
                     const std::map<std::string, std::vector<float>>& state, DType dtype,
                     const std::map<std::string, std::string>& metadata) {
  std::vector<TensorRef> refs;
  for (const auto& p : infos) {
    auto it = state.find(p.name);
    if (it == state.end()) throw Error(Errc::invalid_argument, "save_state_dict: the state has no '" + p.name + "'");
    refs.push_back({p.name, p.shape, it->second});
  }
  write_safetensors(path, refs, dtype, metadata);
}

}  // namespace coshard::models
