// meshtrain serve MODEL [--host H] [--port P]: the HTTP inference API (serve/http_server.h) over a
// checkpoint or Hugging Face directory, as `generate` reads them. Requests are batched by the
// scheduler over --slots sequences (continuous batching); --max-queue more wait, beyond that 503.
// SIGTERM or SIGINT drains: new requests get 503, the ones in flight finish, then it exits 0; a
// second one exits at once (128 + the signal). --enable-auto-tool-choice --tool-call-parser NAME
// reads tool calls from chat answers, as vLLM's flags do.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <thread>

#include "base/error.h"
#include "cli/commands.h"
#include "cli/load_model.h"
#include "data/tokenizer.h"
#include "serve/generator.h"
#include "serve/http_server.h"
#include "serve/tool_parser.h"

namespace mt::cli {
namespace fs = std::filesystem;
namespace {

int g_signal_pipe[2] = {-1, -1};
std::atomic<int> g_signals{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler counts with it");

void on_signal(int sig) {
  // A second signal while the first drains: out at once, as uvicorn's second Ctrl-C (a request in
  // flight may take up to --timeout; only SIGKILL ended it before).
  if (g_signals.fetch_add(1) > 0) {
    static const char said[] = "serve: a second signal: exiting without waiting for the requests in flight\n";
    if (::write(2, said, sizeof(said) - 1) < 0) {
    }
    ::_exit(128 + sig);
  }
  const unsigned char c = static_cast<unsigned char>(sig);
  if (::write(g_signal_pipe[1], &c, 1) < 0) {
  }
}

struct ServeArgs {
  std::string model, tokenizer;
  serve::ServerOptions server;
  int slots = 8;
  int context = 0;  // not given: min(max_positions, 2048)
  std::string dtype = "f32";  // the matrices' dtype in the GEMMs (f32, bf16)
};

void run_serve(ServeArgs a) {
  MT_CHECK(a.slots >= 1, ErrorKind::kInvalidArgument, "--slots must be at least 1");
  // Before the checkpoint loads, as vLLM refuses them at start-up (the server checks them again).
  if (!a.server.tool_call_parser.empty()) serve::tool_call_format(a.server.tool_call_parser);
  MT_CHECK(!a.server.enable_auto_tool_choice || !a.server.tool_call_parser.empty(), ErrorKind::kInvalidArgument,
           std::string("--enable-auto-tool-choice needs --tool-call-parser (") + serve::kToolCallParserNames + ")");
  const DType weights = weights_dtype(a.dtype);  // before the checkpoint loads
  MT_CHECK(a.server.port >= 0 && a.server.port <= 65535, ErrorKind::kInvalidArgument, "--port must be in [0, 65535]");
  LoadedModel lm = load_model(a.model);
  require_causal_lm(lm, a.model, "serve");
  data::Tokenizer tok = load_model_tokenizer(lm, a.model, a.tokenizer);
  const int P = lm.model->config().max_positions;
  MT_CHECK(a.context >= 0 && a.context <= P, ErrorKind::kInvalidArgument,
           "--context must be in [1, " + std::to_string(P) + "] (the model's max_positions)");
  serve::GeneratorOptions go;
  go.capacity = a.context == 0 ? std::min(P, 2048) : a.context;
  go.slots = a.slots;
  go.weights = weights;
  serve::Generator gen(*lm.model, go);
  a.server.eos_ids = lm.eos_ids;
  if (a.server.model_name.empty()) {
    fs::path p = fs::path(a.model).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    a.server.model_name = p.filename().string();
  }

  // SIGTERM/SIGINT: the handler writes the signal to a pipe (whichever thread it lands on, OpenMP's
  // included); a watcher thread reads it and drains the server. SIGPIPE from a client gone
  // mid-write is ignored.
  ::signal(SIGPIPE, SIG_IGN);
  MT_CHECK(::pipe(g_signal_pipe) == 0, ErrorKind::kIOError, "serve: cannot create a pipe");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  // SIGHUP (a closed terminal), SIGUSR1 and SIGUSR2 drain too, as train stops on them: they ended
  // the server at once without a word (stop 74). nohup's ignored SIGHUP stays ignored.
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2}) {
    struct sigaction now {};
    ::sigaction(sig, nullptr, &now);
    if (sig == SIGTERM || sig == SIGINT || now.sa_handler != SIG_IGN) ::sigaction(sig, &sa, nullptr);
  }
  serve::HttpServer server(gen, tok, a.server);
  const int port = server.bind();
  std::thread watcher([&server] {
    unsigned char sig = 0;
    while (::read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    if (sig == 0) return;  // serve() ended otherwise
    std::fprintf(stderr, "serve: %s: draining (new requests get 503; in-flight ones finish; a second signal exits now)\n",
                 sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : sig == SIGUSR1 ? "SIGUSR1" : sig == SIGUSR2 ? "SIGUSR2" : "SIGTERM");
    server.shutdown();
  });
  std::fprintf(stderr, "serve: %s on http://%s:%d (model \"%s\", %s weights, %d slots of %d tokens, %.0f MiB of KV cache)\n",
               a.model.c_str(), a.server.host.c_str(), port, a.server.model_name.c_str(), dtype_name(gen.weights()), a.slots,
               gen.capacity(), gen.cache_bytes() / 1048576.0);
  server.serve();
  const unsigned char none = 0;
  if (::write(g_signal_pipe[1], &none, 1) < 0) {  // wakes the watcher if serve() ended otherwise
  }
  watcher.join();
  const serve::Scheduler::Stats s = server.stats();
  std::fprintf(stderr, "serve: stopped after %llu prompt and %llu generated tokens\n",
               static_cast<unsigned long long>(s.prompt_tokens), static_cast<unsigned long long>(s.generated_tokens));
}

}  // namespace

void register_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  a->server.model_name.clear();  // MODEL's name unless --model-name
  auto* cmd = app.add_subcommand("serve", "Serve a checkpoint or Hugging Face model over HTTP (ChatGLM and OpenAI APIs)");
  cmd->add_option("MODEL", a->model, "checkpoint (step-N or save_dir) or HF directory (config.json + model.safetensors)")
      ->required();
  cmd->add_option("--host", a->server.host, "address to listen on (default 127.0.0.1)");
  cmd->add_option("--port", a->server.port, "port (default 8000; 0 = any free port, printed)");
  cmd->add_option("--tokenizer", a->tokenizer, "tokenizer.json or GPT-2 vocabulary directory");
  cmd->add_option("--model-name", a->server.model_name, "the model's id in /v1/models (default: MODEL's name)");
  cmd->add_option("--slots", a->slots, "sequences generated together, batched each step (default 8)");
  cmd->add_option("--dtype", a->dtype, "the GEMMs' weights: f32 (default) or bf16 (copied once; half the bytes a step reads)");
  // A given 0 was taken as the default without a word, where -5 was refused (stop 73).
  cmd->add_option("--context", a->context, "tokens a sequence holds (default min(max_positions, 2048))")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
  cmd->add_option("--max-queue", a->server.max_queue, "requests waiting for a slot before 503 (default 64)");
  cmd->add_option("--timeout", a->server.request_timeout_s, "seconds a request may take, queue included (default 600)");
  // 1 byte to 1 TiB: -1 wrapped to the largest size_t (no limit at all) and 0 refused every POST.
  cmd->add_option("--max-body-bytes", a->server.max_body_bytes, "larger request bodies get 413 (default 1 MiB)")
      ->check(CLI::Range(static_cast<size_t>(1), static_cast<size_t>(1) << 40));
  cmd->add_option("--default-max-tokens", a->server.default_max_tokens,
                  "max_tokens of a completion that gives none (default 16, as OpenAI's)");
  // vLLM's tool calling flags (docs/SERVE.md, Tool calling).
  cmd->add_flag("--enable-auto-tool-choice", a->server.enable_auto_tool_choice,
                "read tool calls from chat answers (tool_choice \"auto\"); needs --tool-call-parser");
  cmd->add_option("--tool-call-parser", a->server.tool_call_parser,
                  "how the model writes tool calls: hermes (Hermes, Qwen2.5) or llama3_json (Llama 3.1/3.2)");
  cmd->callback([a] { run_serve(*a); });
}

}  // namespace mt::cli
