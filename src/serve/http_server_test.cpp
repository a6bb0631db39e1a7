// serve/http_server over loopback with a real HTTP client (cpp-httplib's): every endpoint and
// error, greedy answers equal to the generator's, streaming equal to the whole answer, stop
// strings, concurrent clients, a client that disconnects, and a graceful shutdown.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <memory>
#include <optional>
#include <regex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/file_io.h"
#include "data/chat.h"
#include "data/tokenizer.h"
#include "serve/generator.h"
#include "serve/http_server.h"
#include "serve/test_socket.h"
#include "serve/test_util.h"

namespace mt::serve {
namespace {

using json = nlohmann::json;
using testing::connect_loopback;

const char* kCorpus =
    "The cat sat on the mat. The dog sat on the log. A bird sang in the tree, and the cat watched it.\n"
    "你好，世界。今天天气很好。我们去公园散步吧。\n"
    "Once upon a time there was a model that answered questions over HTTP, one token at a time.\n";

using testing::Running;

class HttpServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tok_ = std::make_unique<data::Tokenizer>(data::Tokenizer::train(kCorpus, 300));
    models::ModelConfig c = testing::tiny_config("tiny-gpt2");
    c.vocab_size = 300;
    c.max_positions = 128;
    model_ = testing::make_model(c);
    ServerOptions so;
    so.model_name = "tiny";
    so.max_body_bytes = 64 << 10;
    server_ = std::make_unique<Running>(*model_, *tok_, GeneratorOptions{.slots = 4}, so);
    alone_ = std::make_unique<Generator>(*model_);
  }
  static void TearDownTestSuite() {
    server_.reset();
    alone_.reset();
    model_.reset();
    tok_.reset();
  }

  static httplib::Result post(const std::string& path, const std::string& body) {
    httplib::Client cli("127.0.0.1", server_->port);
    cli.set_read_timeout(60, 0);
    return cli.Post(path.c_str(), body, "application/json");
  }
  static json post_json(const std::string& path, const json& body, int want_status = 200) {
    httplib::Result r = post(path, body.dump());
    EXPECT_TRUE(r) << "no response";
    if (!r) return json();
    EXPECT_EQ(r->status, want_status) << r->body;
    return json::parse(r->body);
  }
  // What the generator alone answers, greedily, to prompt ids: text up to <|endoftext|>, with
  // bytes that are not UTF-8 replaced by U+FFFD as a JSON answer must (a random model's tokens
  // split characters).
  static std::string reference(const std::vector<int32_t>& prompt, int max_new) {
    std::vector<int32_t> ids = alone_->generate(prompt, max_new, {.temperature = 0.0f}, tok_->eot_id());
    if (!ids.empty() && ids.back() == tok_->eot_id()) ids.pop_back();
    return json::parse(json(tok_->decode(ids)).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
  }
  static std::vector<int32_t> encode_pieces(const std::vector<std::string>& pieces) {
    std::vector<int32_t> ids;
    for (const std::string& p : pieces) {
      std::vector<int32_t> part = tok_->encode(p);
      ids.insert(ids.end(), part.begin(), part.end());
    }
    return ids;
  }
  static std::vector<json> events(const std::string& body, bool* done) { return testing::sse_events(body, done); }

  static std::unique_ptr<data::Tokenizer> tok_;
  static std::unique_ptr<models::TransformerLM> model_;
  static std::unique_ptr<Running> server_;
  static std::unique_ptr<Generator> alone_;
};
std::unique_ptr<data::Tokenizer> HttpServerTest::tok_;
std::unique_ptr<models::TransformerLM> HttpServerTest::model_;
std::unique_ptr<Running> HttpServerTest::server_;
std::unique_ptr<Generator> HttpServerTest::alone_;

TEST_F(HttpServerTest, HealthModelsAndMetrics) {
  httplib::Client cli("127.0.0.1", server_->port);
  auto h = cli.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(json::parse(h->body)["status"], "ok");
  auto m = cli.Get("/v1/models");
  ASSERT_TRUE(m);
  json models = json::parse(m->body);
  EXPECT_EQ(models["object"], "list");
  ASSERT_EQ(models["data"].size(), 1u);
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  post_json("/v1/completions", {{"prompt", "The cat"}, {"max_tokens", 3}, {"temperature", 0}});
  auto metrics = cli.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  for (const char* name :
       {"meshtrain_requests_total{endpoint=\"/v1/completions\",status=\"200\"}", "meshtrain_request_duration_seconds_bucket{le=\"+Inf\"}",
        "meshtrain_generated_tokens_total", "meshtrain_prompt_tokens_total", "meshtrain_queue_depth 0",
        "meshtrain_active_sequences", "meshtrain_slots 4"})
    EXPECT_NE(metrics->body.find(name), std::string::npos) << name << "\n" << metrics->body;
}

TEST_F(HttpServerTest, GreedyCompletionEqualsTheGenerators) {
  for (const std::string prompt : {"The cat sat", "Once upon", "你好"}) {
    json r = post_json("/v1/completions", {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 20}, {"temperature", 0}});
    const std::vector<int32_t> ids = tok_->encode(prompt);
    const std::string want = reference(ids, 20);
    EXPECT_EQ(r["object"], "text_completion");
    EXPECT_EQ(r["model"], "tiny");
    EXPECT_EQ(r["choices"][0]["text"], want) << prompt;
    EXPECT_EQ(r["usage"]["prompt_tokens"], ids.size());
    EXPECT_EQ(r["usage"]["total_tokens"], r["usage"]["prompt_tokens"].get<int>() + r["usage"]["completion_tokens"].get<int>());
    const std::vector<int32_t> drawn = alone_->generate(ids, 20, {.temperature = 0.0f}, tok_->eot_id());
    const bool ended = !drawn.empty() && drawn.back() == tok_->eot_id();
    EXPECT_EQ(r["usage"]["completion_tokens"], drawn.size());  // an end of text that ended it counts (vLLM's)
    EXPECT_EQ(r["choices"][0]["finish_reason"], ended ? "stop" : "length");
  }
  // Seeded sampling is reproducible over HTTP.
  const json s = {{"prompt", "The"}, {"max_tokens", 12}, {"temperature", 1.0}, {"top_k", 40}, {"top_p", 0.9}, {"seed", 5}};
  EXPECT_EQ(post_json("/v1/completions", s)["choices"][0]["text"], post_json("/v1/completions", s)["choices"][0]["text"]);
  // vLLM's top_k -1 (every token) is 0's draw: it was refused.
  json every = s;
  every["top_k"] = -1;
  json none = s;
  none.erase("top_k");
  EXPECT_EQ(post_json("/v1/completions", every)["choices"][0]["text"], post_json("/v1/completions", none)["choices"][0]["text"]);
}

