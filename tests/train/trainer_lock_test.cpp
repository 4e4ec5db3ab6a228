// gpt2-train's --checkpoint-dir lock (DIR/.lock, "pid host job beat") seen from another host,
// where kill(pid, 0) tells nothing: the holder raises its beat, and a step of the same Slurm job
// takes the lock over only once the beat stood still (its host died and Slurm requeued the job
// elsewhere), never from a live step, which used to happen at once.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "support/run_command.hpp"
#include "train/trainer_support.hpp"

namespace {

using coshard::testing::run_command;
using namespace coshard::testing::train;
namespace fs = std::filesystem;

const std::string kArgs = "--steps 2 --seq 32 --checkpoint-dir ";

// A lock as another host's process would leave it: pid 4242 on host "elsewhere".
void other_host_lock(const fs::path& dir, const std::string& job) {
  fs::create_directories(dir);
  std::ofstream(dir / ".lock") << "4242 elsewhere " << job << " 000000000007\n";
}

TEST(TrainerLock, ALiveJobRaisesTheBeatOfItsLock) {
  auto d = temp_dir("lock-beat");
  const std::string dir = (d / "c").string();
  // Long enough to be read twice, 11 s apart (a beat every 5 s); then stopped.
  auto r = run_command(launch(1, "--steps 1000000 --seq 32 --checkpoint-dir " + dir) + " > " + d.string() +
                       "/log 2>&1 & j=$!; for i in $(seq 300); do [ -s " + dir + "/.lock ] && break; sleep 0.1; done; "
                       "echo \"first=$(cat " + dir + "/.lock)\"; sleep 11; echo \"then=$(cat " + dir + "/.lock)\"; "
                       "kill $j; wait $j; true");
  std::istringstream out(r.output);
  std::string first, then;
  for (std::string line; std::getline(out, line);) {
    if (line.starts_with("first=")) first = line.substr(6);
    if (line.starts_with("then=")) then = line.substr(5);
  }
  ASSERT_FALSE(first.empty()) << r.output;
  const auto beat_at = first.rfind(' ');
  ASSERT_NE(beat_at, std::string::npos) << first;
  EXPECT_EQ(first.size() - beat_at - 1, 12u) << "the beat is 12 digits wide: " << first;
  EXPECT_EQ(then.substr(0, beat_at), first.substr(0, beat_at)) << "the holder changed: " << r.output;
  EXPECT_NE(then.substr(beat_at), first.substr(beat_at)) << "the beat stood still: " << r.output;
}

TEST(TrainerLock, ALockOfThisSlurmJobOnAnotherHostIsTakenOverOnceItsBeatStandsStill) {
  auto d = temp_dir("lock-requeue");
  other_host_lock(d / "c", "slurm:77");
  auto r = run_command("SLURM_JOB_ID=77 " + launch(1, kArgs + (d / "c").string()));
  EXPECT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("is held by pid 4242 on host elsewhere of this Slurm job (slurm:77); taking it over unless "
                          "its holder refreshes it within 15 s"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("taking over " + (d / "c" / ".lock").string() + " from pid 4242 on host elsewhere, which is "
                          "gone"),
            std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(d / "c" / ".lock")) << "the job's own lock outlived it";
}

// The second step's holder is alive: a loop that raises the beat every second, as a live
// gpt2-train does every 5 s (each record replaced whole, as a reader may look at any moment).
TEST(TrainerLock, ALockOfThisSlurmJobOnAnotherHostThatBeatsIsRefused) {
  auto d = temp_dir("lock-live");
  const fs::path dir = d / "c";
  other_host_lock(dir, "slurm:77");
  const std::string run = d.string() + "/beating";
  std::ofstream(run).close();
  const std::string beater = "n=8; while [ -e " + run + " ]; do printf '4242 elsewhere slurm:77 %012d\\n' $n > " +
                             dir.string() + "/.lock.new && mv " + dir.string() + "/.lock.new " + dir.string() +
                             "/.lock; n=$((n+1)); sleep 1; done";
  auto r = run_command("{ (" + beater + ") & b=$!; SLURM_JOB_ID=77 " + launch(1, kArgs + dir.string()) +
                       "; rc=$?; rm " + run + "; wait $b; exit $rc; }");
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("is in use by another job (pid 4242 on host elsewhere, see " + (dir / ".lock").string() +
                          "), a step of this Slurm job that refreshed the lock within 15 s"),
            std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << "trained beside a live job: " << r.output;
}

// A job whose lock another took over (as a step of its Slurm job elsewhere does after it stood
// still for 15 s) stops at its next checkpoint rather than prune checkpoints that may be the
// other's.
TEST(TrainerLock, AJobWhoseLockWasTakenOverStopsAtItsNextCheckpoint) {
  auto d = temp_dir("lock-lost");
  const std::string dir = (d / "c").string();
  auto r = run_command("{ timeout 60 " + launch(1, "--steps 1000000 --seq 32 --checkpoint-every 2 --checkpoint-dir " + dir) +
                       " & j=$!; for i in $(seq 300); do [ -s " + dir + "/.lock ] && break; sleep 0.1; done; "
                       "echo '4242 elsewhere slurm:77 000000000001' > " + dir + "/.lock.new && mv " + dir +
                       "/.lock.new " + dir + "/.lock; wait $j; }");
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("this job's lock " + dir + "/.lock was taken over by pid 4242 on host elsewhere"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("stopping rather than remove checkpoints that may be the other's"), std::string::npos)
      << r.output;
  EXPECT_TRUE(fs::exists(fs::path(dir) / ".lock")) << "the other's lock was removed";
}

// Another job's lock on another host is refused at once, as before: nothing says it is gone.
TEST(TrainerLock, AnotherJobsLockOnAnotherHostIsRefused) {
  auto d = temp_dir("lock-other");
  other_host_lock(d / "c", "slurm:78");
  auto r = run_command("SLURM_JOB_ID=77 " + launch(1, kArgs + (d / "c").string()));
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("is in use by another job (pid 4242 on host elsewhere"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("taking it over unless"), std::string::npos) << r.output;
}

}  // namespace
