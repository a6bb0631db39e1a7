// The .txt/.jsonl dataset cache (corpus_prepare): one dataset for each file and tokenizer as they
// are, never another file's tokens.
#include "engine/corpus.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

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

}  // namespace
}  // namespace mt::engine
