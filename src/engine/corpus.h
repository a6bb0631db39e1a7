// Text corpora -> Megatron indexed datasets (what `meshtrain tokenize` does, and what `train` does
// when data.train / data.valid name a .txt or .jsonl file rather than a dataset prefix).
//
// Inputs:
//   .txt    documents separated by blank lines, every token trained;
//   .jsonl  one JSON object per line, either {"text": str} (every token trained), an SFT record
//           {"prompt": str, "response": str, "history": [[prompt, response], ...] (optional)}, or
//           a conversation in TRL's forms: {"messages": [{"role", "content"}, ...]} or
//           {"prompt": [messages], "completion": [messages]} (with "tools" optional), laid out by
//           the tokenizer's chat template (data/chat_template.h: assistant turns, or the
//           completion, trained) or, for a tokenizer without one, by data/chat.h's layout.
// An SFT record becomes one document: for each history turn, then the record's own turn,
// prompt + "\n" + response, turns joined by "\n"; only the final response (and the <|endoftext|>
// that ends every document) is trained: the loss mask is 1 on those tokens and 0 elsewhere. The
// prompt and response are tokenized separately, so the boundary is exact. The layout is
// data/chat.h's, which `meshtrain serve` applies to chat requests.
// Outputs: PREFIX.bin/.idx (tokens) and, when any token is masked, PREFIX.mask.bin/.idx (0/1, one
// value per token, same sequence lengths); train picks the mask up automatically.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "engine/ds_config.h"

namespace mt::engine {

struct CorpusDocument {
  std::vector<std::pair<std::string, bool>> pieces;  // text, trained
  // A conversation record ({"messages"} or {"prompt", "completion"} lists, "tools"), laid out by
  // corpus_write_dataset with the tokenizer's chat template; pieces are then empty. where names
  // its file and line.
  nlohmann::ordered_json chat;  // keys in the record's order
  std::string where;
};

// Throws kInvalidArgument naming file:line for a malformed line or record, kNotFound when missing.
std::vector<CorpusDocument> corpus_read(const std::string& path);

struct CorpusStats {
  size_t documents = 0, tokens = 0, trained_tokens = 0;
  double unigram_entropy = 0.0;  // nats/token over all tokens: -sum p ln p
};
// Tokenizes (each document ends with the tokenizer's <|endoftext|>) into PREFIX(.mask).bin/.idx.
CorpusStats corpus_write_dataset(const std::vector<CorpusDocument>& docs, const data::Tokenizer& tokenizer,
                                 const std::string& prefix);
// The dataset prefix for a data path: itself when it is a prefix; for a .txt/.jsonl file, a
// dataset tokenized with `tokenizer` into cache_dir, named STEM-HASH after the file and the
// tokenizer (their paths, sizes and times), and reused while both are unchanged. Prints one line
// to stderr when it tokenizes.
std::string corpus_prepare(const std::string& path, const std::string& tokenizer, const std::string& cache_dir);
// A text file (path) tokenized into prefix with a tokenizer larger than the model's vocabulary:
// the first id the model cannot embed is refused at start, named by key, position and the
// tokenizer's size (it was found when a sample reached it, hours in). Nothing is read when the
// tokenizer's ids all fit, or when prefix is path (an indexed dataset: checked as it is read).
void corpus_check_vocab(const std::string& prefix, const std::string& path, const std::string& tokenizer, int64_t vocab,
                        const std::string& key);
// PREFIX.mask when that dataset exists, else "".
std::string corpus_mask_prefix(const std::string& prefix);
// The end-of-document id data.eod_mask_loss masks after, as Megatron's tokenizer's eod: data.eod_id
// when given; else data.tokenizer's <|endoftext|> (GPT2BPETokenizer's eod); else the model's
// eos_token_id (HuggingFaceTokenizer's). *from says which. Refused when none is known or it is
// outside the vocabulary.
int32_t corpus_eod_id(const RunConfig& cfg, std::string* from);

}  // namespace mt::engine
