// meshtrain launch: DeepSpeed hostfile parsing and --include/--exclude filters as pure functions,
// and end to end through mpirun: rank-tagged output, a failing rank's exit code, bad hostfiles.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "base/affinity.h"
#include "base/error.h"
#include "cli/cli_test_util.h"
#include "cli/hostfile.h"

namespace fs = std::filesystem;
using mt::cli::HostSlots;
using mt::cli::hostfile_filter;
using mt::cli::hostfile_parse;

namespace {

std::string dir() {
  static std::string d = mt::cli::testing::make_test_dir("mt_launch_test");
  return d;
}

std::string write(const std::string& name, const std::string& text) {
  std::string path = dir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

int run(const std::string& args, std::string* out = nullptr, std::string* err = nullptr) {
  return mt::cli::testing::run_meshtrain(dir(), args, out, err);
}

// The exception's message, or "" when parsing succeeds.
std::string parse_error(const std::string& text) {
  try {
    hostfile_parse(text, "hosts.txt");
  } catch (const mt::Error& e) {
    EXPECT_EQ(e.kind(), mt::ErrorKind::kInvalidArgument);
    return e.what();
  }
  return "";
}

// `launch -n 1 -- config check` of a tiny model written to `name`: the environment the test set is
// what launch sees; its mpirun line is on *err.
int launch_one_rank(const std::string& name, std::string* out, std::string* err) {
  return run("launch -n 1 -- config check " +
                 write(name, R"({"model": {"model_type": "gpt2", "vocab_size": 97, "n_positions": 32,)"
                             R"( "n_embd": 48, "n_layer": 2, "n_head": 4}, "train_micro_batch_size_per_gpu": 1})"),
             out, err);
}

}  // namespace

TEST(Hostfile, ParsesHostsCommentsAndBlankLines) {
  auto hosts = hostfile_parse("# cluster\n\nworker-1 slots=4\n  worker-2   slots=8  # big one\n\t\n", "hosts.txt");
  ASSERT_EQ(hosts.size(), 2u);
  EXPECT_EQ(hosts[0].host, "worker-1");
  EXPECT_EQ(hosts[0].slots, 4);
  EXPECT_EQ(hosts[1].host, "worker-2");
  EXPECT_EQ(hosts[1].slots, 8);
  EXPECT_TRUE(hostfile_parse("# nothing\n\n", "h").empty());
}

TEST(Hostfile, RejectsBadLinesNamingFileAndLine) {
  EXPECT_NE(parse_error("a slots=1\nworker-1 4\n").find("hosts.txt:2:"), std::string::npos);
  EXPECT_NE(parse_error("worker-1\n").find("hosts.txt:1:"), std::string::npos);
  // Words after slots=N are ignored, as DeepSpeed's `^(\S+)\s+slots=(\d+)` ignores them (OpenMPI's
  // max_slots=M was refused); a name with mpirun's separators is refused (it ran elsewhere).
  EXPECT_EQ(parse_error("worker-1 slots=2 max_slots=4\n"), "");
  EXPECT_EQ(hostfile_parse("worker-1 slots=2 max_slots=4\n", "h")[0].slots, 2);
  EXPECT_NE(parse_error("a,b slots=1\n").find("hosts.txt:1: host name `a,b` holds ',' or ':'"), std::string::npos);
  EXPECT_NE(parse_error("a:3 slots=1\n").find("hosts.txt:1:"), std::string::npos);
  EXPECT_NE(parse_error("worker-1 slots=0\n").find("hosts.txt:1: slots=0"), std::string::npos);
  EXPECT_NE(parse_error("worker-1 slots=-2\n").find("hosts.txt:1:"), std::string::npos);
  EXPECT_NE(parse_error("worker-1 slots=x\n").find("hosts.txt:1:"), std::string::npos);
  EXPECT_NE(parse_error("worker-1 slots=99999999999\n").find("hosts.txt:1:"), std::string::npos);
  std::string dup = parse_error("# c\nw1 slots=2\nw2 slots=2\nw1 slots=4\n");
  EXPECT_NE(dup.find("hosts.txt:4:"), std::string::npos) << dup;
  EXPECT_NE(dup.find("line 2"), std::string::npos) << dup;
}

TEST(Hostfile, IncludeAndExclude) {
  std::vector<HostSlots> hosts = {{"a", 4, {}}, {"b", 2, {}}, {"c", 8, {}}};
  auto slots = [](const std::vector<HostSlots>& v) {
    std::string s;
    for (const auto& h : v) s += h.host + ":" + std::to_string(h.slots) + " ";
    return s;
  };
  EXPECT_EQ(slots(hostfile_filter(hosts, "", "")), "a:4 b:2 c:8 ");
  EXPECT_EQ(slots(hostfile_filter(hosts, "c@a", "")), "a:4 c:8 ");
  EXPECT_EQ(slots(hostfile_filter(hosts, "a:0,2@b", "")), "a:2 b:2 ");
  // The slot indices kept are the ranks' devices (DeepSpeed's CUDA_VISIBLE_DEVICES).
  EXPECT_EQ(hostfile_filter(hosts, "a:2,0@b", "")[0].ids, (std::vector<int>{0, 2}));
  EXPECT_TRUE(hostfile_filter(hosts, "a:2,0@b", "")[1].ids.empty());
  EXPECT_EQ(hostfile_filter(hosts, "", "a:1")[0].ids, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(slots(hostfile_filter(hosts, "", "b")), "a:4 c:8 ");
  EXPECT_EQ(slots(hostfile_filter(hosts, "", "a:1@c:0,1,7")), "a:3 b:2 c:5 ");
  EXPECT_EQ(slots(hostfile_filter(hosts, "", "b:0,1")), "a:4 c:8 ");
  EXPECT_THROW(hostfile_filter(hosts, "a", "b"), mt::Error);     // mutually exclusive
  EXPECT_THROW(hostfile_filter(hosts, "zz", ""), mt::Error);     // unknown host
  EXPECT_THROW(hostfile_filter(hosts, "b:2", ""), mt::Error);    // slot out of range
  EXPECT_THROW(hostfile_filter(hosts, "", "a:x"), mt::Error);    // not an index
  EXPECT_THROW(hostfile_filter(hosts, "a@", ""), mt::Error);     // empty host
}

TEST(Launch, RunsASubcommandOnTwoRanksWithTaggedOutput) {
  std::string cfg = write("tiny.json",
                          R"({"model": {"model_type": "gpt2", "vocab_size": 97, "n_positions": 32, "n_embd": 48,)"
                          R"( "n_layer": 2, "n_head": 4}, "train_micro_batch_size_per_gpu": 1})");
  std::string out, err;
  ASSERT_EQ(run("launch -n 2 -- config check " + cfg, &out, &err), 0) << out << err;
  // OpenMPI's --tag-output: [jobid,rank]<stdout>:line
  EXPECT_NE(out.find(",0]<stdout>:{"), std::string::npos) << out;
  EXPECT_NE(out.find(",1]<stdout>:{"), std::string::npos) << out;
  EXPECT_NE(err.find("launch: mpirun "), std::string::npos) << err;
  EXPECT_NE(err.find("-np 2"), std::string::npos) << err;
  EXPECT_NE(err.find("--host localhost:2"), std::string::npos) << err;
  EXPECT_NE(err.find("-x MT_LAUNCHED=1"), std::string::npos) << err;
  EXPECT_NE(err.find("-x OMP_NUM_THREADS="), std::string::npos) << err;
}

// A user's OMP_NUM_THREADS is what the ranks get (hosts sharing cores: scripts/netns-hosts.sh).
TEST(Launch, AUsersOmpNumThreadsWins) {
  const char* before = std::getenv("OMP_NUM_THREADS");
  std::string saved = before ? before : "";
  setenv("OMP_NUM_THREADS", "3", 1);
  std::string out, err;
  int rc = launch_one_rank("omp.json", &out, &err);
  if (before) setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  else unsetenv("OMP_NUM_THREADS");
  ASSERT_EQ(rc, 0) << out << err;
  EXPECT_NE(err.find("-x OMP_NUM_THREADS=3 "), std::string::npos) << err;
}

// MT_REDUCE_SCATTER must reach the ranks of every host alike: a rank that took the other path
// would wait for messages that never come.
TEST(Launch, PassesTheReduceScatterChoiceToEveryHost) {
  setenv("MT_REDUCE_SCATTER", "mpi", 1);
  std::string out, err;
  int rc = launch_one_rank("rs.json", &out, &err);
  unsetenv("MT_REDUCE_SCATTER");
  ASSERT_EQ(rc, 0) << out << err;
  EXPECT_NE(err.find("-x MT_REDUCE_SCATTER=mpi "), std::string::npos) << err;
}

TEST(Launch, PassesMasterAddrAndPortThrough) {
  std::string out, err;
  std::string hosts = write("one.txt", "localhost slots=1\n");
  ASSERT_EQ(run("launch --hostfile " + hosts + " --master_addr 127.0.0.1 --master_port 29500 -- config check " +
                    write("t2.json", R"({"model": {"model_type": "gpt2", "vocab_size": 97, "n_positions": 32,)"
                                     R"( "n_embd": 48, "n_layer": 2, "n_head": 4}, "train_micro_batch_size_per_gpu": 1})"),
                &out, &err),
            0)
      << out << err;
  EXPECT_NE(err.find("-x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500"), std::string::npos) << err;
  EXPECT_NE(err.find("-np 1 "), std::string::npos) << err;  // -n defaults to every slot
}

// DeepSpeed's --bind_cores_to_rank: each rank of the host on a core of its own, as the kernel now
// runs it (the rank's line reads its mask back), a thread each; the request reaches the ranks as
// MT_BIND_CORES. More ranks than the list's cores, or a bad list, exit 2 before mpirun runs.
TEST(Launch, BindCoresToRankGivesEachRankACoreOfItsOwn) {
  std::string out, err;
  const std::string cfg = write("bind.json", R"({"model": {"model_type": "gpt2", "vocab_size": 97, "n_positions": 32,)"
                                             R"( "n_embd": 48, "n_layer": 2, "n_head": 4}, "train_micro_batch_size_per_gpu": 1})");
  const std::vector<int> cores = mt::one_cpu_per_core(mt::allowed_cpus());
  if (cores.size() >= 2) {
    // Without a list, every core: each of the two ranks its half, a thread per core of it (over the
    // user's OMP_NUM_THREADS, as DeepSpeed).
    const char* before = std::getenv("OMP_NUM_THREADS");
    const std::string saved = before ? before : "";
    setenv("OMP_NUM_THREADS", "5", 1);
    const int rc = run("launch -n 2 --bind_cores_to_rank -- config check " + cfg, &out, &err);
    if (before) setenv("OMP_NUM_THREADS", saved.c_str(), 1);
    else unsetenv("OMP_NUM_THREADS");
    ASSERT_EQ(rc, 0) << out << err;
    EXPECT_NE(err.find("-x MT_BIND_CORES=all"), std::string::npos) << err;
    const size_t half = cores.size() / 2;
    EXPECT_NE(err.find("-x OMP_NUM_THREADS=" + std::to_string(half) + " "), std::string::npos) << err;
    for (size_t r : {0, 1}) {
      const std::vector<int> mine(cores.begin() + static_cast<long>(r * half), cores.begin() + static_cast<long>((r + 1) * half));
      EXPECT_NE(err.find("meshtrain: rank " + std::to_string(r) + " (local " + std::to_string(r) + " of 2) bound to CPU" +
                         (half == 1 ? " " : "s ") + mt::format_core_list(mine) + ", " + std::to_string(half) +
                         " OpenMP thread"),
                std::string::npos)
          << err;
    }
  }
  const std::string first = std::to_string(mt::allowed_cpus().front());
  EXPECT_EQ(run("launch -n 2 --bind_cores_to_rank --bind_core_list " + first + " -- config check " + cfg, &out, &err), 2);
  EXPECT_NE(err.find("2 ranks on this host but 1 cores to bind them to (" + first + ")"), std::string::npos) << err;
  EXPECT_EQ(err.find("launch: mpirun"), std::string::npos) << err;
  EXPECT_EQ(run("launch -n 1 --bind_cores_to_rank --bind_core_list 1,0 -- config check " + cfg, &out, &err), 2);
  EXPECT_NE(err.find("core list '1,0': '0' overlaps or precedes"), std::string::npos) << err;
  ASSERT_EQ(run("launch -n 1 --bind_core_list " + first + " -- config check " + cfg, &out, &err), 0) << err;
  EXPECT_NE(err.find("--bind_core_list has no effect without --bind_cores_to_rank"), std::string::npos) << err;
  EXPECT_EQ(err.find("bound to"), std::string::npos) << err;
}

TEST(Launch, FailingRanksGiveTheirExitCode) {
  std::string out, err;
  EXPECT_EQ(run("launch -n 2 -- config check /nonexistent.json", &out, &err), 2) << out << err;
  EXPECT_NE(err.find("cannot open"), std::string::npos) << err;
}

// mpirun itself killed (the OOM killer, an operator's kill -9): the launcher exited 137 with no
// line. A stand-in mpirun first on PATH kills itself.
TEST(Launch, AKilledMpirunIsSaid) {
  const std::string bin = dir() + "/killed-bin";
  fs::create_directories(bin);
  const std::string fake = write("killed-bin/mpirun", "#!/bin/sh\nkill -9 $$\n");
  fs::permissions(fake, fs::perms::owner_all);
  const char* path = std::getenv("PATH");
  const std::string saved = path ? path : "";
  setenv("PATH", (bin + ":" + saved).c_str(), 1);
  std::string err;
  const int rc = run("launch -n 1 -- config check x.json", nullptr, &err);
  setenv("PATH", saved.c_str(), 1);
  EXPECT_EQ(rc, 137) << err;
  EXPECT_NE(err.find("launch: mpirun was killed by signal 9 (Killed); its ranks end with it"), std::string::npos) << err;
}

TEST(Launch, BadHostfileExits2NamingFileAndLine) {
  std::string hosts = write("bad.txt", "# ok\nlocalhost slots=2\nworker slots=two\n");
  std::string err;
  EXPECT_EQ(run("launch -n 1 --hostfile " + hosts + " -- config check x.json", nullptr, &err), 2);
  EXPECT_NE(err.find(hosts + ":3:"), std::string::npos) << err;
  EXPECT_EQ(err.find("launch: mpirun"), std::string::npos) << err;  // nothing ran
  // A FIFO hung the launcher waiting for a writer (and /dev/zero read until memory ran out); a
  // directory said "no hosts".
  const std::string fifo = dir() + "/hosts.fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  for (const std::string& h : {fifo, dir()}) {
    EXPECT_EQ(run("launch -n 1 --hostfile " + h + " -- config check x.json", nullptr, &err), 2) << h;
    EXPECT_NE(err.find(h + ": the hostfile is not a regular file"), std::string::npos) << err;
  }
}

TEST(Launch, MoreRanksThanSlotsNamesTheCounts) {
  std::string hosts = write("two.txt", "localhost slots=2\n");
  std::string err;
  EXPECT_EQ(run("launch -n 3 --hostfile " + hosts + " -- config check x.json", nullptr, &err), 2);
  EXPECT_NE(err.find("-n 3 ranks but only 2 slots"), std::string::npos) << err;
  EXPECT_EQ(run("launch -n 1 -- ", nullptr, &err), 2);  // nothing to run
  EXPECT_NE(err.find("nothing to run"), std::string::npos) << err;
}

// DeepSpeed's launcher's command lines (a review against deepspeed/launcher/runner.py): options
// after the subcommand are the subcommand's (launch took --num_gpus there: -np 2); --include with
// --num_gpus refused (it overrode the slots); a slot subset becomes CUDA_VISIBLE_DEVICES; the
// .deepspeed_env file reaches the ranks; -H/-i/-e and DeepSpeed's no-op switches are read; a port
// outside 1..65535 is refused (0 and -5 were dropped, 99999 exported).
TEST(Launch, DeepSpeedsLauncherCommandLines) {
  const std::string cfg = write("ds-cli.json", R"({"model": {"model_type": "gpt2", "vocab_size": 97, "n_positions": 32,)"
                                               R"( "n_embd": 48, "n_layer": 2, "n_head": 4}, "train_micro_batch_size_per_gpu": 1})");
  const std::string two = write("two.txt", "localhost slots=2\n");
  std::string out, err;
  // No "--": the subcommand's own -n 2 is not launch's (config check refuses it, on its one rank).
  EXPECT_NE(run("launch config check " + cfg + " -n 2", &out, &err), 0) << err;
  EXPECT_NE(err.find("-np 1 "), std::string::npos) << err;
  EXPECT_EQ(err.find("-np 2 "), std::string::npos) << err;
  ASSERT_EQ(run("launch -n 1 config check " + cfg, &out, &err), 0) << err;
  EXPECT_EQ(run("launch -H " + two + " -i localhost:0 --num_gpus 2 -- config check " + cfg, &out, &err), 2);
  EXPECT_NE(err.find("--num_gpus/--num_nodes cannot be given with --include/--exclude"), std::string::npos) << err;
  ASSERT_EQ(run("launch -H " + two + " -i localhost:1 --no_ssh_check --launcher openmpi config check " + cfg, &out, &err), 0)
      << err;
  EXPECT_NE(err.find("-np 1 --host localhost:1"), std::string::npos) << err;
  EXPECT_NE(err.find("-x CUDA_VISIBLE_DEVICES=1 "), std::string::npos) << err;
  EXPECT_EQ(run("launch -n 1 --launcher pdsh config check " + cfg, &out, &err), 2);
  EXPECT_NE(err.find("--launcher pdsh is not supported"), std::string::npos) << err;
  for (const char* port : {"0", "-5", "99999"}) {
    EXPECT_EQ(run(std::string("launch -n 1 --master_port=") + port + " config check " + cfg, &out, &err), 2) << port;
    EXPECT_NE(err.find("--master_port must be a port in 1..65535"), std::string::npos) << err;
  }
  const std::string env = write("ds.env", "# exported to every rank\nMY_SETTING=a b\n\n");
  setenv("DS_ENV_FILE", env.c_str(), 1);
  int rc = run("launch -n 1 config check " + cfg, &out, &err);
  write("bad.env", "export FOO=bar\n");
  setenv("DS_ENV_FILE", (dir() + "/bad.env").c_str(), 1);
  int bad = run("launch -n 1 config check " + cfg, &out, &err);
  std::string bad_err = err;
  setenv("DS_ENV_FILE", mt::cli::testing::kNoDeepSpeedEnv, 1);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(bad, 2);
  EXPECT_NE(bad_err.find("bad.env:1: expected KEY=VALUE"), std::string::npos) << bad_err;
  ASSERT_EQ(run("launch -n 1 config check " + cfg, &out, &err), 0) << err;
  EXPECT_EQ(err.find("MY_SETTING"), std::string::npos) << err;
  setenv("DS_ENV_FILE", env.c_str(), 1);
  ASSERT_EQ(run("launch -n 1 config check " + cfg, &out, &err), 0) << err;
  setenv("DS_ENV_FILE", mt::cli::testing::kNoDeepSpeedEnv, 1);
  EXPECT_NE(err.find("-x 'MY_SETTING=a b'"), std::string::npos) << err;
  {  // Without DS_ENV_FILE, DeepSpeed's default: .deepspeed_env in $HOME (the tests' own HOME here).
    const std::string home = dir() + "/home";
    std::filesystem::create_directories(home);
    std::ofstream(home + "/.deepspeed_env") << "FROM_HOME=1\n";
    const char* was = std::getenv("HOME");
    const std::string saved = was ? was : "";
    setenv("HOME", home.c_str(), 1);
    unsetenv("DS_ENV_FILE");
    const int home_rc = run("launch -n 1 config check " + cfg, &out, &err);
    setenv("DS_ENV_FILE", mt::cli::testing::kNoDeepSpeedEnv, 1);
    if (was) setenv("HOME", saved.c_str(), 1);
    else unsetenv("HOME");
    EXPECT_EQ(home_rc, 0) << err;
    EXPECT_NE(err.find("-x FROM_HOME=1"), std::string::npos) << err;
  }
  // Other slot indices on two hosts: CPU ranks count slots, so it runs, with a line (it was refused).
  // (The second host does not resolve: mpirun fails fast, after the line.)
  const std::string pair = write("pair.txt", "localhost slots=2\nbadhost.invalid slots=2\n");
  run("launch -H " + pair + " -e localhost:0 -n 3 config check " + cfg, &out, &err);
  EXPECT_NE(err.find("-np 3 --host localhost:1,badhost.invalid:2"), std::string::npos) << err;
  EXPECT_NE(err.find("CUDA_VISIBLE_DEVICES is not set"), std::string::npos) << err;
  EXPECT_EQ(err.find("-x CUDA_VISIBLE_DEVICES"), std::string::npos) << err;
  // A fully qualified name is the host ssh is asked for (OpenMPI shortened it to "badhost").
  const std::string fqdn = write("fqdn.txt", "badhost.invalid slots=1\n");
  EXPECT_NE(run("launch -H " + fqdn + " config check " + cfg, &out, &err), 0);
  EXPECT_NE(err.find("--mca orte_keep_fqdn_hostnames 1"), std::string::npos) << err;
  EXPECT_EQ(err.find("hostname badhost:"), std::string::npos) << err;
}

// DeepSpeed's own config flags: the switch --deepspeed with --deepspeed_config FILE, and the
// --local_rank its launcher appends (the switch took "--deepspeed_config" as its file; both were
// refused, on every rank).
TEST(Launch, DeepSpeedsConfigFlagsAreRead) {
  const std::string ds = write("dsflags.json", R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}})");
  const std::string model = write("dsflags-model.json", R"({"model_type": "gpt2", "vocab_size": 97, "n_positions": 32,)"
                                                        R"( "n_embd": 48, "n_layer": 2, "n_head": 4})");
  std::string out, err;
  for (const std::string& flags : {"--deepspeed --deepspeed_config " + ds, "--deepspeed_config " + ds, "--deepscale_config " + ds,
                                   "--deepspeed " + ds + " --local_rank=0"}) {
    ASSERT_EQ(run("config check " + flags + " --model " + model, &out, &err), 0) << flags << ": " << err;
    EXPECT_NE(out.find("\"stage\": 2"), std::string::npos) << flags << ": " << out;
  }
  EXPECT_EQ(run("config check --deepspeed " + ds + " --deepspeed_config " + model + " --model " + model, &out, &err), 2);
  EXPECT_NE(err.find("name two files: give one"), std::string::npos) << err;
}
