#include "serve/http_server.h"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <httplib.h>

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <climits>
#include <cstdio>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <functional>
#include <future>
#include <list>
#include <mutex>
#include <random>
#include <span>
#include <system_error>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/fault.h"
#include "data/chat.h"

namespace mt::serve {
namespace {

using json = nlohmann::json;

// Latency histogram bounds (seconds), Prometheus' le labels.
constexpr double kLatencyBounds[] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
constexpr size_t kLatencyBuckets = sizeof(kLatencyBounds) / sizeof(kLatencyBounds[0]);

// A request error: an HTTP status and OpenAI's error object.
struct HttpError {
  int status;
  std::string message, type, code;
};

[[noreturn]] void bad(const std::string& message, const std::string& code = "invalid_request_error") {
  throw HttpError{400, message, "invalid_request_error", code};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json error_json(const HttpError& e) {
  json err = {{"message", e.message}, {"type", e.type}};
  err["code"] = e.code.empty() ? json(nullptr) : json(e.code);
  return json{{"error", err}};
}

void send_error(httplib::Response& res, const HttpError& e) {
  res.status = e.status;
  if (e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(dump(error_json(e)), "application/json");
}

// An exception that is not an HttpError, answered as a 500 with its text.
HttpError internal_error(const std::exception& e) { return HttpError{500, e.what(), "server_error", ""}; }

json parse_body(const httplib::Request& req) {
  // nlohmann parses iteratively but dumps and copies recursively: a body of 100,000 nested
  // brackets under "model" (200 KB) overflowed a worker's stack when its error was written, and
  // ended the server (json_load_file's bound).
  constexpr int kMaxDepth = 1000;
  auto shallow = [](int depth, json::parse_event_t, json&) {
    if (depth > kMaxDepth) bad("the body is nested deeper than " + std::to_string(kMaxDepth) + " levels", "invalid_json");
    return true;
  };
  try {
    json j = json::parse(req.body, shallow);
    if (!j.is_object()) bad("the body must be a JSON object", "invalid_json");
    return j;
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number past a double (1e400)
    bad(std::string("the body is not valid JSON: ") + e.what(), "invalid_json");
  }
}

bool present(const json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

int get_int(const json& j, const char* key, int fallback, int lo, int hi) {
  if (!present(j, key)) return fallback;
  const json& v = j[key];
  if (!v.is_number_integer()) bad(std::string("\"") + key + "\" must be an integer", "invalid_type");
  // (past 2^63 - 1 the value is unsigned: read as int64 it wrapped, and the message said -1)
  const bool past = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX);
  const int64_t x = past ? INT64_MAX : v.get<int64_t>();
  if (x < lo || x > hi)
    bad(std::string("\"") + key + "\" must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump(),
        "invalid_value");
  return static_cast<int>(x);
}

// A number in [lo, hi], or (lo, hi] when lo_open (typical_p's (0, 1]); the bounds printed as %g
// ("[0.000000, 100.000000]" was printed, and 1e-6 for an open 0).
float get_float(const json& j, const char* key, float fallback, float lo, float hi, bool lo_open = false) {
  if (!present(j, key)) return fallback;
  const json& v = j[key];
  if (!v.is_number()) bad(std::string("\"") + key + "\" must be a number", "invalid_type");
  const double x = v.get<double>();
  if (!((lo_open ? x > lo : x >= lo) && x <= hi)) {
    char range[96];
    std::snprintf(range, sizeof range, "%s%g, %g]", lo_open ? "(" : "[", static_cast<double>(lo), static_cast<double>(hi));
    bad(std::string("\"") + key + "\" must be in " + range + ", got " + v.dump(), "invalid_value");
  }
  return static_cast<float>(x);
}

std::string get_string(const json& j, const char* key) {
  if (!present(j, key)) bad(std::string("\"") + key + "\" is required", "missing_field");
  if (!j[key].is_string()) bad(std::string("\"") + key + "\" must be a string", "invalid_type");
  return j[key].get<std::string>();
}

// A field that would change what is generated and that we do not implement: refused unless it
// holds its neutral value.
void refuse_unless(const json& j, const char* key, const json& neutral) {
  if (present(j, key) && j[key] != neutral)
    bad(std::string("\"") + key + "\" is not supported (only " + neutral.dump() + ")", "unsupported_parameter");
}
// The same for a field with two neutral values (none: null or []).
void refuse_unless(const json& j, const char* key, const json& neutral, const json& also) {
  if (present(j, key) && j[key] != neutral && j[key] != also)
    bad(std::string("\"") + key + "\" is not supported (only " + neutral.dump() + " or " + also.dump() + ")",
        "unsupported_parameter");
}

// Fields other servers (vLLM, TGI, OpenAI) take that change what is generated and that this one
// does not implement: refused unless neutral (the structured-output fields on every endpoint; the
// OpenAI endpoints' sampling fields on the ChatGLM one, which reads none of them).
// They were answered 200 and ignored.
void refuse_unimplemented(const json& j, bool openai) {
  refuse_unless(j, "response_format", json{{"type", "text"}});
  refuse_unless(j, "functions", nullptr);
  refuse_unless(j, "function_call", nullptr);
  refuse_unless(j, "guided_json", nullptr);
  refuse_unless(j, "guided_regex", nullptr);
  // vLLM's other structured-output and decoding fields (stop 73: answered 200 and ignored).
  refuse_unless(j, "guided_choice", nullptr);
  refuse_unless(j, "guided_grammar", nullptr);
  refuse_unless(j, "guided_whitespace_pattern", nullptr);
  refuse_unless(j, "structured_outputs", nullptr);
  refuse_unless(j, "allowed_token_ids", nullptr);
  refuse_unless(j, "bad_words", nullptr, json::array());
  refuse_unless(j, "use_beam_search", false);
  refuse_unless(j, "prompt_logprobs", nullptr);
  refuse_unless(j, "truncate_prompt_tokens", nullptr);
  refuse_unless(j, "skip_special_tokens", true);  // answers are decoded without special tokens
  refuse_unless(j, "length_penalty", 1);          // beam search's
  if (present(j, "stream_options") && (!j["stream_options"].is_object() ||
                                       (present(j["stream_options"], "include_usage") && !j["stream_options"]["include_usage"].is_boolean())))
    bad("\"stream_options\" must be {\"include_usage\": true|false}", "invalid_type");
  if (!openai) {  // the ChatGLM endpoint's fields: prompt, history, max_length, temperature, top_p, top_k, seed
    // Its length is max_length (prompt and response together); the others' names were answered 200
    // and ignored (max_tokens 1 gave ~40 tokens).
    for (const char* k : {"max_tokens", "max_new_tokens", "max_completion_tokens"})
      if (present(j, k))
        bad(std::string("\"") + k + "\" is not read by this endpoint: its length is \"max_length\" (the prompt, history and response together)",
            "unsupported_parameter");
    refuse_unless(j, "stream", false);
    refuse_unless(j, "best_of", 1);
    refuse_unless(j, "echo", false);
    refuse_unless(j, "suffix", nullptr);
    refuse_unless(j, "top_logprobs", nullptr);
    refuse_unless(j, "n", 1);
    refuse_unless(j, "presence_penalty", 0);
    refuse_unless(j, "frequency_penalty", 0);
    refuse_unless(j, "logit_bias", json::object());
    refuse_unless(j, "stop", nullptr, json::array());
    refuse_unless(j, "logprobs", nullptr);
    refuse_unless(j, "repetition_penalty", 1);
    refuse_unless(j, "min_p", 0);
    refuse_unless(j, "typical_p", 1);
    refuse_unless(j, "min_tokens", 0);
    refuse_unless(j, "stop_token_ids", json::array());
    refuse_unless(j, "include_stop_str_in_output", false);
  }
}

// The sampling fields common to all endpoints. Without a seed, a draw is seeded at random.
SamplingOptions sampling_from(const json& j, float temperature, float top_p) {
  SamplingOptions s;
  s.temperature = get_float(j, "temperature", temperature, 0.0f, 100.0f);
  s.top_p = get_float(j, "top_p", top_p, 0.0f, 1.0f);
  s.top_k = get_int(j, "top_k", 0, -1, 1 << 30);
  if (s.top_k < 0) s.top_k = 0;  // vLLM's -1: every token, as 0
  if (present(j, "seed")) {
    if (!j["seed"].is_number_integer()) bad("\"seed\" must be an integer", "invalid_type");
    s.seed = static_cast<uint64_t>(j["seed"].get<int64_t>());
  } else {
    s.seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  }
  return s;
}

std::vector<std::string> stops_from(const json& j) {
  std::vector<std::string> stops;
  if (!present(j, "stop")) return stops;
  const json& v = j["stop"];
  if (v.is_string()) {
    stops.push_back(v.get<std::string>());
  } else if (v.is_array() && v.size() <= 4) {
    for (const json& s : v) {
      if (!s.is_string()) bad("\"stop\" must be a string or a list of at most 4 strings", "invalid_type");
      stops.push_back(s.get<std::string>());
    }
  } else {
    bad("\"stop\" must be a string or a list of at most 4 strings", "invalid_type");
  }
  for (const std::string& s : stops)
    if (s.empty()) bad("a \"stop\" string must not be empty", "invalid_value");
  return stops;
}

// A chat request's tools (OpenAI's "tools", "tool_choice", "parallel_tool_calls") and what the
// server does with them, as vLLM's chat endpoint reads them.
struct ToolUse {
  nlohmann::ordered_json tools;  // as sent, keys in their order, for the template; null: none
  bool parse = false;            // tool_choice "auto": the answers' tool calls are read
  bool parallel = true;          // parallel_tool_calls: false keeps an answer's first call only
};

// Checks one entry of "tools": {"type": "function" (vLLM's default when absent), "function":
// {"name": non-empty string, "description"?: string, "parameters"?: object}}; other keys are kept.
void check_tool(const json& tool, const std::string& at) {
  if (!tool.is_object()) bad(at + " must be {\"type\": \"function\", \"function\": {\"name\", \"description\", \"parameters\"}}", "invalid_type");
  if (present(tool, "type") && tool["type"] != "function")
    bad(at + ".type must be \"function\", got " + tool["type"].dump(), "invalid_value");
  if (!present(tool, "function")) bad(at + ".function is required", "missing_field");
  const json& f = tool["function"];
  if (!f.is_object()) bad(at + ".function must be {\"name\", \"description\", \"parameters\"}", "invalid_type");
  if (!present(f, "name")) bad(at + ".function.name is required", "missing_field");
  if (!f["name"].is_string()) bad(at + ".function.name must be a string", "invalid_type");
  if (f["name"].get<std::string>().empty()) bad(at + ".function.name must not be empty", "invalid_value");
  if (present(f, "description") && !f["description"].is_string()) bad(at + ".function.description must be a string", "invalid_type");
  if (present(f, "parameters") && !f["parameters"].is_object())
    bad(at + ".function.parameters must be a JSON Schema object", "invalid_type");
}

// body: the request (parsed), raw: its text (for the tools' key order); templated: the tokenizer
// has a chat template; auto_tools: the server has --enable-auto-tool-choice and a parser.
ToolUse tools_from(const json& body, const std::string& raw, bool templated, bool auto_tools) {
  ToolUse use;
  bool has_tools = false;
  if (present(body, "tools")) {
    const json& t = body["tools"];
    if (!t.is_array()) bad("\"tools\" must be a list of {\"type\": \"function\", \"function\": {...}}", "invalid_type");
    for (size_t k = 0; k < t.size(); ++k) check_tool(t[k], "tools[" + std::to_string(k) + "]");
    has_tools = !t.empty();  // [] is as none
  }
  if (has_tools && !templated)
    bad("\"tools\" need the model's chat template to be written into the prompt, and this tokenizer has none "
        "(tokenizer_config.json's chat_template or chat_template.jinja)",
        "unsupported_parameter");
  if (present(body, "parallel_tool_calls")) {
    if (!body["parallel_tool_calls"].is_boolean()) bad("\"parallel_tool_calls\" must be true or false", "invalid_type");
    use.parallel = body["parallel_tool_calls"].get<bool>();
  }
  // vLLM: tool_choice defaults to "auto" when there are tools; "none" renders them and reads no
  // calls; any other choice needs tools ("required" with [] is "none").
  const json choice = present(body, "tool_choice") ? body["tool_choice"] : json(has_tools ? "auto" : "none");
  if (choice.is_string()) {
    const std::string c = choice.get<std::string>();
    if (c != "none" && c != "auto" && c != "required")
      bad("\"tool_choice\" must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\"}}, got " +
              choice.dump(),
          "invalid_value");
    if (c == "required" && !has_tools && present(body, "tools")) return use;
    if (c != "none" && !has_tools) bad("\"tool_choice\" " + choice.dump() + " needs \"tools\"", "invalid_value");
  } else if (choice.is_object()) {
    const char* form = "\"tool_choice\" must name a function as {\"type\": \"function\", \"function\": {\"name\": string}}";
    if (!present(choice, "function") || !choice["function"].is_object() || !present(choice["function"], "name") ||
        !choice["function"]["name"].is_string() || choice["function"]["name"].get<std::string>().empty())
      bad(form, "invalid_type");
    if (present(choice, "type") && choice["type"] != "function") bad(form, "invalid_value");
    if (!has_tools) bad("\"tool_choice\" names a function and needs \"tools\"", "invalid_value");
    bool listed = false;
    for (const json& tool : body["tools"]) listed |= tool["function"]["name"] == choice["function"]["name"];
    if (!listed) bad("\"tool_choice\" names " + choice["function"]["name"].dump() + ", which is not in \"tools\"", "invalid_value");
  } else {
    bad("\"tool_choice\" must be a string or {\"type\": \"function\", \"function\": {\"name\"}}", "invalid_type");
  }
  if (choice == "required" || choice.is_object())
    bad("\"tool_choice\" " + choice.dump() +
            " is not supported: vLLM forces the call by constraining decoding to the tools' schemas (guided decoding), "
            "which this server does not implement; use \"auto\" (or \"none\")",
        "unsupported_parameter");
  if (has_tools) use.tools = nlohmann::ordered_json::parse(raw)["tools"];  // parsed above: it is JSON
  if (choice == "auto") {
    if (!auto_tools)
      bad("\"tool_choice\" \"auto\" (the default with \"tools\") needs the server started with "
          "--enable-auto-tool-choice and --tool-call-parser NAME (hermes, llama3_json); \"none\" renders the tools and reads no calls",
          "unsupported_parameter");
    use.parse = true;
  }
  return use;
}

// An assistant turn's tool_calls as tool-use templates read them (vLLM's and transformers'
// convention): each function's "arguments" an object, parsed from the JSON string OpenAI's API
// carries (absent, null or "": {}); an empty list is dropped. Entries of another shape are left to
// the template.
void tool_calls_for_template(nlohmann::ordered_json& turn, const std::string& at) {
  using ojson = nlohmann::ordered_json;
  if (turn["role"] != "assistant" || !turn.contains("tool_calls") || !turn["tool_calls"].is_array()) return;
  ojson& calls = turn["tool_calls"];
  if (calls.empty()) {
    turn.erase("tool_calls");
    return;
  }
  for (size_t k = 0; k < calls.size(); ++k) {
    if (!calls[k].is_object() || !calls[k].contains("function") || !calls[k]["function"].is_object()) continue;
    ojson& f = calls[k]["function"];
    if (!f.contains("arguments") || f["arguments"].is_null() || f["arguments"] == "") {
      f["arguments"] = ojson::object();
      continue;
    }
    if (!f["arguments"].is_string()) continue;  // an object already (or the template's to judge)
    const std::string where = at + ".tool_calls[" + std::to_string(k) + "].function.arguments";
    bool deep = false;
    auto bounded = [&deep](int depth, ojson::parse_event_t, ojson&) {
      if (depth > 1000) deep = true;  // parse_body's bound
      return !deep;
    };
    ojson parsed = ojson::parse(f["arguments"].get<std::string>(), bounded, /*allow_exceptions=*/false);
    if (deep || parsed.is_discarded()) bad(where + " must be the arguments' JSON text", "invalid_value");
    f["arguments"] = std::move(parsed);
  }
}

// An answer's tool call as OpenAI's API writes it; `index` for a stream's delta.
json tool_call_json(const ToolCall& call, std::optional<size_t> index) {
  json j = json::object();
  if (index) j["index"] = *index;
  j["id"] = tool_call_id();
  j["type"] = "function";
  j["function"] = {{"name", call.name}, {"arguments", call.arguments}};
  return j;
}

// The tool calls read from an answer's whole text (at most one without parallel_tool_calls, as vLLM
// keeps the first). REQUIRES: use.parse.
ParsedToolCalls read_tool_calls(const ToolUse& use, ToolCallFormat format, const std::string& text) {
  ParsedToolCalls p = parse_tool_calls(format, text);
  if (!use.parallel && p.calls.size() > 1) p.calls.resize(1);
  return p;
}

std::string local_time() {  // ChatGLM's "%Y-%m-%d %H:%M:%S"
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string random_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s-%llx%06llx", prefix, static_cast<unsigned long long>(std::time(nullptr)),
                static_cast<unsigned long long>(counter.fetch_add(1)));
  return buf;
}

}  // namespace

size_t utf8_complete_prefix(const std::string& s) {
  // Walk back over at most 3 continuation bytes to the last lead byte; keep it only if its
  // character is complete.
  const size_t n = s.size();
  size_t i = n, back = 0;
  while (i > 0 && back < 4 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) {
    --i;
    ++back;
  }
  if (i == 0) return back == 0 ? 0 : n;  // only continuation bytes: not UTF-8 we can fix; keep
  const unsigned char lead = static_cast<unsigned char>(s[i - 1]);
  size_t need = 1;
  if (lead >= 0xF0) need = 4;
  else if (lead >= 0xE0) need = 3;
  else if (lead >= 0xC0) need = 2;
  else return n;  // ASCII lead: complete (stray continuation bytes are the model's; keep them)
  return back + 1 >= need ? n : i - 1;
}

HttpServer::HttpServer(Generator& generator, const data::Tokenizer& tokenizer, const ServerOptions& options)
    : gen_(generator), tok_(tokenizer), options_(options) {
  MT_CHECK(options.max_queue >= 1, ErrorKind::kInvalidArgument, "serve: --max-queue must be at least 1");
  // A deadline past ~9.2e9 s overflowed the clock's nanoseconds into the past: every request 504.
  MT_CHECK(options.request_timeout_s > 0 && options.request_timeout_s <= 1e9, ErrorKind::kInvalidArgument,
           "serve: --timeout must be positive and at most 1e9 seconds");
  MT_CHECK(options.default_max_tokens >= 1, ErrorKind::kInvalidArgument, "serve: the default max_tokens must be >= 1");
  // An Instruct tokenizer's eos_token (its end of turn: <|eot_id|>, <|im_end|>) ends answers too, as
  // vLLM stops on the tokenizer's eos: a base model's config.json names only its end of text, and a
  // chat fine-tuned from it answered past its turn.
  if (const int32_t turn = tok_.chat_end_of_turn_id();
      turn >= 0 && std::find(options_.eos_ids.begin(), options_.eos_ids.end(), turn) == options_.eos_ids.end())
    options_.eos_ids.push_back(turn);
  if (tok_.has_eot()) end_ids_.push_back(tok_.eot_id());
  end_ids_.insert(end_ids_.end(), options_.eos_ids.begin(), options_.eos_ids.end());
  // As vLLM's serve: auto tool choice needs a parser; a parser alone is named but not used.
  MT_CHECK(!options.enable_auto_tool_choice || !options.tool_call_parser.empty(), ErrorKind::kInvalidArgument,
           std::string("serve: --enable-auto-tool-choice needs --tool-call-parser (") + kToolCallParserNames + ")");
  if (!options.tool_call_parser.empty()) {
    const ToolCallFormat format = tool_call_format(options.tool_call_parser);
    if (options.enable_auto_tool_choice) auto_tools_ = format;
  }
  scheduler_ = std::make_unique<Scheduler>(gen_, SchedulerOptions{options.max_queue});
  http_ = std::make_unique<httplib::Server>();
  latency_buckets_.assign(kLatencyBuckets, 0);
  created_ = static_cast<int64_t>(std::time(nullptr));
  route();
}

HttpServer::~HttpServer() {
  if (http_->is_running()) http_->stop();
}

int HttpServer::bind() {
  int port = options_.port;
  if (port == 0) {
    port = http_->bind_to_any_port(options_.host);
    MT_CHECK(port > 0, ErrorKind::kIOError, "serve: cannot bind " + options_.host + " to any port");
  } else {
    MT_CHECK(http_->bind_to_port(options_.host, port), ErrorKind::kIOError,
             "serve: cannot bind " + options_.host + ":" + std::to_string(port) + " (in use, or not an address here)");
  }
  // cpp-httplib listens with a backlog of 5: past it, the kernel drops a connection's handshake and
  // the client waits for its retransmission (1, 2, 4 s ...), however idle the workers. Listening
  // again on the bound socket sets the backlog (capped by net.core.somaxconn).
  MT_CHECK(listen_fd_ >= 0 && ::listen(listen_fd_, SOMAXCONN) == 0, ErrorKind::kIOError,
           "serve: cannot listen on " + options_.host + ":" + std::to_string(port) + ": " + std::strerror(errno));
  return port;
}

void HttpServer::serve() {
  {
    std::lock_guard<std::mutex> lock(serve_mu_);
    if (stopping_) return;  // shut down before it listened
    serving_ = true;
  }
  http_->listen_after_bind();
  std::lock_guard<std::mutex> lock(serve_mu_);
  served_ = true;
}

namespace {
// The local port of a socket, or -1.
int local_port(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return -1;
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
  return -1;
}

// Shuts both ways every connection this process accepted on `port` (a connected socket whose
// local port is the listening one's), so that the workers blocked reading them return.
void shut_connections(int port) {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode) || local_port(fd) != port) continue;
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) == 0) ::shutdown(fd, SHUT_RDWR);
  }
  ::closedir(d);
}
}  // namespace