// A token's string in logprobs as OpenAI writes it: its bytes where they are UTF-8, else
// "bytes:\xNN..." (a byte-level BPE's piece of a character).
std::string token_string_of(const std::string& raw) {
  const std::string round = json::parse(json(raw).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
  if (round == raw) return raw;
  static const char* const kHex = "0123456789abcdef";
  std::string out = "bytes:";
  for (unsigned char c : raw) out += std::string("\\x") + kHex[c >> 4] + kHex[c & 15];
  return out;
}

// The log-softmax of the generator's own logits at a prompt's last position, in double.
std::vector<double> log_softmax_of(Generator& gen, const std::vector<int32_t>& prefix) {
  std::span<const float> z = gen.prefill(prefix);
  double m = -INFINITY, sum = 0.0;
  for (float x : z) m = std::max(m, static_cast<double>(x));
  for (float x : z) sum += std::exp(static_cast<double>(x) - m);
  std::vector<double> out;
  for (float x : z) out.push_back(static_cast<double>(x) - m - std::log(sum));
  return out;
}

// lm-evaluation-harness's loglikelihood request (local-completions: tokenized prompts in a batch,
// max_tokens 1, temperature 0, logprobs 1, echo): each prompt token's log-probability is the
// log-softmax at the position before it (the generator's logits for the prefix, a prefill of its
// own), the first null; the drawn token is the greedy one and its log-probability the largest of
// its top_logprobs (the harness's is_greedy); the text is the prompt's then the answer's, and the
// token strings joined are the text at their offsets.
TEST_F(HttpServerTest, EchoAndLogprobsAreWhatLoglikelihoodEvaluationReads) {
  // The third is past two of the head's 16-row blocks of prefill scoring.
  const std::vector<std::vector<int32_t>> prompts = {
      tok_->encode("The cat sat on the"), tok_->encode("Once upon a time there"),
      tok_->encode("The dog sat on the log. A bird sang in the tree, and the cat watched it. The cat sat on the mat, one "
                   "token at a time.")};
  ASSERT_GT(prompts[2].size(), 33u);
  const json r = post_json("/v1/completions", {{"prompt", prompts}, {"max_tokens", 1}, {"temperature", 0}, {"logprobs", 1},
                                               {"echo", true}, {"seed", 1234}});
  ASSERT_EQ(r["choices"].size(), 3u);
  int completion = 0;
  for (size_t c = 0; c < 3; ++c) {
    SCOPED_TRACE(c);
    const json& ch = r["choices"][c];
    EXPECT_EQ(ch["index"], c);
    const std::vector<int32_t>& p = prompts[c];
    const json& lp = ch["logprobs"];
    const std::vector<int32_t> greedy = alone_->generate(p, 1, {.temperature = 0.0f}, tok_->eot_id());
    completion += 1;  // the end of text, when drawn, counts too (vLLM's count: its token ids hold it)
    ASSERT_EQ(lp["tokens"].size(), p.size() + 1);  // the end of text, when drawn, is listed (no text)
    EXPECT_TRUE(lp["token_logprobs"][0].is_null());
    EXPECT_TRUE(lp["top_logprobs"][0].is_null());
    for (size_t i = 1; i < p.size(); ++i) {
      const std::vector<double> want = log_softmax_of(*alone_, std::vector<int32_t>(p.begin(), p.begin() + static_cast<ptrdiff_t>(i)));
      EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), want[static_cast<size_t>(p[i])], 1e-4) << i;
      const size_t best = static_cast<size_t>(std::max_element(want.begin(), want.end()) - want.begin());
      const json& top = lp["top_logprobs"][i];
      EXPECT_LE(top.size(), 2u);  // the most likely and the prompt's own
      // Keys are token strings as JSON writes them (a byte that is not UTF-8 on its own as U+FFFD).
      const std::string key = token_string_of(tok_->decode(std::vector<int32_t>{static_cast<int32_t>(best)}));
      ASSERT_TRUE(top.contains(key)) << top.dump();
      EXPECT_NEAR(top[key].get<double>(), want[best], 1e-4) << i;
      ASSERT_TRUE(top.contains(lp["tokens"][i].get<std::string>())) << top.dump();
      EXPECT_EQ(top[lp["tokens"][i].get<std::string>()], lp["token_logprobs"][i]);
    }
    // Each token's string, and its offset: the characters (UTF-8 lead bytes) of the tokens before.
    std::vector<int32_t> all = p;
    all.push_back(greedy[0]);
    size_t chars = 0;
    for (size_t i = 0; i < lp["tokens"].size(); ++i) {
      const std::string raw = tok_->decode(std::vector<int32_t>{all[i]});
      EXPECT_EQ(lp["tokens"][i], token_string_of(raw)) << i;
      EXPECT_EQ(lp["text_offset"][i], chars) << i;
      for (unsigned char c : raw) chars += (c & 0xC0) != 0x80;
    }
    EXPECT_EQ(ch["text"], tok_->decode(p) + reference(p, 1));
    {
      const json& top = lp["top_logprobs"].back();
      double most = -INFINITY;
      for (const auto& [k, v] : top.items()) most = std::max(most, v.get<double>());
      EXPECT_EQ(lp["token_logprobs"].back().get<double>(), most);
      const std::vector<double> last = log_softmax_of(*alone_, p);
      EXPECT_NEAR(most, *std::max_element(last.begin(), last.end()), 1e-4);
    }
  }
  EXPECT_EQ(r["usage"]["prompt_tokens"], prompts[0].size() + prompts[1].size() + prompts[2].size());
  EXPECT_EQ(r["usage"]["completion_tokens"], completion);
  // A draw that is a stop id (the model's eos: a server whose eos is this prompt's greedy token)
  // is listed last with its log-probability, outside the text: the harness's [ctxlen:-1] drops it
  // and not the prompt's last token (it dropped that before).
  {
    const std::vector<int32_t>& p = prompts[0];
    const int32_t next = alone_->generate(p, 1, {.temperature = 0.0f})[0];
    ServerOptions so;
    so.model_name = "tiny";
    so.eos_ids = {next};
    Running eos_server(*model_, *tok_, GeneratorOptions{.slots = 1}, so);
    httplib::Client cli("127.0.0.1", eos_server.port);
    const json body = {{"prompt", json::array({p})}, {"max_tokens", 1}, {"temperature", 0}, {"logprobs", 1}, {"echo", true}};
    httplib::Result res = cli.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    const json e = json::parse(res->body)["choices"][0];
    EXPECT_EQ(json::parse(res->body)["usage"]["completion_tokens"], 1);  // the stop id counts (it was 0)
    EXPECT_EQ(e["text"], tok_->decode(p));
    EXPECT_EQ(e["finish_reason"], "stop");
    ASSERT_EQ(e["logprobs"]["tokens"].size(), p.size() + 1);
    EXPECT_EQ(e["logprobs"]["token_logprobs"][p.size() - 1], r["choices"][0]["logprobs"]["token_logprobs"][p.size() - 1]);
    const std::vector<double> last = log_softmax_of(*alone_, p);
    EXPECT_NEAR(e["logprobs"]["token_logprobs"][p.size()].get<double>(), last[static_cast<size_t>(next)], 1e-4);
  }
  // max_tokens 0 with echo: the prompt alone, scored.
  const json z = post_json("/v1/completions", {{"prompt", "The cat sat"}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 0}});
  EXPECT_EQ(z["choices"][0]["text"], "The cat sat");
  EXPECT_EQ(z["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(z["choices"][0]["logprobs"]["tokens"].size(), tok_->encode("The cat sat").size());
  EXPECT_EQ(z["usage"]["completion_tokens"], 0);
}

// n choices of a prompt (and of each of a list of prompts, at index prompt · n + k): choice k is
// the sampler seeded seed + k, as the generator alone draws it; chat's logprobs list each answer
// token with its bytes and the top_logprobs most likely, the drawn one first when greedy.
TEST_F(HttpServerTest, NChoicesAndChatLogprobs) {
  const json r = post_json("/v1/completions", {{"prompt", json::array({"Once upon", "The dog"})}, {"max_tokens", 6},
                                               {"temperature", 1.0}, {"seed", 11}, {"n", 3}});
  ASSERT_EQ(r["choices"].size(), 6u);
  size_t drawn = 0;
  for (size_t c = 0; c < 6; ++c) {
    const std::vector<int32_t> p = tok_->encode(c < 3 ? "Once upon" : "The dog");
    std::vector<int32_t> ids = alone_->generate(p, 6, {.temperature = 1.0f, .seed = 11 + c % 3}, tok_->eot_id());
    drawn += ids.size();  // an end of text that ended a choice counts
    if (!ids.empty() && ids.back() == tok_->eot_id()) ids.pop_back();
    EXPECT_EQ(r["choices"][c]["index"], c);
    EXPECT_EQ(r["choices"][c]["text"],
              json::parse(json(tok_->decode(ids)).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>())
        << c;
  }
  EXPECT_EQ(r["usage"]["completion_tokens"], drawn);
  const json chat = post_json("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "The cat"}}}}, {"max_tokens", 5},
                                                       {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 3}});
  const json& content = chat["choices"][0]["logprobs"]["content"];
  const bool eot = chat["choices"][0]["finish_reason"] == "stop";  // listed last, no text
  ASSERT_EQ(content.size(), chat["usage"]["completion_tokens"].get<size_t>());  // the end of text listed and counted
  // A random model's tokens split characters: a token's string is "bytes:\xNN" where it is not
  // UTF-8 on its own (the bytes, joined, are the answer's).
  auto replaced = [](const std::string& raw) {
    return json::parse(json(raw).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
  };
  std::string joined;
  for (const json& e : content) {
    std::string bytes;
    for (const json& b : e["bytes"]) bytes.push_back(static_cast<char>(b.get<int>()));
    if (!eot || &e != &content.back()) joined += bytes;
    EXPECT_EQ(token_string_of(bytes), e["token"].get<std::string>());
    ASSERT_EQ(e["top_logprobs"].size(), 3u);
    EXPECT_EQ(e["top_logprobs"][0]["token"], e["token"]);  // greedy: the drawn token is the most likely
    EXPECT_EQ(e["top_logprobs"][0]["logprob"], e["logprob"]);
    EXPECT_GE(e["top_logprobs"][0]["logprob"].get<double>(), e["top_logprobs"][1]["logprob"].get<double>());
    EXPECT_GE(e["top_logprobs"][1]["logprob"].get<double>(), e["top_logprobs"][2]["logprob"].get<double>());
  }
  EXPECT_EQ(replaced(joined), chat["choices"][0]["message"]["content"]);
}

// OpenAI's penalties and logit_bias, vLLM's repetition_penalty, min_p, min_tokens and
// stop_token_ids reach the sampler: a greedy answer with them is what the generator alone gives
// with a Sampler of the same options (the sampler's own test checks its definitions).
TEST_F(HttpServerTest, PenaltiesBiasAndStopIdsShapeTheAnswer) {
  const std::vector<int32_t> p = tok_->encode("The cat sat on the");
  // `stop`: stop_token_ids, written as the answer's last token (vLLM's, for ids that are not special).
  auto greedy_with = [&](SamplingOptions o, int max_new, std::vector<int32_t> stop = {}, int min_tokens = 0) {
    o.temperature = 0.0f;
    Sampler s(o);
    s.set_prompt(p);
    const size_t written = stop.size();
    stop.push_back(tok_->eot_id());
    std::vector<int32_t> ids;
    std::span<const float> z = alone_->prefill(p);
    for (int i = 0; i < max_new; ++i) {
      const int32_t id = s.sample(z, static_cast<int>(ids.size()) < min_tokens ? std::span<const int32_t>(stop) : std::span<const int32_t>());
      const auto at = std::find(stop.begin(), stop.end(), id);
      if (at != stop.end()) {
        if (static_cast<size_t>(at - stop.begin()) < written) ids.push_back(id);
        break;
      }
      ids.push_back(id);
      z = alone_->decode(id);
    }
    return json::parse(json(tok_->decode(ids)).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
  };
  const json base = {{"prompt", "The cat sat on the"}, {"max_tokens", 8}, {"temperature", 0}};
  json with = base;
  with["frequency_penalty"] = 1.5;
  with["presence_penalty"] = 0.5;
  with["repetition_penalty"] = 1.3;
  const std::string penalised = greedy_with({.repetition_penalty = 1.3f, .frequency_penalty = 1.5f, .presence_penalty = 0.5f}, 8);
  EXPECT_NE(penalised, reference(p, 8));  // the penalties change this answer
  EXPECT_EQ(post_json("/v1/completions", with)["choices"][0]["text"], penalised);
  // logit_bias 100 on one id: every token of the answer is it.
  const int32_t cat = tok_->encode(" cat")[0];
  with = base;
  with["logit_bias"] = {{std::to_string(cat), 100}};
  EXPECT_EQ(post_json("/v1/completions", with)["choices"][0]["text"], greedy_with({.logit_bias = {{cat, 100.0f}}}, 8));
  // The greedy first token as a stop id ends the answer before it, counted (vLLM's count);
  // include_stop_str_in_output writes it, as the answer's last token (it is not a special token),
  // but not the end of text; min_tokens 2 bans it for two.
  const int32_t first = alone_->generate(p, 1, {.temperature = 0.0f})[0];
  ASSERT_NE(first, tok_->eot_id());
  with = base;
  with["stop_token_ids"] = {first};
  json r = post_json("/v1/completions", with);
  EXPECT_EQ(r["choices"][0]["text"], "");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["completion_tokens"], 1);
  with["include_stop_str_in_output"] = true;
  r = post_json("/v1/completions", with);
  EXPECT_EQ(r["choices"][0]["text"], greedy_with({}, 1));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["completion_tokens"], 1);
  with["ignore_eos"] = true;
  with["stop_token_ids"] = {tok_->eot_id()};
  with["logit_bias"] = {{std::to_string(tok_->eot_id()), 100}};
  r = post_json("/v1/completions", with);
  EXPECT_EQ(r["choices"][0]["text"], "");
  EXPECT_EQ(r["usage"]["completion_tokens"], 1);
  // Drawn as the last token max_tokens allows, a stop id still ends the answer "stop", outside the
  // text: vLLM's check_stop tests the end of text and the stop ids before the length (its early
  // v1 tested the length first).
  with = base;
  with["max_tokens"] = 1;
  with["stop_token_ids"] = {first};
  r = post_json("/v1/completions", with);
  EXPECT_EQ(r["choices"][0]["text"], "");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["completion_tokens"], 1);
  with = base;
  with["stop_token_ids"] = {first};
  with["min_tokens"] = 2;
  r = post_json("/v1/completions", with);
  EXPECT_GE(r["usage"]["completion_tokens"].get<int>(), 2);
  EXPECT_EQ(r["choices"][0]["text"], greedy_with({}, 8, {first}, 2));
  // min_tokens holds stop strings back too (vLLM's): a match counts once it ends past the text of
  // the first min_tokens tokens.
  {
    std::vector<int32_t> ids = alone_->generate(p, 8, {.temperature = 0.0f}, tok_->eot_id());
    if (!ids.empty() && ids.back() == tok_->eot_id()) ids.pop_back();
    ASSERT_GE(ids.size(), 6u);
    const std::string full = tok_->decode(ids), early = tok_->decode(std::vector<int32_t>(ids.begin(), ids.begin() + 5));
    const std::string stop = full.substr(0, 1);  // the answer's first character: a match at once without min_tokens
    size_t at = full.find(stop);
    while (at != std::string::npos && at + stop.size() <= early.size()) at = full.find(stop, at + 1);
    with = base;
    with["stop"] = stop;
    EXPECT_EQ(post_json("/v1/completions", with)["choices"][0]["text"], "");
    with["min_tokens"] = 5;
    EXPECT_EQ(post_json("/v1/completions", with)["choices"][0]["text"], full.substr(0, at == std::string::npos ? full.size() : at));
  }
  // typical_p reaches the sampler: a seeded answer is the generator's with a Sampler of it.
  {
    const json typ = {{"prompt", "The cat sat on the"}, {"max_tokens", 8}, {"temperature", 1.0}, {"seed", 3}, {"typical_p", 0.3}};
    Sampler s({.temperature = 1.0f, .seed = 3, .typical_p = 0.3f});
    std::vector<int32_t> ids;
    std::span<const float> z = alone_->prefill(p);
    for (int i = 0; i < 8; ++i) {
      const int32_t id = s.sample(z);
      if (id == tok_->eot_id()) break;
      ids.push_back(id);
      z = alone_->decode(id);
    }
    EXPECT_EQ(post_json("/v1/completions", typ)["choices"][0]["text"],
              json::parse(json(tok_->decode(ids)).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>());
  }
  // min_p at temperature 0 is greedy still.
  with = base;
  with["min_p"] = 0.5;
  EXPECT_EQ(post_json("/v1/completions", with)["choices"][0]["text"], reference(p, 8));
}

// Choices with stop strings each end at their own: the tokens generated are the answers' (and a
// few more while a cancellation reaches the engine), not n x max_tokens (followed in turn, the
// later ones decoded on while the first ran).
TEST_F(HttpServerTest, EachChoiceEndsAtItsOwnStopString) {
  const uint64_t before = server_->server.stats().generated_tokens;
  const json r = post_json("/v1/completions", {{"prompt", "The cat"}, {"max_tokens", 100}, {"temperature", 1.0}, {"n", 4},
                                               {"seed", 6}, {"stop", "e"}, {"ignore_eos", true}});
  int answered = 0;
  for (const json& c : r["choices"]) EXPECT_EQ(c["text"].get<std::string>().find('e'), std::string::npos);
  answered = r["usage"]["completion_tokens"].get<int>();
  const uint64_t made = server_->server.stats().generated_tokens - before;
  EXPECT_LE(made, static_cast<uint64_t>(answered) + 4 * 20) << answered << " answered";
}

TEST_F(HttpServerTest, StreamingConcatenatesToTheWholeAnswer) {
  for (bool chat : {false, true}) {
    SCOPED_TRACE(chat ? "chat" : "completions");
    const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
    json body = {{"max_tokens", 25}, {"temperature", 0}};
    if (chat) body["messages"] = json::array({{{"role", "user"}, {"content", "你好"}}});
    else body["prompt"] = "The dog";
    json whole = post_json(path, body);
    body["stream"] = true;
    httplib::Result r = post(path, body.dump());
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
    bool done = false;
    std::vector<json> evs = events(r->body, &done);
    EXPECT_TRUE(done) << "the stream does not end with data: [DONE]";
    ASSERT_GE(evs.size(), 2u);
    std::string text;
    for (size_t i = 0; i < evs.size(); ++i) {
      const json& c = evs[i]["choices"][0];
      EXPECT_EQ(evs[i]["object"], chat ? "chat.completion.chunk" : "text_completion");
      EXPECT_EQ(evs[i]["id"], evs[0]["id"]);
      if (i + 1 < evs.size()) {
        EXPECT_TRUE(c["finish_reason"].is_null());
      }
      text += chat ? c["delta"].value("content", "") : c["text"].get<std::string>();
    }
    if (chat) {
      EXPECT_EQ(evs[0]["choices"][0]["delta"]["role"], "assistant");
    }
    const json& whole_choice = whole["choices"][0];
    EXPECT_EQ(text, chat ? whole_choice["message"]["content"].get<std::string>() : whole_choice["text"].get<std::string>());
    EXPECT_EQ(evs.back()["choices"][0]["finish_reason"], whole_choice["finish_reason"]);
    // stream_options.include_usage (LangChain's and vLLM's benchmark clients send it): one more
    // chunk, no choices, the usage of the whole answer (it was ignored).
    body["stream_options"] = {{"include_usage", true}};
    r = post(path, body.dump());
    ASSERT_TRUE(r);
    evs = events(r->body, &done);
    EXPECT_TRUE(done);
    ASSERT_GE(evs.size(), 2u);
    EXPECT_TRUE(evs.back()["choices"].empty()) << evs.back();
    EXPECT_EQ(evs.back()["usage"], whole["usage"]);
    EXPECT_FALSE(evs[evs.size() - 2].contains("usage"));
  }
}

// Several choices (a list of prompts, n of each), logprobs and echo stream too (they were refused):
// each choice's chunks carry its index, and joined per index they are the whole answer's choice:
// its text (echo's prompt first), its finish reason, and its logprobs entry for entry (the tokens
// and their offsets exactly, the values within float rounding: the batch's rows may differ). A
// stop string that never matches makes the stream hold text back, so tokens' entries come with
// later chunks; the usage chunk counts every choice.
TEST_F(HttpServerTest, StreamedChoicesLogprobsAndEchoJoinToTheWholeAnswer) {
  auto near_values = [](const json& a, const json& b) {  // numbers within 1e-4, the rest equal
    if (a.is_number() && b.is_number()) return std::abs(a.get<double>() - b.get<double>()) <= 1e-4;
    if (a.type() != b.type() || a.size() != b.size()) return false;
    if (a.is_object()) {
      for (const auto& [k, v] : a.items())
        if (!b.contains(k) || !(std::abs(v.get<double>() - b[k].get<double>()) <= 1e-4)) return false;
      return true;
    }
    return a == b;
  };
  struct Case {
    std::string path;
    json body;
  };
  const std::vector<Case> cases = {
      {"/v1/completions",
       {{"prompt", json::array({"The cat", "你好"})}, {"n", 2}, {"max_tokens", 12}, {"temperature", 0.9}, {"seed", 3},
        {"logprobs", 2}, {"echo", true}, {"stop", "\x01never matches"}}},
      {"/v1/completions", {{"prompt", "The dog sat"}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 1}}},
      {"/v1/completions", {{"prompt", "Once upon"}, {"n", 3}, {"max_tokens", 10}, {"temperature", 0.9}, {"seed", 8}}},
      {"/v1/completions",
       {{"prompt", "The cat"}, {"max_tokens", 30}, {"temperature", 0.9}, {"seed", 4}, {"logprobs", 1}, {"ignore_eos", true},
        {"stop", "\x01never matches"}}},
      {"/v1/chat/completions",
       {{"messages", json::array({{{"role", "user"}, {"content", "你好"}}})}, {"n", 2}, {"max_tokens", 12},
        {"temperature", 0.9}, {"seed", 5}, {"logprobs", true}, {"top_logprobs", 2}, {"stop", "\x01never matches"}}},
  };
  int long_answers = 0;
  auto echo_case = [](const json& body) { return body.value("echo", false); };  // its first chunk is the prompt's
  for (const Case& tc : cases) {
    SCOPED_TRACE(tc.body.dump());
    const bool chat = tc.path == "/v1/chat/completions";
    const json whole = post_json(tc.path, tc.body);
    const size_t n = whole["choices"].size();
    ASSERT_GE(n, 1u);
    json body = tc.body;
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    httplib::Result r = post(tc.path, body.dump());
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    bool done = false;
    const std::vector<json> evs = events(r->body, &done);
    EXPECT_TRUE(done);
    ASSERT_GE(evs.size(), 2u);
    std::vector<std::string> text(n);
    std::vector<json> finish(n), lp(n), first(n);
    std::vector<size_t> listed_bytes(n, 0);  // chat: the entries' bytes so far
    std::vector<std::vector<size_t>> per_chunk(n);  // entries in each chunk before the finish
    for (size_t i = 0; i + 1 < evs.size(); ++i) {
      ASSERT_EQ(evs[i]["choices"].size(), 1u) << evs[i];
      const json& c = evs[i]["choices"][0];
      const size_t k = c["index"].get<size_t>();
      ASSERT_LT(k, n);
      EXPECT_TRUE(finish[k].is_null()) << "choice " << k << " streamed past its finish";
      if (first[k].is_null()) first[k] = c;
      text[k] += chat ? c["delta"].value("content", "") : c["text"].get<std::string>();
      if (!c["finish_reason"].is_null()) finish[k] = c["finish_reason"];
      if (c["logprobs"].is_null()) continue;
      if (chat) {  // an entry goes with its text, never ahead of it
        for (const json& e : c["logprobs"]["content"]) listed_bytes[k] += e["bytes"].size();
        if (c["finish_reason"].is_null()) {
          EXPECT_LE(listed_bytes[k], text[k].size()) << evs[i];
          per_chunk[k].push_back(c["logprobs"]["content"].size());
        }
      } else if (c["finish_reason"].is_null()) {
        per_chunk[k].push_back(c["logprobs"]["tokens"].size());
      }
      if (lp[k].is_null()) {
        lp[k] = c["logprobs"];
        continue;
      }
      for (const auto& [key, v] : c["logprobs"].items())
        for (const json& e : v) lp[k][key].push_back(e);
    }
    EXPECT_TRUE(evs.back()["choices"].empty());
    EXPECT_EQ(evs.back()["usage"], whole["usage"]);
    for (size_t k = 0; k < n; ++k) {
      SCOPED_TRACE("choice " + std::to_string(k));
      const json& w = whole["choices"][k];
      if (chat) {
        EXPECT_EQ(first[k]["delta"]["role"], "assistant");
      }
      EXPECT_EQ(text[k], chat ? w["message"]["content"].get<std::string>() : w["text"].get<std::string>());
      EXPECT_EQ(finish[k], w["finish_reason"]);
      ASSERT_EQ(lp[k].is_null(), w["logprobs"].is_null()) << lp[k];
      if (lp[k].is_null()) continue;
      // A long answer's entries come with its text, not all with its last piece (the held-back
      // text): the stop string holds back 13 bytes (15 allowed), so a piece before it covered a token.
      size_t longest = 0, early = 0;
      for (int32_t t = 0; t < tok_->vocab_size(); ++t) longest = std::max(longest, tok_->token_bytes(t).size());
      for (size_t i = 0; i + 1 < per_chunk[k].size(); ++i) early += per_chunk[k][i];
      if (!echo_case(tc.body) && text[k].size() > 15 + longest) {
        EXPECT_GT(early, 0u) << text[k];
        ++long_answers;
      }
      if (chat) {
        const json& got = lp[k]["content"];
        const json& want = w["logprobs"]["content"];
        ASSERT_EQ(got.size(), want.size());
        for (size_t t = 0; t < got.size(); ++t) {
          EXPECT_EQ(got[t]["token"], want[t]["token"]);
          EXPECT_EQ(got[t]["bytes"], want[t]["bytes"]);
          EXPECT_NEAR(got[t]["logprob"].get<double>(), want[t]["logprob"].get<double>(), 1e-4);
          ASSERT_EQ(got[t]["top_logprobs"].size(), want[t]["top_logprobs"].size());
          for (size_t j = 0; j < got[t]["top_logprobs"].size(); ++j)
            EXPECT_EQ(got[t]["top_logprobs"][j]["token"], want[t]["top_logprobs"][j]["token"]);
        }
      } else {
        const json& want = w["logprobs"];
        EXPECT_EQ(lp[k]["tokens"], want["tokens"]);
        EXPECT_EQ(lp[k]["text_offset"], want["text_offset"]);
        ASSERT_EQ(lp[k]["token_logprobs"].size(), want["token_logprobs"].size());
        for (size_t t = 0; t < want["token_logprobs"].size(); ++t) {
          EXPECT_TRUE(near_values(lp[k]["token_logprobs"][t], want["token_logprobs"][t])) << t;
          EXPECT_TRUE(near_values(lp[k]["top_logprobs"][t], want["top_logprobs"][t])) << t;
        }
      }
    }
  }
  EXPECT_GE(long_answers, 1) << "no answer long enough to see its entries come before the finish";
}

