// Tool calling over HTTP (stop 77), as vLLM serves it: a request's tools written into the prompt by
// the chat template, the refusals (no template, malformed tools, tool_choice "required" or a named
// function, "auto" on a server without --enable-auto-tool-choice), and answers read as tool calls,
// whole and streamed. The model's answer is scripted with the API's own fields: the tokenizer has
// added tokens whose text is a whole tool call, a logit_bias of 100 draws one, and stop_token_ids
// with include_stop_str_in_output ends the answer on it with its text ("stop").
#include <unistd.h>

#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/file_io.h"
#include "data/tokenizer.h"
#include "serve/generator.h"
#include "serve/http_server.h"
#include "serve/test_socket.h"
#include "serve/test_util.h"
#include "serve/tool_parser.h"

namespace mt::serve {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

const char* kCorpus =
    "The cat sat on the mat. The dog sat on the log. What is the weather in Paris? It is sunny.\n"
    "Once upon a time there was a model that answered questions over HTTP, one token at a time.\n";

// The answers the tests script: each an added token (ids 300...) of the tokenizer.
const std::string kHermesCall =
    "I will check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"note\": \"été\"}}\n</tool_call>";
const std::string kLlamaCalls =
    "<|python_tag|>{\"name\": \"get_time\", \"parameters\": {\"zone\": \"UTC\"}}; "
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}";
const std::string kBrokenCall = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>";
constexpr int kHermesId = 300, kLlamaId = 301, kBrokenId = 302;

// Prints the tools (as transformers' templates do, with tojson), or raises with them, so the
// prompt shows what the template was given.
const char* kTemplate =
    "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n{% endif %}"
    "{% for m in messages %}{% if m.content == 'show tools' %}"
    "{{ raise_exception('tools: ' ~ (tools | tojson) ~ ' messages: ' ~ (messages | tojson)) }}{% endif %}"
    "<{{ m.role }}> {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant> {% endif %}";

// A server of two slots in f32 on a free port (testing::Running).
struct Running : testing::Running {
  Running(models::TransformerLM& model, const data::Tokenizer& tok, ServerOptions so)
      : testing::Running(model, tok, GeneratorOptions{.capacity = 0, .prefill_chunk = 512, .slots = 2, .weights = DType::kF32},
                         std::move(so)) {}
};

ServerOptions tool_options(const std::string& parser, bool enable) {
  ServerOptions so;
  so.tool_call_parser = parser;
  so.enable_auto_tool_choice = enable;
  return so;
}

class ToolCallTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const data::Tokenizer base = data::Tokenizer::train(kCorpus, 300);
    dir_ = ::testing::TempDir() + "/mt_serve_tools_" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
    base.save_json(dir_ + "/tokenizer.json");
    std::vector<char> raw = file_read_all(dir_ + "/tokenizer.json");
    json j = json::parse(raw.begin(), raw.end());
    int id = kHermesId;
    for (const std::string& text : {kHermesCall, kLlamaCalls, kBrokenCall})
      j["added_tokens"].push_back({{"id", id++}, {"content", text}, {"single_word", false}, {"lstrip", false},
                                   {"rstrip", false}, {"normalized", false}, {"special", false}});
    std::ofstream(dir_ + "/tokenizer.json") << j.dump();
    plain_ = std::make_unique<data::Tokenizer>(data::Tokenizer::load(dir_ + "/tokenizer.json"));  // no template
    std::ofstream(dir_ + "/tokenizer_config.json") << json{{"eos_token", "<|endoftext|>"}, {"chat_template", kTemplate}}.dump();
    tok_ = std::make_unique<data::Tokenizer>(data::Tokenizer::load(dir_));
    ASSERT_NE(tok_->chat_template(), nullptr);
    ASSERT_EQ(tok_->vocab_size(), 303);
    models::ModelConfig c = testing::tiny_config("tiny-gpt2");
    c.vocab_size = 303;
    c.max_positions = 512;
    model_ = testing::make_model(c);
    hermes_ = std::make_unique<Running>(*model_, *tok_, tool_options("hermes", true));
    llama_ = std::make_unique<Running>(*model_, *tok_, tool_options("llama3_json", true));
  }
  static void TearDownTestSuite() {
    hermes_.reset();
    llama_.reset();
    model_.reset();
    tok_.reset();
    plain_.reset();
    std::filesystem::remove_all(dir_);
  }

  static httplib::Result post(int port, const json& body) {
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(60, 0);
    return cli.Post("/v1/chat/completions", body.dump(), "application/json");
  }
  static json call(int port, const json& body, int want) {
    httplib::Result r = post(port, body);
    EXPECT_TRUE(r && r->status == want) << (r ? r->body : "no response") << "\n" << body.dump();
    return r ? json::parse(r->body) : json();
  }
  // A chat request whose answer is the added token `id` (then it ends: "stop").
  static json scripted(int id, json extra = json::object()) {
    json body = {{"messages", json::array({{{"role", "user"}, {"content", "What is the weather in Paris?"}}})},
                 {"tools", tools()},
                 {"temperature", 0},
                 {"max_tokens", 4},
                 {"logit_bias", {{std::to_string(id), 100}}},
                 {"stop_token_ids", {id}},
                 {"include_stop_str_in_output", true}};
    for (auto& [k, v] : extra.items()) body[k] = v;
    return body;
  }
  // OpenAI's tools, keys in the order a client writes them (json sorts its keys; the server must
  // keep the order sent).
  static std::string tools_text() {
    return R"([{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",)"
           R"( "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])";
  }
  static json tools() { return json::parse(tools_text()); }
  static std::vector<json> events(const std::string& body, bool* done) { return testing::sse_events(body, done); }
  static void expect_call_id(const json& call) {
    EXPECT_TRUE(std::regex_match(call["id"].get<std::string>(), std::regex("chatcmpl-tool-[0-9a-f]{32}"))) << call;
    EXPECT_EQ(call["type"], "function");
  }

  static std::string dir_;
  static std::unique_ptr<data::Tokenizer> tok_, plain_;
  static std::unique_ptr<models::TransformerLM> model_;
  static std::unique_ptr<Running> hermes_, llama_;
};
std::string ToolCallTest::dir_;
std::unique_ptr<data::Tokenizer> ToolCallTest::tok_, ToolCallTest::plain_;
std::unique_ptr<models::TransformerLM> ToolCallTest::model_;
std::unique_ptr<Running> ToolCallTest::hermes_, ToolCallTest::llama_;

// The tools reach the template as sent (their keys in order), as apply_chat_template(tools=...)
// gets them; without tools the template sees none.
TEST_F(ToolCallTest, TheToolsAreWrittenIntoThePromptByTheTemplate) {
  const std::string tool_json = python_json_dumps(ojson::parse(tools_text())[0]);
  const std::string with = "<tools>" + tool_json + "\n</tools>\n<user> Hi\n<assistant> ";
  const json messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  // The body as a client writes it (json would sort the tools' keys).
  const std::string body = R"({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "tool_choice": "none", "tools": )" +
                           tools_text() + "}";
  httplib::Client cli("127.0.0.1", hermes_->port);
  httplib::Result r = cli.Post("/v1/chat/completions", body, "application/json");
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
  EXPECT_EQ(json::parse(r->body)["usage"]["prompt_tokens"], tok_->encode(with).size());
  EXPECT_EQ(call(hermes_->port, {{"messages", messages}, {"max_tokens", 1}}, 200)["usage"]["prompt_tokens"],
            tok_->encode("<user> Hi\n<assistant> ").size());
  // The template's own view of them, word for word (tojson writes as Python's json.dumps).
  std::string shown = body;
  shown.replace(shown.find("\"Hi\""), 4, "\"show tools\"");
  r = cli.Post("/v1/chat/completions", shown, "application/json");
  ASSERT_TRUE(r && r->status == 400) << (r ? r->body : "no response");
  const std::string message = json::parse(r->body)["error"]["message"];
  EXPECT_NE(message.find("tools: [" + tool_json + "]"), std::string::npos) << message;
  // A conversation that called a tool: the assistant's tool_calls reach the template with their
  // arguments as objects, parsed from OpenAI's JSON strings (vLLM's _postprocess_messages), its
  // content may be left out, and the tool's answer is a turn.
  const json turns = json::array(
      {{{"role", "user"}, {"content", "What is the weather in Paris?"}},
       {{"role", "assistant"},
        {"tool_calls", json::array({{{"id", "chatcmpl-tool-1"}, {"type", "function"},
                                     {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}}}},
                                    {{"id", "chatcmpl-tool-2"}, {"type", "function"},
                                     {"function", {{"name", "get_weather"}, {"arguments", ""}}}}})}},
       {{"role", "tool"}, {"tool_call_id", "chatcmpl-tool-1"}, {"content", "sunny"}},
       {{"role", "user"}, {"content", "show tools"}}});
  const json shown_calls = call(hermes_->port, {{"messages", turns}, {"tools", tools()}, {"tool_choice", "none"}}, 400);
  const std::string calls_message = shown_calls["error"]["message"];
  EXPECT_NE(calls_message.find(R"("function": {"arguments": {"city": "Paris"}, "name": "get_weather"})"), std::string::npos)
      << calls_message;  // (json sorted the keys this request was written with)
  EXPECT_NE(calls_message.find(R"("function": {"arguments": {}, "name": "get_weather"})"), std::string::npos) << calls_message;
  EXPECT_NE(calls_message.find(R"({"content": "sunny", "role": "tool", "tool_call_id": "chatcmpl-tool-1"})"), std::string::npos)
      << calls_message;
  json unparsed = turns;
  unparsed[1]["tool_calls"][0]["function"]["arguments"] = "{city: Paris}";
  const json e = call(hermes_->port, {{"messages", unparsed}, {"max_tokens", 1}}, 400)["error"];
  EXPECT_EQ(e["code"], "invalid_value");
  EXPECT_NE(e["message"].get<std::string>().find("messages[1].tool_calls[0].function.arguments"), std::string::npos) << e;
}

