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

#include "coshard/gpt2/config.hpp"
#include "coshard/gpt2/params.hpp"
#include "coshard/runtime/dtype.hpp"
#include "coshard/runtime/tensor.hpp"

namespace coshard::gpt2 {

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

// ---- GPT-2 checkpoints ----

using StateDict = std::map<std::string, std::vector<float>>;

// Writes the model's parameters under their Hugging Face names (lm_head.weight only when untied).
void save_model(const std::filesystem::path& path, const ParamStore& params, DType dtype = DType::f32,
                const std::map<std::string, std::string>& metadata = {});
void save_state_dict(const std::filesystem::path& path, const Config& config, const StateDict& state,
                     DType dtype = DType::f32, const std::map<std::string, std::string>& metadata = {});

// Reads every parameter of `config` from a checkpoint, validated: names may carry a
// "transformer." prefix (Hugging Face GPT2LMHeadModel); Hugging Face's attention buffers
// (h.N.attn.bias, h.N.attn.masked_bias) are ignored; an untied config without lm_head.weight gets
// a copy of wte.weight. A missing parameter, a wrong shape, a dtype other than F32/BF16/F16, or
// any other tensor is an error naming it, raised before anything is returned.
StateDict read_model(const std::filesystem::path& path, const Config& config);
// read_model, then copies into `params` (all or nothing).
void load_model(const std::filesystem::path& path, ParamStore& params, const Config& config);

}  // namespace coshard::gpt2
