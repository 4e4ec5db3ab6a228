// coshard-run's flags (options.hpp), parsed in process: what each sets, each usage error and what
// it names, and a Slurm step's flags, from an environment given here.
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "options.hpp"

namespace {

using coshard::run::Options;
using coshard::run::parse_options;
using coshard::run::ParseResult;

using Env = std::map<std::string, std::string>;

ParseResult parsed(const std::string& line, const Env& env = {}) {
  std::vector<std::string> words{"coshard-run"};
  std::istringstream in(line);
  for (std::string w; in >> w;) words.push_back(w);
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  return parse_options(static_cast<int>(argv.size()), argv.data(),
                       [&](std::string_view name) -> std::optional<std::string> {
                         auto it = env.find(std::string(name));
                         if (it == env.end()) return std::nullopt;
                         return it->second;
                       });
}

Options parse(const std::string& line, const Env& env = {}) {
  ParseResult r = parsed(line, env);
  if (!r.options) {
    ADD_FAILURE() << line << " was refused: " << r.message;
    return {};
  }
  return *r.options;
}

// The message of the usage error `line` is (exit code 2), or "" when it parses.
std::string error_of(const std::string& line, const Env& env = {}) {
  const ParseResult r = parsed(line, env);
  if (r.options) return "";
  EXPECT_EQ(r.exit_code, 2) << line;
  EXPECT_NE(r.message.find("(coshard-run --help shows the usage)"), std::string::npos) << r.message;
  return r.message;
}

TEST(LauncherOptions, EachFlagSetsWhatItNames) {
  const Options o = parse(
      "--nproc-per-node 3 --nnodes 2:4 --node-rank 1 --master host7:29400 --token t --grace 7 --max-restarts 2 "
      "--join-timeout 9 --rejoin-timeout 11 --last-call 13 --take-in-timeout 17 --silence-timeout 6 -- prog --a b");
  EXPECT_EQ(o.nproc_per_node, 3);
  EXPECT_EQ(o.min_nodes, 2);
  EXPECT_EQ(o.nnodes, 4);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "host7");
  EXPECT_EQ(o.master_port, 29400);
  EXPECT_EQ(o.token, "t");
  EXPECT_EQ(o.grace_seconds, 7);
  EXPECT_EQ(o.max_restarts, 2);
  EXPECT_EQ(o.join_timeout.count(), 9);
  EXPECT_EQ(o.rejoin_timeout.count(), 11);
  EXPECT_EQ(o.last_call.count(), 13);
  EXPECT_EQ(o.take_in_timeout.count(), 17);
  EXPECT_EQ(o.silence_timeout.count(), 6);
  EXPECT_EQ(o.command, (std::vector<std::string>{"prog", "--a", "b"}));
}

TEST(LauncherOptions, TheDefaults) {
  const Options o = parse("-- prog");
  EXPECT_EQ(o.nproc_per_node, 1);
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.min_nodes, 1);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 0);
  EXPECT_EQ(o.rejoin_timeout.count(), 60);
  EXPECT_EQ(o.silence_timeout.count(), 15);
  EXPECT_EQ(o.take_in_timeout.count(), 300);
  // The program's own flags are its own, even one that coshard-run also has.
  EXPECT_EQ(parse("-- prog --nnodes 2").command, (std::vector<std::string>{"prog", "--nnodes", "2"}));
}

