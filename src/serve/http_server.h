// HttpServer: `meshtrain serve`'s HTTP API over a Scheduler (continuous batching), with
// cpp-httplib (Debian's libcpp-httplib-dev).
//
// Endpoints (docs/SERVE.md has the request and response shapes):
//   POST /                      ChatGLM's api.py: {"prompt", "history"} -> {"response", "history",
//                               "status", "time"}
//   POST /v1/completions        OpenAI completions (max_tokens, temperature, top_p, top_k, stop,
//                               seed, stream as server-sent events)
//   POST /v1/chat/completions   OpenAI chat completions (the same, over "messages"; "tools" go to
//                               the chat template, and with --enable-auto-tool-choice the answer's
//                               tool calls are read by the --tool-call-parser: serve/tool_parser.h)
//   GET  /v1/models             the one model served
//   GET  /health                200 {"status": "ok"}; 503 while draining
//   GET  /metrics               Prometheus text: requests, tokens, latency histogram, queue depth
// A chat's turns are laid out as SFT training lays them out (data/chat.h). Errors are JSON
// {"error": {"message", "type", "code"}} with a 4xx status (400 bad JSON or field, 404 unknown
// model or path, 413 body too large) or 503 (queue full, shutting down), 504 (timed out); the
// server keeps serving. shutdown() drains: new requests get 503, in-flight ones finish, then
// serve() returns.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/tokenizer.h"
#include "serve/generator.h"
#include "serve/scheduler.h"
#include "serve/tool_parser.h"

namespace httplib {
class Server;
class Request;
struct Response;
class ContentReader;
}  // namespace httplib

namespace mt::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                       // 0 = any free port (bind() returns it)
  std::string model_name = "meshtrain";  // /v1/models' id; a request naming another model gets 404
  int max_queue = 64;                    // waiting requests beyond the slots; more get 503
  size_t max_body_bytes = 1 << 20;       // larger bodies get 413
  double request_timeout_s = 600;        // queue + generation; then 504 (or an error event)
  int default_max_tokens = 16;           // OpenAI completions' default for max_tokens
  int threads = 0;                       // HTTP worker threads kept; 0 = slots + max_queue + 8
  int max_threads = 1024;                // more while connections find none idle (idle ones hold one)
  int idle_timeout_s = 5;                // a connection's wait for its (next) request, and each read
  std::vector<int32_t> eos_ids;          // the model's config.json eos_token_id(s), besides <|endoftext|>
  // vLLM's --tool-call-parser (hermes, llama3_json; "" none) and --enable-auto-tool-choice (which
  // needs a parser): a chat request's tool_choice "auto" (the default with tools) reads the
  // answer's tool calls with it, and is refused without both.
  std::string tool_call_parser;
  bool enable_auto_tool_choice = false;
};

class HttpServer {
 public:
  // The generator (its slots are the batch) and tokenizer must outlive the server.
  HttpServer(Generator& generator, const data::Tokenizer& tokenizer, const ServerOptions& options);
  ~HttpServer();

  // Binds host:port; returns the port. Throws kIOError when it cannot bind.
  int bind();
  // Serves until shutdown() has drained. REQUIRES: bind() succeeded.
  void serve();
  // Refuses new requests (503), waits for the in-flight ones, then stops serve(). Thread-safe.
  void shutdown();

  std::string metrics_text() const;
  Scheduler::Stats stats() const { return scheduler_->stats(); }

 private:
  void route();
  void handle_chatglm(const httplib::Request& req, httplib::Response& res);
  void handle_completion(const httplib::Request& req, httplib::Response& res, bool chat);
  // A POST's body read through its content reader, at most --max-body-bytes as decoded; false
  // once the error is sent (and counted under `endpoint`).
  bool read_body(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                 const std::string& endpoint, std::string& body);
  void record(const std::string& endpoint, int status, double seconds);
  std::vector<int32_t> encode_pieces(const std::vector<std::string>& pieces) const;
  // The tokenizer's chat template applied to messages with the generation prompt (and the request's
  // tools in its context, unless null), encoded; its refusals are the request's 400s.
  std::vector<int32_t> template_prompt(const nlohmann::ordered_json& messages,
                                       const nlohmann::ordered_json& tools = nullptr) const;

  Generator& gen_;
  const data::Tokenizer& tok_;
  ServerOptions options_;
  std::vector<int32_t> end_ids_;  // <|endoftext|> and the model's eos ids: never part of an answer's text
  std::optional<ToolCallFormat> auto_tools_;  // --enable-auto-tool-choice with its parser
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<httplib::Server> http_;
  int listen_fd_ = -1;  // the listening socket (httplib's), once bound
  std::atomic<int> in_flight_{0};
  std::atomic<bool> draining_{false};
  // serve() against shutdown(): cpp-httplib's stop() does nothing before its listening loop runs,
  // and a loop started after it accepted forever (a test's teardown hung 20 minutes under load).
  std::mutex serve_mu_;
  bool stopping_ = false, serving_ = false, served_ = false;
  int64_t created_ = 0;

  mutable std::mutex metrics_mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;  // (endpoint, status) -> count
  std::vector<uint64_t> latency_buckets_;                     // cumulative at render time
  double latency_sum_ = 0;
  uint64_t latency_count_ = 0;
};

// The longest prefix of s that ends on a whole UTF-8 character (a multi-byte token may split one).
size_t utf8_complete_prefix(const std::string& s);

}  // namespace mt::serve
