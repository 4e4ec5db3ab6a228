// safetensors and token files: round trips, the GPT-2 checkpoint rules, and every bad file.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "coshard/gpt2/data.hpp"
#include "coshard/gpt2/model.hpp"
#include "coshard/gpt2/safetensors.hpp"
#include "coshard/ops/cast.hpp"
#include "coshard/runtime/error.hpp"

namespace {

using namespace coshard;
using namespace coshard::gpt2;
namespace fs = std::filesystem;

class Gpt2Files : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("coshard_gpt2_files_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path file(const std::string& name) const { return dir_ / name; }
  static void write_bytes(const fs::path& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  static std::string read_bytes(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // A safetensors file from a header text and `data_bytes` bytes of data.
  static std::string st(const std::string& header, std::size_t data_bytes, std::uint64_t claimed_len = 0) {
    std::uint64_t n = claimed_len ? claimed_len : header.size();
    std::string s(8, '\0');
    std::memcpy(s.data(), &n, 8);
    return s + header + std::string(data_bytes, '\x01');
  }
  // The error message of f(), which must throw coshard::Error with `code`.
  template <class F>
  static std::string error_of(F&& f, Errc code = Errc::corrupt_file) {
    try {
      f();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "no error";
    return {};
  }
  fs::path dir_;
};

#define EXPECT_HAS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

TEST_F(Gpt2Files, SafetensorsRoundTripInEveryDtype) {
  const std::vector<float> a = {1.0f, -2.5f, 3.14159f, 1e-8f, 65504.0f, -0.0f};
  const std::vector<float> b = {0.1f, 0.2f};
  const std::vector<TensorRef> refs = {{"a", {2, 3}, a}, {"b.c", {2}, b}};
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    const auto p = file("t.safetensors");
    write_safetensors(p, refs, d, {{"format", "pt"}});
    const auto f = SafetensorsFile::open(p);
    ASSERT_EQ(f.tensors().size(), 2u);
    EXPECT_EQ(f.metadata().at("format"), "pt");
    const auto* ta = f.find("a");
    ASSERT_TRUE(ta);
    EXPECT_EQ(ta->shape, (Shape{2, 3}));
    EXPECT_EQ(ta->dtype, d);
    const auto got = f.read(*ta);
    for (std::size_t i = 0; i < a.size(); ++i) {
      const float want = d == DType::f32 ? a[i] : d == DType::bf16 ? ops::bf16_to_f32(ops::f32_to_bf16(a[i]))
                                                                   : ops::f16_to_f32(ops::f32_to_f16(a[i]));
      EXPECT_EQ(std::memcmp(&got[i], &want, 4), 0) << i;
    }
    // The header is 8-aligned and the data follows in order.
    const std::string bytes = read_bytes(p);
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    EXPECT_EQ(n % 8, 0u);
    EXPECT_EQ(bytes.size(), 8 + n + 8 * size_of(d));
  }
  EXPECT_FALSE(fs::exists(file("t.safetensors.tmp." + std::to_string(::getpid()))));
}

TEST_F(Gpt2Files, ModelRoundTripAndPrefix) {
  const Config c = parse_config("layers=2,heads=3,width=24,vocab=29,context=9");
  Gpt2 m(c, 1);
  save_model(file("m.safetensors"), m.params());
  Gpt2 n(c, 2);
  load_model(file("m.safetensors"), n.params(), c);
  EXPECT_TRUE(std::equal(m.params().flat().begin(), m.params().flat().end(), n.params().flat().begin()));
  // Hugging Face GPT2LMHeadModel names: "transformer." prefix, attention buffers beside.
  std::vector<TensorRef> refs;
  std::vector<float> mask(9 * 9, 1.0f);
  for (std::size_t i = 0; i < m.params().size(); ++i) {
    refs.push_back({"transformer." + m.params().infos()[i].name, m.params().infos()[i].shape, m.params().at(i)});
  }
  refs.push_back({"transformer.h.0.attn.bias", {1, 1, 9, 9}, mask});
  refs.push_back({"lm_head.weight", {29, 24}, m.params()["wte.weight"]});  // tied: equal to wte
  write_safetensors(file("hf.safetensors"), refs, DType::f32);
  Gpt2 k(c, 3);
  load_model(file("hf.safetensors"), k.params(), c);
  EXPECT_TRUE(std::equal(m.params().flat().begin(), m.params().flat().end(), k.params().flat().begin()));
  // An untied model takes a tied checkpoint: lm_head.weight = wte.weight.
  auto u = c;
  u.tie_head = false;
  Gpt2 un(u, 4);
  load_model(file("m.safetensors"), un.params(), u);
  const auto wte = un.params()["wte.weight"], head = un.params()["lm_head.weight"];
  EXPECT_TRUE(std::equal(wte.begin(), wte.end(), head.begin()));
  EXPECT_TRUE(std::equal(wte.begin(), wte.end(), m.params()["wte.weight"].begin()));
  // A bf16 checkpoint loads rounded.
  save_model(file("bf16.safetensors"), m.params(), DType::bf16);
  load_model(file("bf16.safetensors"), k.params(), c);
  EXPECT_EQ(k.params()["h.1.mlp.c_fc.weight"][7], ops::bf16_to_f32(ops::f32_to_bf16(m.params()["h.1.mlp.c_fc.weight"][7])));
}

TEST_F(Gpt2Files, BadSafetensorsFiles) {
  const auto p = file("bad.safetensors");
  auto open_err = [&](const std::string& bytes) {
    write_bytes(p, bytes);
    return error_of([&] { SafetensorsFile::open(p); });
  };
  EXPECT_HAS(open_err("abc"), "fewer than the 8-byte header length");
  EXPECT_HAS(open_err(st("{}", 0, 1000)), "header length 1000 runs past the end of the file");
  EXPECT_HAS(open_err(st("{}", 0, (100ull << 20) + 1)), "exceeds the limit");
  EXPECT_HAS(open_err(st("{\"a\": ", 0)), "not valid JSON");
  EXPECT_HAS(open_err(st("[1]", 0)), "not a JSON object");
  EXPECT_HAS(open_err(st(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12)),
             "tensors 'a' [0, 8) and 'b' [4, 12) overlap");
  EXPECT_HAS(open_err(st(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 12)),
             "tensor 'a': data_offsets [0, 16] are out of range: the data section has 12 bytes (truncated file?)");
  EXPECT_HAS(open_err(st(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)),
             "tensor 'a': shape [3] of F32 needs 12 bytes but data_offsets [0, 8] span 8");
  EXPECT_HAS(open_err(st(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8)), "tensor 'a': data_offsets [8, 0]");
  EXPECT_HAS(open_err(st(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8)), "tensor 'a': unknown dtype 'F33'");
  EXPECT_HAS(open_err(st(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)), "not a non-negative integer");
  EXPECT_HAS(open_err(st(R"({"a":{"dtype":"F32","shape":[2]}})", 8)), "tensor 'a': needs an object with dtype, shape and data_offsets");
  EXPECT_HAS(open_err(st(R"({"__metadata__":{"k":1}})", 0)), "__metadata__ entry 'k' is not a string");
  // A truncated real file: its last tensor runs past the end.
  const std::vector<float> v(10, 1.0f);
  const std::vector<TensorRef> refs = {{"x", {10}, v}, {"y", {10}, v}};
  write_safetensors(p, refs, DType::f32);
  std::string whole = read_bytes(p);
  EXPECT_HAS(open_err(whole.substr(0, whole.size() - 3)), "tensor 'y': data_offsets [40, 80] are out of range");
  // A valid I64 tensor opens, but reading it is an error naming it.
  write_bytes(p, st(R"({"i":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8));
  const auto f = SafetensorsFile::open(p);
  EXPECT_HAS(error_of([&] { f.read(f.tensors()[0]); }), "tensor 'i' has dtype I64");
}

TEST_F(Gpt2Files, BadCheckpointsLeaveTheModelUntouched) {
  const Config c = parse_config("layers=1,heads=2,width=8,vocab=11,context=4");
  Gpt2 m(c, 1);
  const auto p = file("m.safetensors");
  auto all = [&](const std::string& skip, const std::string& rename_to, Shape reshape, DType dtype) {
    std::vector<TensorRef> refs;
    for (std::size_t i = 0; i < m.params().size(); ++i) {
      const auto& info = m.params().infos()[i];
      if (info.name == skip && rename_to.empty() && reshape.empty()) continue;
      TensorRef r{info.name, info.shape, m.params().at(i)};
      if (info.name == skip && !rename_to.empty()) r.name = rename_to;
      if (info.name == skip && !reshape.empty()) {
        r.shape = reshape;
      }
      refs.push_back(r);
    }
    write_safetensors(p, refs, dtype);
  };
  Gpt2 target(c, 2);
  const std::vector<float> before(target.params().flat().begin(), target.params().flat().end());
  auto load_err = [&] {
    auto e = error_of([&] { load_model(p, target.params(), c); });
    EXPECT_TRUE(std::equal(before.begin(), before.end(), target.params().flat().begin())) << "half-loaded";
    return e;
  };
  all("ln_f.bias", "", {}, DType::f32);
  EXPECT_HAS(load_err(), "missing tensor 'ln_f.bias' of shape [8]");
  all("h.0.mlp.c_proj.weight", "", {8, 32}, DType::f32);  // same numel, wrong shape
  EXPECT_HAS(load_err(), "tensor 'h.0.mlp.c_proj.weight' has shape [8, 32] but the model expects [32, 8]");
  all("h.0.ln_2.bias", "h.0.ln_3.bias", {}, DType::f32);
  EXPECT_HAS(load_err(), "missing tensor 'h.0.ln_2.bias'");
  // An unexpected tensor besides a complete set.
  {
    std::vector<TensorRef> refs;
    for (std::size_t i = 0; i < m.params().size(); ++i) refs.push_back({m.params().infos()[i].name, m.params().infos()[i].shape, m.params().at(i)});
    std::vector<float> extra(3, 0.0f);
    refs.push_back({"h.0.attn.rotary", {3}, extra});
    write_safetensors(p, refs, DType::f32);
    EXPECT_HAS(load_err(), "tensor 'h.0.attn.rotary' is not a parameter of GPT-2");
    // A tied model refuses an untied head.
    refs.pop_back();
    std::vector<float> other(11 * 8, 0.5f);
    refs.push_back({"lm_head.weight", {11, 8}, other});
    write_safetensors(p, refs, DType::f32);
    EXPECT_HAS(load_err(), "lm_head.weight' differs from wte.weight");
  }
  // A parameter of an unsupported dtype: written as F32, then the header edited to I32 (same size).
  all("", "", {}, DType::f32);
  std::string bytes = read_bytes(p);
  const auto at = bytes.find("\"wpe.weight\":{\"data_offsets\"");
  ASSERT_NE(at, std::string::npos) << bytes.substr(0, 400);
  const auto dt = bytes.find("\"F32\"", at);
  bytes.replace(dt, 5, "\"I32\"");
  write_bytes(p, bytes);
  EXPECT_HAS(load_err(), "tensor 'wpe.weight' has dtype I32; parameters must be F32, BF16 or F16");
  // Truncated: the last tensor's bytes are missing.
  all("", "", {}, DType::f32);
  bytes = read_bytes(p);
  write_bytes(p, bytes.substr(0, bytes.size() - 5));
  EXPECT_HAS(load_err(), "are out of range");
}

TEST_F(Gpt2Files, LlmcTokensRoundTripAndBadFiles) {
  const Tokens toks = {0, 1, 50256, 7, 65535, 3};
  const auto p = file("t.bin");
  write_llmc_tokens(p, toks);
  EXPECT_EQ(fs::file_size(p), 1024u + 2 * toks.size());
  EXPECT_EQ(read_llmc_tokens(p, 65536), toks);
  EXPECT_EQ(read_tokens(p, 65536), toks);
  EXPECT_EQ(tokens_in(p), toks.size());
  EXPECT_HAS(error_of([&] { read_llmc_tokens(p, 50257); }), "token 4 (byte 1032) is 65535, outside the vocabulary [0, 50257)");
  std::string bytes = read_bytes(p);
  write_bytes(p, bytes.substr(0, bytes.size() - 1));
  EXPECT_HAS(error_of([&] { read_llmc_tokens(p, 65536); }), "announces 6 uint16 tokens (1036 bytes) but the file has 1035 bytes (truncated)");
  write_bytes(p, bytes.substr(0, 100));
  EXPECT_HAS(error_of([&] { read_llmc_tokens(p, 65536); }), "less than llm.c's 1024-byte header");
  std::string bad = bytes;
  bad[0] ^= 1;
  write_bytes(p, bad);
  EXPECT_HAS(error_of([&] { read_llmc_tokens(p, 65536); }), "bad magic");
  EXPECT_HAS(error_of([&] { read_llmc_tokens(p, 65536); }), p.string());
  bad = bytes;
  bad[4] = 2;
  write_bytes(p, bad);
  EXPECT_HAS(error_of([&] { read_llmc_tokens(p, 65536); }), "version 2 at byte 4");
  EXPECT_EQ(error_of([&] { read_llmc_tokens(file("none.bin"), 10); }, Errc::io).find("none.bin") != std::string::npos, true);
}

// llm.c's Llama 3 format: uint32 tokens, for ids a uint16 file cannot hold.
TEST_F(Gpt2Files, LlmcUint32TokensRoundTripAndAreChecked) {
  const Tokens toks = {0, 65536, 128255, 7};
  const auto p = file("t32.bin");
  EXPECT_EQ(&llmc_format_for(65536), &kLlmcU16);
  EXPECT_EQ(&llmc_format_for(65537), &kLlmcU32);
  EXPECT_EQ(&llmc_format_for(128256), &kLlmcU32);
  EXPECT_HAS(error_of([&] { write_llmc_tokens(p, toks, kLlmcU16); }, Errc::invalid_argument),
             "token 1 is 65536, too large for uint16 tokens");
  write_llmc_tokens(p, toks, llmc_format_for(128256));
  EXPECT_EQ(fs::file_size(p), 1024u + 4 * toks.size());
  const std::string bytes = read_bytes(p);
  std::int32_t head[3];
  std::memcpy(head, bytes.data(), sizeof head);
  EXPECT_EQ(head[0], 20240801);  // llm.c's dev/data/data_common.py, "llama-3"
  EXPECT_EQ(head[1], 7);
  EXPECT_EQ(head[2], 4);
  EXPECT_EQ(read_llmc_tokens(p, 128256), toks);
  EXPECT_EQ(tokens_in(p), toks.size());
  EXPECT_HAS(error_of([&] { read_llmc_tokens(p, 100000); }), "token 2 (byte 1032) is 128255, outside the vocabulary [0, 100000)");
  write_bytes(p, bytes.substr(0, bytes.size() - 2));
  EXPECT_HAS(error_of([&] { read_llmc_tokens(p, 128256); }),
             "announces 4 uint32 tokens (1040 bytes) but the file has 1038 bytes (truncated)");
  EXPECT_EQ(tokens_in(p), 0u);
  std::string bad = bytes;
  bad[4] = 1;  // GPT-2's version under Llama 3's magic
  write_bytes(p, bad);
  EXPECT_HAS(error_of([&] { read_llmc_tokens(p, 128256); }), "version 1 at byte 4, expected 7 for magic 20240801");
  // A uint16 file cannot have been written by a tokenizer of a vocabulary above 65,536.
  const auto p16 = file("t16.bin");
  write_llmc_tokens(p16, Tokens{1, 2, 3});
  EXPECT_HAS(error_of([&] { read_llmc_tokens(p16, 128256); }), "uint16 tokens, which cannot hold the ids of the model's vocabulary of 128256");
}

TEST_F(Gpt2Files, TextIsBytes) {
  const auto p = file("t.txt");
  write_bytes(p, std::string("hi\n\xff", 4));
  EXPECT_EQ(read_tokens(p, 256), (Tokens{'h', 'i', '\n', 255}));
  EXPECT_EQ(tokens_in(p), 4u);
  EXPECT_HAS(error_of([&] { read_text_tokens(p, 200); }), "token 3 (byte 3) is 255, outside the vocabulary [0, 200)");
}

std::vector<std::vector<std::int32_t>> rows(const Batch& b) {
  std::vector<std::vector<std::int32_t>> r;
  for (std::size_t i = 0; i < b.B; ++i) r.emplace_back(b.inputs.begin() + static_cast<std::ptrdiff_t>(i * b.T), b.inputs.begin() + static_cast<std::ptrdiff_t>((i + 1) * b.T));
  return r;
}

TEST(Gpt2Loader, GlobalBatchIsTheSameForAnyRankCount) {
  auto toks = std::make_shared<Tokens>();
  for (int i = 0; i < 1000; ++i) toks->push_back(static_cast<Token>(i));
  for (bool shuffle : {false, true}) {
    DataLoader one(toks, {.batch = 6, .seq_len = 8, .rank = 0, .world = 1, .shuffle = shuffle, .seed = 9});
    for (std::int64_t step : {0, 1, 2, 20, 21, 40}) {  // 124 sequences: steps past 20 wrap
      auto global = rows(one.batch(step));
      std::vector<std::vector<std::int32_t>> joined;
      for (int r = 0; r < 3; ++r) {
        DataLoader part(toks, {.batch = 2, .seq_len = 8, .rank = r, .world = 3, .shuffle = shuffle, .seed = 9});
        for (auto& row : rows(part.batch(step))) joined.push_back(row);
      }
      EXPECT_EQ(joined, global) << "step " << step << " shuffle " << shuffle;
    }
  }
}

TEST(Gpt2Loader, SequentialLayoutTargetsAndWrap) {
  auto toks = std::make_shared<Tokens>();
  for (int i = 0; i < 50; ++i) toks->push_back(static_cast<Token>(i));
  DataLoader l(toks, {.batch = 2, .seq_len = 10, .rank = 0, .world = 1});
  EXPECT_EQ(l.sequences(), 4);  // (50 - 1) / 10
  auto b = l.next();
  EXPECT_EQ(b.inputs[0], 0);
  EXPECT_EQ(b.targets[0], 1);
  EXPECT_EQ(b.inputs[10], 10);
  EXPECT_EQ(b.targets[19], 20);
  b = l.next();
  EXPECT_EQ(b.inputs[10], 30);
  EXPECT_EQ(b.targets[19], 40);
  b = l.next();  // wraps
  EXPECT_EQ(b.inputs[0], 0);
  EXPECT_EQ(l.step(), 3);
  EXPECT_THROW(DataLoader(toks, {.batch = 1, .seq_len = 50}), Error);
  EXPECT_THROW(DataLoader(toks, {.batch = 1, .seq_len = 4, .rank = 2, .world = 2}), Error);
  // The sequence index step x world x batch overflowed past 2^63 (a resume at a late step of a
  // large job computed it at once); the last step that fits is still read.
  DataLoader wide(toks, {.batch = 2, .seq_len = 4, .rank = 1, .world = 2});
  const std::int64_t last_fit = (std::numeric_limits<std::int64_t>::max() - 4) / 4;
  EXPECT_NO_THROW(wide.batch(last_fit));
  try {
    wide.batch(std::numeric_limits<std::int64_t>::max() / 4 + 1);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("sequences is past the 2^63 a run can count"), std::string::npos) << e.what();
  }
}

TEST(Gpt2Loader, ShuffleIsASeededPermutationPerEpoch) {
  auto toks = std::make_shared<Tokens>(1001, 0);
  DataLoader a(toks, {.batch = 1, .seq_len = 10, .shuffle = true, .seed = 1});
  DataLoader b(toks, {.batch = 1, .seq_len = 10, .shuffle = true, .seed = 1});
  DataLoader c(toks, {.batch = 1, .seq_len = 10, .shuffle = true, .seed = 2});
  std::vector<std::int64_t> e0, e1, ec;
  for (std::int64_t g = 0; g < 100; ++g) {
    e0.push_back(a.sequence_start(g));
    e1.push_back(a.sequence_start(100 + g));
    ec.push_back(c.sequence_start(g));
    EXPECT_EQ(b.sequence_start(g), e0.back());
  }
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, ec);
  for (auto* e : {&e0, &e1}) {
    auto s = *e;
    std::sort(s.begin(), s.end());
    for (std::int64_t i = 0; i < 100; ++i) EXPECT_EQ(s[static_cast<std::size_t>(i)], i * 10);
  }
}

}  // namespace
