// meshtrain tokenize INPUT -o PREFIX [--tokenizer T | --train-bpe N]: turns a .txt file (documents
// separated by blank lines) or a .jsonl file (a "text" field per line) into a Megatron indexed
// dataset PREFIX.bin/.idx, one document per paragraph/record, each ended by <|endoftext|>. With
// --train-bpe N a byte-level BPE of N tokens is trained on INPUT first and saved as
// PREFIX.tokenizer.json. Also: meshtrain tokenizer encode|decode TOKENIZER (JSON lines on stdin).
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/file_io.h"
#include "cli/commands.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer.h"

namespace mt::cli {
namespace {

struct TokenizeArgs {
  std::string input, output, tokenizer;
  int train_bpe = 0;
};

// Documents of a .txt (split at blank lines) or .jsonl ("text" fields) file.
std::vector<std::string> read_documents(const std::string& path) {
  std::vector<char> bytes = file_read_all(path);
  std::string text(bytes.begin(), bytes.end());
  std::vector<std::string> docs;
  bool jsonl = path.size() > 6 && path.substr(path.size() - 6) == ".jsonl";
  size_t pos = 0, line_no = 0;
  std::string current;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    std::string line = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    ++line_no;
    if (jsonl) {
      if (!line.empty()) {
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception&) {
          throw Error(ErrorKind::kInvalidArgument, path + ":" + std::to_string(line_no) + ": not valid JSON");
        }
        MT_CHECK(j.is_object() && j.contains("text") && j["text"].is_string(), ErrorKind::kInvalidArgument,
                 path + ":" + std::to_string(line_no) + ": expected an object with a string \"text\" field");
        docs.push_back(j["text"].get<std::string>());
      }
    } else if (line.find_first_not_of(" \t\r") == std::string::npos) {
      if (!current.empty()) docs.push_back(std::move(current));
      current.clear();
    } else {
      current += line + "\n";
    }
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  if (!current.empty()) docs.push_back(std::move(current));
  MT_CHECK(!docs.empty(), ErrorKind::kInvalidArgument, path + ": no documents");
  return docs;
}

// Calls fn with each stdin line parsed as JSON; a line that is not JSON is an error naming `what`.
template <typename Fn>
void for_each_json_line(const char* what, Fn fn) {
  std::string line;
  while (std::getline(std::cin, line)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      throw Error(ErrorKind::kInvalidArgument, std::string("stdin: a line is not ") + what);
    }
    fn(j);
  }
}

void run_tokenize(const TokenizeArgs& a) {
  MT_CHECK((a.train_bpe > 0) != !a.tokenizer.empty(), ErrorKind::kInvalidArgument,
           "tokenize: give exactly one of --tokenizer FILE or --train-bpe N");
  std::vector<std::string> docs = read_documents(a.input);
  std::unique_ptr<data::Tokenizer> tok;
  if (a.train_bpe > 0) {
    std::string corpus;
    for (const auto& d : docs) corpus += d;
    tok = std::make_unique<data::Tokenizer>(data::Tokenizer::train(corpus, a.train_bpe));
    tok->save_json(a.output + ".tokenizer.json");
    std::fprintf(stderr, "trained a %d-token BPE -> %s.tokenizer.json\n", tok->vocab_size(), a.output.c_str());
  } else {
    tok = std::make_unique<data::Tokenizer>(data::Tokenizer::load(a.tokenizer));
  }
  data::IndexedDatasetWriter w(a.output, tok->vocab_size());
  size_t total = 0;
  int32_t eot = tok->eot_id();
  for (const auto& d : docs) {
    std::vector<int32_t> ids = tok->encode(d);
    ids.push_back(eot);
    total += ids.size();
    w.add_sequence(ids);
    w.end_document();
  }
  w.finalize();
  std::printf("%zu documents, %zu tokens -> %s.bin/.idx\n", docs.size(), total, a.output.c_str());
  // The unigram entropy H = -sum p ln p (nats/token): the loss of a model that ignores context.
  std::vector<double> counts(static_cast<size_t>(tok->vocab_size()), 0.0);
  for (const auto& d : docs)
    for (int32_t id : tok->encode(d)) counts[static_cast<size_t>(id)] += 1.0;
  counts[static_cast<size_t>(eot)] += static_cast<double>(docs.size());
  double h = 0.0;
  for (double c : counts)
    if (c > 0) h -= c / static_cast<double>(total) * std::log(c / static_cast<double>(total));
  std::printf("unigram entropy %.4f nats/token\n", h);
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  auto* cmd = app.add_subcommand("tokenize", "Tokenize .txt/.jsonl into a Megatron indexed dataset");
  cmd->add_option("INPUT", a->input, ".txt (documents separated by blank lines) or .jsonl (\"text\" field)")->required();
  cmd->add_option("-o,--output", a->output, "output prefix (PREFIX.bin, PREFIX.idx)")->required();
  cmd->add_option("--tokenizer", a->tokenizer, "tokenizer.json, or a directory with encoder.json+vocab.bpe");
  cmd->add_option("--train-bpe", a->train_bpe, "train a byte-level BPE of this many tokens on INPUT first");
  cmd->callback([a] { run_tokenize(*a); });

  auto path = std::make_shared<std::string>();
  auto* t = app.add_subcommand("tokenizer", "Encode or decode with a tokenizer (JSON lines on stdin)");
  t->require_subcommand(1);
  auto* enc = t->add_subcommand("encode", "one JSON string per line in, one JSON array of ids per line out");
  enc->add_option("TOKENIZER", *path, "tokenizer.json or a GPT-2 vocabulary directory")->required();
  enc->callback([path] {
    data::Tokenizer tok = data::Tokenizer::load(*path);
    for_each_json_line("a JSON string", [&](const nlohmann::json& j) {
      MT_CHECK(j.is_string(), ErrorKind::kInvalidArgument, "stdin: a line is not a JSON string");
      std::printf("%s\n", nlohmann::json(tok.encode(j.get<std::string>())).dump().c_str());
    });
  });
  auto* dec = t->add_subcommand("decode", "one JSON array of ids per line in, one JSON string per line out");
  dec->add_option("TOKENIZER", *path, "tokenizer.json or a GPT-2 vocabulary directory")->required();
  dec->callback([path] {
    data::Tokenizer tok = data::Tokenizer::load(*path);
    for_each_json_line("a JSON array of ids", [&](const nlohmann::json& j) {
      MT_CHECK(j.is_array(), ErrorKind::kInvalidArgument, "stdin: a line is not a JSON array of ids");
      std::vector<int32_t> ids = j.get<std::vector<int32_t>>();
      for (int32_t id : ids)
        MT_CHECK(id >= 0 && id < tok.vocab_size(), ErrorKind::kInvalidArgument, "stdin: id " + std::to_string(id) + " out of range");
      std::printf("%s\n", nlohmann::json(tok.decode(ids)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    });
  });
}

}  // namespace mt::cli