TEST_F(ToolCallTest, RequestsTheServerCannotHonourAreRefused) {
  const json messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  auto refused = [&](int port, const json& extra, const std::string& code, const std::string& says) {
    json body = {{"messages", messages}, {"max_tokens", 1}};
    for (auto& [k, v] : extra.items()) body[k] = v;
    const json e = call(port, body, 400)["error"];
    EXPECT_EQ(e["code"], code) << extra.dump();
    EXPECT_NE(e["message"].get<std::string>().find(says), std::string::npos) << extra.dump() << ": " << e["message"];
  };
  // Nothing can write tools into a prompt without a template.
  {
    Running untemplated(*model_, *plain_, tool_options("hermes", true));
    refused(untemplated.port, {{"tools", tools()}, {"tool_choice", "none"}}, "unsupported_parameter", "chat template");
    call(untemplated.port, {{"messages", messages}, {"max_tokens", 1}, {"tools", json::array()}}, 200);  // [] is none
  }
  const int port = hermes_->port;
  json bad_type = tools(), no_function = tools(), no_name = tools(), bad_params = tools(), bad_desc = tools();
  bad_type[0]["type"] = "retrieval";
  no_function[0].erase("function");
  no_name[0]["function"].erase("name");
  bad_params[0]["function"]["parameters"] = "city";
  bad_desc[0]["function"]["description"] = 5;
  refused(port, {{"tools", "get_weather"}}, "invalid_type", "\"tools\"");
  refused(port, {{"tools", {5}}}, "invalid_type", "tools[0]");
  refused(port, {{"tools", bad_type}}, "invalid_value", "tools[0].type");
  refused(port, {{"tools", no_function}}, "missing_field", "tools[0].function");
  refused(port, {{"tools", no_name}}, "missing_field", "tools[0].function.name");
  refused(port, {{"tools", bad_params}}, "invalid_type", "tools[0].function.parameters");
  refused(port, {{"tools", bad_desc}}, "invalid_type", "tools[0].function.description");
  // vLLM forces these by guided decoding, which this server does not have.
  const json named = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  refused(port, {{"tools", tools()}, {"tool_choice", "required"}}, "unsupported_parameter", "\"required\" is not supported");
  refused(port, {{"tools", tools()}, {"tool_choice", named}}, "unsupported_parameter", "is not supported");
  refused(port, {{"tools", tools()}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "other"}}}}}}, "invalid_value",
          "not in \"tools\"");
  refused(port, {{"tools", tools()}, {"tool_choice", {{"function", "get_weather"}}}}, "invalid_type", "\"tool_choice\"");
  refused(port, {{"tools", tools()}, {"tool_choice", "sometimes"}}, "invalid_value", "\"tool_choice\"");
  refused(port, {{"tool_choice", "auto"}}, "invalid_value", "needs \"tools\"");
  refused(port, {{"tools", tools()}, {"parallel_tool_calls", "no"}}, "invalid_type", "\"parallel_tool_calls\"");
  call(port, {{"messages", messages}, {"max_tokens", 1}, {"tool_choice", "none"}}, 200);
  call(port, {{"messages", messages}, {"max_tokens", 1}, {"tools", json::array()}, {"tool_choice", "required"}}, 200);  // none
  // "auto", the default with tools, reads calls: a server without --enable-auto-tool-choice and a
  // parser refuses it as vLLM does; "none" still renders the tools.
  for (const auto& so : {ServerOptions{}, tool_options("hermes", false)}) {
    Running manual(*model_, *tok_, so);
    refused(manual.port, {{"tools", tools()}}, "unsupported_parameter", "--enable-auto-tool-choice and --tool-call-parser");
    refused(manual.port, {{"tools", tools()}, {"tool_choice", "auto"}}, "unsupported_parameter", "--enable-auto-tool-choice");
    call(manual.port, {{"messages", messages}, {"max_tokens", 1}, {"tools", tools()}, {"tool_choice", "none"}}, 200);
  }
}