void HttpServer::shutdown() {
  if (draining_.exchange(true)) return;
  scheduler_->drain();  // refuses new generations; waits for queued and active ones
  // The handlers still write their last bytes after their generation ended.
  while (in_flight_.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  bool serving = false;
  {
    std::lock_guard<std::mutex> lock(serve_mu_);
    stopping_ = true;
    serving = serving_;
  }
  // A serve() under way: its listening loop must be running for stop() to end it.
  while (serving && !http_->is_running()) {
    {
      std::lock_guard<std::mutex> lock(serve_mu_);
      if (served_) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const int port = listen_fd_ >= 0 ? local_port(listen_fd_) : -1;  // before stop() closes it
  http_->stop();
  // Every request has its answer by now. The connections left are idle keep-alives and clients
  // still sending a request: one that trickled its headers (each read's timeout starts again with
  // each byte) held a worker, the pool's shutdown and the exit for as long as it kept sending.
  if (port > 0) shut_connections(port);
}

void HttpServer::record(const std::string& endpoint, int status, double seconds) {
  std::lock_guard<std::mutex> lock(metrics_mu_);
  ++requests_[{endpoint, status}];
  for (size_t b = 0; b < kLatencyBuckets; ++b)
    if (seconds <= kLatencyBounds[b]) {
      ++latency_buckets_[b];
      break;
    }
  latency_sum_ += seconds;
  ++latency_count_;
}

namespace {
// A Prometheus label value as the text format escapes it: backslash, double quote and line feed.
std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}
}  // namespace

std::string HttpServer::metrics_text() const {
  const Scheduler::Stats s = scheduler_->stats();
  std::string out;
  auto line = [&out](const std::string& l) { out += l + "\n"; };
  line("# HELP meshtrain_requests_total HTTP requests by endpoint and status.");
  line("# TYPE meshtrain_requests_total counter");
  {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    for (const auto& [key, n] : requests_)
      line("meshtrain_requests_total{endpoint=\"" + label_value(key.first) + "\",status=\"" + std::to_string(key.second) +
           "\"} " + std::to_string(n));
    line("# HELP meshtrain_request_duration_seconds Time from a request's arrival to its last byte.");
    line("# TYPE meshtrain_request_duration_seconds histogram");
    uint64_t cum = 0;
    char le[32];
    for (size_t b = 0; b < kLatencyBuckets; ++b) {
      cum += latency_buckets_[b];
      std::snprintf(le, sizeof(le), "%g", kLatencyBounds[b]);
      line(std::string("meshtrain_request_duration_seconds_bucket{le=\"") + le + "\"} " + std::to_string(cum));
    }
    line("meshtrain_request_duration_seconds_bucket{le=\"+Inf\"} " + std::to_string(latency_count_));
    char sum[64];
    std::snprintf(sum, sizeof(sum), "%.6f", latency_sum_);
    line(std::string("meshtrain_request_duration_seconds_sum ") + sum);
    line("meshtrain_request_duration_seconds_count " + std::to_string(latency_count_));
  }
  auto metric = [&line](const char* name, const char* type, const char* help, uint64_t value) {
    line(std::string("# HELP ") + name + " " + help);
    line(std::string("# TYPE ") + name + " " + type);
    line(std::string(name) + " " + std::to_string(value));
  };
  metric("meshtrain_prompt_tokens_total", "counter", "Prompt tokens prefilled.", s.prompt_tokens);
  metric("meshtrain_generated_tokens_total", "counter", "Tokens generated.", s.generated_tokens);
  metric("meshtrain_decode_steps_total", "counter", "Batched decode steps.", s.decode_steps);
  metric("meshtrain_decode_rows_total", "counter", "Sequences in those steps (rows/steps = mean batch).", s.decode_rows);
  metric("meshtrain_queue_depth", "gauge", "Requests waiting for a slot.", s.queued);
  metric("meshtrain_active_sequences", "gauge", "Sequences being generated.", s.active);
  metric("meshtrain_slots", "gauge", "Sequences the server generates at once.", s.slots);
  return out;
}

// One prompt: the template's special tokens (Llama 3's <|begin_of_text|>) around its pieces, as a
// text prompt gets them (encode_with_special).
std::vector<int32_t> HttpServer::encode_pieces(const std::vector<std::string>& pieces) const {
  std::vector<int32_t> ids = tok_.special_before();
  for (const std::string& p : pieces) {
    std::vector<int32_t> part = tok_.encode(p);
    ids.insert(ids.end(), part.begin(), part.end());
  }
  ids.insert(ids.end(), tok_.special_after().begin(), tok_.special_after().end());
  return ids;
}

std::vector<int32_t> HttpServer::template_prompt(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools) const {
  std::string text;
  try {
    // The tools as transformers' apply_chat_template(tools=...) and vLLM give them: the template's
    // `tools` variable, absent without any.
    nlohmann::ordered_json extra = nlohmann::ordered_json::object();
    if (!tools.is_null()) extra["tools"] = tools;
    text = tok_.chat_template()->render(messages, true, extra);
  } catch (const Error& e) {
    // The template's own refusal (raise_exception: "Conversation roles must alternate ...").
    bad(e.what(), "invalid_value");
  }
  std::vector<int32_t> ids = tok_.encode(text);
  if (ids.empty()) bad("the chat template renders these messages as no text", "invalid_value");
  return ids;
}

namespace {

// Runs one generation to its end, turning tokens into text: `stops` end it at their first
// occurrence (excluded); on_delta gets each new piece of text that can no longer change (whole
// UTF-8 characters, and nothing that may still begin a stop string) with a count of the answer's
// tokens that stay in it (all that have come, since a stop string ends the answer at the token
// that completes it; or, with follow_generation's cover, those whose text has been handed over),
// and returns false when the client is gone, which cancels the generation.
struct Outcome {
  std::string text;
  Finish finish = Finish::kNone;
  int completion_tokens = 0;
  std::string error;
  bool client_gone = false;  // cancelled because the client closed the connection
  std::vector<int32_t> ids;  // the answer's tokens (to a stop string's token)
  std::vector<TokenLogprobs> logprobs, prompt_logprobs;  // GenerationRequest's, logprobs cut to ids
  std::vector<TokenLogprobs> stop_logprobs;  // the stop id that ended it (not a stop string)
};

// The text of ids without the end-of-text ids (`hidden`: <|endoftext|>, the model's eos), which
// only ignore_eos lets into an answer and which OpenAI's API never writes into one ("<|endoftext|>"
// was). Other added tokens are text (a chat's markers, whitespace runs) and stop strings match them.
std::string visible_text(const data::Tokenizer& tok, std::span<const int32_t> ids, const std::vector<int32_t>& hidden) {
  std::vector<int32_t> kept;
  kept.reserve(ids.size());
  for (int32_t id : ids)
    if (std::find(hidden.begin(), hidden.end(), id) == hidden.end()) kept.push_back(id);
  return tok.decode(kept);
}

// Queues a request: 400 when the scheduler refuses it, 503 when the queue is full or draining.
std::shared_ptr<Generation> submit_or_throw(Scheduler& sched, GenerationRequest request) {
  const int prompt = static_cast<int>(request.prompt.size());
  std::shared_ptr<Generation> g;
  try {
    g = sched.submit(std::move(request));
  } catch (const Error& e) {
    // Only a prompt past the context is a context-length error (min_tokens with every id a stop id
    // was named one too).
    throw HttpError{400, e.what(), "invalid_request_error",
                    prompt > sched.capacity() ? "context_length_exceeded" : "invalid_value"};
  }
  if (!g)
    throw HttpError{503, sched.draining() ? "the server is shutting down" : "the queue is full; retry later",
                    "server_busy", sched.draining() ? "shutting_down" : "queue_full"};
  return g;
}

// Follows a queued generation to its end: the text (cut at the first stop string), its deltas.
// min_tokens: stop strings count from the answer's min_tokens-th token on (vLLM's): a match must end
// past the text of the first min_tokens tokens.
// keep_stop: the answer ends after the stop string instead (vLLM's include_stop_str_in_output).
// cover: on_delta's count is of the tokens whose text the pieces so far hold whole (a stream's
// logprobs go with their text), not of all that stay.
template <typename OnDelta>
Outcome follow_generation(const std::shared_ptr<Generation>& g, const data::Tokenizer& tok,
                          const std::vector<std::string>& stops, const std::vector<int32_t>& hidden, OnDelta on_delta,
                          bool streaming, const std::function<bool()>& gone, int min_tokens = 0, bool keep_stop = false,
                          bool cover = false) {
  size_t covered = 0, covered_bytes = 0;  // with cover: the tokens whose text ends within what was sent
  size_t floor = 0;  // the text of the first min_tokens tokens, once they have come
  size_t hold = 0;
  for (const std::string& s : stops) hold = std::max(hold, s.size() - 1);
  std::vector<int32_t> ids;
  size_t received = 0;  // tokens handed over so far (ids stops growing at a stop string; the wait must not)
  std::string full;
  size_t sent = 0;
  bool done = false, stopped = false, client_gone = false;
  const bool slow_reader = fault_active("serve.slow_reader");  // test seam: tokens arrive in bursts
  while (!done) {
    if (slow_reader) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    // A whole answer without stop strings needs only the end: no wake-up at every token.
    std::vector<int32_t> more = g->wait(received, std::chrono::milliseconds(100), &done, !streaming && stops.empty());
    received += more.size();
    if (!done && !client_gone && gone && gone()) {  // checked every 100 ms at least
      client_gone = true;
      g->cancel(Finish::kCancelled);
    }
    if (!more.empty() && !stopped) {
      const size_t before = ids.size();
      ids.insert(ids.end(), more.begin(), more.end());
      full = visible_text(tok, ids, hidden);
      const size_t whole = utf8_complete_prefix(full);
      const size_t from = sent > hold ? sent - hold : 0;
      if (min_tokens > 0 && before < static_cast<size_t>(min_tokens) && ids.size() >= static_cast<size_t>(min_tokens))
        floor = visible_text(tok, std::span<const int32_t>(ids.data(), static_cast<size_t>(min_tokens)), hidden).size();
      // Where the answer's text ends: the earliest stop string's start (its end with keep_stop).
      auto first_stop = [&](const std::string& text, size_t complete, size_t tokens) {
        size_t cut = std::string::npos, end = std::string::npos;
        if (tokens < static_cast<size_t>(min_tokens)) return cut;
        for (const std::string& s : stops) {
          for (size_t at = text.find(s, from); at != std::string::npos; at = text.find(s, at + 1))
            if (at + s.size() <= complete && at + s.size() > floor) {
              if (at < cut) cut = at, end = at + s.size();
              break;
            }
        }
        return keep_stop ? end : cut;
      };
      if (first_stop(full, whole, ids.size()) != std::string::npos) {
        // The answer ends at the first token that completes a stop string, cut where that stop
        // begins, as if the tokens had come one at a time: the wait hands over every token made
        // since, and the count (1 to 19) and the cut depended on timing.
        for (size_t k = before + 1; k <= ids.size(); ++k) {
          std::string part = visible_text(tok, std::span<const int32_t>(ids.data(), k), hidden);
          const size_t cut = first_stop(part, utf8_complete_prefix(part), k);
          if (cut != std::string::npos) {
            ids.resize(k);
            part.resize(cut);
            full = std::move(part);
            break;
          }
        }
        stopped = true;
      }
      if (stopped) {
        g->cancel(Finish::kStop);
      } else {
        // Held back: a stop string's length less one byte, moved back to a character's start (a
        // piece that ended inside one reached the client as U+FFFD for each half).
        size_t safe = whole > hold ? whole - hold : 0;
        while (safe > sent && (static_cast<unsigned char>(full[safe]) & 0xC0) == 0x80) --safe;
        if (safe > sent) {
          // A prefix's text is its visible tokens' bytes (decode joins them): counted as they come.
          for (; cover && covered < ids.size(); ++covered) {
            const int32_t id = ids[covered];
            const bool shown = std::find(hidden.begin(), hidden.end(), id) == hidden.end();
            const size_t len = shown ? tok.token_bytes(id).size() : 0;
            if (covered_bytes + len > safe) break;
            covered_bytes += len;
          }
          if (!on_delta(full.substr(sent, safe - sent), cover ? covered : ids.size())) g->cancel(Finish::kCancelled);
          sent = safe;
        }
      }
    }
  }
  Outcome out;
  out.client_gone = client_gone;
  out.finish = stopped ? Finish::kStop : g->finish();
  out.error = g->error();
  // The stop id that ended it (the end of text, a stop_token_ids id) counts, though it has no
  // text, as vLLM counts it (its output's token ids hold it); a stop string's tokens are the ids.
  out.completion_tokens = static_cast<int>(ids.size()) + (!stopped && g->ended_on_a_stop_id() ? 1 : 0);
  out.logprobs = g->logprobs();
  if (out.logprobs.size() > ids.size()) out.logprobs.resize(ids.size());
  out.prompt_logprobs = g->prompt_logprobs();
  if (!stopped) out.stop_logprobs = g->stop_logprobs();
  out.ids = ids;
  if (out.finish == Finish::kStop || out.finish == Finish::kLength) {
    // The end: what was held back is final now (a stop string cut it already).
    if (full.size() > sent) on_delta(full.substr(sent), ids.size());
  }
  out.text = std::move(full);
  return out;
}

// The error a generation that did not end by "stop" or "length" answers with.
HttpError finish_error(const Outcome& o, double timeout_s) {
  if (o.finish == Finish::kTimeout)
    return HttpError{504, "the request timed out after " + std::to_string(timeout_s) + " s", "timeout", "timeout"};
  if (o.finish == Finish::kError) return HttpError{500, o.error, "server_error", ""};
  return HttpError{503, "the server is shutting down", "server_busy", "shutting_down"};
}

// A whole generation for a non-streaming response; throws its error unless it ended by "stop" or
// "length".
Outcome generate_all(const std::shared_ptr<Generation>& g, const data::Tokenizer& tok, const std::vector<std::string>& stops,
                     const std::vector<int32_t>& hidden, double timeout_s, const std::function<bool()>& gone,
                     int min_tokens = 0, bool keep_stop = false) {
  Outcome o = follow_generation(g, tok, stops, hidden, [](const std::string&, size_t) { return true; }, false, gone, min_tokens,
                                keep_stop);
  if (o.client_gone) throw HttpError{499, "the client closed the connection", "cancelled", "client_closed"};
  if (o.finish != Finish::kStop && o.finish != Finish::kLength) throw finish_error(o, timeout_s);
  return o;
}

Outcome generate_all(Scheduler& sched, const data::Tokenizer& tok, GenerationRequest request,
                     const std::vector<std::string>& stops, const std::vector<int32_t>& hidden, double timeout_s,
                     const std::function<bool()>& gone) {
  const int min_tokens = request.min_tokens;
  return generate_all(submit_or_throw(sched, std::move(request)), tok, stops, hidden, timeout_s, gone, min_tokens);
}

// OpenAI's completions logprobs: {"tokens", "token_logprobs", "top_logprobs", "text_offset"} over
// the echoed prompt's tokens (the first with null, having no position before it) and the answer's.
// A top_logprobs entry maps the k most likely tokens' strings, and the chosen one's, to their
// log-probabilities (up to k + 1 entries, as OpenAI's API says); text_offset is each token's start
// in characters of the tokens' strings joined.
// A token's string in logprobs: its text, or "bytes:\\xe4\\xbd" (OpenAI's form) where it is not
// UTF-8 on its own (a byte-level BPE's piece of a character): such pieces stay distinct keys.
std::string token_string(const data::Tokenizer& tok, int32_t id) {
  const std::string piece = tok.decode(std::span<const int32_t>(&id, 1));
  // UTF-8 as JSON writers take it (RFC 3629): no overlong forms, surrogates or code points past U+10FFFF.
  bool valid = true;
  for (size_t i = 0; i < piece.size() && valid;) {
    const unsigned char c = static_cast<unsigned char>(piece[i]);
    const size_t len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    valid = len > 0 && i + len <= piece.size();
    for (size_t k = 1; valid && k < len; ++k) valid = (static_cast<unsigned char>(piece[i + k]) & 0xC0) == 0x80;
    if (valid && len > 2) {  // the second byte's range for E0, ED, F0 and F4
      const unsigned char d = static_cast<unsigned char>(piece[i + 1]);
      valid = !(c == 0xE0 && d < 0xA0) && !(c == 0xED && d > 0x9F) && !(c == 0xF0 && d < 0x90) && !(c == 0xF4 && d > 0x8F);
    }
    i += len;
  }
  if (valid) return piece;
  std::string out = "bytes:";
  char buf[8];
  for (unsigned char c : piece) {
    std::snprintf(buf, sizeof buf, "\\x%02x", c);
    out += buf;
  }
  return out;
}

// Completions' logprobs built token by token: a whole answer's at once, a stream's in the pieces
// its chunks carry, with the same text offsets (characters from the echoed prompt's start, or the
// answer's). take() returns the entries added since the last take.
class CompletionLogprobs {
 public:
  explicit CompletionLogprobs(const data::Tokenizer& tok) : tok_(tok) {}
  void add(int32_t id, const TokenLogprobs* t) {
    const std::string raw = tok_.decode(std::span<const int32_t>(&id, 1));
    const std::string piece = token_string(tok_, id);
    tokens_.push_back(piece);
    offsets_.push_back(chars_);
    for (unsigned char c : raw) chars_ += (c & 0xC0) != 0x80;  // UTF-8 lead bytes: characters
    if (t == nullptr) {
      values_.push_back(nullptr);
      tops_.push_back(nullptr);
      return;
    }
    values_.push_back(t->logprob);
    json top = json::object();
    for (const auto& [tid, v] : t->top) top.emplace(token_string(tok_, tid), v);  // the first (largest) of equal strings
    top.emplace(piece, t->logprob);
    tops_.push_back(top);
  }
  // The prompt's tokens (echo): the first has no logprob.
  void add_prompt(const std::vector<int32_t>& prompt, const std::vector<TokenLogprobs>& prompt_lp) {
    for (size_t i = 0; i < prompt.size(); ++i) add(prompt[i], i == 0 ? nullptr : &prompt_lp.at(i - 1));
  }
  json take() {
    json out{{"tokens", std::move(tokens_)}, {"token_logprobs", std::move(values_)}, {"top_logprobs", std::move(tops_)},
             {"text_offset", std::move(offsets_)}};
    tokens_ = values_ = tops_ = offsets_ = json::array();
    return out;
  }

 private:
  const data::Tokenizer& tok_;
  json tokens_ = json::array(), values_ = json::array(), tops_ = json::array(), offsets_ = json::array();
  int64_t chars_ = 0;
};

json completion_logprobs(const data::Tokenizer& tok, const std::vector<int32_t>* prompt,
                         const std::vector<TokenLogprobs>& prompt_lp, const std::vector<int32_t>& ids,
                         const std::vector<TokenLogprobs>& lp, const std::vector<TokenLogprobs>& stop) {
  CompletionLogprobs out(tok);
  if (prompt != nullptr) out.add_prompt(*prompt, prompt_lp);
  for (size_t i = 0; i < ids.size(); ++i) out.add(ids[i], &lp.at(i));
  for (const TokenLogprobs& t : stop) out.add(t.id, &t);  // the end of text that ended the answer (no text)
  return out.take();
}

// OpenAI's chat logprobs: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
// "logprob", "bytes"}] (the k most likely)}]} over the answer's tokens; one token's entry.
json chat_logprob_entry(const data::Tokenizer& tok, int32_t id, const TokenLogprobs& t) {
  auto entry = [&](int32_t tid, float v) {
    const std::string raw = tok.decode(std::span<const int32_t>(&tid, 1));
    json bytes = json::array();
    for (unsigned char c : raw) bytes.push_back(static_cast<int>(c));
    return json{{"token", token_string(tok, tid)}, {"logprob", v}, {"bytes", bytes}};
  };
  json e = entry(id, t.logprob);
  e["top_logprobs"] = json::array();
  for (const auto& [tid, v] : t.top) e["top_logprobs"].push_back(entry(tid, v));
  return e;
}

json chat_logprobs(const data::Tokenizer& tok, const std::vector<int32_t>& ids, const std::vector<TokenLogprobs>& lp,
                   const std::vector<TokenLogprobs>& stop) {
  json content = json::array();
  for (size_t i = 0; i < ids.size(); ++i) content.push_back(chat_logprob_entry(tok, ids[i], lp.at(i)));
  for (const TokenLogprobs& t : stop) content.push_back(chat_logprob_entry(tok, t.id, t));  // the end of text that ended it
  return json{{"content", content}};
}

// The accepted socket a request arrived on, found by its peer address among this process's
// sockets (cpp-httplib 0.11 does not hand a handler its socket); -1 when none matches. The socket
// stays open while the handler runs.
int request_socket(const httplib::Request& req) {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int found = -1;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) continue;
    char host[NI_MAXHOST], port[NI_MAXSERV];
    if (::getnameinfo(reinterpret_cast<sockaddr*>(&peer), len, host, sizeof(host), port, sizeof(port),
                      NI_NUMERICHOST | NI_NUMERICSERV) != 0)
      continue;
    if (req.remote_addr == host && std::to_string(req.remote_port) == port) {
      found = fd;
      break;
    }
  }
  ::closedir(d);
  return found;
}

// The HTTP workers. A connection holds its worker from accept until it has sent a request or the
// wait for one has timed out (5 s), and again between keep-alive requests; with a fixed pool, idle
// or half-sent connections queued every request behind them (DESIGN-NOTES 85). Here a connection
// that finds no worker idle gets a new one, up to `max`; the workers past `core` end after 10 s
// without work (joined at the next enqueue). Past `max`, connections wait for a worker.
class ElasticPool final : public httplib::TaskQueue {
 public:
  ElasticPool(size_t core, size_t max) : core_(core), max_(std::max<size_t>({core, max, 1})) {}
  ~ElasticPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::lock_guard<std::mutex> lock(mutex_);
    reap();
    jobs_.push_back(std::move(fn));
    if (idle_ >= jobs_.size()) {
      work_.notify_one();
    } else if (live_ < max_) {
      try {
        auto slot = threads_.emplace(threads_.end());  // allocated before the thread exists
        try {
          *slot = std::thread([this] { run(); });
          ++live_;
        } catch (...) {
          threads_.erase(slot);
          throw;
        }
      } catch (...) {  // no thread to be had: the connection waits for a worker
      }
    }
  }
  // Lets the workers finish what they hold and the queue, then joins every one. httplib calls it
  // once it has stopped accepting, so nothing enqueues meanwhile.
  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      work_.notify_all();
    }
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    ended_.clear();
    // Connections no worker could be made for: run here, where httplib (stopped) closes them.
    while (!jobs_.empty()) {
      std::function<void()> fn = std::move(jobs_.front());
      jobs_.pop_front();
      fn();
    }
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      ++idle_;
      const bool woken = work_.wait_for(lock, std::chrono::seconds(10), [this] { return stop_ || !jobs_.empty(); });
      --idle_;
      if (!jobs_.empty()) {
        std::function<void()> fn = std::move(jobs_.front());
        jobs_.pop_front();
        lock.unlock();
        fn();
        lock.lock();
        continue;
      }
      if (stop_) return;  // joined by shutdown()
      if (!woken && live_ > core_) break;
    }
    --live_;
    ended_.push_back(std::this_thread::get_id());  // joined by the next enqueue; nothing after this
  }
  // Joins the workers that have ended (each is past its last use of the pool). REQUIRES: mutex_.
  void reap() {
    for (const std::thread::id id : ended_) {
      auto it = std::find_if(threads_.begin(), threads_.end(), [id](const std::thread& t) { return t.get_id() == id; });
      it->join();
      threads_.erase(it);
    }
    ended_.clear();
  }

  const size_t core_, max_;
  std::mutex mutex_;
  std::condition_variable work_;
  std::deque<std::function<void()>> jobs_;
  std::list<std::thread> threads_;
  std::vector<std::thread::id> ended_;  // workers that ended for want of work, not joined yet
  size_t live_ = 0, idle_ = 0;
  bool stop_ = false;
};