// With a stop string the stream holds back its length less one byte, and the piece it released
// ended there even inside a character: the client got U+FFFD for each half ("你好" streamed as
// "你\uFFFD", "\uFFFD\uFFFD..."). Sampled answers of the tiny model with a stop that never
// matches, streamed and whole, until several have characters of more than one byte.
TEST_F(HttpServerTest, StreamingWithAStopStringKeepsCharactersWhole) {
  auto multibyte = [](const std::string& s) {  // a whole character of 2+ bytes, not U+FFFD
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      if (c >= 0xC2 && c < 0xF5 && s.compare(i, 3, "\xEF\xBF\xBD") != 0) return true;
    }
    return false;
  };
  int with_multibyte = 0;
  for (int seed = 0; seed < 200 && with_multibyte < 5; ++seed) {
    json body = {{"messages", json::array({{{"role", "user"}, {"content", "你好"}}})}, {"max_tokens", 30},
                 {"temperature", 1.0}, {"seed", seed}, {"stop", json::array({"\x01never matches anything"})}};
    const std::string whole = post_json("/v1/chat/completions", body)["choices"][0]["message"]["content"];
    if (!multibyte(whole)) continue;
    ++with_multibyte;
    body["stream"] = true;
    httplib::Result r = post("/v1/chat/completions", body.dump());
    ASSERT_TRUE(r);
    bool done = false;
    std::string text;
    for (const json& e : events(r->body, &done)) text += e["choices"][0]["delta"].value("content", "");
    EXPECT_TRUE(done);
    EXPECT_EQ(text, whole) << "seed " << seed;
  }
  EXPECT_GE(with_multibyte, 5) << "too few answers with characters of more than one byte to test";
}

