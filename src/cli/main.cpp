// meshtrain: the single binary. Errors are caught here only: one line, a non-zero exit code
// (2 for bad input — arguments, configs, files — and 1 for everything else).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "base/affinity.h"
#include "base/error.h"
#include "base/signals.h"
#include "base/text.h"
#include "base/threads.h"
#include "cli/commands.h"
#include "comm/mpi_backend.h"

int main(int argc, char** argv) {
  // `launch` starts mpirun's daemons on other hosts through here (mpirun --launch-agent): with
  // SIGTERM held, as mpirun itself (launch.cpp), so that a scheduler's SIGTERM to a daemon does not
  // end that host's ranks in the middle of the stop's save.
  if (argc > 1 && std::strcmp(argv[1], "_orted") == 0) {
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    ::sigprocmask(SIG_BLOCK, &term, nullptr);
    argv[1] = const_cast<char*>("orted");
    ::execvp("orted", argv + 1);
    std::fprintf(stderr, "meshtrain: cannot run OpenMPI's orted on this host: %s\n", std::strerror(errno));
    return 127;
  }
  // `launch` starts mpirun with SIGTERM held (launch.cpp), and its ranks inherit that: release it.
  if (std::getenv("MT_LAUNCHED")) {
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    ::sigprocmask(SIG_UNBLOCK, &term, nullptr);
  }
  mt::comm::mpi_prepare_process(argv);  // under mpirun: huge pages for MPI's temporary buffers (re-execs once)
  // A rank of `launch --bind_cores_to_rank`: its cores, before any thread starts (threads inherit them);
  // after mpi_prepare_process, whose re-exec would otherwise run the binding twice.
  if (!(argc > 1 && std::strcmp(argv[1], "launch") == 0)) {
    try {
      mt::bind_rank_from_environment(argv);
    } catch (const mt::Error& e) {
      std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
      return e.kind() == mt::ErrorKind::kInvalidArgument ? 2 : 1;
    }
  }
  mt::threads_default();                // no more threads than a container's CPU quota allows
  // Before any thread starts: the stop signals' handlers run on a thread of their own, never on one
  // inside a oneDNN kernel (base/signals.h). `launch` computes nothing and waits on its child with
  // the signals' EINTR in its main thread. After mpi_prepare_process's re-exec, which would pass the
  // held set on: a signal the process starts holding stays held on the signal thread too.
  if (!(argc > 1 && std::strcmp(argv[1], "launch") == 0)) {
    mt::route_signals_to_their_own_thread();
    mt::stop_on_signals(argc > 1 ? argv[1] : "meshtrain");  // train and serve put their own over these
  }
  CLI::App app{"meshtrain: train transformer language models on one or many processes"};
  app.require_subcommand(1);
  mt::cli::register_bench(app);
  mt::cli::register_inspect(app);
  mt::cli::register_config(app);
  mt::cli::register_train(app);
  mt::cli::register_tokenize(app);
  mt::cli::register_export(app);
  mt::cli::register_plot(app);
  mt::cli::register_generate(app);
  mt::cli::register_serve(app);
  mt::cli::register_loadtest(app);
  mt::cli::register_predict(app);
  mt::cli::register_launch(app);
  mt::cli::register_estimate(app);
  mt::cli::register_calibrate(app);
  mt::cli::register_plan(app);
  // A mistyped subcommand: CLI11 would say only "A subcommand is required".
  if (argc > 1 && argv[1][0] != '-') {
    std::string given = argv[1];
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
    if (std::find(names.begin(), names.end(), given) == names.end()) {
      std::string best;
      size_t best_d = 3;  // suggest only near misses
      std::string list;
      for (const auto& n : names) {
        size_t d = static_cast<size_t>(mt::edit_distance(given, n));
        if (d < best_d) best_d = d, best = n;
        list += (list.empty() ? "" : ", ") + n;
      }
      std::fprintf(stderr, "meshtrain: error: unknown subcommand '%s'%s; the subcommands are %s\n", given.c_str(),
                   best.empty() ? "" : (" (did you mean '" + best + "'?)").c_str(), list.c_str());
      return 2;
    }
  }
  // launch's subcommand and its options are the subcommand's: "--" put before it where missing.
  std::vector<std::string> words(argv, argv + argc);
  words = mt::cli::launch_separate_args(words);
  std::vector<char*> args;
  for (std::string& w : words) args.push_back(w.data());
  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    // --help and --version print and exit 0 as CLI11 has them. A bad argument is bad input: one
    // line, exit 2, as every other (CLI11 printed two lines and exited 100-114). The hint names the
    // subcommand as far as the words name one (`config check`, `tokenizer encode`).
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    std::string sub;
    const CLI::App* at = &app;
    for (int i = 1; i < argc; ++i) {
      const CLI::App* next = nullptr;
      for (const CLI::App* s : at->get_subcommands({}))
        if (s->get_name() == argv[i]) next = s;
      if (!next) break;
      sub += argv[i];
      sub += ' ';
      at = next;
    }
    std::fprintf(stderr, "meshtrain: error: %s (meshtrain %s--help lists the options)\n", what.c_str(), sub.c_str());
    return 2;
  } catch (const mt::Error& e) {
    std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
    bool bad_input = e.kind() == mt::ErrorKind::kInvalidArgument || e.kind() == mt::ErrorKind::kNotFound ||
                     e.kind() == mt::ErrorKind::kCorruption || e.kind() == mt::ErrorKind::kNotSupported;
    return bad_input ? 2 : 1;
  } catch (const std::bad_alloc&) {
    // An allocation outside the accounted allocator (whose kOutOfMemory names its categories):
    // a container of the setup, a tokenizer's table. It said only "std::bad_alloc".
    std::fprintf(stderr,
                 "meshtrain: error: out of memory: %s could not allocate (std::bad_alloc); the process's limit is "
                 "the machine's memory or `ulimit -v`, and `meshtrain estimate CONFIG` gives what a rank needs\n",
                 argc > 1 ? argv[1] : "meshtrain");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
    return 1;
  }
  // What a command wrote to standard output (generate's text, tokenizer encode's ids, --json) is
  // its result: a full disk or a closed pipe lost it and the command exited 0.
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "meshtrain: error: writing standard output: %s\n", std::strerror(errno));
    return 1;
  }
  return 0;
}