TEST(ToolCallOptions, AutoToolChoiceNeedsAKnownParser) {
  auto model = testing::make_model(testing::tiny_config("tiny-gpt2"));
  Generator gen(*model);
  const data::Tokenizer tok = data::Tokenizer::train(kCorpus, 300);
  EXPECT_THROW(HttpServer(gen, tok, tool_options("", true)), Error);
  EXPECT_THROW(HttpServer(gen, tok, tool_options("mistral", false)), Error);
  EXPECT_NO_THROW(HttpServer(gen, tok, tool_options("llama3_json", false)));
}

TEST_F(ToolCallTest, AHermesAnswerIsReadAsToolCalls) {
  const json r = call(hermes_->port, scripted(kHermesId), 200);
  const json& choice = r["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["message"]["content"], "I will check.");  // the text before the block
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << r;
  const json& tc = choice["message"]["tool_calls"][0];
  expect_call_id(tc);
  EXPECT_EQ(tc["function"]["name"], "get_weather");
  EXPECT_EQ(tc["function"]["arguments"], "{\"city\": \"Paris\", \"note\": \"été\"}");  // Python's json.dumps
  EXPECT_EQ(r["usage"]["completion_tokens"], 1);
  // A block that is not JSON: the whole answer is content, as vLLM falls back.
  const json broken = call(hermes_->port, scripted(kBrokenId), 200)["choices"][0];
  EXPECT_EQ(broken["message"]["content"], kBrokenCall);
  EXPECT_FALSE(broken["message"].contains("tool_calls"));
  EXPECT_EQ(broken["finish_reason"], "stop");
  // tool_choice "none": no calls read.
  const json none = call(hermes_->port, scripted(kHermesId, {{"tool_choice", "none"}}), 200)["choices"][0];
  EXPECT_EQ(none["message"]["content"], kHermesCall);
  EXPECT_EQ(none["finish_reason"], "stop");
  // Each of n choices is read on its own; a call cut by max_tokens keeps "length" (vLLM's).
  const json two = call(hermes_->port, scripted(kHermesId, {{"n", 2}}), 200);
  ASSERT_EQ(two["choices"].size(), 2u);
  for (const json& c : two["choices"]) EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_NE(two["choices"][0]["message"]["tool_calls"][0]["id"], two["choices"][1]["message"]["tool_calls"][0]["id"]);
  json cut = scripted(kHermesId, {{"max_tokens", 1}});
  cut.erase("stop_token_ids");
  cut.erase("include_stop_str_in_output");
  const json length = call(hermes_->port, cut, 200)["choices"][0];
  EXPECT_EQ(length["finish_reason"], "length");
  EXPECT_EQ(length["message"]["tool_calls"].size(), 1u);
}

TEST_F(ToolCallTest, ALlama3JsonAnswerIsReadAsToolCalls) {
  const json choice = call(llama_->port, scripted(kLlamaId), 200)["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 2u);
  for (const json& tc : choice["message"]["tool_calls"]) expect_call_id(tc);
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "get_time");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["arguments"], "{\"zone\": \"UTC\"}");  // its "parameters"
  EXPECT_EQ(choice["message"]["tool_calls"][1]["function"]["arguments"], "{\"city\": \"Oslo\"}");
  // parallel_tool_calls false keeps the first (vLLM's).
  const json first = call(llama_->port, scripted(kLlamaId, {{"parallel_tool_calls", false}}), 200)["choices"][0];
  ASSERT_EQ(first["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(first["message"]["tool_calls"][0]["function"]["name"], "get_time");
  // Text that is not a call of this format is content.
  const json hermes_text = call(llama_->port, scripted(kHermesId), 200)["choices"][0];
  EXPECT_EQ(hermes_text["message"]["content"], kHermesCall);
  EXPECT_EQ(hermes_text["finish_reason"], "stop");
}

// A stream's content goes out until a call may begin; the calls come whole, one delta each, indexed
// as the OpenAI SDK accumulates them; its content joined is the whole answer's.
TEST_F(ToolCallTest, StreamedToolCallsComeAsDeltas) {
  struct Case {
    Running* server;
    int id;
    std::string content;               // joined
    std::vector<std::string> names;    // the calls
    const char* finish;
  };
  for (const Case& k : {Case{hermes_.get(), kHermesId, "I will check.", {"get_weather"}, "tool_calls"},
                        Case{llama_.get(), kLlamaId, "", {"get_time", "get_weather"}, "tool_calls"},
                        Case{hermes_.get(), kBrokenId, kBrokenCall, {}, "stop"}}) {
    SCOPED_TRACE(k.id);
    json body = scripted(k.id, {{"stream", true}});
    httplib::Result r = post(k.server->port, body);
    ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    bool done = false;
    const std::vector<json> evs = events(r->body, &done);
    EXPECT_TRUE(done);
    std::string content, finish;
    std::vector<json> calls;
    for (const json& ev : evs) {
      ASSERT_EQ(ev["object"], "chat.completion.chunk");
      const json& c = ev["choices"][0];
      if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
      if (c["delta"].contains("tool_calls"))
        for (const json& tc : c["delta"]["tool_calls"]) calls.push_back(tc);
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
    EXPECT_EQ(content, k.content);
    EXPECT_EQ(finish, k.finish);
    ASSERT_EQ(calls.size(), k.names.size());
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(calls[i]["index"], i);
      expect_call_id(calls[i]);
      EXPECT_EQ(calls[i]["function"]["name"], k.names[i]);
    }
    if (k.id == kHermesId) {
      EXPECT_EQ(calls[0]["function"]["arguments"], "{\"city\": \"Paris\", \"note\": \"été\"}");
    }
    // The whole answer agrees.
    body.erase("stream");
    const json whole = call(k.server->port, body, 200)["choices"][0]["message"];
    EXPECT_EQ(whole["content"].is_null() ? std::string() : whole["content"].get<std::string>(), k.content);
  }
  // With logprobs, the entries of a token whose text is held come with a later chunk: joined, they
  // are the whole answer's.
  json body = scripted(kHermesId, {{"stream", true}, {"logprobs", true}, {"top_logprobs", 2}});
  httplib::Result r = post(hermes_->port, body);
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
  bool done = false;
  json joined = json::array();
  for (const json& ev : events(r->body, &done))
    if (!ev["choices"][0]["logprobs"].is_null())
      for (const json& e : ev["choices"][0]["logprobs"]["content"]) joined.push_back(e);
  body.erase("stream");
  const json whole = call(hermes_->port, body, 200)["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(joined.size(), whole.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_EQ(joined[i]["token"], whole[i]["token"]);
    EXPECT_NEAR(joined[i]["logprob"].get<double>(), whole[i]["logprob"].get<double>(), 1e-5);
  }
  EXPECT_EQ(whole.size(), 1u);
}

}  // namespace
}  // namespace mt::serve