// With ignore_eos the answer goes on past <|endoftext|>, which was written into the text; it is
// left out, as OpenAI's API and vLLM (skip_special_tokens) answer. Sampled answers of the tiny model
// with an <|endoftext|> among their tokens, against the generator alone.
TEST_F(HttpServerTest, AnswersLeaveOutTheTokenizersAddedTokens) {
  const std::vector<int32_t> prompt = tok_->encode("The dog");
  int found = 0;
  for (int seed = 0; seed < 400 && found < 3; ++seed) {
    std::vector<int32_t> ids =
        alone_->generate(prompt, 30, {.temperature = 1.0f, .seed = static_cast<uint64_t>(seed)}, std::nullopt);
    if (std::find(ids.begin(), ids.end(), tok_->eot_id()) == ids.end()) continue;
    ++found;
    ids.erase(std::remove(ids.begin(), ids.end(), tok_->eot_id()), ids.end());
    const std::string want =
        json::parse(json(tok_->decode(ids)).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
    const json r = post_json("/v1/completions", {{"prompt", "The dog"}, {"max_tokens", 30}, {"temperature", 1.0},
                                                 {"seed", seed}, {"ignore_eos", true}});
    const std::string text = r["choices"][0]["text"];
    EXPECT_EQ(text.find("<|endoftext|>"), std::string::npos) << "seed " << seed << ": " << text;
    EXPECT_EQ(text, want) << "seed " << seed;
    EXPECT_EQ(r["usage"]["completion_tokens"], 30) << "seed " << seed;  // the token still counts
  }
  EXPECT_GE(found, 3) << "too few sampled answers with <|endoftext|> to test";
}

// A tokenizer.json whose template puts a token before the text (Llama-3.2's <|begin_of_text|>):
// a text prompt and a chat prompt begin with it, once, as Hugging Face's tokenizer(prompt) and
// vLLM's completions encode them; a prompt of ids is taken as it is. They began without it: a Llama
// model answered a prompt unlike every text it was trained on.
TEST_F(HttpServerTest, ATemplatesSpecialTokensBeginATextPromptOnce) {
  const std::string path = ::testing::TempDir() + "/mt_serve_tpl_" + std::to_string(::getpid()) + ".json";
  tok_->save_json(path);
  std::vector<char> raw = file_read_all(path);
  json j = json::parse(raw.begin(), raw.end());
  const int bos = tok_->eot_id();  // the template's token: an id the model has
  j["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [)" + std::to_string(bos) + "]}}}");
  std::ofstream(path) << j.dump();
  const data::Tokenizer tok = data::Tokenizer::load(path);
  std::remove(path.c_str());
  Running templated(*model_, tok, GeneratorOptions{.slots = 1}, ServerOptions{});
  auto prompt_tokens = [&](const char* endpoint, const json& body) {
    httplib::Client cli("127.0.0.1", templated.port);
    cli.set_read_timeout(60, 0);
    httplib::Result r = cli.Post(endpoint, body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    return r && r->status == 200 ? json::parse(r->body)["usage"]["prompt_tokens"].get<size_t>() : 0;
  };
  EXPECT_EQ(prompt_tokens("/v1/completions", {{"prompt", "The cat sat"}, {"max_tokens", 1}}),
            tok_->encode("The cat sat").size() + 1);
  EXPECT_EQ(prompt_tokens("/v1/completions", {{"prompt", ""}, {"max_tokens", 1}}), 1u);  // <s> alone
  EXPECT_EQ(prompt_tokens("/v1/completions", {{"prompt", {5, 6, 7}}, {"max_tokens", 1}}), 3u);
  EXPECT_EQ(prompt_tokens("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "The cat"}}}}, {"max_tokens", 1}}),
            encode_pieces(data::chat_prompt_pieces({}, "The cat")).size() + 1);
}

// An Instruct tokenizer's chat template (stop 76): a chat is the template's text with its
// generation prompt, encoded without the tokenizer's special tokens, as vLLM applies it; the
// template's own refusals are 400s with its message; ChatGLM's history goes through it too.
TEST_F(HttpServerTest, AChatTemplateLaysOutTheChat) {
  const std::string dir = ::testing::TempDir() + "/mt_serve_chat_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  tok_->save_json(dir + "/tokenizer.json");
  std::ofstream(dir + "/tokenizer_config.json") << json{
      {"eos_token", "<|endoftext|>"},
      {"chat_template",
       "{% for m in messages %}{% if m.role == 'system' and not loop.first %}{{ raise_exception('System only first') }}"
       "{% endif %}<{{ m.role }}> {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant> {% endif %}"}}.dump();
  const data::Tokenizer tok = data::Tokenizer::load(dir);
  ASSERT_NE(tok.chat_template(), nullptr);
  Running templated(*model_, tok, GeneratorOptions{.slots = 1}, ServerOptions{});
  auto call = [&](const char* endpoint, const json& body, int want) {
    httplib::Client cli("127.0.0.1", templated.port);
    cli.set_read_timeout(60, 0);
    httplib::Result r = cli.Post(endpoint, body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == want) << (r ? r->body : "no response");
    return r ? json::parse(r->body) : json();
  };
  const json messages = json::array({{{"role", "developer"}, {"content", "Be brief."}},
                                     {{"role", "user"}, {"content", "What sat on the mat?"}},
                                     {{"role", "assistant"}, {"content", "The cat."}},
                                     {{"role", "user"}, {"content", "And the dog?"}}});
  const std::string text = "<system> Be brief.\n<user> What sat on the mat?\n<assistant> The cat.\n<user> And the dog?\n<assistant> ";
  const std::vector<int32_t> ids = tok.encode(text);
  json chat = call("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 20}, {"temperature", 0}}, 200);
  EXPECT_EQ(chat["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(chat["choices"][0]["message"]["content"], reference(ids, 20));
  // The last turn need not be the user's, and the roles are the template's to judge.
  call("/v1/chat/completions", {{"messages", json::array({messages[1], messages[2]})}, {"max_tokens", 1}}, 200);
  // An assistant's turn of tool calls alone (content null) goes to the template as sent (it was a
  // 400 that tokenize and `tokenizer chat` do not give: a probe); the template prints None.
  json calls = call("/v1/chat/completions",
                    {{"messages", json::array({messages[1], {{"role", "assistant"}, {"content", nullptr},
                                                             {"tool_calls", json::array({{{"type", "function"}}})}}})},
                     {"max_tokens", 1}},
                    200);
  EXPECT_EQ(calls["usage"]["prompt_tokens"], tok.encode("<user> What sat on the mat?\n<assistant> None\n<assistant> ").size());
  json refused = call("/v1/chat/completions",
                      {{"messages", json::array({messages[1], {{"role", "system"}, {"content", "late"}}})}, {"max_tokens", 1}}, 400);
  EXPECT_NE(refused["error"]["message"].get<std::string>().find("System only first"), std::string::npos) << refused;
  EXPECT_EQ(refused["error"]["code"], "invalid_value");
  // ChatGLM's prompt and history, as messages.
  const std::vector<int32_t> glm_ids = tok.encode("<user> What sat on the mat?\n<assistant> The cat.\n<user> 你好\n<assistant> ");
  json glm = call("/", {{"prompt", "你好"}, {"history", json::array({{"What sat on the mat?", "The cat."}})}, {"max_length", 60},
                        {"temperature", 0}},
                  200);
  EXPECT_EQ(glm["response"], reference(glm_ids, 60 - static_cast<int>(glm_ids.size())));
  std::filesystem::remove_all(dir);
}

TEST_F(HttpServerTest, ChatAndChatGLMApplyTheTrainingLayout) {
  const data::ChatHistory history = {{"What sat on the mat?", "The cat."}};
  const std::string want = reference(encode_pieces(data::chat_prompt_pieces(history, "And the dog?")), 30);
  json chat = post_json("/v1/chat/completions",
                        {{"messages", json::array({{{"role", "user"}, {"content", "What sat on the mat?"}},
                                                   {{"role", "assistant"}, {"content", "The cat."}},
                                                   {{"role", "user"}, {"content", "And the dog?"}}})},
                         {"max_tokens", 30},
                         {"temperature", 0}});
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(chat["choices"][0]["message"]["content"], want);
  // ChatGLM's api.py request and answer; max_length counts the prompt too.
  const std::vector<int32_t> glm_prompt = encode_pieces(data::chat_prompt_pieces(history, "你好"));
  json glm = post_json("/", {{"prompt", "你好"}, {"history", json::array({{"What sat on the mat?", "The cat."}})},
                             {"max_length", 60}, {"temperature", 0}});
  const std::string glm_want = reference(glm_prompt, 60 - static_cast<int>(glm_prompt.size()));
  EXPECT_EQ(glm["status"], 200);
  EXPECT_EQ(glm["response"], glm_want);
  ASSERT_EQ(glm["history"].size(), 2u);
  EXPECT_EQ(glm["history"][1][0], "你好");
  EXPECT_EQ(glm["history"][1][1], glm["response"]);
  EXPECT_TRUE(std::regex_match(glm["time"].get<std::string>(), std::regex(R"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")))
      << glm["time"];
}

TEST_F(HttpServerTest, StopStringsCutTheAnswer) {
  json body = {{"prompt", "Once upon a time"}, {"max_tokens", 40}, {"temperature", 0}};
  const std::string full = post_json("/v1/completions", body)["choices"][0]["text"];
  ASSERT_GE(full.size(), 8u) << full;
  size_t at = 3;  // two ASCII bytes past the start (a random model's text has U+FFFD in it)
  while (at + 1 < full.size() && (static_cast<unsigned char>(full[at]) >= 0x80 || static_cast<unsigned char>(full[at + 1]) >= 0x80))
    ++at;
  ASSERT_LT(at + 1, full.size()) << full;
  const std::string stop = full.substr(at, 2);
  const std::string want = full.substr(0, full.find(stop));
  body["stop"] = json::array({"\x01never", stop});
  json r = post_json("/v1/completions", body);
  EXPECT_EQ(r["choices"][0]["text"], want);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  {  // vLLM's include_stop_str_in_output keeps the stop string (it was ignored), streamed too
    json keep = body;
    keep["include_stop_str_in_output"] = true;
    EXPECT_EQ(post_json("/v1/completions", keep)["choices"][0]["text"], want + stop);
    keep["stream"] = true;
    httplib::Result st = post("/v1/completions", keep.dump());
    ASSERT_TRUE(st);
    bool done = false;
    std::string text;
    for (const json& e : events(st->body, &done)) text += e["choices"][0]["text"].get<std::string>();
    EXPECT_TRUE(done);
    EXPECT_EQ(text, want + stop);
  }
  // The tokens counted end at the one that completed the stop string, every time (they were as
  // many as the generator had made when the answer was read: 1 to 19 for one request).
  int need = 0;
  for (int k = 1; k <= 40; ++k) {
    json one = post_json("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", k}, {"temperature", 0}});
    if (one["choices"][0]["text"].get<std::string>().find(stop) != std::string::npos) {
      need = k;
      break;
    }
  }
  ASSERT_GT(need, 0);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(post_json("/v1/completions", body)["usage"]["completion_tokens"], need) << i;
  // Two stops, one beginning a byte before the other and ending after it: the answer must be the
  // same read a token at a time and in bursts (the cut moved with the burst).
  // A token boundary b inside ASCII text: stop A ends at b (completed by one token), stop B begins
  // a byte before A and ends a byte after b (completed by the next). A token at a time, A cuts;
  // a burst of both tokens let B, which begins earlier, cut instead.
  const std::vector<int32_t> gen_ids =
      alone_->generate(tok_->encode("Once upon a time"), 40, {.temperature = 0.0f}, tok_->eot_id());
  auto ascii = [&](size_t i) { return i < full.size() && static_cast<unsigned char>(full[i]) < 0x80; };
  std::string a_stop, b_stop;
  size_t b = 0;
  for (size_t k = 0; k + 1 < gen_ids.size() && b_stop.empty(); ++k) {
    b += tok_->decode(std::span<const int32_t>(&gen_ids[k], 1)).size();
    if (b < 3 || !(ascii(b - 3) && ascii(b - 2) && ascii(b - 1) && ascii(b))) continue;
    const std::string a = full.substr(b - 2, 2), bb = full.substr(b - 3, 4);
    if (full.find(a) == b - 2 && full.find(bb) == b - 3) a_stop = a, b_stop = bb;
  }
  ASSERT_FALSE(b_stop.empty()) << "no token boundary in ASCII text: " << full;
  json two = body;
  two["stop"] = json::array({a_stop, b_stop});
  const json one_at_a_time = post_json("/v1/completions", two);
  struct SlowReader {  // the answer read in bursts of tokens, as a busy server does; unset on any exit
    SlowReader() { setenv("MT_FAULT", "serve.slow_reader", 1); }
    ~SlowReader() { unsetenv("MT_FAULT"); }
  };
  {
    SlowReader slow;
    EXPECT_EQ(post_json("/v1/completions", body)["usage"]["completion_tokens"], need);
    EXPECT_EQ(post_json("/v1/completions", body)["choices"][0]["text"], want);
    const json burst = post_json("/v1/completions", two);
    EXPECT_EQ(burst["choices"][0]["text"], one_at_a_time["choices"][0]["text"]);
    EXPECT_EQ(burst["usage"]["completion_tokens"], one_at_a_time["usage"]["completion_tokens"]);
  }
  body["stream"] = true;
  bool done = false;
  httplib::Result s = post("/v1/completions", body.dump());
  ASSERT_TRUE(s);
  std::string text;
  for (const json& e : events(s->body, &done)) text += e["choices"][0]["text"].get<std::string>();
  EXPECT_TRUE(done);
  EXPECT_EQ(text, want);
}

TEST_F(HttpServerTest, BadRequestsAre4xxAndTheServerGoesOn) {
  struct Case {
    std::string path, body;
    int status;
    std::string code;
  };
  const std::string big(100 << 10, 'a');
  const std::string too_long = "{\"prompt\": \"" + std::string(2000, 'x') + " " + std::string(2000, 'y') + "\"}";
  // Nested past the bound (100,000 levels under "model", 200 KB, overflowed a worker's stack as its
  // 404 was written, and the server died; 30,000 fit the test's 64 KiB body limit).
  const std::string deep = "{\"prompt\": \"a\", \"model\": " + std::string(30000, '[') + std::string(30000, ']') + "}";
  json all_ids = json::array();
  for (int id = 0; id < 300; ++id) all_ids.push_back(id);
  const std::string every_id_stops = json{{"prompt", "a"}, {"min_tokens", 3}, {"stop_token_ids", all_ids}}.dump();
  const std::vector<Case> cases = {
      {"/v1/completions", "not json", 400, "invalid_json"},
      {"/v1/completions", "[1, 2]", 400, "invalid_json"},  // SERVE.md's code (stop 73)
      {"/v1/completions", R"({"prompt": 3})", 400, "invalid_type"},
      {"/v1/completions", R"({"max_tokens": 3})", 400, "missing_field"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": "3"})", 400, "invalid_type"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": 0})", 400, "invalid_value"},
      {"/v1/completions", R"({"prompt": "a", "temperature": -1})", 400, "invalid_value"},
      {"/v1/completions", R"({"prompt": "a", "top_p": 1.5})", 400, "invalid_value"},
      {"/v1/completions", R"({"prompt": "a", "stream": "yes"})", 400, "invalid_type"},
      {"/v1/completions", R"({"prompt": "a", "stop": [1]})", 400, "invalid_type"},
      {"/v1/completions", R"({"prompt": "a", "logprobs": 21})", 400, "invalid_value"},
      {"/v1/completions", R"({"prompt": "a", "n": 0})", 400, "invalid_value"},
      {"/v1/completions", R"({"prompt": [[]]})", 400, "invalid_value"},
      {"/v1/completions", R"({"prompt": [1, 300]})", 400, "invalid_value"},
      {"/v1/completions", R"({"prompt": [1, "a"]})", 400, "invalid_type"},
      {"/v1/completions", R"({"prompt": "a", "n": 65})", 400, "invalid_value"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2})", 400, "invalid_value"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "a"}], "logprobs": 1})", 400, "invalid_type"},
      {"/v1/completions", R"({"prompt": "a", "presence_penalty": 2.5})", 400, "invalid_value"},
      {"/v1/completions", R"({"prompt": "a", "repetition_penalty": 0})", 400, "invalid_value"},
      {"/v1/completions", R"({"prompt": "a", "min_p": 1.5})", 400, "invalid_value"},
      {"/v1/completions", R"({"prompt": "a", "logit_bias": {"x": 1}})", 400, "invalid_value"},
      {"/v1/completions", R"({"prompt": "a", "logit_bias": {"5": 200}})", 400, "invalid_value"},
      {"/v1/completions", R"({"prompt": "a", "stop_token_ids": [300]})", 400, "invalid_value"},
      {"/v1/completions", R"({"prompt": "a", "min_tokens": -1})", 400, "invalid_value"},
      {"/v1/completions", R"({"prompt": "a", "min_tokens": 5, "max_tokens": 4})", 400, "invalid_value"},
      {"/v1/completions", R"({"prompt": "a", "logit_bias": {"-0": 1}})", 400, "invalid_value"},
      // Fields that change the output and were answered 200 and ignored (vLLM's and TGI's, and the
      // OpenAI ones on the ChatGLM endpoint).
      {"/v1/completions", R"({"prompt": "a", "typical_p": 0})", 400, "invalid_value"},
      {"/", R"({"prompt": "a", "typical_p": 0.5})", 400, "unsupported_parameter"},
      {"/", R"({"prompt": "a", "repetition_penalty": 1.3})", 400, "unsupported_parameter"},
      {"/", R"({"prompt": "a", "min_p": 0.1})", 400, "unsupported_parameter"},
      {"/", R"({"prompt": "a", "stop_token_ids": [5]})", 400, "unsupported_parameter"},
      {"/", R"({"prompt": "a", "include_stop_str_in_output": true})", 400, "unsupported_parameter"},
      {"/v1/completions", R"({"prompt": "a", "include_stop_str_in_output": 1})", 400, "invalid_type"},
      {"/v1/completions", R"({"prompt": "a", "stream": true, "stream_options": {"include_usage": 1}})", 400,
       "invalid_type"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "a"}], "response_format": {"type": "json_object"}})",
       400, "unsupported_parameter"},
      {"/", R"({"prompt": "a", "logit_bias": {"44": -100}})", 400, "unsupported_parameter"},
      {"/", R"({"prompt": "a", "frequency_penalty": 1})", 400, "unsupported_parameter"},
      {"/", R"({"prompt": "a", "stop": "x"})", 400, "unsupported_parameter"},
      // Answered 200 and ignored before (a review, stop 57): the ChatGLM endpoint's length is
      // max_length; best_of/echo/suffix on chat; two lengths that differ.
      {"/", R"({"prompt": "a", "max_tokens": 1})", 400, "unsupported_parameter"},
      {"/", R"({"prompt": "a", "max_new_tokens": 1})", 400, "unsupported_parameter"},
      {"/", R"({"prompt": "a", "stream": true})", 400, "unsupported_parameter"},
      {"/", R"({"prompt": "a", "best_of": 4})", 400, "unsupported_parameter"},
      {"/", R"({"prompt": "a", "echo": true})", 400, "unsupported_parameter"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "a"}], "best_of": 5})", 400, "unsupported_parameter"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "a"}], "echo": true})", 400, "unsupported_parameter"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "a"}], "suffix": "z"})", 400, "unsupported_parameter"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": 2, "max_completion_tokens": 3})", 400, "invalid_value"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})",
       400, "invalid_value"},
      {"/v1/completions", R"({"prompt": "a", "model": "gpt-4"})", 404, "model_not_found"},
      {"/v1/completions", R"({"prompt": "a", "model": [1]})", 404, "model_not_found"},
      {"/v1/completions", deep, 400, "invalid_json"},
      {"/v1/completions", R"({"prompt": "a", "stream": true, "stream_options": "yes"})", 400, "invalid_type"},
      {"/v1/completions", too_long, 400, "context_length_exceeded"},
      // A max_tokens the context cannot hold besides the prompt (128 here): cut short at the full
      // context with finish_reason "length" before, where OpenAI and vLLM refuse it.
      {"/v1/completions", R"({"prompt": "a", "max_tokens": 128})", 400, "context_length_exceeded"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "a"}], "max_completion_tokens": 500})", 400,
       "context_length_exceeded"},
      {"/v1/completions", R"({"prompt": "a", "top_k": -2})", 400, "invalid_value"},
      {"/v1/completions", big, 413, "payload_too_large"},
      {"/v1/chat/completions", R"({"messages": []})", 400, "invalid_type"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user"}]})", 400, "invalid_type"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})",
       400, "invalid_value"},
      {"/v1/chat/completions", R"({"messages": [{"role": "robot", "content": "a"}]})", 400, "invalid_value"},
      {"/", R"({"history": []})", 400, "missing_field"},
      {"/", R"({"prompt": "a", "history": [["q"]]})", 400, "invalid_type"},
      {"/", R"({"prompt": "a", "max_length": 1})", 400, "context_length_exceeded"},
      {"/v1/nothing", "{}", 404, "not_found"},
      // A number past a double: nlohmann's out_of_range went to the exception handler (500).
      {"/v1/completions", R"({"prompt": "a", "temperature": 1e400})", 400, "invalid_json"},
      // Refused by the scheduler with a prompt that fits: named a context-length error before.
      {"/v1/completions", every_id_stops, 400, "invalid_value"},
  };
  for (const Case& c : cases) {
    httplib::Result r = post(c.path, c.body);
    ASSERT_TRUE(r) << c.path << " " << c.body.substr(0, 80);
    EXPECT_EQ(r->status, c.status) << c.path << " " << c.body.substr(0, 80) << " -> " << r->body;
    json e;
    ASSERT_NO_THROW(e = json::parse(r->body)) << r->body;
    EXPECT_EQ(e["error"]["code"], c.code) << c.body.substr(0, 80) << " -> " << r->body;
    EXPECT_FALSE(e["error"]["message"].get<std::string>().empty());
  }
  httplib::Client cli("127.0.0.1", server_->port);
  // A JSON body sent as form-urlencoded (curl -d's type) past cpp-httplib's own 8192-byte limit for
  // that type is read as the JSON it is (it was a 413; the server reads its bodies itself now).
  httplib::Result form = cli.Post("/v1/completions", "{\"prompt\": \"a\", \"max_tokens\": 1}" + std::string(9000, ' '),
                                  "application/x-www-form-urlencoded");
  ASSERT_TRUE(form);
  EXPECT_EQ(form->status, 200) << form->body;
  // A path is not a metrics label: one that closed the label and began a line forged a series, and
  // every unknown path added one for good. They count under "unmatched".
  for (const char* path : {"/a%22%7D%201%0Aevil_metric%7Bx%3D%22", "/x1", "/x2"}) {
    auto r = cli.Get(path);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404);
  }
  const std::string text = server_->server.metrics_text();
  EXPECT_EQ(text.find("\nevil_metric"), std::string::npos) << text;
  EXPECT_EQ(text.find("/x1"), std::string::npos) << text;
  EXPECT_NE(text.find("meshtrain_requests_total{endpoint=\"unmatched\",status=\"404\"}"), std::string::npos) << text;
  auto wrong_method = cli.Get("/v1/completions");
  ASSERT_TRUE(wrong_method);
  EXPECT_GE(wrong_method->status, 400);
  EXPECT_LT(wrong_method->status, 500);
  // Still serving.
  json ok = post_json("/v1/completions", {{"prompt", "The"}, {"max_tokens", 2}, {"temperature", 0}});
  EXPECT_EQ(ok["choices"].size(), 1u);
  // max_completion_tokens on completions (it was ignored: 16 tokens, the default), and OpenAI's chat
  // shapes: text content parts (joined by a newline, as vLLM) and the developer role (the system's).
  json mct = post_json("/v1/completions", {{"prompt", "The"}, {"max_completion_tokens", 2}, {"temperature", 0}, {"ignore_eos", true}});
  EXPECT_EQ(mct["usage"]["completion_tokens"], 2) << mct;
  const json plain = post_json("/v1/chat/completions", {{"messages", json::array({{{"role", "system"}, {"content", "Be brief."}},
                                                                                  {{"role", "user"}, {"content", "Hi\nthere"}}})},
                                                        {"max_tokens", 4}, {"temperature", 0}});
  const json parts = post_json(
      "/v1/chat/completions",
      {{"messages", json::array({{{"role", "developer"}, {"content", "Be brief."}},
                                 {{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "Hi"}}, {{"type", "text"}, {"text", "there"}}})}}})},
       {"max_tokens", 4}, {"temperature", 0}});
  EXPECT_EQ(parts["usage"], plain["usage"]) << parts;
  EXPECT_EQ(parts["choices"][0]["message"], plain["choices"][0]["message"]) << parts;
  // A null include_usage is absent, as every other null field: it threw nlohmann's type_error past
  // the handler (a 500), which left the request counted in flight, and shutdown waited forever.
  httplib::Result nul =
      post("/v1/completions", R"({"prompt": "a", "max_tokens": 2, "stream": true, "stream_options": {"include_usage": null}})");
  ASSERT_TRUE(nul);
  EXPECT_EQ(nul->status, 200) << nul->body;
}

