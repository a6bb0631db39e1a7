// The .txt/.jsonl dataset cache (corpus_prepare): one dataset for each file and tokenizer as they
// are, never another file's tokens.
#include "engine/corpus.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>
#include <vector>

#include "base/error.h"
#include "base/file_io.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer.h"

namespace mt::engine {
namespace {

namespace fs = std::filesystem;

uint64_t tokens(const std::string& prefix) { return data::IndexedDataset(prefix).total_tokens(); }

TEST(CorpusCache, FilesOfOneNameAndOtherTokenizersNeverShareADataset) {
  const std::string d = ::testing::TempDir() + "/mt_corpus_" + std::to_string(::getpid());
  fs::remove_all(d);
  fs::create_directories(d + "/train");
  fs::create_directories(d + "/valid");
  std::ofstream(d + "/train/corpus.txt") << "one two three four five six seven eight nine ten\n";
  std::ofstream(d + "/valid/corpus.txt") << "alpha\n";
  const std::string text = "one two three four five six seven eight nine ten alpha beta";
  data::Tokenizer::train(text, 270).save_json(d + "/a.tokenizer.json");
  data::Tokenizer::train(text, 280).save_json(d + "/b.tokenizer.json");
  const std::string cache = d + "/cache";

  // A train/ and a valid/ corpus.txt: two datasets, each of its own text (the valid one was the
  // train one's before: the cache was named after the stem alone).
  const std::string train = corpus_prepare(d + "/train/corpus.txt", d + "/a.tokenizer.json", cache);
  const std::string valid = corpus_prepare(d + "/valid/corpus.txt", d + "/a.tokenizer.json", cache);
  EXPECT_NE(train, valid);
  EXPECT_GT(tokens(train), tokens(valid));
  // The same file and tokenizer again: the same dataset, not tokenized again.
  const auto written = fs::last_write_time(data::indexed_dataset_idx_path(train));
  EXPECT_EQ(corpus_prepare(d + "/train/corpus.txt", d + "/a.tokenizer.json", cache), train);
  EXPECT_EQ(fs::last_write_time(data::indexed_dataset_idx_path(train)), written);
  // Another tokenizer, or the file replaced by another text with an older time: new datasets.
  const std::string other = corpus_prepare(d + "/train/corpus.txt", d + "/b.tokenizer.json", cache);
  EXPECT_NE(other, train);
  std::ofstream(d + "/train/corpus.txt") << "alpha beta\n";
  fs::last_write_time(d + "/train/corpus.txt", written - std::chrono::hours(24));
  const std::string edited = corpus_prepare(d + "/train/corpus.txt", d + "/a.tokenizer.json", cache);
  EXPECT_NE(edited, train);
  EXPECT_LT(tokens(edited), tokens(train));
  // x.txt and x.jsonl.
  std::ofstream(d + "/train/corpus.jsonl") << "{\"text\": \"alpha beta\"}\n";
  EXPECT_NE(corpus_prepare(d + "/train/corpus.jsonl", d + "/a.tokenizer.json", cache), edited);
  fs::remove_all(d);
}

std::vector<int32_t> sequence(const data::IndexedDataset& ds, uint64_t i) {
  std::vector<int32_t> out(static_cast<size_t>(ds.sequence_length(i)));
  ds.read(i, 0, static_cast<int64_t>(out.size()), out.data());
  return out;
}

// A tokenizer.json laid out as Llama 3's (Llama-3.2's template puts <|begin_of_text|> first, its
// end of text is <|end_of_text|>): a document is the template's tokens around its text, then the
// end of text, as Megatron's preprocess_data.py writes it with a HuggingFaceTokenizer
// (tokenizer(text).input_ids + eod); once a document, not once a piece of an SFT record. Without
// them a Llama checkpoint trained on text it never saw begin so, and tokenize refused the file.
TEST(CorpusDataset, ATemplatesSpecialTokensFrameEachDocument) {
  const std::string d = ::testing::TempDir() + "/mt_corpus_tpl_" + std::to_string(::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  data::Tokenizer::train("one two three one two three answer prompt", 270).save_json(d + "/base.json");
  std::vector<char> raw = file_read_all(d + "/base.json");
  nlohmann::json j = nlohmann::json::parse(raw.begin(), raw.end());
  j["added_tokens"][0]["content"] = "<|end_of_text|>";  // id 269
  j["added_tokens"].push_back({{"id", 270}, {"content", "<|begin_of_text|>"}, {"special", true}, {"normalized", false}});
  j["post_processor"] = nlohmann::json::parse(R"({"type": "Sequence", "processors": [{"type": "ByteLevel"},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
       "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [270]}}}]})");
  std::ofstream(d + "/tokenizer.json") << j.dump();
  const data::Tokenizer tok = data::Tokenizer::load(d + "/tokenizer.json");
  ASSERT_EQ(tok.eot_id(), 269);

  std::vector<CorpusDocument> docs(3);
  docs[0].pieces = {{"one two", true}};
  docs[1].pieces = {{"prompt\n", false}, {"answer", true}};  // an SFT record
  docs[2].pieces = {{"", true}};                              // no text: no sequence
  corpus_write_dataset(docs, tok, d + "/ds");
  const data::IndexedDataset ds(d + "/ds");
  ASSERT_EQ(ds.num_sequences(), 2u);
  std::vector<int32_t> want = {270};
  for (int32_t id : tok.encode("one two")) want.push_back(id);
  want.push_back(269);
  EXPECT_EQ(sequence(ds, 0), want);
  want = {270};
  for (const char* piece : {"prompt\n", "answer"})
    for (int32_t id : tok.encode(piece)) want.push_back(id);
  want.push_back(269);
  EXPECT_EQ(sequence(ds, 1), want);
  // The mask: <|begin_of_text|> as the prompt beside it (not trained), the end of text trained.
  const data::IndexedDataset mask(d + "/ds.mask");
  const std::vector<int32_t> m = sequence(mask, 1);
  ASSERT_EQ(m.size(), want.size());
  EXPECT_EQ(m.front(), 0);
  EXPECT_EQ(m.back(), 1);
  fs::remove_all(d);
}

// TRL's conversational records (stop 76). With the tokenizer's chat template: the template's text
// encoded at once without the tokenizer's own special tokens (the template writes
// <|begin_of_text|>: it was not doubled), the assistant turns with their end of turn trained, the
// end of text after the conversation not; the prompt-completion form trains its completion. Without
// a template: data/chat.h's layout, as serve lays out a chat.
TEST(CorpusDataset, AConversationIsItsTemplatesTextWithTheAssistantTurnsTrained) {
  const std::string d = ::testing::TempDir() + "/mt_corpus_chat_" + std::to_string(::getpid());
  fs::remove_all(d);
  fs::create_directories(d + "/tok");
  data::Tokenizer::train("one two three one two three answer prompt user assistant", 270).save_json(d + "/base.json");
  std::vector<char> raw = file_read_all(d + "/base.json");
  nlohmann::json j = nlohmann::json::parse(raw.begin(), raw.end());
  j["added_tokens"][0]["content"] = "<|end_of_text|>";  // id 269
  j["added_tokens"].push_back({{"id", 270}, {"content", "<|begin_of_text|>"}, {"special", true}, {"normalized", false}});
  j["added_tokens"].push_back({{"id", 271}, {"content", "<|eot_id|>"}, {"special", true}, {"normalized", false}});
  j["post_processor"] = nlohmann::json::parse(R"({"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
       "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [270]}}})");
  std::ofstream(d + "/tok/tokenizer.json") << j.dump();
  // Llama 3's layout, in a template of its own.
  std::ofstream(d + "/tok/tokenizer_config.json") << nlohmann::json{
      {"bos_token", "<|begin_of_text|>"},
      {"eos_token", "<|eot_id|>"},
      {"chat_template",
       "{{ bos_token }}{% for m in messages %}[{{ m.role }}]\n\n{{ m.content | trim }}<|eot_id|>{% endfor %}"
       "{% if add_generation_prompt %}[assistant]\n\n{% endif %}"}}.dump();
  std::ofstream(d + "/chat.jsonl")
      << R"({"messages": [{"role": "user", "content": "one two"}, {"role": "assistant", "content": "three "}, )"
         R"({"role": "user", "content": "prompt"}, {"role": "assistant", "content": [{"type": "text", "text": "answer"}]}]})" "\n"
      << R"({"prompt": [{"role": "user", "content": "one"}], "completion": [{"role": "assistant", "content": "two"}]})" "\n";
  const data::Tokenizer tok = data::Tokenizer::load(d + "/tok");
  ASSERT_NE(tok.chat_template(), nullptr);
  const std::string prefix = corpus_prepare(d + "/chat.jsonl", d + "/tok", d + "/cache");
  const data::IndexedDataset ds(prefix), mask(prefix + ".mask");
  ASSERT_EQ(ds.num_sequences(), 2u);
  auto expect = [&](uint64_t i, const std::vector<std::pair<std::string, bool>>& pieces) {
    std::string text;
    for (const auto& p : pieces) text += p.first;
    std::vector<int32_t> ids = tok.encode(text), m;
    for (const auto& [piece, trained] : pieces) m.insert(m.end(), tok.encode(piece).size(), trained ? 1 : 0);
    ASSERT_EQ(m.size(), ids.size()) << "the pieces' tokens are the text's here";
    ids.push_back(269);  // the end of text between conversations, not trained
    m.push_back(0);
    EXPECT_EQ(sequence(ds, i), ids) << i;
    EXPECT_EQ(sequence(mask, i), m) << i;
    EXPECT_EQ(std::count(ids.begin(), ids.end(), 270), 1) << "one <|begin_of_text|>";
  };
  expect(0, {{"<|begin_of_text|>[user]\n\none two<|eot_id|>[assistant]\n\n", false},
             {"three<|eot_id|>", true},
             {"[user]\n\nprompt<|eot_id|>[assistant]\n\n", false},
             {"answer<|eot_id|>", true}});
  expect(1, {{"<|begin_of_text|>[user]\n\none<|eot_id|>[assistant]\n\n", false}, {"two<|eot_id|>", true}});

  // Without a template: the layout serve applies without one, each assistant turn trained and the
  // end of text after the last.
  fs::remove(d + "/tok/tokenizer_config.json");
  const data::Tokenizer plain = data::Tokenizer::load(d + "/tok");
  std::vector<CorpusDocument> docs = corpus_read(d + "/chat.jsonl");
  corpus_write_dataset(docs, plain, d + "/plain");
  const data::IndexedDataset pds(d + "/plain"), pmask(d + "/plain.mask");
  std::vector<int32_t> want = {270}, want_mask = {0};
  for (const auto& [piece, trained] : std::vector<std::pair<std::string, bool>>{
           {"one two\n", false}, {"three ", true}, {"\n", false}, {"prompt\n", false}, {"answer", true}})
    for (int32_t id : plain.encode(piece)) {
      want.push_back(id);
      want_mask.push_back(trained ? 1 : 0);
    }
  want.push_back(269);
  want_mask.push_back(1);
  EXPECT_EQ(sequence(pds, 0), want);
  EXPECT_EQ(sequence(pmask, 0), want_mask);

  // Records the layout cannot take, and malformed ones, are refused naming the line.
  auto refused = [&](const std::string& line, const std::string& words) {
    std::ofstream(d + "/bad.jsonl") << "{\"text\": \"one\"}\n" << line << "\n";
    try {
      corpus_write_dataset(corpus_read(d + "/bad.jsonl"), plain, d + "/bad");
      ADD_FAILURE() << line << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("bad.jsonl:2"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused(R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})", "alternate");
  refused(R"({"messages": [{"role": "user", "content": "a"}]})", "end with an assistant turn");
  refused(R"({"messages": []})", "non-empty list");
  refused(R"({"messages": [{"role": "user"}]})", "messages[0]");
  refused(R"({"prompt": [{"role": "user", "content": "a"}]})", "completion");
  // Both a text and a conversation: the conversation was dropped without a word (a probe).
  refused(R"({"text": "one", "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})",
          "not both");
  fs::remove_all(d);
}

}  // namespace
}  // namespace mt::engine
