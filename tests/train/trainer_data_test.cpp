// What gpt2-train trains and validates on: every token of --data is training data unless the user
// asks for validation (--val-data FILE or --val-fraction F), the log says what was held out, and
// the validation loss is the loss of the validation batch under the current weights.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "coshard/gpt2/data.hpp"
#include "support/run_command.hpp"
#include "train/trainer_support.hpp"

namespace {

using coshard::testing::run_command;
using namespace coshard::testing::train;

constexpr int kSeq = 16, kBatch = 2, kRanks = 2;
const std::string kModel = " --model layers=1,heads=2,width=32,vocab=64,context=16 --seq 16 --batch 2 --clip 0 ";

// n tokens of a fixed pseudo-random sequence in [0, 64).
std::string token_file(const fs::path& dir, const std::string& name, std::size_t n, std::uint32_t seed) {
  coshard::gpt2::Tokens t(n);
  for (auto& v : t) v = static_cast<coshard::gpt2::Token>((seed = seed * 1664525u + 1013904223u) >> 26);
  const auto path = dir / name;
  coshard::gpt2::write_llmc_tokens(path, t);
  return path.string();
}

// A file of exactly one global batch (plus the last target) trains: nothing is held out for a
// validation nobody asked for, and the log says so.
TEST(TrainerData, EveryTokenIsTrainingDataUnlessValidationIsAsked) {
  auto d = temp_dir("data-all");
  const auto data = token_file(d, "one-batch.bin", kRanks * kBatch * kSeq + 1, 7);
  auto r = run_command(launch(kRanks, "--steps 2 --log-json - --data " + data + kModel));
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("data: 65 training tokens from --data " + data + "; no validation data"), std::string::npos)
      << r.output;
  EXPECT_EQ(step_records(r.output).size(), 2u) << r.output;
}

// With --val-data the same file as --data (one global batch), step 2 trains on the batch step 1
// was validated on, under the same weights: its training loss is the validation loss of step 1.
TEST(TrainerData, ValidationLossIsTheLossOfTheValidationBatch) {
  auto d = temp_dir("data-val");
  const auto data = token_file(d, "one-batch.bin", kRanks * kBatch * kSeq + 1, 11);
  auto r = run_command(launch(kRanks, "--steps 3 --eval-every 1 --log-json - --data " + data + " --val-data " + data + kModel));
  ASSERT_EQ(r.rc, 0) << r.output;
  const auto s = step_records(r.output);
  ASSERT_EQ(s.size(), 3u) << r.output;
  for (std::size_t i = 0; i + 1 < s.size(); ++i) {
    ASSERT_TRUE(s[i]["val_loss"].is_number()) << s[i].dump();
    const double val = s[i]["val_loss"], next = s[i + 1]["loss"];
    EXPECT_NEAR(val, next, 1e-6 * std::fabs(next)) << "step " << i + 1;
  }
  EXPECT_NE(r.output.find("65 validation tokens from --val-data " + data), std::string::npos) << r.output;
}

// --val-fraction holds out the end of --data, says how much, and still needs one sequence left
// to train on.
TEST(TrainerData, ValFractionHoldsOutTheEndAndSaysSo) {
  auto d = temp_dir("data-fraction");
  const auto data = token_file(d, "tokens.bin", 1000, 13);
  auto r = run_command(launch(kRanks, "--steps 2 --eval-every 2 --val-fraction 0.25 --log-json - --data " + data + kModel));
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("data: 750 training tokens from --data " + data +
                          "; 250 validation tokens held out (the last 25% of the data, --val-fraction)"),
            std::string::npos)
      << r.output;
  const auto s = step_records(r.output);
  ASSERT_EQ(s.size(), 2u) << r.output;
  EXPECT_TRUE(s[0]["val_loss"].is_null()) << s[0].dump();
  EXPECT_TRUE(s[1]["val_loss"].is_number()) << s[1].dump();

  const auto small = token_file(d, "small.bin", 20, 17);
  r = run_command(launch(1, "--steps 1 --val-fraction 0.5 --data " + small + kModel));
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("--data " + small + " less the validation split (--val-fraction) has 3 tokens, fewer than "
                          "one sequence of --seq 16 + 1"),
            std::string::npos)
      << r.output;
}