// A request timeout past what the clock holds in nanoseconds (~9.2e9 s) put every deadline in the
// past: each request was answered 504 at once.
TEST(HttpServerOptions, ATimeoutPastTheClocksRangeIsRefused) {
  const data::Tokenizer tok = data::Tokenizer::train(kCorpus, 300);
  models::ModelConfig c = testing::tiny_config("tiny-gpt2");
  c.vocab_size = 300;
  std::unique_ptr<models::TransformerLM> model = testing::make_model(c);
  Generator gen(*model);
  for (double t : {1e10, std::numeric_limits<double>::infinity()}) {
    ServerOptions so;
    so.request_timeout_s = t;
    try {
      HttpServer s(gen, tok, so);
      ADD_FAILURE() << t << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--timeout must be positive and at most 1e9 seconds"), std::string::npos) << e.what();
    }
  }
}

// From a probe of the request fields (stop 73): vLLM's fields that change the answer were answered
// 200 and ignored; the context counted an explicit length, not the default one or min_tokens, and an
// answer without a length ran one token past the context; numbers past 2^63 were printed wrapped.
TEST_F(HttpServerTest, EveryLengthIsCountedAgainstTheContextAndUnreadFieldsAreRefused) {
  const json chat_msg = json::array({{{"role", "user"}, {"content", "a"}}});
  for (const std::string& path : {std::string("/v1/completions"), std::string("/v1/chat/completions"), std::string("/")}) {
    for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{
             {"guided_choice", json::array({"yes", "no"})}, {"guided_grammar", "root ::= \"a\""},
             {"structured_outputs", {{"choice", json::array({"a"})}}}, {"allowed_token_ids", json::array({5})},
             {"bad_words", json::array({"cat"})}, {"use_beam_search", true}, {"prompt_logprobs", 1},
             {"truncate_prompt_tokens", 5}, {"skip_special_tokens", false}}) {
      json body = path == "/v1/chat/completions" ? json{{"messages", chat_msg}} : json{{"prompt", "a"}};
      body[key] = value;
      httplib::Result r = post(path, body.dump());
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 400) << path << " " << key << " -> " << r->body;
      EXPECT_EQ(json::parse(r->body)["error"]["code"], "unsupported_parameter") << path << " " << key;
    }
  }
  // Their neutral values pass.
  EXPECT_EQ(post_json("/v1/completions", {{"prompt", "a"}, {"max_tokens", 1}, {"bad_words", json::array()},
                                          {"skip_special_tokens", true}, {"use_beam_search", false}})["choices"].size(),
            1u);
  EXPECT_EQ(post_json("/", {{"prompt", "a"}, {"max_length", 8}, {"stop", json::array()}})["status"], 200);
  auto refused = [&](const std::string& path, const json& body, const std::string& code, const std::string& says) {
    httplib::Result r = post(path, body.dump());
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << body.dump().substr(0, 100) << " -> " << r->body;
    const json e = json::parse(r->body);
    EXPECT_EQ(e["error"]["code"], code) << r->body;
    EXPECT_NE(e["error"]["message"].get<std::string>().find(says), std::string::npos) << r->body;
  };
  refused("/v1/completions", {{"prompt", "a"}, {"max_new_tokens", 1}}, "unsupported_parameter", "its length is \"max_tokens\"");
  refused("/v1/completions", {{"prompt", "a"}, {"top_logprobs", 2}}, "unsupported_parameter", "takes \"logprobs\": N");
  // completions' default of 16 past the context (it was cut to what fitted, "length", 200).
  const json long_prompt(std::vector<int32_t>(120, 5));
  refused("/v1/completions", {{"prompt", long_prompt}}, "context_length_exceeded",
          "the prompt is 120 tokens and \"max_tokens\" (the default) asks for 16 more; the context holds 128");
  refused("/v1/chat/completions", {{"messages", chat_msg}, {"min_tokens", 200}}, "context_length_exceeded",
          "\"min_tokens\" asks for 200 more; the context holds 128");
  refused("/v1/completions", {{"prompt", "a"}, {"min_tokens", 20}}, "invalid_value",
          "\"min_tokens\" (20) is more than \"max_tokens\" (the default) (16)");
  refused("/v1/completions", {{"prompt", json(std::vector<int32_t>(128, 5))}, {"max_tokens", 1}}, "context_length_exceeded",
          "the context holds 128");
  refused("/v1/chat/completions", {{"messages", chat_msg}, {"max_tokens", 18446744073709551615ull}}, "invalid_value",
          "got 18446744073709551615");
  refused("/v1/completions", {{"prompt", "a"}, {"top_k", 9223372036854775808ull}}, "invalid_value", "got 9223372036854775808");
  refused("/v1/completions", {{"prompt", "a"}, {"typical_p", 0}}, "invalid_value", "must be in (0, 1], got 0");
  refused("/v1/completions", {{"prompt", "a"}, {"temperature", 101}}, "invalid_value", "must be in [0, 100], got 101");
  // Without a length an answer ends where the context does: prompt and answer 128 (it was 129).
  const json full = post_json("/v1/completions", {{"prompt", json(std::vector<int32_t>(100, 5))}, {"max_tokens", 28},
                                                  {"temperature", 0}, {"ignore_eos", true}});
  EXPECT_EQ(full["usage"]["total_tokens"], 128) << full;
  const json chat = post_json("/v1/chat/completions", {{"messages", chat_msg}, {"temperature", 0}, {"ignore_eos", true}});
  EXPECT_EQ(chat["usage"]["total_tokens"], 128) << chat["usage"];
  EXPECT_EQ(chat["choices"][0]["finish_reason"], "length");
  // An empty prompt echoes the <|endoftext|> it starts with, as its ids given as a list do, so the
  // offsets index the text (its echo was "", and the offsets counted 13 characters).
  const json empty = post_json("/v1/completions", {{"prompt", ""}, {"max_tokens", 2}, {"echo", true}, {"logprobs", 0},
                                                   {"temperature", 0}, {"ignore_eos", true}});
  const json ids = post_json("/v1/completions", {{"prompt", json::array({tok_->eot_id()})}, {"max_tokens", 2}, {"echo", true},
                                                 {"logprobs", 0}, {"temperature", 0}, {"ignore_eos", true}});
  EXPECT_EQ(empty["choices"][0]["text"], ids["choices"][0]["text"]);
  EXPECT_EQ(empty["choices"][0]["text"].get<std::string>().rfind("<|endoftext|>", 0), 0u) << empty;
  EXPECT_EQ(empty["choices"][0]["logprobs"]["text_offset"], ids["choices"][0]["logprobs"]["text_offset"]);
}

