// meshtrain loadtest --url URL --clients 1,8 --duration S: a bounded HTTP load test of a running
// `meshtrain serve` (or any OpenAI-compatible completions server). For each client count, that
// many threads send completions back to back for the duration; it reports requests, errors,
// p50/p99 latency and the generated tokens per second (the "usage" counts), and the speed-up of
// each count over the first.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cli/commands.h"

namespace mt::cli {
namespace {

struct LoadArgs {
  std::string url = "http://127.0.0.1:8000";
  std::string clients = "1,8";
  double duration = 10.0;
  int max_tokens = 64;
  std::string prompt = "The meaning of life is";
  bool ignore_eos = true;
  bool json_out = false;
};

// --url split into the server (scheme://host[:port], what httplib::Client takes) and the paths: a
// URL with a path was handed whole to httplib::Client, which took it for no server at all.
struct Target {
  std::string server, completions = "/v1/completions", health = "/health";
};

Target parse_url(const std::string& url) {
  const size_t scheme = url.find("://");
  const std::string bad = "--url '" + url + "': give http://HOST[:PORT][/PATH] (PATH: a base, /v1, or /v1/completions)";
  MT_CHECK(scheme != std::string::npos && (url.compare(0, scheme, "http") == 0 || url.compare(0, scheme, "https") == 0),
           ErrorKind::kInvalidArgument, bad);
  const size_t slash = url.find('/', scheme + 3);
  Target t;
  t.server = url.substr(0, slash);
  MT_CHECK(t.server.size() > scheme + 3, ErrorKind::kInvalidArgument, bad);
  std::string path = slash == std::string::npos ? std::string() : url.substr(slash);
  while (!path.empty() && path.back() == '/') path.pop_back();
  auto ends_with = [&path](const std::string& tail) {
    return path.size() >= tail.size() && path.compare(path.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (ends_with("/v1/completions")) path.resize(path.size() - 15);
  else if (ends_with("/v1")) path.resize(path.size() - 3);
  t.completions = path + "/v1/completions";
  t.health = path + "/health";
  return t;
}

struct Phase {
  int clients = 0;
  int requests = 0, errors = 0;
  std::string first_error;  // what the first failed request got
  double seconds = 0, p50 = 0, p99 = 0;
  long long tokens = 0;
  double tokens_per_s() const { return seconds > 0 ? tokens / seconds : 0; }
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

Phase run_phase(const LoadArgs& a, const Target& target, int clients) {
  Phase ph;
  ph.clients = clients;
  std::mutex mu;
  std::vector<double> latencies;
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.duration));
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&, c] {
      httplib::Client cli(target.server);
      cli.set_read_timeout(600, 0);
      int k = 0;
      while (Clock::now() < end) {
        nlohmann::json body = {{"prompt", a.prompt}, {"max_tokens", a.max_tokens}, {"temperature", 1.0},
                               {"seed", c * 100003 + k++}, {"ignore_eos", a.ignore_eos}};
        const auto s = Clock::now();
        httplib::Result r = cli.Post(target.completions.c_str(), body.dump(), "application/json");
        const double lat = std::chrono::duration<double>(Clock::now() - s).count();
        long long tokens = 0;
        bool ok = r && r->status == 200;
        std::string why;
        if (ok) {
          try {
            tokens = nlohmann::json::parse(r->body)["usage"]["completion_tokens"].get<long long>();
          } catch (const std::exception&) {
            ok = false;
            why = "HTTP 200 without usage.completion_tokens: " + r->body.substr(0, 300);
          }
        } else {
          why = r ? "HTTP " + std::to_string(r->status) + " " + r->body.substr(0, 300) : "no answer (" + httplib::to_string(r.error()) + ")";
          std::replace(why.begin(), why.end(), '\n', ' ');
        }
        std::lock_guard<std::mutex> lock(mu);
        ++ph.requests;
        if (!ok) {
          if (ph.errors++ == 0) ph.first_error = why;
          continue;
        }
        ph.tokens += tokens;
        latencies.push_back(lat);
      }
    });
  for (std::thread& t : threads) t.join();
  ph.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  ph.p50 = percentile(latencies, 0.5);
  ph.p99 = percentile(latencies, 0.99);
  return ph;
}

void run_loadtest(const LoadArgs& a) {
  // (inf or 1e10 overflowed the deadline into the past: phases of 0 requests, exit 0.)
  MT_CHECK(a.duration > 0 && a.duration <= 1e6, ErrorKind::kInvalidArgument, "--duration must be positive and at most 1e6 seconds");
  MT_CHECK(a.max_tokens >= 1, ErrorKind::kInvalidArgument, "--max-tokens must be at least 1");
  MT_CHECK(!a.clients.empty(), ErrorKind::kInvalidArgument, "--clients: no count given (say 1,8)");
  std::vector<int> counts;
  std::stringstream ss(a.clients + ",");  // (a trailing comma is an empty, refused count)
  for (std::string item; std::getline(ss, item, ',');) {
    int n = 0;
    try {
      n = std::stoi(item);
    } catch (const std::exception&) {
      n = 0;
    }
    MT_CHECK(n >= 1 && n <= 1024, ErrorKind::kInvalidArgument, "--clients: '" + item + "' is not a count in [1, 1024]");
    counts.push_back(n);
  }
  MT_CHECK(!counts.empty(), ErrorKind::kInvalidArgument, "--clients: no count given (say 1,8)");
  const Target target = parse_url(a.url);
  {
    httplib::Client probe(target.server);
    MT_CHECK(probe.is_valid(), ErrorKind::kInvalidArgument, "--url '" + a.url + "': not a server this client can reach");
    httplib::Result h = probe.Get(target.health.c_str());
    MT_CHECK(static_cast<bool>(h), ErrorKind::kIOError,
             "loadtest: no server answers at " + target.server + " (" + httplib::to_string(h.error()) + ")");
  }
  std::vector<Phase> phases;
  nlohmann::json out = nlohmann::json::array();
  for (int n : counts) {
    phases.push_back(run_phase(a, target, n));
    const Phase& p = phases.back();
    const double speedup = phases.front().tokens_per_s() > 0 ? p.tokens_per_s() / phases.front().tokens_per_s() : 0;
    if (a.json_out) {
      out.push_back({{"clients", p.clients}, {"requests", p.requests}, {"errors", p.errors}, {"seconds", p.seconds},
                     {"p50_s", p.p50}, {"p99_s", p.p99}, {"tokens", p.tokens}, {"tokens_per_s", p.tokens_per_s()},
                     {"speedup", speedup}});
    } else {
      std::printf("clients %3d: %4d requests, %d errors, latency p50 %.3f s p99 %.3f s, %lld tokens in %.1f s = %.1f "
                  "tokens/s (%.2fx the first)\n",
                  p.clients, p.requests, p.errors, p.p50, p.p99, p.tokens, p.seconds, p.tokens_per_s(), speedup);
      std::fflush(stdout);
    }
  }
  if (a.json_out) std::printf("%s\n", out.dump(2).c_str());
  int errors = 0;
  std::string first;
  for (const Phase& p : phases) {
    errors += p.errors;
    if (first.empty()) first = p.first_error;
    MT_CHECK(p.requests > 0, ErrorKind::kIOError,
             "loadtest: the phase of " + std::to_string(p.clients) + " client(s) completed no request in " + std::to_string(a.duration) + " s");
  }
  MT_CHECK(errors == 0, ErrorKind::kIOError, "loadtest: " + std::to_string(errors) + " requests failed; the first got " + first);
}

}  // namespace

void register_loadtest(CLI::App& app) {
  auto a = std::make_shared<LoadArgs>();
  auto* cmd = app.add_subcommand("loadtest", "Load-test a completions server: latency and tokens/s per client count");
  cmd->add_option("--url", a->url, "server (default http://127.0.0.1:8000)");
  cmd->add_option("--clients", a->clients, "concurrent clients, one phase per comma-separated count (default 1,8)");
  cmd->add_option("--duration", a->duration, "seconds a phase sends requests (default 10)");
  cmd->add_option("--max-tokens", a->max_tokens, "max_tokens of each request (default 64)");
  cmd->add_option("--prompt", a->prompt, "the prompt of every request");
  cmd->add_flag("!--stop-at-eos", a->ignore_eos, "let a request end at <|endoftext|> (default: ignore_eos, every request generates max_tokens)");
  cmd->add_flag("--json", a->json_out, "one JSON list of the phases on stdout");
  cmd->callback([a] { run_loadtest(*a); });
}

}  // namespace mt::cli