// Whether the client at the other end of fd has closed its side: a peek that reads end-of-file or
// fails. (A pipelined next request is data, not a close.)
bool peer_closed(int fd) {
  char c;
  const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

}  // namespace

// A request whose body is refused unread, or read in part: once the answer is written (the
// logger runs then), the connection's reading side is shut, so it closes. cpp-httplib 0.11 closes
// by the request's headers only, and what was left of the body was read as the next request (one
// hidden in a body was answered); shut before the answer, the answer was not written.
namespace {
void close_after(const httplib::Request& req) {
  if (const int fd = request_socket(req); fd >= 0) ::shutdown(fd, SHUT_RD);
}
}  // namespace

void HttpServer::route() {
  httplib::Server& s = *http_;
  const int threads = options_.threads > 0 ? options_.threads : gen_.slots() + options_.max_queue + 8;
  const int max_threads = std::max(threads, options_.max_threads);
  s.new_task_queue = [threads, max_threads] {
    return new ElasticPool(static_cast<size_t>(threads), static_cast<size_t>(max_threads));
  };
  s.set_payload_max_length(options_.max_body_bytes);
  s.set_keep_alive_timeout(static_cast<time_t>(options_.idle_timeout_s));
  s.set_read_timeout(static_cast<time_t>(options_.idle_timeout_s), 0);
  // The listening socket: SO_REUSEADDR (a restart binds over connections in TIME_WAIT), not
  // httplib's default SO_REUSEPORT, with which a second server bound the same port and the kernel
  // shared the connections between the two. Kept for bind()'s backlog.
  s.set_socket_options([this](int sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd_ = sock;
  });
  s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler's own error
    HttpError e{res.status, "", "invalid_request_error", ""};
    if (res.status == 413) {
      e.message = "the body is larger than " + std::to_string(options_.max_body_bytes) + " bytes";
      e.code = "payload_too_large";
    } else if (res.status == 404) {
      e.message = "no endpoint " + req.method + " " + req.path;
      e.code = "not_found";
    } else {
      // cpp-httplib's own refusals: a request line, header or framing it could not read.
      e.message = "HTTP " + std::to_string(res.status) + ": the request line, a header or the body's framing could not be read";
      e.code = "invalid_request";
    }
    res.set_content(dump(error_json(e)), "application/json");
    // An unknown path is counted under one label: a path in the metrics' label forged series
    // (a quote and a newline in it) and each new one added a series for good.
    bool routed = false;
    for (const char* r : {"/", "/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions"})
      routed |= req.path == r;
    record(routed && res.status != 404 ? req.path : std::string("unmatched"), res.status, 0.0);
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, HttpError{500, what, "server_error", ""});
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining_) {
      res.status = 503;
      res.set_content(R"({"status":"draining"})", "application/json");
    } else {
      res.set_content(R"({"status":"ok"})", "application/json");
    }
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json m = {{"id", options_.model_name}, {"object", "model"}, {"created", created_}, {"owned_by", "meshtrain"}};
    res.set_content(dump(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
    record("/v1/models", 200, 0.0);
  });
  s.set_logger([](const httplib::Request& req, const httplib::Response& res) {
    if (res.get_header_value("Connection") == "close") close_after(req);
  });
  // A client that asks before it sends (Expect: 100-continue, curl's way past 1 KiB) is told 413 at
  // once for a length over the limit (cpp-httplib answered 100 Continue and so invited the body).
  s.set_expect_100_continue_handler([this](const httplib::Request& req, httplib::Response& res) {
    const std::string length = req.get_header_value("Content-Length");
    if (length.empty() || length.size() > 19 || length.find_first_not_of("0123456789") != std::string::npos ||
        std::stoull(length) <= options_.max_body_bytes)
      return 100;
    send_error(res, HttpError{413, "the body is larger than " + std::to_string(options_.max_body_bytes) + " bytes",
                              "invalid_request_error", "payload_too_large"});
    record(req.path == "/" || req.path == "/v1/completions" || req.path == "/v1/chat/completions" ? req.path
                                                                                                    : std::string("unmatched"),
           413, 0.0);
    res.set_header("Connection", "close");  // the logger shuts the connection's reading side
    return 413;
  });
  // The bodies are read here, not by cpp-httplib, whose limit holds for a Content-Length only: a
  // chunked body, or a gzip one as it inflates, was read whole (a 48 KB gzip body held 1.6 GB).
  for (const char* path : {"/", "/v1/completions", "/v1/chat/completions"}) {
    const std::string endpoint = path;
    s.Post(path, [this, endpoint](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
      std::string body;
      if (!read_body(req, res, reader, endpoint, body)) return;
      httplib::Request with_body = req;
      with_body.body = std::move(body);
      if (endpoint == "/") handle_chatglm(with_body, res);
      else handle_completion(with_body, res, endpoint == "/v1/chat/completions");
    });
  }
}