TEST(TrainerData, ValidationFlagsThatCannotWorkAreUsageErrors) {
  auto d = temp_dir("data-flags");
  const auto data = token_file(d, "tokens.bin", 200, 19), tiny = token_file(d, "tiny.bin", 5, 23);
  auto r = run_command(kTrain + " --eval-every 5 --data " + data + kModel);
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("--eval-every needs validation data: --val-data FILE, or --val-fraction F"), std::string::npos)
      << r.output;
  r = run_command(kTrain + " --val-data " + data + " --val-fraction 0.1 --data " + data + kModel);
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("--val-data and --val-fraction both"), std::string::npos) << r.output;
  r = run_command(kTrain + " --val-fraction 0.95" + kModel);
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("--val-fraction"), std::string::npos) << r.output;
  r = run_command(kTrain + " --metrics-port 0 --eval-every 1 --val-data " + tiny + " --data " + data + kModel);
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("--val-data " + tiny + " has 5 tokens, fewer than one sequence"), std::string::npos) << r.output;
}

// A FIFO as --tokenizer hung the job before training; a --tokenizer with the embedded corpus was
// ignored without a word; an empty vocabulary was "fixed" with advice to set vocab=0.
TEST(TrainerData, TokenizersThatCannotDecodeAreNamedBeforeTraining) {
  auto d = temp_dir("data-tokenizer");
  const auto data = token_file(d, "tokens.bin", 200, 29);
  const std::string fifo = (d / "fifo.json").string(), empty = (d / "empty.json").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::ofstream(empty) << R"({"model": {"type": "BPE", "vocab": {}}, "pre_tokenizer": {"type": "ByteLevel"}})";
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"--data " + data + kModel + " --tokenizer " + fifo,
            "cannot read '" + fifo + "': it is not a regular file (a FIFO, socket or device)"},
           {"--data " + data + kModel + " --tokenizer " + empty, "its vocabulary is empty"},
           {"--tokenizer " + empty, "without --data the run trains on the embedded corpus (byte text, no tokenizer "
                                    "needed): give --data, or drop --tokenizer"}}) {
    auto r = run_command("timeout 60 " + kTrain + " --metrics-port 0 --steps 1 " + args);
    EXPECT_NE(r.rc, 0) << args << "\n" << r.output;
    EXPECT_NE(r.rc, 124) << "hung: " << args << "\n" << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << "trained: " << r.output;
  }
}

// llm.c's uint32 files (its Llama 3 format) train as uint16 files do: the same tokens in either
// give the same losses, a uint32 file feeds a vocabulary above 65,536, and a uint16 file given to
// one is refused before the first step.
TEST(TrainerData, Uint32TokenFilesTrainAndFeedVocabulariesAboveUint16s) {
  auto d = temp_dir("data-u32");
  namespace gpt2 = coshard::gpt2;
  const auto u16 = token_file(d, "u16.bin", 300, 31);
  const auto same = gpt2::read_llmc_tokens(u16, 64);
  const auto u32 = (d / "u32.bin").string();
  gpt2::write_llmc_tokens(u32, same, gpt2::kLlmcU32);
  const auto losses = [&](const std::string& data) {
    auto r = run_command(launch(kRanks, "--steps 3 --log-json - --data " + data + kModel));
    EXPECT_EQ(r.rc, 0) << r.output;
    std::vector<double> out;
    for (const auto& s : step_records(r.output)) out.push_back(s["loss"].get<double>());
    return out;
  };
  const auto a = losses(u16), b = losses(u32);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a, b);

  // Ids across the whole of a vocabulary of 70,001, most of them above what uint16 holds.
  constexpr std::int64_t kVocab = 70001;
  gpt2::Tokens wide(300);
  for (std::size_t i = 0; i < wide.size(); ++i) wide[i] = static_cast<gpt2::Token>((i * 7919u) % kVocab);
  const auto big = (d / "big.bin").string();
  gpt2::write_llmc_tokens(big, wide, gpt2::llmc_format_for(kVocab));
  const std::string llama = " --model llama-tiny,vocab=" + std::to_string(kVocab) + " --seq 16 --batch 2 ";
  auto r = run_command(launch(kRanks, "--steps 2 --log-json - --data " + big + llama));
  ASSERT_EQ(r.rc, 0) << r.output;
  const auto s = step_records(r.output);
  ASSERT_EQ(s.size(), 2u) << r.output;
  EXPECT_NEAR(s[0]["loss"].get<double>(), std::log(static_cast<double>(kVocab)), 0.3) << r.output;

  r = run_command("timeout 60 " + kTrain + " --metrics-port 0 --steps 1 --data " + u16 + llama);
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("holds uint16 tokens, which cannot hold the ids of the model's vocabulary of 70001"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << "trained: " << r.output;
}

