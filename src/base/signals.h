// Where asynchronous signals run their handlers. A handler runs on the stack of whichever thread
// the kernel picks, and Debian's oneDNN 2.6 JIT GEMM kernels (jit_avx512_common_gemm_f32 and the
// AVX2 one) point rsp into a heap buffer while they run (oneDNN issue 4845, fixed in 3.11.1): a
// signal handled on a thread inside one writes its frame over the heap ("corrupted size vs.
// prev_size" at a later free, SIGABRT). A SIGTERM during a step did that about once in a hundred
// stops (DESIGN-NOTES 122). So every thread holds the signals meshtrain handles, and one thread of
// their own, which runs no kernel, takes them: every handler runs there.
#pragma once

#include <signal.h>

#include <string>

namespace mt {

// The asynchronous signals routed: SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCONT.
sigset_t routed_signals();
// Holds the routed signals in the calling thread (and so in every thread it starts later) and
// starts the thread that takes them; signals the process started holding stay held there too. Call
// it once, before any other thread starts (main(), before the subcommand). Not for `launch`, whose
// main thread waits for its child with the signals' EINTR.
void route_signals_to_their_own_thread();
// The signal mask the process had before route_signals_to_their_own_thread (the current thread's
// mask if it was never called): what a child process gets.
sigset_t starting_signal_mask();
// For the commands without a stop of their own (tokenize, export, generate, bench, ...): SIGTERM,
// SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 remove the temporaries of the atomic writes in progress
// (base/file_io.h), print one line naming the command and the signal, and exit 128 + the signal.
// They used to end those commands without a word, leaving PATH.tmp.XXXXXX files behind (stop 74).
// A signal the process ignores (nohup's SIGHUP) stays ignored; train and serve install their own
// handlers over these. SIGXFSZ is ignored, so a file past `ulimit -f` is a write error (EFBIG) that
// the writer names, not a silent death.
void stop_on_signals(const char* command);

// std::system(command) with the calling thread's mask set to the starting one for the call, so that
// the child (gnuplot, a `meshtrain launch` run) does not start holding SIGTERM and SIGINT.
int system_as_started(const std::string& command);

}  // namespace mt