TEST(LauncherOptions, EachUsageErrorNamesTheFlagAndWhatToDo) {
  const std::string multi = "--nnodes 2 --nproc-per-node 1 --master 127.0.0.1:29400 --token t ";
  const struct {
    std::string line, says;
  } rows[] = {
      {"--nproc-per-node zero -- true", "--nproc-per-node needs an integer in [1, 1024], got 'zero'"},
      {"--nproc-per-node 2", "no program given: put it after --"},
      {"--nproc-per-node", "--nproc-per-node"},
      {"--frobnicate 1 -- true", "--frobnicate"},
      {"prog --nproc-per-node 2", "prog; coshard-run's flags go before --, the program and its arguments after it"},
      {"--token -- true", "--token"},
      {"--nnodes 2 --nproc-per-node 1 -- true", "--nnodes > 1 needs --master ADDR:PORT with a fixed port"},
      {"--nnodes 2 --nproc-per-node 1 --master 127.0.0.1:29400 -- true", "--nnodes > 1 needs --token T"},
      {"--nnodes 2 --node-rank 2 --nproc-per-node 1 --master 127.0.0.1:29400 --token t -- true",
       "--node-rank 2 must be below --nnodes 2: give each of the 2 nodes its own --node-rank from 0 to 1"},
      {"--master nohost -- true", "--master needs ADDR:PORT, got 'nohost'"},
      {"--master h:70000 -- true", "--master port needs an integer in [0, 65535], got '70000'"},
      {"--nproc-per-node 1 --rejoin-timeout 0 -- true", "--rejoin-timeout needs an integer in [1, 86400], got '0'"},
      {"--silence-timeout 2 -- true", "--silence-timeout needs an integer in [3, 3600], got '2'"},
      {"--nnodes 3:2 -- true", "--nnodes MIN needs an integer in [1, 2], got '3'"},
      {multi + "--nnodes 1:2 -- true", "goes on without a lost node by restarting the others: give --max-restarts N"},
      {multi + "--last-call 5 -- true", "drop --last-call, or give --nnodes MIN:2"},
      {multi + "--take-in-timeout 5 -- true", "drop --take-in-timeout, or give --nnodes MIN:2"},
  };
  for (const auto& r : rows) {
    const std::string got = error_of(r.line);
    EXPECT_NE(got.find(r.says), std::string::npos) << r.line << "\n  says: " << got;
  }
}

// --help (or -h) is the help, exit code 0: the usage line, every flag with its default, in the
// trainer's style (CLI11's); after "--" it is the program's.
TEST(LauncherOptions, HelpListsEveryFlagWithItsDefault) {
  for (const char* line : {"--help", "-h", "--nproc-per-node 2 --help -- prog"}) {
    const ParseResult r = parsed(line);
    EXPECT_FALSE(r.options) << line;
    EXPECT_EQ(r.exit_code, 0) << line;
    for (const char* says : {"Usage: coshard-run [OPTIONS] -- PROGRAM [ARGS...]", "--nproc-per-node N=1",
                             "--nnodes [MIN:]M=1", "--master ADDR:PORT", "--silence-timeout SECONDS=15",
                             "--take-in-timeout SECONDS=300", "--rejoin-timeout SECONDS=60", "Inside a Slurm step"}) {
      EXPECT_NE(r.message.find(says), std::string::npos) << line << ": no '" << says << "' in\n" << r.message;
    }
  }
  EXPECT_EQ(parse("-- prog --help").command, (std::vector<std::string>{"prog", "--help"}));
}

// A flag given twice takes its last value, as gpt2-train's and torchrun's do, so that a wrapper
// sets defaults its user's flags override; --flag=value reads as --flag value.
TEST(LauncherOptions, TheLastOfARepeatedFlagWinsAndEqualsSignsRead) {
  const Options o = parse("--nproc-per-node 2 --grace 3 --nproc-per-node=4 -- prog");
  EXPECT_EQ(o.nproc_per_node, 4);
  EXPECT_EQ(o.grace_seconds, 3);
}

// srun --ntasks-per-node=1 coshard-run ...: the step gives the node count, node rank, master and
// token; flags that contradict it are named with what to do.
TEST(LauncherOptions, ASlurmStepGivesTheNodesAndRefusesFlagsThatContradictIt) {
  const Env step{{"SLURM_STEP_ID", "3"},          {"SLURM_PROCID", "1"},        {"SLURM_JOB_ID", "4242"},
                 {"SLURM_STEP_NODELIST", "n[1-2]"}, {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}, {"SLURM_NODEID", "1"}};
  const Options o = parse("--nproc-per-node 2 -- prog", step);
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.min_nodes, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "n1");
  EXPECT_EQ(o.token, "slurm-4242.3");
  EXPECT_NE(o.master_port, 0);
  EXPECT_NE(error_of("--nnodes 3 -- prog", step).find("--nnodes 3 but this Slurm step spans 2 host(s) (n1...)"),
            std::string::npos);
  EXPECT_NE(error_of("--node-rank 0 -- prog", step).find("--node-rank 0 but Slurm runs this task on n2, node 1 of the "
                                                         "step: drop --node-rank"),
            std::string::npos);
  Env two_tasks = step;
  two_tasks["SLURM_STEP_TASKS_PER_NODE"] = "2(x2)";
  EXPECT_NE(error_of("-- prog", two_tasks).find("runs 2 coshard-run tasks on n2"), std::string::npos);
  Env broken = step;
  broken.erase("SLURM_NODEID");
  EXPECT_NE(error_of("-- prog", broken).find("SLURM_NODEID is not set"), std::string::npos);
}

}  // namespace