// Ranks started with another --lr or other data trained without complaint, each on its own (losses
// up to 1.6 apart). They are refused before the first step, naming the setting and the rank; the
// same settings spelled otherwise (a model spec's keys in another order, a path with ./) agree.
TEST(TrainerData, RanksStartedWithOtherSettingsOrDataAreRefusedNamingTheSetting) {
  auto d = temp_dir("data-agree");
  const auto data = token_file(d, "a.bin", 300, 7);
  const auto other = token_file(d, "b.bin", 300, 8);
  // Rank 1 runs with `rank1` in place of `common`'s tail.
  const auto ranks = [&](const std::string& common, const std::string& rank0, const std::string& rank1) {
    return run_command(kRun + " --nproc-per-node 2 -- sh -c 'if [ \"$RANK\" = 1 ]; then x=\"" + rank1 +
                       "\"; else x=\"" + rank0 + "\"; fi; exec " + kTrain +
                       " --metrics-port 0 --samples 0 --steps 2 --seq 16 --batch 2 --clip 0 " + common + " $x'");
  };
  const std::string model = "--model layers=1,heads=2,width=32,vocab=64,context=16";
  auto r = ranks(model + " --data " + data, "--lr 0.003", "--lr 0.001");
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("the ranks were started with different --lr: rank 1 differs from rank 0"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << "trained: " << r.output;
  EXPECT_LT(r.seconds, 60) << "found at the collective deadline, not at start";

  r = ranks(model, "--data " + data, "--data " + other);
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("the ranks were started with different --data: rank 1 differs from rank 0 (--data is 300 "
                          "tokens, hash "),
            std::string::npos)
      << r.output;

  r = ranks("--data " + data, model, "--model vocab=64,context=16,layers=1,width=32,heads=2");
  EXPECT_EQ(r.rc, 0) << r.output;
  r = run_command("cd " + d.string() + " && " + kRun + " --nproc-per-node 2 -- sh -c 'if [ \"$RANK\" = 1 ]; then x=" +
                  data + "; else x=./a.bin; fi; exec " + kTrain + " --metrics-port 0 --samples 0 --steps 2 --seq 16 " +
                  "--batch 2 --clip 0 " + model + " --data $x'");
  EXPECT_EQ(r.rc, 0) << r.output;
}

// A resume took another --val-fraction (losses 0.157 apart) and a --data file replaced at the same
// path (0.961 apart): only the path was recorded. The checkpoint now records the data by content
// and the split; the same content under another path resumes.
TEST(TrainerData, AResumeRefusesOtherDataOrSplitAndTakesTheSameDataAnywhere) {
  auto d = temp_dir("data-resume");
  const auto data = token_file(d, "a.bin", 600, 7);
  const std::string ckpt = (d / "ckpt").string();
  const std::string common = "--steps 4 --val-fraction 0.1 --eval-every 2" + kModel;
  auto r = run_command(launch(kRanks, common + " --data " + data + " --checkpoint-every 2 --checkpoint-dir " + ckpt));
  ASSERT_EQ(r.rc, 0) << r.output;
  const std::string from = " --resume " + ckpt + "/step-00000002";

  r = run_command(launch(kRanks, "--steps 4 --val-fraction 0.5 --eval-every 2" + kModel + " --data " + data + from));
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("was trained with --val-fraction 0.10000000000000001 and this run has 0.5: set "
                          "--val-fraction as it was"),
            std::string::npos)
      << r.output;

  const auto moved = (d / "moved.bin").string();
  fs::copy_file(data, moved);
  r = run_command(launch(kRanks, common + " --data " + moved + from));
  EXPECT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("at step 2 of 4"), std::string::npos) << r.output;

  token_file(d, "a.bin", 600, 9);  // replaced in place: the same path, other tokens
  r = run_command(launch(kRanks, common + " --data " + data + from));
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("was trained with data of 600 tokens, hash "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("give the --data it was trained on"), std::string::npos) << r.output;
}

// A FIFO or /dev/null as --data or --init said "Operation not supported" (std::filesystem's
// file_size of what is not a regular file), or blocked on the FIFO.
TEST(TrainerData, AFifoOrDeviceAsDataOrInitIsNamedAsNoRegularFile) {
  auto d = temp_dir("data-fifo");
  const auto fifo = (d / "tokens.bin").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto data = token_file(d, "a.bin", 300, 7);
  for (const std::string& flags : std::vector<std::string>{"--data /dev/null", "--data " + fifo, "--data " + data +
                                                           " --init /dev/null", "--data " + data + " --init " + fifo}) {
    auto r = run_command("timeout 60 " + kTrain + " --metrics-port 0 --steps 1 " + flags + kModel);
    EXPECT_NE(r.rc, 0) << flags << ": " << r.output;
    EXPECT_NE(r.output.find("it is not a regular file (a FIFO, socket or device)"), std::string::npos)
        << flags << ": " << r.output;
    EXPECT_EQ(r.output.find("Operation not supported"), std::string::npos) << r.output;
  }
}

}  // namespace