bool HttpServer::read_body(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                           const std::string& endpoint, std::string& body) {
  // A refused body is read to its end and dropped where it can be, so the connection stays in step
  // (cpp-httplib 0.11 keeps a connection by the request's headers alone, and what was left of a body
  // was read as the next request: one hidden in a body was answered). Where it cannot be (framing
  // that cannot be read, a body past the drain's bound), the reading side is shut and the
  // connection ends after the answer.
  auto refuse = [&](int status, const std::string& message, const char* code, bool in_step) {
    HttpError e{status, message, "invalid_request_error", code};
    json j = error_json(e);
    if (endpoint == "/") j["status"] = status;  // ChatGLM's answers carry it
    res.status = status;
    res.set_content(dump(j), "application/json");
    record(endpoint, status, 0.0);
    if (!in_step) res.set_header("Connection", "close");  // the logger shuts the connection's reading side
    return false;
  };
  const std::string too_large = "the body is larger than " + std::to_string(options_.max_body_bytes) + " bytes";
  // cpp-httplib reads chunks where the header is exactly "chunked"; any other coding it read as a
  // body without length, until the client closed.
  std::string te = req.get_header_value("Transfer-Encoding");
  std::transform(te.begin(), te.end(), te.begin(), ::tolower);
  const bool chunked = te == "chunked";
  if (req.has_header("Transfer-Encoding") && !chunked)
    return refuse(501, "Transfer-Encoding: '" + te + "' is not supported (chunked, or a Content-Length)", "not_implemented", false);
  if (req.has_header("Content-Length")) {
    const std::string length = req.get_header_value("Content-Length");
    if (length.empty() || length.size() > 19 || length.find_first_not_of("0123456789") != std::string::npos)
      return refuse(400, "Content-Length: '" + length + "' is not a byte count", "invalid_request", false);
  } else if (!chunked) {
    return true;  // neither length nor chunks: no body (RFC 9112 6.3); it waited for the client to close
  }
  if (req.is_multipart_form_data()) {  // read (within the limit) and dropped
    const bool read = reader([](const httplib::MultipartFormData&) { return true; }, [](const char*, size_t) { return true; });
    return refuse(read ? 415 : res.status == 413 ? 413 : 400,
                  read ? std::string("a multipart/form-data body is not read; send the JSON with the header Content-Type: application/json")
                       : res.status == 413 ? too_large : std::string("the multipart body could not be read"),
                  read ? "unsupported_media_type" : res.status == 413 ? "payload_too_large" : "invalid_request", read || res.status == 413);
  }
  // Past the limit the rest is read and dropped, up to a bound (a gzip body may inflate without end).
  const size_t drain = std::max<size_t>(size_t{16} << 20, 4 * options_.max_body_bytes);
  size_t seen = 0;
  const bool read = reader([&](const char* data, size_t n) {
    seen += n;
    if (seen > options_.max_body_bytes) {
      body.clear();
      return seen <= drain;
    }
    body.append(data, n);
    return true;
  });
  // A Content-Length over the limit: cpp-httplib skips the body itself (413, in step).
  if (!read && res.status == 413) return refuse(413, too_large, "payload_too_large", true);
  if (seen > options_.max_body_bytes) return refuse(413, too_large + " (as sent, or inflated)", "payload_too_large", read);
  if (!read)
    return refuse(400, "the body could not be read (its chunks or its Content-Encoding are broken, or the client stopped sending)",
                  "invalid_request", false);
  return true;
}

