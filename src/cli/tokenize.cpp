// meshtrain tokenize INPUT -o PREFIX [--tokenizer T | --train-bpe N]: turns a .txt file (documents
// separated by blank lines, UTF-8) or a .jsonl/.json file (JSON lines: "text" fields or SFT records,
// engine/corpus.h) into a
// Megatron indexed dataset PREFIX.bin/.idx (+ PREFIX.mask for SFT), one document per
// paragraph/record, each ended by <|endoftext|> (Llama 3's <|end_of_text|>), after the special tokens
// a tokenizer.json's template puts around a text (Llama 3's <|begin_of_text|> first). With
// --train-bpe N a byte-level BPE of N tokens is trained on INPUT first and saved as
// PREFIX.tokenizer.json. Also: meshtrain tokenizer encode|decode TOKENIZER (JSON lines on stdin).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/file_io.h"
#include "cli/commands.h"
#include "data/chat_template.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer.h"
#include "engine/corpus.h"

namespace mt::cli {
namespace {

constexpr int kNotGiven = std::numeric_limits<int>::min();

struct TokenizeArgs {
  std::string input, output, tokenizer;
  int train_bpe = kNotGiven;  // --train-bpe N (kNotGiven: absent; 0 or less given is refused)
};

// Calls fn with each stdin line parsed as JSON; a line that is not JSON is an error naming `what`.
template <typename Json = nlohmann::json, typename Fn>
void for_each_json_line(const char* what, Fn fn) {
  std::string line;
  for (int64_t n = 1; std::getline(std::cin, line); ++n) {
    const std::string where = "stdin:" + std::to_string(n);
    Json j;
    try {
      j = Json::parse(line);
    } catch (const nlohmann::json::exception&) {
      throw Error(ErrorKind::kInvalidArgument, where + ": the line is not " + what);
    }
    fn(j, where);
  }
}

void run_tokenize(const TokenizeArgs& a) {
  const bool train = a.train_bpe != kNotGiven;
  MT_CHECK(!train || a.train_bpe > 0, ErrorKind::kInvalidArgument,  // 0 was taken for absent: "give exactly one of"
           "tokenize: --train-bpe " + std::to_string(a.train_bpe) + ": the vocabulary size must be positive");
  MT_CHECK(!a.output.empty() && a.output.back() != '/', ErrorKind::kInvalidArgument,
           "tokenize: -o '" + a.output + "': give an output prefix (PREFIX.bin and PREFIX.idx are written)");
  MT_CHECK(train != !a.tokenizer.empty(), ErrorKind::kInvalidArgument,
           "tokenize: give exactly one of --tokenizer FILE or --train-bpe N");
  // The output's files, checked before the work (a missing directory failed after it, exit 1, naming
  // PREFIX.bin.tmp; a directory at PREFIX.bin after the whole tokenization). One of them the input
  // itself (tokenize in.bin -o in) replaced the text by its token ids, exit 0.
  {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path parent = fs::path(a.output).parent_path();
    MT_CHECK(parent.empty() || fs::is_directory(parent, ec), ErrorKind::kInvalidArgument,
             "tokenize: -o " + a.output + ": " + parent.string() + " is not a directory");
    for (const char* ext : {".bin", ".idx", ".mask.bin", ".mask.idx", ".tokenizer.json"}) {
      const std::string out = a.output + ext;
      if (!fs::exists(out, ec)) continue;
      MT_CHECK(!fs::is_directory(out, ec), ErrorKind::kInvalidArgument, "tokenize: -o " + a.output + ": " + out + " is a directory");
      for (const std::string& in : {a.input, a.tokenizer})
        MT_CHECK(in.empty() || !fs::equivalent(out, in, ec), ErrorKind::kInvalidArgument,
                 "tokenize: -o " + a.output + " would write " + out + ", which is the input " + in + "; give another prefix");
    }
  }
  std::vector<engine::CorpusDocument> docs = engine::corpus_read(a.input);
  // (a .jsonl whose every "text" is "" wrote a dataset of no tokens, exit 0; an empty .txt is refused)
  MT_CHECK(std::any_of(docs.begin(), docs.end(),
                       [](const engine::CorpusDocument& d) {
                         return !d.chat.is_null() ||
                                std::any_of(d.pieces.begin(), d.pieces.end(), [](const auto& p) { return !p.first.empty(); });
                       }),
           ErrorKind::kInvalidArgument, a.input + ": every document's text is empty: nothing to tokenize");
  std::unique_ptr<data::Tokenizer> tok;
  if (train) {
    std::string corpus;
    for (const auto& d : docs) {
      for (const auto& p : d.pieces) corpus += p.first;
      for (const char* key : {"messages", "prompt", "completion"})  // a conversation's turns
        if (d.chat.contains(key))
          for (const auto& m : d.chat[key])
            if (m["content"].is_string()) corpus += m["content"].get<std::string>() + "\n";
    }
    tok = std::make_unique<data::Tokenizer>(data::Tokenizer::train(corpus, a.train_bpe));
    tok->save_json(a.output + ".tokenizer.json");
    std::fprintf(stderr, "trained a %d-token BPE -> %s.tokenizer.json\n", tok->vocab_size(), a.output.c_str());
  } else {
    tok = std::make_unique<data::Tokenizer>(data::Tokenizer::load(a.tokenizer));
  }
  engine::CorpusStats st = engine::corpus_write_dataset(docs, *tok, a.output);
  std::printf("%zu documents, %zu tokens -> %s.bin/.idx\n", st.documents, st.tokens, a.output.c_str());
  if (st.trained_tokens != st.tokens)
    std::printf("loss mask: %zu of %zu tokens trained -> %s.mask.bin/.idx\n", st.trained_tokens, st.tokens, a.output.c_str());
  // The unigram entropy: the loss of a model that ignores context.
  std::printf("unigram entropy %.4f nats/token\n", st.unigram_entropy);
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  auto* cmd = app.add_subcommand("tokenize", "Tokenize .txt/.jsonl into a Megatron indexed dataset");
  cmd->add_option("INPUT", a->input, ".txt (documents separated by blank lines, UTF-8) or .jsonl/.json (JSON lines: \"text\", \"prompt\"/\"response\"/\"history\", or a conversation: \"messages\", or \"prompt\" and \"completion\" lists)")->required();
  cmd->add_option("-o,--output", a->output, "output prefix (PREFIX.bin, PREFIX.idx)")->required();
  cmd->add_option("--tokenizer", a->tokenizer, "tokenizer.json, or a directory with it or a GPT-2 pair (encoder.json+vocab.bpe, vocab.json+merges.txt, gpt2-vocab.json+gpt2-merges.txt)");
  cmd->add_option("--train-bpe", a->train_bpe, "train a byte-level BPE of this many tokens on INPUT first");
  cmd->callback([a] { run_tokenize(*a); });

  auto path = std::make_shared<std::string>();
  auto* t = app.add_subcommand("tokenizer", "Encode or decode with a tokenizer (JSON lines on stdin)");
  t->require_subcommand(1);
  auto* enc = t->add_subcommand("encode", "one JSON string per line in, one JSON array of ids per line out");
  enc->add_option("TOKENIZER", *path, "tokenizer.json or a GPT-2 vocabulary directory")->required();
  auto special = std::make_shared<bool>(false);
  enc->add_flag("--add-special-tokens", *special,
                "add the special tokens of the tokenizer.json's template (Llama 3's <|begin_of_text|>), as a "
                "document or a prompt gets them; without it, the text's own ids (add_special_tokens=False)");
  enc->callback([path, special] {
    data::Tokenizer tok = data::Tokenizer::load(*path);
    for_each_json_line("a JSON string", [&](const nlohmann::json& j, const std::string& where) {
      MT_CHECK(j.is_string(), ErrorKind::kInvalidArgument, where + ": the line is not a JSON string");
      const std::string text = j.get<std::string>();
      std::printf("%s\n", nlohmann::json(*special ? tok.encode_with_special(text) : tok.encode(text)).dump().c_str());
    });
  });
  // transformers' apply_chat_template: {"messages": [...], "add_generation_prompt": bool, "tools":
  // [...]} a line in, {"text", "ids"} a line out (the ids without the tokenizer's special tokens,
  // which the template writes).
  auto* chat = t->add_subcommand(
      "chat", "one JSON object {\"messages\", \"add_generation_prompt\"} per line in, {\"text\", \"ids\"} of the "
              "tokenizer's chat template per line out");
  chat->add_option("TOKENIZER", *path, "a tokenizer directory with tokenizer_config.json's chat_template or chat_template.jinja")
      ->required();
  chat->callback([path] {
    data::Tokenizer tok = data::Tokenizer::load(*path);
    MT_CHECK(tok.chat_template() != nullptr, ErrorKind::kNotFound,
             *path + ": no chat template beside the tokenizer (tokenizer_config.json's chat_template, chat_template.jinja)");
    for_each_json_line<nlohmann::ordered_json>("a JSON object", [&](const nlohmann::ordered_json& j, const std::string& where) {
      MT_CHECK(j.is_object() && j.contains("messages") && j["messages"].is_array(), ErrorKind::kInvalidArgument,
               where + ": expected {\"messages\": [...], \"add_generation_prompt\": true|false}");
      nlohmann::ordered_json messages = nlohmann::ordered_json::array();
      for (size_t i = 0; i < j["messages"].size(); ++i)
        messages.push_back(data::chat_message_normalized(j["messages"][i], where + ": messages[" + std::to_string(i) + "]"));
      const nlohmann::ordered_json gen = j.value("add_generation_prompt", nlohmann::ordered_json(false));
      MT_CHECK(gen.is_boolean(), ErrorKind::kInvalidArgument, where + ": \"add_generation_prompt\" must be true or false");
      nlohmann::ordered_json extra = nlohmann::ordered_json::object();
      if (j.contains("tools")) extra["tools"] = j["tools"];
      std::string text;
      try {
        text = tok.chat_template()->render(messages, gen.get<bool>(), extra);
      } catch (const Error& e) {
        throw Error(e.kind(), where + ": " + e.what());  // which line the template refused
      }
      std::printf("%s\n", nlohmann::json{{"text", text}, {"ids", tok.encode(text)}}.dump().c_str());
    });
  });
  auto* dec = t->add_subcommand("decode", "one JSON array of ids per line in, one JSON string per line out");
  dec->add_option("TOKENIZER", *path, "tokenizer.json or a GPT-2 vocabulary directory")->required();
  dec->callback([path] {
    data::Tokenizer tok = data::Tokenizer::load(*path);
    for_each_json_line("a JSON array of ids", [&](const nlohmann::json& j, const std::string& where) {
      MT_CHECK(j.is_array(), ErrorKind::kInvalidArgument, where + ": the line is not a JSON array of ids");
      // Each element checked as it is: get<vector<int32_t>> wrapped 4294968710 to 1414, truncated
      // 1414.9 and read true as 1, and a string was a JSON library's type error (exit 1).
      std::vector<int32_t> ids;
      for (const nlohmann::json& e : j) {
        MT_CHECK(e.is_number_integer(), ErrorKind::kInvalidArgument, where + ": " + e.dump() + " is not an integer id");
        const bool in_range = e.is_number_unsigned() ? e.get<uint64_t>() < static_cast<uint64_t>(tok.vocab_size())
                                                     : e.get<int64_t>() >= 0 && e.get<int64_t>() < tok.vocab_size();
        MT_CHECK(in_range, ErrorKind::kInvalidArgument,
                 where + ": id " + e.dump() + " out of range (the vocabulary has " + std::to_string(tok.vocab_size()) + ")");
        ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
      }
      std::printf("%s\n", nlohmann::json(tok.decode(ids)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    });
  });
}

}  // namespace mt::cli
