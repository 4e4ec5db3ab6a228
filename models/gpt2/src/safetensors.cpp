#include "coshard/gpt2/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "coshard/ops/cast.hpp"
#include "coshard/runtime/error.hpp"
#include "coshard/runtime/file_io.hpp"

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace coshard::gpt2 {
namespace {

using json = nlohmann::json;

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

Error corrupt(const std::filesystem::path& path, const std::string& msg) {
  return Error(Errc::corrupt_file, "safetensors file '" + path.string() + "': " + msg);
}

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

// ---- GPT-2 checkpoints ----

void save_model(const std::filesystem::path& path, const ParamStore& params, DType dtype,
                const std::map<std::string, std::string>& metadata) {
  std::vector<TensorRef> refs;
  for (std::size_t i = 0; i < params.size(); ++i) refs.push_back({params.infos()[i].name, params.infos()[i].shape, params.at(i)});
  write_safetensors(path, refs, dtype, metadata);
}

void save_state_dict(const std::filesystem::path& path, const Config& config, const StateDict& state, DType dtype,
                     const std::map<std::string, std::string>& metadata) {
  std::vector<TensorRef> refs;
  for (const auto& p : all_params(config)) {
    auto it = state.find(p.name);
    if (it == state.end()) throw Error(Errc::invalid_argument, "save_state_dict: the state has no '" + p.name + "'");
    refs.push_back({p.name, p.shape, it->second});
  }
  write_safetensors(path, refs, dtype, metadata);
}

StateDict read_model(const std::filesystem::path& path, const Config& config) {
  const auto file = SafetensorsFile::open(path);
  const auto infos = all_params(config);
  // Names without the "transformer." prefix.
  std::map<std::string, const TensorEntry*> entries;
  for (const auto& t : file.tensors()) {
    std::string name = t.name;
    if (name.rfind("transformer.", 0) == 0) name = name.substr(12);
    if (!entries.emplace(name, &t).second) {
      throw corrupt(path, "tensor '" + name + "' appears twice (with and without the 'transformer.' prefix)");
    }
  }
  const std::string cfg = " (config " + config.to_string() + ")";
  std::set<std::string> wanted;
  const TensorEntry* tied_head = nullptr;
  for (const auto& p : infos) {
    wanted.insert(p.name);
    auto it = entries.find(p.name);
    if (it == entries.end()) {
      if (p.name == "lm_head.weight") continue;  // untied model from a tied checkpoint: copy wte below
      throw corrupt(path, "missing tensor '" + p.name + "' of shape " + shape_str(p.shape) + cfg);
    }
    const TensorEntry& t = *it->second;
    if (!t.convertible()) {
      throw corrupt(path, "tensor '" + t.name + "' has dtype " + t.dtype_name + "; parameters must be F32, BF16 or F16");
    }
    if (t.shape != p.shape) {
      throw corrupt(path, "tensor '" + t.name + "' has shape " + shape_str(t.shape) + " but the model expects " +
                              shape_str(p.shape) + cfg);
    }
  }
  for (const auto& [name, t] : entries) {
    if (wanted.count(name)) continue;
    static const std::regex hf_buffer(R"(h\.[0-9]+\.attn\.(bias|masked_bias))");
    if (std::regex_match(name, hf_buffer)) continue;
    if (name == "lm_head.weight" && config.tie_head) {
      tied_head = t;
      continue;
    }
    throw corrupt(path, "tensor '" + t->name + "' is not a parameter of GPT-2" + cfg);
  }
  StateDict state;
  for (const auto& p : infos) {
    auto it = entries.find(p.name);
    if (it == entries.end()) continue;
    state[p.name] = file.read(*it->second);
  }
  if (!config.tie_head && !state.count("lm_head.weight")) state["lm_head.weight"] = state.at("wte.weight");
  if (tied_head) {
    // A tied model can take a file that stores the head too, only if it really is wte.
    if (tied_head->shape != Shape{config.vocab, config.width} || file.read(*tied_head) != state.at("wte.weight")) {
      throw corrupt(path, "tensor 'lm_head.weight' differs from wte.weight: the checkpoint has an untied head; "
                          "load it with tie_head=false");
    }
  }
  return state;
}

void load_model(const std::filesystem::path& path, ParamStore& params, const Config& config) {
  const auto infos = all_params(config);
  bool match = infos.size() == params.size();
  for (std::size_t i = 0; match && i < infos.size(); ++i) {
    match = infos[i].name == params.infos()[i].name && infos[i].shape == params.infos()[i].shape;
  }
  if (!match) throw Error(Errc::invalid_argument, "load_model: the parameter store does not hold GPT-2 " + config.to_string());
  const StateDict state = read_model(path, config);
  for (std::size_t i = 0; i < infos.size(); ++i) {
    const auto& v = state.at(infos[i].name);
    std::copy(v.begin(), v.end(), params.at(i).begin());
  }
}

}  // namespace coshard::gpt2