void HttpServer::handle_chatglm(const httplib::Request& req, httplib::Response& res) {
  const auto t0 = Clock::now();
  ++in_flight_;
  int status = 200;
  try {
    const json body = parse_body(req);
    refuse_unimplemented(body, false);
    const std::string prompt = get_string(body, "prompt");
    data::ChatHistory history;
    json history_json = json::array();
    if (present(body, "history")) {
      const json& h = body["history"];
      if (!h.is_array()) bad("\"history\" must be a list of [prompt, response]", "invalid_type");
      for (const json& turn : h) {
        if (!turn.is_array() || turn.size() != 2 || !turn[0].is_string() || !turn[1].is_string())
          bad("each \"history\" entry must be [prompt, response] strings", "invalid_type");
        history.emplace_back(turn[0].get<std::string>(), turn[1].get<std::string>());
        history_json.push_back(turn);
      }
    }
    // ChatGLM's defaults: max_length 2048 (prompt and response together), top_p 0.7, temperature 0.95.
    GenerationRequest r;
    if (tok_.chat_template() != nullptr) {
      nlohmann::ordered_json messages = nlohmann::ordered_json::array();
      for (const auto& [q, a] : history) {
        messages.push_back({{"role", "user"}, {"content", q}});
        messages.push_back({{"role", "assistant"}, {"content", a}});
      }
      messages.push_back({{"role", "user"}, {"content", prompt}});
      r.prompt = template_prompt(messages);
    } else {
      r.prompt = encode_pieces(data::chat_prompt_pieces(history, prompt));
    }
    const int max_length = get_int(body, "max_length", 2048, 1, 1 << 30);
    if (static_cast<int>(r.prompt.size()) >= std::min(max_length, gen_.capacity()))
      throw HttpError{400,
                      "the prompt and history are " + std::to_string(r.prompt.size()) + " tokens; max_length " +
                          std::to_string(max_length) + " and the context of " + std::to_string(gen_.capacity()) +
                          " leave no room for a response",
                      "invalid_request_error", "context_length_exceeded"};
    r.max_new_tokens = max_length - static_cast<int>(r.prompt.size());
    r.sampling = sampling_from(body, 0.95f, 0.7f);
    if (tok_.has_eot()) r.stop_ids = {tok_.eot_id()};
    r.stop_ids.insert(r.stop_ids.end(), options_.eos_ids.begin(), options_.eos_ids.end());
    r.sample_below = tok_.vocab_size();
    r.deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.request_timeout_s));
    const int fd = request_socket(req);
    const std::string text =
        generate_all(*scheduler_, tok_, std::move(r), {}, end_ids_, options_.request_timeout_s,
                     [fd] { return fd >= 0 && peer_closed(fd); })
            .text;
    history_json.push_back(json::array({prompt, text}));
    json out = {{"response", text}, {"history", history_json}, {"status", 200}, {"time", local_time()}};
    res.set_content(dump(out), "application/json");
  } catch (const HttpError& e) {
    status = e.status;
    json j = error_json(e);
    j["status"] = e.status;
    res.status = e.status;
    res.set_content(dump(j), "application/json");
  } catch (const std::exception& e) {  // any other: a 500, and the request still counted out
    const HttpError err = internal_error(e);
    status = err.status;
    json j = error_json(err);
    j["status"] = err.status;
    res.status = err.status;
    res.set_content(dump(j), "application/json");
  }
  record("/", status, std::chrono::duration<double>(Clock::now() - t0).count());
  --in_flight_;
}

