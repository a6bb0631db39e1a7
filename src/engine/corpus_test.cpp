// The .txt/.jsonl dataset cache (corpus_prepare): one dataset for each file and tokenizer as they
// are, never another file's tokens.
#include "engine/corpus.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>
#include <vector>

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

}  // namespace
}  // namespace mt::engine