TEST_F(HttpServerTest, ConcurrentClientsGetTheirOwnAnswers) {
  const std::vector<std::string> prompts = {"The cat", "The dog sat", "A bird", "Once", "你好", "Today the", "It was"};
  std::vector<std::string> got(prompts.size());
  const auto before = server_->server.stats();
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i)
    clients.emplace_back([&, i] {
      json r = post_json("/v1/completions", {{"prompt", prompts[i]}, {"max_tokens", 40}, {"temperature", 0}});
      got[i] = r["choices"][0]["text"];
    });
  for (std::thread& t : clients) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], reference(tok_->encode(prompts[i]), 40)) << prompts[i];
  const auto after = server_->server.stats();
  EXPECT_GT(after.decode_rows - before.decode_rows, after.decode_steps - before.decode_steps)
      << "no decode step ran more than one sequence";
}

// Connections that send nothing, or half a request line, each hold an HTTP worker until their wait
// times out (here 60 s, so that a slow machine cannot drop them first). With a fixed pool (73
// workers here) and httplib's backlog of 5, 240 of them queued /health behind them until the
// server had dropped the first; now every connection that finds no worker idle gets one, and
// /health is answered while all 240 are still open.
TEST_F(HttpServerTest, IdleAndHalfSentConnectionsDoNotQueueOtherRequests) {
  ServerOptions so;
  so.idle_timeout_s = 60;
  Running own(*model_, *tok_, GeneratorOptions{.slots = 1}, so);
  struct Sockets {
    std::vector<int> fds;
    ~Sockets() {
      for (int fd : fds) ::close(fd);
    }
  } idle;
  for (int i = 0; i < 240; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    idle.fds.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(own.port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << i;
    if (i % 6 == 0) {
      ASSERT_EQ(::send(fd, "GET /hea", 8, 0), 8);
    }
  }
  httplib::Client cli("127.0.0.1", own.port);
  cli.set_read_timeout(60, 0);
  auto h = cli.Get("/health");
  ASSERT_TRUE(h) << "no answer to /health within 60 s";
  EXPECT_EQ(h->status, 200);
  int dropped = 0;  // connections the server has closed: it timed them out before it answered
  for (int fd : idle.fds) {
    char c;
    if (::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) >= 0) ++dropped;
  }
  EXPECT_EQ(dropped, 0) << "of " << idle.fds.size() << " idle connections, before /health was answered";
}