void HttpServer::handle_completion(const httplib::Request& req, httplib::Response& res, bool chat) {
  const auto t0 = Clock::now();
  const std::string endpoint = chat ? "/v1/chat/completions" : "/v1/completions";
  ++in_flight_;
  try {
    const json body = parse_body(req);
    if (present(body, "model") && (!body["model"].is_string() || body["model"].get<std::string>() != options_.model_name))
      throw HttpError{404, "the model " + (body["model"].is_string() ? body["model"].dump() : std::string("(a JSON ") + body["model"].type_name() + ")") + " does not exist; this server has \"" +
                               options_.model_name + "\"",
                      "invalid_request_error", "model_not_found"};
    refuse_unimplemented(body, true);
    // TGI's and transformers' name for max_tokens was answered 200 and ignored (stop 73).
    if (present(body, "max_new_tokens"))
      bad("\"max_new_tokens\" is not read by this endpoint: its length is \"max_tokens\"", "unsupported_parameter");
    // best_of and suffix are the completions API's; a chat request with them was answered as if
    // they were absent. echo is the completions API's too.
    refuse_unless(body, "best_of", 1);
    refuse_unless(body, "suffix", nullptr);
    ToolUse tool_use;  // chat's tools: rendered by the template, the calls read with "auto"
    if (chat) {
      tool_use = tools_from(body, req.body, tok_.chat_template() != nullptr, auto_tools_.has_value());
      refuse_unless(body, "echo", false);
    }
    // n choices of each prompt; logprobs (completions: the k most likely, 0-20, as vLLM allows;
    // chat: true, with top_logprobs 0-20); echo (completions: the prompt before the answer, and its
    // tokens' logprobs with logprobs).
    const int n_choices = get_int(body, "n", 1, 1, 128);
    int logprobs = -1;
    if (chat) {
      if (present(body, "logprobs") && !body["logprobs"].is_boolean()) bad("\"logprobs\" must be true or false", "invalid_type");
      const bool want = present(body, "logprobs") && body["logprobs"].get<bool>();
      if (present(body, "top_logprobs") && !want) bad("\"top_logprobs\" needs \"logprobs\": true", "invalid_value");
      if (want) logprobs = get_int(body, "top_logprobs", 0, 0, 20);
    } else {
      // The chat API's field; the completions API's is logprobs: N (it was answered 200 and ignored).
      if (present(body, "top_logprobs"))
        bad("\"top_logprobs\" is the chat API's: the completions API takes \"logprobs\": N", "unsupported_parameter");
      logprobs = get_int(body, "logprobs", -1, 0, 20);
    }
    bool echo = false;
    if (present(body, "echo")) {
      if (!body["echo"].is_boolean()) bad("\"echo\" must be true or false", "invalid_type");
      echo = body["echo"].get<bool>();
    }
    GenerationRequest r;
    std::vector<std::vector<int32_t>> prompts;  // completions: one or more; chat: the one below
    std::vector<std::string> prompt_texts;      // what echo writes before each answer
    if (chat) {
      if (!present(body, "messages") || !body["messages"].is_array() || body["messages"].empty())
        bad("\"messages\" must be a non-empty list of {\"role\", \"content\"}", "invalid_type");
      std::vector<std::string> pieces;
      data::ChatHistory history;
      // The tokenizer's chat template (an Instruct model's), as vLLM applies it: the messages
      // rendered with the generation prompt, the text encoded without the tokenizer's special
      // tokens (the template writes them).
      const data::ChatTemplate* chat_template = tok_.chat_template();
      nlohmann::ordered_json templated = nlohmann::ordered_json::array(), ordered_messages;
      if (chat_template != nullptr && present(body, "messages") && body["messages"].is_array())
        ordered_messages = nlohmann::ordered_json::parse(req.body)["messages"];  // parsed above: it is JSON
      std::string pending;  // a user turn waiting for its assistant reply
      bool have_pending = false;
      const json& msgs = body["messages"];
      for (size_t i = 0; i < msgs.size(); ++i) {
        const json& m = msgs[i];
        const std::string at = "messages[" + std::to_string(i) + "]";
        // An assistant's turn of tool calls alone, for a template: its content null or left out (as
        // OpenAI's API and vLLM take it).
        const bool may_lack_content = chat_template != nullptr && m.is_object() && m.contains("role") && m["role"] == "assistant";
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || (!m.contains("content") && !may_lack_content))
          bad(at + " must be {\"role\": string, \"content\": string or a list of text parts}", "invalid_type");
        std::string content;
        bool no_content = false;
        if (!m.contains("content") || (m["content"].is_null() && may_lack_content)) {
          no_content = true;
        } else if (m["content"].is_string()) {
          content = m["content"];
        } else if (m["content"].is_array()) {
          // OpenAI's content parts: text ones only, joined by a newline (as vLLM joins them).
          for (size_t k = 0; k < m["content"].size(); ++k) {
            const json& part = m["content"][k];
            if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
                !part["text"].is_string())
              bad(at + ".content[" + std::to_string(k) + "]: only {\"type\": \"text\", \"text\": string} parts are supported",
                  "invalid_value");
            if (k > 0) content += "\n";
            content += part["text"].get<std::string>();
          }
        } else {
          bad(at + " must be {\"role\": string, \"content\": string or a list of text parts}", "invalid_type");
        }
        std::string role = m["role"];
        if (role == "developer") role = "system";  // OpenAI's newer name for the system message
        if (chat_template != nullptr) {  // the template takes the turns, and says what it refuses
          // The message as sent (its tool_calls, a tool's name; keys in their order), as vLLM
          // passes it, with the role and the content as read.
          nlohmann::ordered_json turn = ordered_messages[i];
          turn["role"] = role;
          turn["content"] = no_content ? nlohmann::ordered_json() : nlohmann::ordered_json(content);
          tool_calls_for_template(turn, at);
          templated.push_back(std::move(turn));
          continue;
        }
        if (role == "system" && history.empty() && !have_pending) {
          pieces.push_back(content + "\n");
        } else if (role == "user" && !have_pending) {
          pending = content;
          have_pending = true;
        } else if (role == "assistant" && have_pending) {
          history.emplace_back(pending, content);
          have_pending = false;
        } else {
          bad("messages[" + std::to_string(i) + "]: expected " +
                  (have_pending ? "an \"assistant\" turn" : "a \"user\" turn (\"system\" ones only before the first user turn)") +
                  ", got \"" + role + "\"",
              "invalid_value");
        }
      }
      if (chat_template != nullptr) {
        prompts.push_back(template_prompt(templated, tool_use.tools));
      } else {
        if (!have_pending) bad("the last message must be a \"user\" turn", "invalid_value");
        for (std::string& p : data::chat_prompt_pieces(history, pending)) pieces.push_back(std::move(p));
        prompts.push_back(encode_pieces(pieces));
      }
      prompt_texts.emplace_back();
    } else {
      // OpenAI's prompt forms: a string, a list of strings, a list of token ids, a list of such
      // lists (lm-evaluation-harness sends its tokenized requests so); a list gives choices in its
      // order, n for each.
      if (!present(body, "prompt")) bad("\"prompt\" is required", "missing_field");
      const json& p = body["prompt"];
      const char* form = "\"prompt\" must be a string, a list of strings, a list of token ids or a list of lists of token ids";
      auto ids_of = [&](const json& list) {
        std::vector<int32_t> ids;
        if (list.empty()) bad("a \"prompt\" of token ids must not be empty", "invalid_value");
        for (const json& t : list) {
          if (!t.is_number_integer()) bad(form, "invalid_type");
          // The tokenizer's ids (a model's vocabulary padded past them has rows no text is).
          const int64_t v = t.is_number_unsigned() && t.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX) ? -1 : t.get<int64_t>();
          const int64_t limit = std::min<int64_t>(gen_.vocab_size(), tok_.vocab_size());
          if (v < 0 || v >= limit)
            bad("prompt token " + t.dump() + " is outside the vocabulary [0, " + std::to_string(limit) + ")", "invalid_value");
          ids.push_back(static_cast<int32_t>(v));
        }
        prompts.push_back(std::move(ids));
        prompt_texts.push_back(tok_.decode(prompts.back()));
      };
      auto text_of = [&](const std::string& text) {
        // With the template's special tokens, as vLLM's completions encode a text prompt
        // (add_special_tokens true); a prompt of ids is taken as it is.
        std::vector<int32_t> ids = tok_.encode_with_special(text);
        if (ids.empty()) {  // an empty prompt starts a document
          if (!tok_.has_eot()) bad("an empty prompt starts with <|endoftext|>, which this tokenizer lacks", "invalid_value");
          ids.push_back(tok_.eot_id());
        }
        // (an empty one echoes its <|endoftext|>, as the same ids given as a list do: its echo was ""
        // while the logprobs' tokens and offsets counted the 13 characters); so does one with the
        // template's special tokens, which are in its tokens
        const bool templated = !tok_.special_before().empty() || !tok_.special_after().empty();
        prompt_texts.push_back(text.empty() || templated ? tok_.decode(ids) : text);
        prompts.push_back(std::move(ids));
      };
      if (p.is_string()) {
        text_of(p.get<std::string>());
      } else if (p.is_array() && !p.empty() && p[0].is_string()) {
        for (const json& x : p) {
          if (!x.is_string()) bad(form, "invalid_type");
          text_of(x.get<std::string>());
        }
      } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
        ids_of(p);
      } else if (p.is_array() && !p.empty() && p[0].is_array()) {
        for (const json& x : p) {
          if (!x.is_array()) bad(form, "invalid_type");
          ids_of(x);
        }
      } else {
        bad(form, "invalid_type");
      }
    }
    for (const std::vector<int32_t>& prompt : prompts)
      if (static_cast<int>(prompt.size()) > gen_.capacity())
        throw HttpError{400,
                        "the prompt is " + std::to_string(prompt.size()) + " tokens; the context holds " +
                            std::to_string(gen_.capacity()),
                        "invalid_request_error", "context_length_exceeded"};
    const int choices = static_cast<int>(prompts.size()) * n_choices;
    if (choices > options_.max_queue)
      bad("the request asks for " + std::to_string(choices) + " choices (prompts x n); this server takes at most " +
              std::to_string(options_.max_queue) + " (--max-queue)",
          "invalid_value");
    // OpenAI's newer name, read on both endpoints (completions ignored it); both given must agree.
    if (present(body, "max_completion_tokens") && present(body, "max_tokens") && body["max_completion_tokens"] != body["max_tokens"])
      bad("\"max_tokens\" and \"max_completion_tokens\" differ: give one", "invalid_value");
    const char* max_key = present(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    // max_tokens 0 with echo: the prompt alone, scored (OpenAI's legacy loglikelihood request).
    r.max_new_tokens = get_int(body, max_key, chat ? gen_.capacity() : options_.default_max_tokens, echo ? 0 : 1, 1 << 30);
    // A length asked for that the context cannot hold is refused, as OpenAI and vLLM refuse it (it
    // ended at the full context with finish_reason "length", which a client takes for the length it
    // asked); completions' default of 16 is checked as vLLM checks it (it was cut short without a
    // word); without one, chat writes what the context holds, and needs room for a token.
    const bool asked = present(body, max_key);
    const std::string max_name = std::string("\"") + max_key + "\"" + (asked ? "" : " (the default)");
    for (const std::vector<int32_t>& prompt : prompts) {
      const int64_t need = static_cast<int64_t>(prompt.size()) + (asked || !chat ? r.max_new_tokens : std::min(r.max_new_tokens, 1));
      if (need > gen_.capacity())
        throw HttpError{400,
                        "the prompt is " + std::to_string(prompt.size()) + " tokens and " +
                            (asked || !chat ? max_name + " asks for " + std::to_string(r.max_new_tokens) + " more"
                                            : std::string("an answer needs one more")) +
                            "; the context holds " + std::to_string(gen_.capacity()),
                        "invalid_request_error", "context_length_exceeded"};
    }
    r.sampling = sampling_from(body, 1.0f, 1.0f);
    // OpenAI's penalties and logit_bias, vLLM's (and TGI's) repetition_penalty, min_p, min_tokens.
    r.sampling.presence_penalty = get_float(body, "presence_penalty", 0.0f, -2.0f, 2.0f);
    r.sampling.frequency_penalty = get_float(body, "frequency_penalty", 0.0f, -2.0f, 2.0f);
    // (0, ...] as vLLM's ranges; a value below a float's smallest keeps to it
    r.sampling.repetition_penalty = std::max(get_float(body, "repetition_penalty", 1.0f, 0.0f, 1e6f, true), FLT_MIN);
    r.sampling.min_p = get_float(body, "min_p", 0.0f, 0.0f, 1.0f);
    r.sampling.typical_p = std::max(get_float(body, "typical_p", 1.0f, 0.0f, 1.0f, true), FLT_MIN);
    r.min_tokens = get_int(body, "min_tokens", 0, 0, 1 << 30);
    // The ids a draw can give: the tokenizer's (a model's vocabulary padded past it has rows no text is).
    const int64_t drawable = std::min<int64_t>(gen_.vocab_size(), tok_.vocab_size());
    // Counted against the context as a length asked for (a chat answer stopped short of it at the
    // full context, "length", and the message named a max_tokens no one gave).
    for (const std::vector<int32_t>& prompt : prompts)
      if (static_cast<int64_t>(prompt.size()) + r.min_tokens > gen_.capacity())
        throw HttpError{400,
                        "the prompt is " + std::to_string(prompt.size()) + " tokens and \"min_tokens\" asks for " +
                            std::to_string(r.min_tokens) + " more; the context holds " + std::to_string(gen_.capacity()),
                        "invalid_request_error", "context_length_exceeded"};
    if (r.min_tokens > r.max_new_tokens)
      bad("\"min_tokens\" (" + std::to_string(r.min_tokens) + ") is more than " + max_name + " (" +
              std::to_string(r.max_new_tokens) + ")",
          "invalid_value");
    if (present(body, "logit_bias")) {
      if (!body["logit_bias"].is_object()) bad("\"logit_bias\" must be an object of token ids to biases", "invalid_type");
      for (const auto& [key, v] : body["logit_bias"].items()) {
        int64_t tid = -1;
        auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), tid);
        if (key.empty() || key[0] == '-' || ec != std::errc() || end != key.data() + key.size() || tid < 0 || tid >= drawable)
          bad("\"logit_bias\": \"" + key + "\" is not an id the tokenizer can decode: [0, " + std::to_string(drawable) + ")",
              "invalid_value");
        if (!v.is_number() || !(v.get<double>() >= -100.0 && v.get<double>() <= 100.0))
          bad("\"logit_bias\": the bias of \"" + key + "\" must be a number in [-100, 100]", "invalid_value");
        r.sampling.logit_bias.emplace_back(static_cast<int32_t>(tid), v.get<float>());
      }
    }
    r.logprobs = logprobs;
    r.prompt_logprobs = echo && logprobs >= 0;
    bool ignore_eos = false;  // vLLM's extension: generate max_tokens whatever comes (benchmarks)
    if (present(body, "ignore_eos")) {
      if (!body["ignore_eos"].is_boolean()) bad("\"ignore_eos\" must be true or false", "invalid_type");
      ignore_eos = body["ignore_eos"].get<bool>();
    }
    if (!ignore_eos) {
      if (tok_.has_eot()) r.stop_ids = {tok_.eot_id()};
      r.stop_ids.insert(r.stop_ids.end(), options_.eos_ids.begin(), options_.eos_ids.end());
    }
    // vLLM's include_stop_str_in_output: a stop string stays at the answer's end, and a stop id
    // that is not special is its last token (by default neither is in the text, as vLLM answers).
    bool keep_stop = false;
    if (present(body, "include_stop_str_in_output")) {
      if (!body["include_stop_str_in_output"].is_boolean()) bad("\"include_stop_str_in_output\" must be true or false", "invalid_type");
      keep_stop = body["include_stop_str_in_output"].get<bool>();
    }
    // vLLM's stop_token_ids: more ids that end an answer (whatever ignore_eos says).
    if (present(body, "stop_token_ids")) {
      const json& st = body["stop_token_ids"];
      if (!st.is_array()) bad("\"stop_token_ids\" must be a list of token ids", "invalid_type");
      for (const json& t : st) {
        const int64_t drawable = std::min<int64_t>(gen_.vocab_size(), tok_.vocab_size());
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= drawable)
          bad("\"stop_token_ids\": " + t.dump() + " is not an id the tokenizer can decode: [0, " + std::to_string(drawable) + ")",
              "invalid_value");
        const auto tid = static_cast<int32_t>(t.get<int64_t>());
        r.stop_ids.push_back(tid);
        // With include_stop_str_in_output the id is the answer's last token, in its text, unless it
        // is special (vLLM decodes with skip_special_tokens: an end of text has no text).
        if (keep_stop && !tok_.is_special(tid) && std::find(end_ids_.begin(), end_ids_.end(), tid) == end_ids_.end())
          r.returned_stop_ids.push_back(tid);
      }
    }
    r.sample_below = tok_.vocab_size();
    r.deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.request_timeout_s));
    const std::vector<std::string> stops = stops_from(body);
    bool stream = false;
    if (present(body, "stream")) {
      if (!body["stream"].is_boolean()) bad("\"stream\" must be true or false", "invalid_type");
      stream = body["stream"].get<bool>();
    }
    // OpenAI's stream_options.include_usage: a last chunk with no choices and the usage.
    bool include_usage = false;
    if (present(body, "stream_options")) {
      const json& so = body["stream_options"];
      if (!so.is_object()) bad("\"stream_options\" must be an object", "invalid_type");
      if (present(so, "include_usage") && !so["include_usage"].is_boolean())
        bad("\"stream_options.include_usage\" must be true or false", "invalid_type");
      include_usage = stream && present(so, "include_usage") && so["include_usage"].get<bool>();
    }
    const std::string id = random_id(chat ? "chatcmpl" : "cmpl");
    const int64_t created = static_cast<int64_t>(std::time(nullptr));
    int prompt_tokens = 0;
    for (const auto& prompt : prompts) prompt_tokens += static_cast<int>(prompt.size());
    auto finish_json = [](Finish f) { return json(f == Finish::kLength ? "length" : "stop"); };

    // Every choice is queued at once (they batch together), choice k of prompt p at index
    // p · n + k, seeded seed + k (the same request gives the same choices). All or none: a choice
    // the queue refuses cancels those already queued (503 at once, a stream's before its headers).
    std::vector<std::shared_ptr<Generation>> queued;
    try {
      for (size_t p = 0; p < prompts.size(); ++p)
        for (int k = 0; k < n_choices; ++k) {
          GenerationRequest rk = r;
          rk.prompt = prompts[p];
          rk.sampling.seed = r.sampling.seed + static_cast<uint64_t>(k);
          queued.push_back(submit_or_throw(*scheduler_, std::move(rk)));
        }
    } catch (...) {
      for (const auto& g : queued) g->cancel(Finish::kCancelled);
      throw;
    }

    if (!stream) {
      const int fd = request_socket(req);
      // The scheduler runs them together. Without stop strings they are followed one after the
      // other; with them each is followed on a thread of its own, so each ends at its own stop
      // string (followed in turn, a later one decoded to max_tokens while the earlier ran). An error
      // cancels the rest.
      std::vector<Outcome> outcomes;
      auto follow = [&](const std::shared_ptr<Generation>& g) {
        return generate_all(g, tok_, stops, end_ids_, options_.request_timeout_s, [fd] { return fd >= 0 && peer_closed(fd); },
                            r.min_tokens, keep_stop);
      };
      std::exception_ptr failed;
      if (stops.empty() || queued.size() == 1) {
        try {
          for (const auto& g : queued) outcomes.push_back(follow(g));
        } catch (...) {
          failed = std::current_exception();
        }
      } else {
        std::vector<std::future<Outcome>> running;
        for (const auto& g : queued) running.push_back(std::async(std::launch::async, follow, g));
        for (auto& f : running) {  // every one joined before this returns (they read this request's data)
          try {
            outcomes.push_back(f.get());
          } catch (...) {
            if (!failed) failed = std::current_exception();
            for (const auto& g : queued) g->cancel(Finish::kCancelled);
          }
        }
      }
      if (failed) {
        for (const auto& g : queued) g->cancel(Finish::kCancelled);
        std::rethrow_exception(failed);
      }
      int completion = 0;
      json list = json::array();
      for (size_t c = 0; c < outcomes.size(); ++c) {
        const Outcome& o = outcomes[c];
        const size_t p = c / static_cast<size_t>(n_choices);
        completion += o.completion_tokens;
        json choice = {{"index", c}, {"finish_reason", finish_json(o.finish)}};
        if (chat) {
          choice["message"] = {{"role", "assistant"}, {"content", o.text}};
          if (tool_use.parse) {
            // The calls and the content beside them; "tool_calls" where the answer ended by itself
            // (a "length" cut stays visible, as vLLM reports it).
            const ParsedToolCalls p = read_tool_calls(tool_use, *auto_tools_, o.text);
            if (!p.calls.empty()) {
              choice["message"]["content"] = p.content ? json(*p.content) : json(nullptr);
              json calls = json::array();
              for (const ToolCall& call : p.calls) calls.push_back(tool_call_json(call, std::nullopt));
              choice["message"]["tool_calls"] = std::move(calls);
              if (o.finish == Finish::kStop) choice["finish_reason"] = "tool_calls";
            }
          }
          choice["logprobs"] = logprobs >= 0 ? chat_logprobs(tok_, o.ids, o.logprobs, o.stop_logprobs) : json(nullptr);
        } else {
          choice["text"] = echo ? prompt_texts[p] + o.text : o.text;
          choice["logprobs"] = logprobs >= 0 ? completion_logprobs(tok_, echo ? &prompts[p] : nullptr, o.prompt_logprobs, o.ids, o.logprobs,
                                                                 o.stop_logprobs)
                                             : json(nullptr);
        }
        list.push_back(std::move(choice));
      }
      json out = {{"id", id},
                  {"object", chat ? "chat.completion" : "text_completion"},
                  {"created", created},
                  {"model", options_.model_name},
                  {"choices", list},
                  {"usage",
                   {{"prompt_tokens", prompt_tokens},
                    {"completion_tokens", completion},
                    {"total_tokens", prompt_tokens + completion}}}};
      res.set_content(dump(out), "application/json");
      record(endpoint, 200, std::chrono::duration<double>(Clock::now() - t0).count());
      --in_flight_;
      return;
    }

    // Streaming: server-sent events, one per text delta of a choice (its index), then each choice's
    // finish reason, the usage when asked, and [DONE]. The choices (queued above) are followed in
    // the content provider, after the headers, each on a thread of its own when there are
    // several, and their chunks go out whole, one at a time. A failed write cancels them all;
    // a choice's error is one error event and cancels the rest. With logprobs a chunk carries the
    // entries of the tokens whose text it completes (the end of text that ended the answer comes
    // with the finish chunk; a chunk with none has null), so that the chunks' entries, joined,
    // are the whole answer's. With echo a choice's first chunk is its prompt (and its entries).
    struct StreamJob {
      std::vector<std::shared_ptr<Generation>> gens;  // choice c: prompt c / n, seed + c % n
      std::vector<std::vector<int32_t>> prompts;
      std::vector<std::string> prompt_texts;
      int min_tokens = 0;
      bool keep_stop = false;
      bool provided = false;  // the content provider ran (the headers went out)
      int fd = -1;            // the request's socket: its close is seen while text is held back too
    };
    auto job = std::make_shared<StreamJob>();
    job->gens = std::move(queued);
    job->prompts = std::move(prompts);
    job->prompt_texts = std::move(prompt_texts);
    job->min_tokens = r.min_tokens;
    job->keep_stop = keep_stop;
    job->fd = request_socket(req);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, stops, id, created, chat, endpoint, t0, finish_json, include_usage, prompt_tokens, n_choices, logprobs,
         echo, tool_use](size_t, httplib::DataSink& sink) {
          job->provided = true;
          const std::vector<std::shared_ptr<Generation>>& gens = job->gens;
          std::mutex mu;  // one chunk at a time; the state below
          bool alive = true, failed = false;
          int status = 200, completion_tokens = 0;
          auto write = [&](const json& ev) {  // under mu
            if (!alive) return false;
            const std::string line = "data: " + dump(ev) + "\n\n";
            alive = sink.write(line.data(), line.size());
            if (!alive)
              for (const auto& g : gens) g->cancel(Finish::kCancelled);
            return alive;
          };
          auto event = [&](json choices) {
            return json{{"id", id},
                        {"object", chat ? "chat.completion.chunk" : "text_completion"},
                        {"created", created},
                        {"model", options_.model_name},
                        {"choices", std::move(choices)}};
          };
          auto chunk = [&](size_t c, const json& delta_or_text, const json& finish_reason, json lp) {
            json choice = {{"index", c}, {"finish_reason", finish_reason}, {"logprobs", std::move(lp)}};
            if (chat) choice["delta"] = delta_or_text;
            else choice["text"] = delta_or_text;
            return write(event(json::array({std::move(choice)})));
          };
          auto fail = [&](const HttpError& e) {  // under mu: the first error is the one said
            if (failed) return;
            failed = true;
            for (const auto& g : gens) g->cancel(Finish::kCancelled);
            if (!alive) return;  // the client left first: that is what ended it (499)
            status = e.status;
            write(error_json(e));
          };
          auto follow_one = [&](size_t c) {
            const size_t p = c / static_cast<size_t>(n_choices);
            const std::shared_ptr<Generation>& g = gens[c];
            CompletionLogprobs entries(tok_);
            size_t listed = 0;  // the answer's tokens whose entries went out
            bool echoed = !echo;
            // The entries of the answer's tokens [listed, upto) and of `stop`; null when none.
            auto lp_upto = [&](size_t upto, const std::vector<TokenLogprobs>& stop) -> json {
              if (logprobs < 0) return nullptr;
              std::vector<TokenLogprobs> more = upto > listed ? g->logprobs(listed) : std::vector<TokenLogprobs>();
              if (more.size() > upto - std::min(upto, listed)) more.resize(upto - std::min(upto, listed));
              listed += more.size();
              if (more.empty() && stop.empty()) return nullptr;
              if (chat) {
                json content = json::array();
                for (const TokenLogprobs& t : more) content.push_back(chat_logprob_entry(tok_, t.id, t));
                for (const TokenLogprobs& t : stop) content.push_back(chat_logprob_entry(tok_, t.id, t));
                return json{{"content", std::move(content)}};
              }
              for (const TokenLogprobs& t : more) entries.add(t.id, &t);
              for (const TokenLogprobs& t : stop) entries.add(t.id, &t);
              return entries.take();
            };
            auto echo_chunk = [&]() {  // under mu; the prompt's entries are complete once tokens come
              echoed = true;
              json lp = nullptr;
              if (logprobs >= 0) {
                entries.add_prompt(job->prompts[p], g->prompt_logprobs());
                lp = entries.take();
              }
              return chunk(c, job->prompt_texts[p], nullptr, std::move(lp));
            };
            // With tool_choice "auto": content goes out until a call may begin; from there the text
            // is held, and at the end goes out as the calls (one delta each, whole) or, where it
            // holds none, as content.
            std::optional<ToolCallStream> held;
            size_t fed = 0;  // the bytes handed to `held`
            if (tool_use.parse) held.emplace(*auto_tools_);
            {
              std::lock_guard<std::mutex> lock(mu);
              if (failed || !alive) return;
              if (chat && !chunk(c, json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr)) return;
            }
            const Outcome o = follow_generation(
                g, tok_, stops, end_ids_,
                [&](const std::string& delta, size_t covered) {
                  std::lock_guard<std::mutex> lock(mu);
                  if (failed || !alive) return false;
                  if (!echoed && !echo_chunk()) return false;
                  if (held) {
                    // A token's entries go out with its text: with some of it held, with a later chunk.
                    const std::string out = held->add(delta);
                    fed += delta.size();
                    if (out.empty()) return true;
                    return chunk(c, json{{"content", out}}, nullptr, held->released() == fed ? lp_upto(covered, {}) : json(nullptr));
                  }
                  return chunk(c, chat ? json{{"content", delta}} : json(delta), nullptr, lp_upto(covered, {}));
                },
                // The socket is watched as a whole answer's is: a stream that writes nothing for a
                // while (text held back by a stop string's prefix, end-of-text tokens under
                // ignore_eos) ran to max_tokens in its slot after its client left, a write being
                // the only way it noticed.
                true, [fd = job->fd] { return fd >= 0 && peer_closed(fd); }, job->min_tokens, job->keep_stop,
                /*cover=*/logprobs >= 0);
            std::lock_guard<std::mutex> lock(mu);
            if (o.client_gone) {  // as a failed write: every choice ends, the request is a 499
              alive = false;
              for (const auto& h : gens) h->cancel(Finish::kCancelled);
              return;
            }
            if (failed || !alive) return;
            if (o.finish == Finish::kStop || o.finish == Finish::kLength) {
              if (!echoed && !echo_chunk()) return;
              bool called = false;
              if (held) {
                // The whole answer read as a whole answer is: the content streamed so far is the
                // beginning of its content (hermes: the text before the first "<tool_call>").
                const ParsedToolCalls p = read_tool_calls(tool_use, *auto_tools_, o.text);
                const std::string content = p.calls.empty() ? o.text : p.content.value_or("");
                if (content.size() > held->released() &&
                    !chunk(c, json{{"content", content.substr(held->released())}}, nullptr, nullptr))
                  return;
                for (size_t k = 0; k < p.calls.size(); ++k)
                  if (!chunk(c, json{{"tool_calls", json::array({tool_call_json(p.calls[k], k)})}}, nullptr, nullptr)) return;
                called = !p.calls.empty();
              }
              chunk(c, chat ? json::object() : json(""), called && o.finish == Finish::kStop ? json("tool_calls") : finish_json(o.finish),
                    lp_upto(o.ids.size(), o.stop_logprobs));
              completion_tokens += o.completion_tokens;
            } else {
              fail(finish_error(o, options_.request_timeout_s));
            }
          };
          auto follow = [&](size_t c) {
            try {
              follow_one(c);
            } catch (const HttpError& e) {
              std::lock_guard<std::mutex> lock(mu);
              fail(e);
            } catch (const std::exception& e) {
              std::lock_guard<std::mutex> lock(mu);
              fail(internal_error(e));
            }
          };
          if (gens.size() == 1) {
            follow(0);
          } else {
            std::vector<std::future<void>> running;
            try {
              for (size_t c = 0; c < gens.size(); ++c) running.push_back(std::async(std::launch::async, follow, c));
            } catch (const std::exception& e) {  // no thread for one: the rest end too
              std::lock_guard<std::mutex> lock(mu);
              fail(internal_error(e));
            }
            for (auto& f : running) f.wait();  // every one joined before this returns (they use this frame)
          }
          std::lock_guard<std::mutex> lock(mu);
          if (alive && !failed && include_usage) {
            json ev = event(json::array());
            ev["usage"] = {{"prompt_tokens", prompt_tokens},
                           {"completion_tokens", completion_tokens},
                           {"total_tokens", prompt_tokens + completion_tokens}};
            write(ev);
          }
          if (alive) {
            const std::string done = "data: [DONE]\n\n";
            sink.write(done.data(), done.size());
          } else {
            status = 499;  // the client closed the connection (nginx's code)
          }
          sink.done();
          record(endpoint, status, std::chrono::duration<double>(Clock::now() - t0).count());
          return true;
        },
        [this, job, endpoint, t0](bool) {
          for (const auto& g : job->gens) g->cancel(Finish::kCancelled);  // ended ones are not touched
          // The headers could not be written (the client left first): the provider never ran.
          if (!job->provided) record(endpoint, 499, std::chrono::duration<double>(Clock::now() - t0).count());
          --in_flight_;
        });
  } catch (const HttpError& e) {
    send_error(res, e);
    record(endpoint, e.status, std::chrono::duration<double>(Clock::now() - t0).count());
    --in_flight_;
  } catch (const std::exception& e) {
    // Any other exception went to httplib's handler with in_flight_ still counting the request,
    // and shutdown() waited for it forever (a null stream_options.include_usage did it).
    send_error(res, internal_error(e));
    record(endpoint, 500, std::chrono::duration<double>(Clock::now() - t0).count());
    --in_flight_;
  }
}

}  // namespace mt::serve
