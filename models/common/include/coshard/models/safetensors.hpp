#pragma once
// safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON {"name": {"dtype": "F32"|"BF16"|"F16", "shape": [...],
// "data_offsets": [begin, end]}, ..., "__metadata__": {"key": "value"}}, then the data; offsets
// are relative to the end of the header. coshard reads and writes F32, BF16 and F16 (little-endian
// hosts only), converting to and from fp32 with round-to-nearest-even.
//
// Reading validates everything before any data is used: header length within the file and at
// most 100 MiB, valid JSON of the form above, known dtypes, non-negative shapes,
// end - begin = numel x dtype size, every range inside the file and no two ranges overlapping.
// Each failure is coshard::Error(Errc::corrupt_file) naming the file, the tensor and the problem.
// Writing is atomic: a temporary file beside the target, fsync, rename, fsync of the directory.
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "coshard/models/params.hpp"
#include "coshard/runtime/dtype.hpp"
#include "coshard/runtime/error.hpp"
#include "coshard/runtime/tensor.hpp"

namespace coshard::models {

inline constexpr std::uint64_t kSafetensorsMaxHeader = 100ull << 20;

struct TensorEntry {
  std::string name;
  std::string dtype_name;    // as in the file: "F32", "BF16", "I64", ...
  DType dtype = DType::f32;  // for F32, BF16, F16 (convertible() is true)
  Shape shape;
  std::uint64_t begin = 0, end = 0;  // byte range in the data section
  std::int64_t numel() const noexcept;
  bool convertible() const noexcept { return dtype_name == "F32" || dtype_name == "BF16" || dtype_name == "F16"; }
};

class SafetensorsFile {
 public:
  // Opens and validates the header of `path` (the data stays on disk until read).
  static SafetensorsFile open(const std::filesystem::path& path);

  const std::filesystem::path& path() const noexcept { return path_; }
  const std::vector<TensorEntry>& tensors() const noexcept { return tensors_; }
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  const TensorEntry* find(const std::string& name) const noexcept;
  // Reads a tensor converted to fp32 into `out` (numel elements).
  void read(const TensorEntry& t, std::span<float> out) const;
  std::vector<float> read(const TensorEntry& t) const;

 private:
  std::filesystem::path path_;
  std::uint64_t data_start_ = 0;
  std::vector<TensorEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct TensorRef {
  std::string name;
  Shape shape;
  std::span<const float> data;  // numel(shape) fp32 values
};

// Writes `tensors` (names unique, not "__metadata__") in `dtype` (f32, bf16 or f16), atomically.
void write_safetensors(const std::filesystem::path& path, std::span<const TensorRef> tensors, DType dtype,
                       const std::map<std::string, std::string>& metadata = {});

// Writes a store's parameters under their names, in `dtype`, atomically.
void save_params(const std::filesystem::path& path, const ParamStore& params, DType dtype = DType::f32,
                 const std::map<std::string, std::string>& metadata = {});

// Writes the state's tensors named by `infos`, in their order and shapes, atomically; a name the
// state lacks is Errc::invalid_argument.
void save_state_dict(const std::filesystem::path& path, const std::vector<ParamInfo>& infos,
                     const std::map<std::string, std::vector<float>>& state, DType dtype = DType::f32,
                     const std::map<std::string, std::string>& metadata = {});

// "[2, 3]", and the corrupt_file error of a safetensors file, for the models' checkpoint readers.
std::string shape_str(const Shape& s);
Error safetensors_error(const std::filesystem::path& path, const std::string& msg);

}  // namespace coshard::models