// The body limit holds for the body as it arrives and as it inflates: cpp-httplib checks a
// Content-Length only, so a chunked body, or a small gzip one that inflated (48 KB to 50 MB), was
// read whole. A POST with neither length nor chunks has no body (it waited for the client to close,
// then got "HTTP 400" with no code), and a length that is not a number is said.
TEST_F(HttpServerTest, TheBodyLimitHoldsForChunkedAndCompressedBodies) {
  auto code_of = [](const std::string& body) {
    const json e = json::parse(body, nullptr, false);
    if (!e.is_object() || !e.contains("error") || !e["error"].is_object()) return std::string("(no error)");
    return e["error"].value("code", json()).is_string() ? e["error"]["code"].get<std::string>() : std::string("null");
  };
  const std::string padded = "{\"prompt\": \"a\", \"max_tokens\": 1}" + std::string(200 << 10, ' ');  // over 64 KiB
  httplib::Client cli("127.0.0.1", server_->port);
  cli.set_read_timeout(60, 0);
  int sent = 0;
  auto chunked = cli.Post(
      "/v1/completions",
      [&](size_t, httplib::DataSink& sink) {
        if (sent < 20) {
          const std::string part = sent == 0 ? padded.substr(0, 16 << 10) : std::string(16 << 10, ' ');
          ++sent;
          return sink.write(part.data(), part.size());
        }
        sink.done();
        return true;
      },
      "application/json");
  ASSERT_TRUE(chunked);
  EXPECT_EQ(chunked->status, 413) << chunked->body;
  EXPECT_EQ(code_of(chunked->body), "payload_too_large") << chunked->body;
  httplib::Client gz("127.0.0.1", server_->port);
  gz.set_read_timeout(60, 0);
  gz.set_compress(true);  // Content-Encoding: gzip, about 200 bytes on the wire
  auto inflated = gz.Post("/v1/completions", padded, "application/json");
  ASSERT_TRUE(inflated);
  EXPECT_EQ(inflated->status, 413) << inflated->body;
  EXPECT_EQ(code_of(inflated->body), "payload_too_large");
  auto small = gz.Post("/v1/completions", R"({"prompt": "a", "max_tokens": 1})", "application/json");
  ASSERT_TRUE(small);
  EXPECT_EQ(small->status, 200) << small->body;
  auto multipart = cli.Post("/v1/completions", "--x\r\n\r\n{}\r\n--x--\r\n", "multipart/form-data; boundary=x");
  ASSERT_TRUE(multipart);
  EXPECT_EQ(multipart->status, 415);
  EXPECT_EQ(code_of(multipart->body), "unsupported_media_type");
  // Raw requests: no length and no chunks; a negative length.
  // What the server sends on a connection that carries `request` (no Connection: close), until it
  // closes it (read timeout 10 s: a connection left open fails the count below).
  auto raw_all = [this](const std::string& request) {
    const int fd = testing::connect_loopback(server_->port);
    EXPECT_GE(fd, 0);
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    size_t off = 0;
    while (off < request.size()) {
      const ssize_t n = ::send(fd, request.data() + off, request.size() - off, MSG_NOSIGNAL);
      if (n <= 0) break;  // (the server may shut the connection before all of it is sent)
      off += static_cast<size_t>(n);
    }
    std::string answer;
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) answer.append(buf, static_cast<size_t>(n));
    ::close(fd);
    return answer;
  };
  auto raw = [this](const std::string& request) {
    const int fd = testing::connect_loopback(server_->port);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
    std::string answer;
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) answer.append(buf, static_cast<size_t>(n));
    ::close(fd);
    const size_t body = answer.find("\r\n\r\n");
    return body == std::string::npos ? answer : answer.substr(body + 4);
  };
  EXPECT_EQ(code_of(raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")), "invalid_json");
  EXPECT_EQ(code_of(raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\nConnection: close\r\n\r\n")),
            "invalid_request");
  EXPECT_EQ(code_of(raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n")),
            "not_implemented");
  // Keep-alive: a refused body is not read as the next request (cpp-httplib keeps a connection by
  // the request's headers alone: a request hidden in the body was answered). The 413 comes, the body
  // is dropped whole, and the next request on the connection is answered, alone.
  {
    const int fd = testing::connect_loopback(server_->port);
    ASSERT_GE(fd, 0);
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    auto send_all = [fd](const std::string& text) {
      for (size_t off = 0; off < text.size();) {
        const ssize_t n = ::send(fd, text.data() + off, text.size() - off, MSG_NOSIGNAL);
        if (n <= 0) return false;
        off += static_cast<size_t>(n);
      }
      return true;
    };
    std::string got;
    auto read_answer = [&]() {  // one response: its head and Content-Length bytes
      char buf[4096];
      size_t head;
      while ((head = got.find("\r\n\r\n")) == std::string::npos) {
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) return std::string();
        got.append(buf, static_cast<size_t>(n));
      }
      const size_t at = got.find("Content-Length: ");
      const size_t length = at == std::string::npos ? 0 : std::stoul(got.substr(at + 16));
      while (got.size() < head + 4 + length) {
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        got.append(buf, static_cast<size_t>(n));
      }
      std::string one = got.substr(0, std::min(got.size(), head + 4 + length));
      got.erase(0, one.size());
      return one;
    };
    const std::string hidden = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    for (const char* framing : {"length", "chunked"}) {
      const std::string body = hidden + std::string((64 << 10) + 100, ' ');
      std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
      if (std::string(framing) == "length") {
        request += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
      } else {
        char size[32];
        std::snprintf(size, sizeof size, "%zx", body.size());
        request += "Transfer-Encoding: chunked\r\n\r\n" + std::string(size) + "\r\n" + body + "\r\n0\r\n\r\n";
      }
      ASSERT_TRUE(send_all(request)) << framing;
      const std::string refused = read_answer();
      EXPECT_EQ(refused.rfind("HTTP/1.1 413", 0), 0u) << framing << ": " << refused.substr(0, 300);
      ASSERT_TRUE(send_all("GET /health HTTP/1.1\r\nHost: x\r\n\r\n")) << framing;
      const std::string next = read_answer();
      EXPECT_EQ(next.rfind("HTTP/1.1 200", 0), 0u) << framing << ": " << next.substr(0, 300);
      EXPECT_NE(next.find("{\"status\":\"ok\"}"), std::string::npos) << framing << ": the hidden GET /metrics was answered: "
                                                                      << next.substr(0, 300);
    }
    ::close(fd);
  }
  // Expect: 100-continue with a length over the limit: 413 at once (100 Continue invited the body).
  const std::string asked = raw_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\nExpect: 100-continue\r\n\r\n");
  EXPECT_EQ(asked.rfind("HTTP/1.1 413", 0), 0u) << asked.substr(0, 300);
  EXPECT_EQ(asked.find("100 Continue"), std::string::npos) << asked.substr(0, 300);
}

// A second server on a port in use is refused with its line: with cpp-httplib's default
// SO_REUSEPORT it bound too, and the kernel shared the first one's connections with it.
TEST_F(HttpServerTest, ASecondServerOnAPortInUseIsRefused) {
  Generator gen(*model_, GeneratorOptions{.slots = 1});
  ServerOptions so;
  so.port = server_->port;
  HttpServer second(gen, *tok_, so);
  try {
    second.bind();
    ADD_FAILURE() << "a second server bound port " << so.port;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot bind 127.0.0.1:" + std::to_string(so.port) + " (in use"), std::string::npos)
        << e.what();
  }
}

// A shutdown before serve() has started listening: cpp-httplib's stop() does nothing until its
// listening loop runs, and a loop started after it accepted forever (a suite's teardown hung 20
// minutes under a loaded CI). serve() now returns at once, and a shutdown racing a serve() under
// way waits for the loop it stops.
TEST_F(HttpServerTest, AShutdownBeforeServeListensEndsIt) {
  for (int round = 0; round < 2; ++round) {
    Generator gen(*model_, GeneratorOptions{.slots = 1});
    ServerOptions so;
    so.port = 0;
    auto server = std::make_shared<HttpServer>(gen, *tok_, so);
    server->bind();
    auto done = std::make_shared<std::promise<void>>();
    std::future<void> served = done->get_future();
    if (round == 0) server->shutdown();  // before serve() is called at all
    std::thread t([server, done] {
      server->serve();
      done->set_value();
    });
    if (round == 1) server->shutdown();  // while serve() may be starting
    const bool ended = served.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
    EXPECT_TRUE(ended) << "round " << round;
    if (ended) {
      t.join();
    } else {
      t.detach();  // stuck in accept: leave it (the process ends with the test binary)
      std::_Exit(1);
    }
  }
}

TEST(Utf8, CompletePrefixHoldsBackASplitCharacter) {
  const std::string ni = "\xE4\xBD\xA0";  // 你
  EXPECT_EQ(utf8_complete_prefix(""), 0u);
  EXPECT_EQ(utf8_complete_prefix("ab"), 2u);
  EXPECT_EQ(utf8_complete_prefix("a" + ni), 4u);
  EXPECT_EQ(utf8_complete_prefix("a" + ni.substr(0, 2)), 1u);
  EXPECT_EQ(utf8_complete_prefix("a" + ni.substr(0, 1)), 1u);
  EXPECT_EQ(utf8_complete_prefix("a\xF0\x9F\x98"), 1u);       // 3 of an emoji's 4 bytes
  EXPECT_EQ(utf8_complete_prefix("a\xF0\x9F\x98\x80"), 5u);  // all 4
  EXPECT_EQ(utf8_complete_prefix("a\xC3"), 1u);
  EXPECT_EQ(utf8_complete_prefix("a\xC3\xA9"), 3u);
}

// A raw client: sends one request, reads until `until` appears in the response, then closes.
std::string request_then_close(int port, const std::string& path, const std::string& body, const std::string& until) {
  const int fd = connect_loopback(port);
  EXPECT_GE(fd, 0) << "connect to port " << port;
  const std::string req = "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
  EXPECT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  std::string got;
  char buf[4096];
  while (got.find(until) == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return got;
}

// A slower model (LLaMA-shaped, untied head whose <|endoftext|> row is zero, so greedy decoding
// never ends by itself) for what needs a generation still running.
class SlowServerTest : public HttpServerTest {
 protected:
  static std::unique_ptr<models::TransformerLM> slow_model() {
    models::ModelConfig c = testing::tiny_config("tiny-llama");
    c.vocab_size = 300; c.hidden = 256; c.n_head = 4; c.n_kv_head = 4;
    c.intermediate = 688; c.n_layer = 4; c.max_positions = 2048;
    auto m = testing::make_model(c);
    nn::Parameter* head = m->store().find("lm_head.weight");
    std::fill(head->master + static_cast<size_t>(tok_->eot_id()) * c.hidden,
              head->master + static_cast<size_t>(tok_->eot_id() + 1) * c.hidden, 0.0f);
    return m;
  }
};

// The scheduler's active count once it has settled: a cancelled request's 499 is recorded when its
// generation ends, a moment before the scheduler lowers the count.
auto active_once_settled(HttpServer& server) {
  for (int i = 0; i < 200 && server.stats().active != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return server.stats().active;
}

// With two choices streaming (n 2), the failed write ends both.
TEST_F(SlowServerTest, AClientThatDisconnectsCancelsItsGeneration) {
  auto model = slow_model();
  Running srv(*model, *tok_, {.slots = 2}, {});
  int closed = 0;
  for (const auto& [body, choices] :
       {std::pair{R"({"prompt": "The cat", "max_tokens": 2000, "temperature": 0, "stream": true})", 1u},
        std::pair{R"({"prompt": "The cat", "max_tokens": 2000, "temperature": 0, "stream": true, "n": 2})", 2u}}) {
    SCOPED_TRACE(body);
    const uint64_t before = srv.server.stats().generated_tokens;
    const std::string got = request_then_close(srv.port, "/v1/completions", body, "\"finish_reason\":null");
    ASSERT_NE(got.find("200 OK"), std::string::npos) << got;
    // The server notices at a following write and ends the generation long before 2000 tokens.
    const std::string want =
        "meshtrain_requests_total{endpoint=\"/v1/completions\",status=\"499\"} " + std::to_string(++closed);
    for (int i = 0; i < 200 && srv.server.metrics_text().find(want) == std::string::npos; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_NE(srv.server.metrics_text().find(want), std::string::npos) << srv.server.metrics_text();
    EXPECT_EQ(active_once_settled(srv.server), 0);
    // Counted over all choices: each stops short of its 2000 (two choices' 1500 tokens were 750
    // steps, under a second on a loaded machine).
    EXPECT_LT(srv.server.stats().generated_tokens - before, 1500u * choices);
  }
}

// A stream that writes nothing while its client leaves (its text held back as a possible start of a
// stop string 20,000 characters long): the socket is watched, and the generation ends long before
// its 2000 tokens. It ran on in its slot to max_tokens, a write being the only way it noticed.
TEST_F(SlowServerTest, AStreamHoldingItsTextBackIsCancelledWhenItsClientLeaves) {
  auto model = slow_model();
  Running srv(*model, *tok_, {.slots = 2}, {});
  const json body = {{"prompt", "The cat"}, {"max_tokens", 2000}, {"temperature", 0}, {"stream", true},
                     {"stop", json::array({std::string(20000, 'z')})}};
  const uint64_t before = srv.server.stats().generated_tokens;
  const std::string got = request_then_close(srv.port, "/v1/completions", body.dump(), "200 OK");
  ASSERT_NE(got.find("200 OK"), std::string::npos) << got;
  const std::string want = "meshtrain_requests_total{endpoint=\"/v1/completions\",status=\"499\"} 1";
  for (int i = 0; i < 200 && srv.server.metrics_text().find(want) == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_NE(srv.server.metrics_text().find(want), std::string::npos) << srv.server.metrics_text();
  EXPECT_EQ(active_once_settled(srv.server), 0);
  EXPECT_LT(srv.server.stats().generated_tokens - before, 1500u);
}

// The same for a whole (non-streaming) answer: the server finds the request's socket and sees it
// closed while it waits for the end.
TEST_F(SlowServerTest, AClientThatDisconnectsBeforeAWholeAnswerCancelsIt) {
  auto model = slow_model();
  Running srv(*model, *tok_, {.slots = 2}, {});
  for (const char* path : {"/v1/completions", "/"}) {
    SCOPED_TRACE(path);
    const std::string body = std::string(path) == "/" ? R"({"prompt": "The cat", "max_length": 2000, "temperature": 0})"
                                                       : R"({"prompt": "The cat", "max_tokens": 2000, "temperature": 0})";
    const uint64_t before = srv.server.stats().generated_tokens;
    request_then_close(srv.port, path, body, "");  // sends, closes at once
    const std::string want = std::string("meshtrain_requests_total{endpoint=\"") + path + "\",status=\"499\"} 1";
    for (int i = 0; i < 200 && srv.server.metrics_text().find(want) == std::string::npos; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_NE(srv.server.metrics_text().find(want), std::string::npos) << srv.server.metrics_text();
    EXPECT_EQ(active_once_settled(srv.server), 0);
    EXPECT_LT(srv.server.stats().generated_tokens - before, 1500u);
  }
}

// A client that trickles its request's headers (a line every 100 ms, for up to 30 s) does not hold
// the shutdown: serve() returns while it is still sending. A read's timeout starts again with each
// byte, so its worker, the pool's shutdown and with it the exit waited for as long as it sent.
TEST_F(HttpServerTest, AClientTricklingItsHeadersDoesNotHoldTheShutdown) {
  Generator gen(*model_, {.slots = 1});
  ServerOptions so;
  so.port = 0;
  HttpServer server(gen, *tok_, so);
  const int port = server.bind();
  std::thread serving([&server] { server.serve(); });
  const int fd = connect_loopback(port);
  ASSERT_GE(fd, 0) << "connect to port " << port;
  std::atomic<bool> stop{false}, sent_all{false};
  std::thread trickle([&] {
    const std::string first = "POST /v1/completions HTTP/1.1\r\n", line = "X-Slow: a\r\n";
    ::send(fd, first.data(), first.size(), MSG_NOSIGNAL);
    for (int i = 0; i < 300 && !stop; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (::send(fd, line.data(), line.size(), MSG_NOSIGNAL) < 0) return;  // the server shut it
    }
    sent_all = !stop;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // its worker is reading the headers
  server.shutdown();
  serving.join();
  EXPECT_FALSE(sent_all) << "serve() returned only once the client had sent for 30 s";
  stop = true;
  trickle.join();
  ::close(fd);
}

TEST_F(SlowServerTest, ShutdownFinishesInFlightRequestsAndRefusesNewOnes) {
  auto model = slow_model();
  // The refusals below must come while the stream still runs: an attempt whose stream had ended
  // first (its 1500 tokens are about 1.5 s, and the threads between start, stop and refusals can
  // wait that long on a loaded machine) proves nothing and is made again with a new server.
  std::unique_ptr<Running> srv;
  std::string streamed;
  httplib::Result h{nullptr, httplib::Error::Unknown}, refused{nullptr, httplib::Error::Unknown},
      refused_stream{nullptr, httplib::Error::Unknown};
  bool during = false;
  for (int attempt = 0; attempt < 3 && !during; ++attempt) {
    srv = std::make_unique<Running>(*model, *tok_, GeneratorOptions{.slots = 2}, ServerOptions{});
    const int port = srv->port;
    streamed.clear();
    std::thread client([&] {
      httplib::Client cli("127.0.0.1", port);
      cli.set_read_timeout(120, 0);
      auto r = cli.Post("/v1/completions", R"({"prompt": "The", "max_tokens": 1500, "temperature": 0, "stream": true})",
                        "application/json");
      if (r) streamed = r->body;
    });
    // (Bounded: a stream that never started failed the test after ctest's timeout, not at once.)
    for (int i = 0; i < 6000 && srv->server.stats().generated_tokens < 5; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_GE(srv->server.stats().generated_tokens, 5u);
    std::thread stopper([&] { srv->server.shutdown(); });
    for (int i = 0; i < 6000 && (!srv->server.stats().active || srv->server.metrics_text().empty()); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    // While the stream runs, the server answers and refuses new work (once the stopper has begun).
    httplib::Client cli("127.0.0.1", port);
    h = cli.Get("/health");
    for (int i = 0; i < 200 && h && h->status != 503; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      h = cli.Get("/health");
    }
    refused = cli.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 2})", "application/json");
    // A stream is refused before its headers, with the same status (it was a 200 and an error event).
    refused_stream = cli.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 2, "stream": true})", "application/json");
    during = srv->server.stats().generated_tokens < 1500;
    client.join();
    stopper.join();
  }
  EXPECT_TRUE(during) << "each attempt's stream ended before its refusals";
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503);
  EXPECT_EQ(json::parse(refused->body)["error"]["code"], "shutting_down");
  ASSERT_TRUE(refused_stream);
  EXPECT_EQ(refused_stream->status, 503) << refused_stream->body;
  EXPECT_EQ(json::parse(refused_stream->body)["error"]["code"], "shutting_down");
  bool done = false;
  std::vector<json> evs = events(streamed, &done);
  EXPECT_TRUE(done);
  ASSERT_FALSE(evs.empty());
  EXPECT_EQ(evs.back()["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(srv->server.stats().generated_tokens, 1500u);
  srv.reset();  // serve() has returned: the destructor joins at once
}

}  // namespace
}  // namespace mt::serve
