// meshtrain launch -n N [--hostfile F] [DeepSpeed launcher flags] -- SUBCOMMAND ARGS...: runs
// SUBCOMMAND on N ranks through OpenMPI's mpirun, re-executing this same binary (/proc/self/exe)
// on every rank. Hosts and slots come from a DeepSpeed hostfile (or localhost with N slots),
// filtered by --include/--exclude, --num_nodes and --num_gpus/--num_procs as DeepSpeed does.
// The mpirun command line is printed on stderr first; mpirun's exit code (the first failing
// rank's) becomes ours. Every rank sees MT_LAUNCHED=1.
// NOTE: only rank 0 should draw progress bars; that is `train`'s job once data-parallel training
// lands (issue 4): it can read MT_LAUNCHED and OMPI_COMM_WORLD_RANK.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/affinity.h"
#include "base/error.h"
#include "base/threads.h"
#include "cli/commands.h"
#include "cli/hostfile.h"

namespace mt::cli {
namespace {

struct LaunchArgs {
  int n = -1;  // -1 (not given): every slot
  std::string hostfile, include, exclude, master_addr, launcher = "openmpi";
  int num_procs = 0, num_nodes = 0, master_port = 0, ssh_port = 0;
  bool n_given = false, procs_given = false, nodes_given = false;  // -n -1 ran every slot; 0 nodes, the default
  bool master_addr_given = false, master_port_given = false, ssh_port_given = false;
  bool bind_cores_to_rank = false;  // DeepSpeed's --bind_cores_to_rank, over --bind_core_list's CPUs
  std::string bind_core_list;
  std::vector<std::string> rest;
};

// The launcher's own options (DeepSpeed's names and short forms): those that take a value, and
// the switches. `launch_separate_args` stops at the first word that is none of them.
const char* const kValueOptions[] = {"-n", "--hostfile", "-H", "--num_gpus", "--num_procs", "--num_accelerators",
                                     "--num_nodes", "--include", "-i", "--exclude", "-e", "--master_addr",
                                     "--master_port", "--launcher", "--ssh_port", "--bind_core_list"};
const char* const kSwitches[] = {"-h", "--help", "--no_ssh_check", "--force_multi", "--no_local_rank",
                                 "--bind_cores_to_rank"};


// DeepSpeed's DS_ENV_FILE (.deepspeed_env, in the home directory and then the working directory):
// KEY=VAL lines exported to every rank. Blank lines and '#' comments are skipped; any other line
// without '=' is refused naming it.
std::vector<std::string> deepspeed_env_exports() {
  const char* name = std::getenv("DS_ENV_FILE");
  const std::string file = name && *name ? name : ".deepspeed_env";
  std::vector<std::string> dirs;
  if (const char* home = std::getenv("HOME"); home && *home) dirs.push_back(home);
  dirs.push_back(".");
  std::vector<std::string> out;
  for (const std::string& dir : dirs) {
    const std::string path = std::filesystem::path(file).is_absolute() ? file : dir + "/" + file;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) continue;  // as DeepSpeed's os.path.isfile
    const std::string text = read_launcher_file(path, "environment file");
    size_t pos = 0;
    for (int lineno = 1; pos < text.size(); ++lineno) {
      size_t nl = text.find('\n', pos);
      std::string line = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
      pos = nl == std::string::npos ? text.size() : nl + 1;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos || line[line.find_first_not_of(" \t")] == '#') continue;
      // A variable's name, else mpirun drops it without a word (`export FOO=bar` was passed on).
      const size_t eq = line.find('=');
      const std::string key = line.substr(0, eq);
      const bool name_ok = eq != std::string::npos && !key.empty() && !std::isdigit(static_cast<unsigned char>(key[0])) &&
                           std::all_of(key.begin(), key.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
      MT_CHECK(name_ok, ErrorKind::kInvalidArgument,
               path + ":" + std::to_string(lineno) + ": expected KEY=VALUE with KEY a variable name, got `" + line + "`");
      out.push_back(line);
    }
    if (std::filesystem::path(file).is_absolute()) break;
  }
  return out;
}


// SIGTERM / SIGINT / SIGHUP to the launcher stop the ranks after their step and its save: mpirun
// gets SIGUSR1 (SIGUSR2 for SIGINT), which it passes to every rank and lets the job run on, and
// `train` stops on them as on SIGTERM (SIGINT). mpirun's own SIGTERM/SIGINT kill the ranks about
// a second later, in the middle of the stop's save (it exited 1, and a save that took longer was
// lost). mpirun runs in its own process group, so a terminal's Ctrl-C reaches the launcher only.
// A second signal is passed on as SIGINT: mpirun then ends the job at once. The launcher keeps
// waiting for mpirun, so no rank outlives it.
// If the launcher itself dies (SIGKILL, a job-group kill), mpirun gets SIGINT from the kernel
// (PR_SET_PDEATHSIG) and ends its ranks. SIGQUIT (Ctrl-\) ends the job at once. A signal the
// launcher was started ignoring (nohup's SIGHUP) stays ignored.
volatile std::sig_atomic_t g_child = 0;
volatile std::sig_atomic_t g_first_signal = 0;
volatile std::sig_atomic_t g_killed = 0;  // mpirun was sent SIGINT: it ends the ranks itself

void forward_signal(int sig) {
  if (g_child <= 0) return;
  if (g_first_signal == 0 && sig != SIGQUIT) {
    g_first_signal = sig == SIGINT ? SIGINT : SIGTERM;  // SIGHUP stops the ranks as SIGTERM does
    ::kill(static_cast<pid_t>(g_child), sig == SIGINT ? SIGUSR2 : SIGUSR1);
  } else {
    if (g_first_signal == 0) g_first_signal = SIGTERM;
    g_killed = 1;
    ::kill(static_cast<pid_t>(g_child), SIGINT);  // mpirun's SIGTERM is held (run_process); SIGINT ends it alike
  }
}

// Ctrl-Z (SIGTSTP from the terminal) reaches the launcher only, mpirun being in a process group
// of its own: it is passed to mpirun, which passes it to every rank, and then the launcher stops
// as the default action would. Continued (`fg`, `bg`), it continues mpirun, and mpirun the ranks.
// Their collectives' timeouts start afresh after a continue (comm/backend.h).
void stop_with_the_job(int) {
  const int saved = errno;
  if (g_child > 0) ::kill(static_cast<pid_t>(g_child), SIGTSTP);
  struct sigaction mine {}, dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(SIGTSTP, &dfl, &mine);
  sigset_t tstp;
  sigemptyset(&tstp);
  sigaddset(&tstp, SIGTSTP);
  ::raise(SIGTSTP);
  ::sigprocmask(SIG_UNBLOCK, &tstp, nullptr);  // the stop happens here; a continue returns from it
  ::sigprocmask(SIG_BLOCK, &tstp, nullptr);
  ::sigaction(SIGTSTP, &mine, nullptr);
  if (g_child > 0) ::kill(static_cast<pid_t>(g_child), SIGCONT);
  errno = saved;
}

constexpr int kForwarded[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};

// Runs argv without a shell, forwarding stop signals to it; returns its exit code (128 + signal
// when killed).
int run_process(const std::vector<std::string>& argv) {
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  int pipefd[2];  // reports exec's errno to the parent; closes on a successful exec
  MT_CHECK(::pipe2(pipefd, O_CLOEXEC) == 0, ErrorKind::kInternal, std::string("launch: pipe: ") + std::strerror(errno));
  std::fflush(nullptr);
  // The handlers are in place, and the signals held, before the fork: one that arrives before
  // g_child is set is delivered (and forwarded) once it is.
  sigset_t stops, before;
  sigemptyset(&stops);
  for (int sig : kForwarded) sigaddset(&stops, sig);
  ::sigprocmask(SIG_BLOCK, &stops, &before);
  struct sigaction sa {};
  sa.sa_handler = forward_signal;
  sa.sa_mask = stops;  // one handler at a time: two signals at once cannot both pass as the first
  sa.sa_flags = 0;  // no SA_RESTART: waitpid returns EINTR and is called again
  for (int sig : kForwarded) {
    struct sigaction now {};
    ::sigaction(sig, nullptr, &now);
    if (now.sa_handler != SIG_IGN) ::sigaction(sig, &sa, nullptr);
  }
  struct sigaction tstp {}, now {};
  tstp.sa_handler = stop_with_the_job;
  sigemptyset(&tstp.sa_mask);
  tstp.sa_flags = 0;
  ::sigaction(SIGTSTP, nullptr, &now);
  if (now.sa_handler != SIG_IGN) ::sigaction(SIGTSTP, &tstp, nullptr);  // a shell without job control ignores it
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  MT_CHECK(pid >= 0, ErrorKind::kInternal, std::string("launch: fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::close(pipefd[0]);
    ::setpgid(0, 0);  // a terminal's Ctrl-C reaches the launcher only, which passes it on as above
    ::signal(SIGTTOU, SIG_IGN);  // a background group's writes to the terminal (stty tostop) go through
    ::prctl(PR_SET_PDEATHSIG, SIGINT);
    if (::getppid() != parent) ::_exit(127);  // the launcher died before prctl
    // mpirun starts with SIGTERM held. A scheduler's stop (Slurm's scancel or time limit, systemd)
    // sends SIGTERM to every process of the job, mpirun included, and mpirun's own teardown kills
    // the ranks (SIGTERM a second in, SIGKILL a second later; its odls_base_sigkill_timeout makes
    // both waits longer even when the ranks have ended) in the middle of the stop's save. Held, it
    // stays pending: the ranks, which have the signal themselves and as the launcher's SIGUSR1,
    // save and exit, and mpirun with them. The launcher ends mpirun with SIGINT (and the kernel
    // does when the launcher dies), which mpirun takes as SIGTERM; `meshtrain` releases SIGTERM
    // in every rank (main.cpp) before anything else.
    sigset_t held = before;
    sigaddset(&held, SIGTERM);
    ::sigprocmask(SIG_SETMASK, &held, nullptr);
    ::execvp(cargv[0], cargv.data());
    int err = errno;
    ssize_t w = ::write(pipefd[1], &err, sizeof err);
    (void)w;
    ::_exit(127);
  }
  g_child = pid;
  ::sigprocmask(SIG_SETMASK, &before, nullptr);
  ::close(pipefd[1]);
  int err = 0;
  ssize_t got;
  do got = ::read(pipefd[0], &err, sizeof err);
  while (got < 0 && errno == EINTR);
  ::close(pipefd[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  MT_CHECK(got != static_cast<ssize_t>(sizeof err), ErrorKind::kNotFound,
           "launch: cannot run " + argv[0] + ": " + std::strerror(err) + " (is OpenMPI installed?)");
  int rc = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
  // mpirun itself killed (the OOM killer, an operator's kill -9): exit 137 said nothing.
  if (WIFSIGNALED(status))
    std::fprintf(stderr, "meshtrain: error: launch: %s was killed by signal %d (%s); its ranks end with it\n", argv[0].c_str(),
                 WTERMSIG(status), strsignal(WTERMSIG(status)));
  // The ranks' own status stands (143 or 130 after their stop and save; 1 or 2 when the save
  // failed). mpirun says 1 when it ended them itself (sent SIGINT: a second signal, SIGQUIT): then
  // 128 + the signal.
  if (rc == 1 && g_killed != 0) rc = 128 + g_first_signal;
  return rc;
}

int run_launch(LaunchArgs a) {
  MT_CHECK(!a.rest.empty(), ErrorKind::kInvalidArgument, "launch: nothing to run: expected `-- SUBCOMMAND ARGS...`");
  // DeepSpeed's runner refuses these together: --include/--exclude choose the slots themselves.
  MT_CHECK((a.include.empty() && a.exclude.empty()) || (!a.procs_given && !a.nodes_given), ErrorKind::kInvalidArgument,
           "launch: --num_gpus/--num_nodes cannot be given with --include/--exclude (as DeepSpeed's launcher refuses)");
  MT_CHECK(a.launcher == "openmpi", ErrorKind::kNotSupported,
           "launch: --launcher " + a.launcher + " is not supported (\"openmpi\": meshtrain's ranks are MPI processes)");
  MT_CHECK(!a.master_port_given || (a.master_port >= 1 && a.master_port <= 65535), ErrorKind::kInvalidArgument,
           "launch: --master_port must be a port in 1..65535 (got " + std::to_string(a.master_port) + ")");
  MT_CHECK(!a.master_addr_given || (!a.master_addr.empty() && a.master_addr[0] != '-'), ErrorKind::kInvalidArgument,
           "launch: --master_addr needs a host name or address (got `" + a.master_addr + "`)");
  MT_CHECK(!a.ssh_port_given || (a.ssh_port >= 1 && a.ssh_port <= 65535), ErrorKind::kInvalidArgument,
           "launch: --ssh_port must be a port in 1..65535 (got " + std::to_string(a.ssh_port) + ")");
  // DeepSpeed's default hostfile (DLTS_HOSTFILE), read when none is given and it exists.
  if (a.hostfile.empty() && std::filesystem::is_regular_file("/job/hostfile")) a.hostfile = "/job/hostfile";
  MT_CHECK(!a.n_given || a.n >= 1, ErrorKind::kInvalidArgument,
           "launch: -n must be at least 1 (got " + std::to_string(a.n) + "); leave it out to use every slot");
  MT_CHECK((!a.procs_given || a.num_procs >= 1) && (!a.nodes_given || a.num_nodes >= 1), ErrorKind::kInvalidArgument,
           "launch: --num_gpus/--num_procs and --num_nodes must be at least 1 (leave them out for every slot and host)");
  std::vector<HostSlots> hosts;
  if (!a.hostfile.empty()) {
    hosts = hostfile_parse(read_launcher_file(a.hostfile), a.hostfile);
    MT_CHECK(!hosts.empty(), ErrorKind::kInvalidArgument, a.hostfile + ": no hosts");
  } else {
    hosts = {{"localhost", a.num_procs > 0 ? a.num_procs : a.n > 0 ? a.n : 1, {}}};
  }
  hosts = hostfile_filter(hosts, a.include, a.exclude);
  MT_CHECK(!hosts.empty(), ErrorKind::kInvalidArgument, "launch: --include/--exclude left no slots");
  if (a.num_nodes > 0) {
    MT_CHECK(a.num_nodes <= static_cast<int>(hosts.size()), ErrorKind::kInvalidArgument,
             "launch: --num_nodes " + std::to_string(a.num_nodes) + " but only " + std::to_string(hosts.size()) +
                 " hosts are available");
    hosts.resize(static_cast<size_t>(a.num_nodes));
  }
  if (a.num_procs > 0)  // DeepSpeed: --num_gpus sets the processes per node
    for (auto& h : hosts) h.slots = a.num_procs;
  long total = 0;
  for (const auto& h : hosts) total += h.slots;
  const int n = a.n > 0 ? a.n : static_cast<int>(total);
  if (n > total) {
    std::string msg = "launch: -n ";
    msg += std::to_string(n);
    msg += " ranks but only ";
    msg += std::to_string(total);
    msg += " slots are available";
    if (!a.hostfile.empty()) msg += " (" + a.hostfile + ")";
    throw Error(ErrorKind::kInvalidArgument, msg);
  }

  // mpirun fills hosts in order, slot by slot: the ranks per host, and the busiest host's count.
  // Remote hosts are assumed to have as many cores as this one (we cannot ask them from here).
  const int cores = host_cores();
  std::string host_list;
  int left = n, busiest = 0;
  // Slot indices an --include/--exclude chose are devices, as DeepSpeed's launcher gives them to
  // its ranks (CUDA_VISIBLE_DEVICES): one list for every host used, since mpirun exports one value.
  std::string devices;
  bool devices_differ = false;
  for (const auto& h : hosts) {
    if (left == 0) break;
    int r = std::min(left, h.slots);
    left -= r;
    busiest = std::max(busiest, r);
    if (!host_list.empty()) host_list += ',';
    host_list += h.host + ":" + std::to_string(h.slots);
    std::string mine;
    for (int i = 0; i < h.slots; ++i)
      mine += (i ? "," : "") + std::to_string(h.ids.empty() ? i : h.ids[static_cast<size_t>(i)]);
    if (devices.empty()) devices = mine;
    else devices_differ = devices_differ || devices != mine;
  }
  // Different lists on different hosts cannot be one exported value: CPU ranks only count slots,
  // so the job runs, and a line says what a CUDA run's ranks would take.
  const bool any_ids =
      std::any_of(hosts.begin(), hosts.end(), [](const HostSlots& h) { return !h.ids.empty(); }) && !devices_differ;
  if (devices_differ)
    std::fprintf(stderr,
                 "launch: warning: --include/--exclude keep other slot indices on different hosts; mpirun exports "
                 "one environment, so CUDA_VISIBLE_DEVICES is not set and a CUDA run's ranks take each host's first "
                 "devices\n");
  // --bind_cores_to_rank: the ranks bind themselves (main(), base/affinity.h) from MT_BIND_CORES, which
  // the MT_ variables below carry to every host; one set by the caller binds nested launches alike
  // (plan --validate's). The list is checked here, and against this host's cores when every rank is
  // here; a remote host's rank checks its own and exits 2 naming it.
  const char* bind_env = std::getenv("MT_BIND_CORES");
  if (!a.bind_core_list.empty() && !a.bind_cores_to_rank && !(bind_env && *bind_env))
    std::fprintf(stderr, "launch: warning: --bind_core_list has no effect without --bind_cores_to_rank (as DeepSpeed)\n");
  if (a.bind_cores_to_rank) ::setenv("MT_BIND_CORES", a.bind_core_list.empty() ? "all" : a.bind_core_list.c_str(), 1);
  ::unsetenv("MT_BIND_REEXEC");  // a bound rank's own marker (base/affinity.h), never a new job's
  int bound_threads = 0;  // each rank's cores where every rank is here
  if (const char* bind = std::getenv("MT_BIND_CORES"); bind && *bind) {
    try {
      // Another host's CPUs are its own: there the list's syntax only, and each rank checks the rest.
      if (a.hostfile.empty()) bound_threads = static_cast<int>(rank_cores(bind_candidates(bind), 0, busiest).size());
      else if (std::string(bind) != "all") parse_core_list(bind);
    } catch (const Error& e) {
      throw Error(ErrorKind::kInvalidArgument, std::string("launch: ") +
                                                   (a.bind_cores_to_rank ? "--bind_cores_to_rank" : "MT_BIND_CORES") +
                                                   " (MT_BIND_CORES=" + bind + "): " + e.what());
    }
  }
  // A user's OMP_NUM_THREADS wins (as under torchrun): hosts that share cores (scripts/netns-hosts.sh)
  // or have fewer than this one. With bound cores each rank runs a thread per core (DeepSpeed's rule).
  std::string omp_threads = std::to_string(threads_per_rank(busiest));
  if (const char* user = std::getenv("OMP_NUM_THREADS"); user && *user) omp_threads = user;
  if (bound_threads > 0) omp_threads = std::to_string(bound_threads);

  std::vector<std::string> cmd = {"mpirun"};
  if (::geteuid() == 0) cmd.push_back("--allow-run-as-root");
  if (busiest > cores) cmd.push_back("--oversubscribe");
  // Each rank runs OMP_NUM_THREADS OpenMP threads: binding every rank to one core (OpenMPI's
  // default for small jobs) would pile those threads onto it.
  cmd.insert(cmd.end(), {"--bind-to", "none", "-np", std::to_string(n), "--host", host_list, "--tag-output"});
  // In its own process group mpirun may not read a terminal (SIGTTIN would stop it); no rank reads one.
  if (isatty(STDIN_FILENO)) cmd.insert(cmd.end(), {"--stdin", "none"});
  // mpirun's daemons on other hosts start with SIGTERM held, as mpirun does (run_process), through
  // `meshtrain _orted` (main.cpp), unless the user chose a launch agent.
  if (!a.hostfile.empty() && !std::getenv("OMPI_MCA_orte_launch_agent"))
    cmd.insert(cmd.end(), {"--launch-agent", self_exe() + " _orted"});
  cmd.insert(cmd.end(), {"-x", "OMP_NUM_THREADS=" + omp_threads, "-x", "MT_LAUNCHED=1"});
  // mpirun gives its ranks a pseudo-terminal: tell rank 0 whether ours is a real one (progress bar
  // or plain lines).
  cmd.insert(cmd.end(), {"-x", std::string("MT_STDOUT_TTY=") + (isatty(STDOUT_FILENO) ? "1" : "0")});
  // torch.distributed needs these; MPI does not, but the ranks get them as DeepSpeed's would.
  if (!a.master_addr.empty()) cmd.insert(cmd.end(), {"-x", "MASTER_ADDR=" + a.master_addr});
  if (a.master_port > 0) cmd.insert(cmd.end(), {"-x", "MASTER_PORT=" + std::to_string(a.master_port)});
  if (any_ids) cmd.insert(cmd.end(), {"-x", "CUDA_VISIBLE_DEVICES=" + devices});
  if (a.ssh_port_given) cmd.insert(cmd.end(), {"--mca", "plm_rsh_args", "-p " + std::to_string(a.ssh_port)});
  // Host names as the hostfile writes them: OpenMPI shortened node1.example.org to node1 and ssh'd
  // there (DeepSpeed's pdsh runner uses the names as written).
  if (!a.hostfile.empty()) cmd.insert(cmd.end(), {"--mca", "orte_keep_fqdn_hostnames", "1"});
  // Local ranks inherit this environment; ranks on other hosts get what -x names. As DeepSpeed's
  // OpenMPI runner: PATH and LD_LIBRARY_PATH, and the variables of the libraries under the ranks
  // (NCCL_*, UCX_*), and meshtrain's own (MT_*: the reduce-scatter path every rank must share,
  // MT_MALLOC_REEXEC, the fault seams of base/fault.h), then the .deepspeed_env file's.
  for (const char* v : {"PATH", "LD_LIBRARY_PATH"})
    if (const char* val = std::getenv(v); val && *val) cmd.insert(cmd.end(), {"-x", v});
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    const bool ours = key == "MT_LAUNCHED" || key == "MT_STDOUT_TTY";  // set above
    if (!ours && (key.rfind("MT_", 0) == 0 || key.rfind("NCCL_", 0) == 0 || key.rfind("UCX_", 0) == 0) &&
        kv.size() > key.size() + 1)
      cmd.insert(cmd.end(), {"-x", kv});
  }
  for (const std::string& kv : deepspeed_env_exports()) cmd.insert(cmd.end(), {"-x", kv});
  cmd.push_back(self_exe());
  cmd.insert(cmd.end(), a.rest.begin(), a.rest.end());

  std::string line = "launch:";
  for (const auto& c : cmd) {
    line += ' ';
    bool quote = c.empty() || c.find_first_of(" \t\"'\\$") != std::string::npos;
    line += quote ? "'" + c + "'" : c;
  }
  std::fprintf(stderr, "%s\n", line.c_str());
  return run_process(cmd);
}

}  // namespace

std::string self_exe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  MT_CHECK(!ec, ErrorKind::kInternal, "launch: cannot read /proc/self/exe: " + ec.message());
  return p.string();
}

std::vector<std::string> launch_separate_args(const std::vector<std::string>& args) {
  std::vector<std::string> out(args);
  if (out.size() < 2 || out[1] != "launch") return out;
  auto in = [](const std::string& w, auto& list) {
    return std::any_of(std::begin(list), std::end(list), [&](const char* o) { return w == o; });
  };
  for (size_t i = 2; i < out.size(); ++i) {
    const std::string& w = out[i];
    if (w == "--") return out;  // already separated
    const std::string name = w.substr(0, w.find('='));
    if (in(name, kValueOptions)) {
      if (name == w) ++i;  // its value is the next word
      continue;
    }
    if (in(w, kSwitches)) continue;
    if (w.size() > 2 && w[0] == '-' && w[1] != '-' && in(w.substr(0, 2), kValueOptions)) continue;  // -n2, -Hhosts
    if (w.size() > 1 && w[0] == '-') return out;  // an option launch lacks: CLI11 names it
    out.insert(out.begin() + static_cast<std::ptrdiff_t>(i), "--");  // the subcommand: the rest is its
    return out;
  }
  return out;
}

void register_launch(CLI::App& app) {
  auto a = std::make_shared<LaunchArgs>();
  auto* cmd = app.add_subcommand("launch", "Run a subcommand on many processes through mpirun (-- SUBCOMMAND ARGS...)");
  auto* n = cmd->add_option("-n", a->n, "total ranks (default: every slot of the hostfile; without one, 1)");
  cmd->add_option("--hostfile,-H", a->hostfile,
                  "DeepSpeed hostfile: `hostname slots=N` lines (default: /job/hostfile where it exists, else localhost)");
  auto* procs = cmd->add_option("--num_gpus,--num_procs,--num_accelerators", a->num_procs,
                                "processes per node (DeepSpeed's --num_gpus)");
  auto* nodes = cmd->add_option("--num_nodes", a->num_nodes, "use the first N hosts");
  cmd->add_option("--include,-i", a->include, "hosts/slots to use: host1@host2:0,1 (slots: the ranks' devices)");
  cmd->add_option("--exclude,-e", a->exclude, "hosts/slots to leave out: host1@host2:0,1");
  auto* addr = cmd->add_option("--master_addr", a->master_addr, "passed to the ranks as MASTER_ADDR (MPI does not need it)");
  auto* port = cmd->add_option("--master_port", a->master_port, "passed to the ranks as MASTER_PORT (MPI does not need it)");
  cmd->add_option("--launcher", a->launcher, "DeepSpeed's launcher choice: openmpi only");
  auto* ssh = cmd->add_option("--ssh_port", a->ssh_port, "ssh port of the other hosts");
  cmd->add_flag("--bind_cores_to_rank", a->bind_cores_to_rank,
                "bind each rank of a host to a run of cores of its own (all the cores, or --bind_core_list's), a "
                "thread per core (DeepSpeed's option)");
  cmd->add_option("--bind_core_list", a->bind_core_list,
                  "the CPUs --bind_cores_to_rank shares out: 0,2-4,6 (default: one CPU of each core)");
  cmd->add_flag("--no_ssh_check,--force_multi,--no_local_rank")->description("accepted for DeepSpeed's command lines; no effect here");
  cmd->add_option("ARGS", a->rest, "the subcommand and its arguments (launch's own options before it)");
  cmd->callback([a, n, procs, nodes, addr, port, ssh] {
    a->n_given = n->count() > 0;
    a->procs_given = procs->count() > 0;
    a->nodes_given = nodes->count() > 0;
    a->master_addr_given = addr->count() > 0;
    a->master_port_given = port->count() > 0;
    a->ssh_port_given = ssh->count() > 0;
    int rc = run_launch(*a);
    std::fflush(nullptr);
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace mt::cli
