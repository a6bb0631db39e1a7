#include "engine/corpus.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/checksum.h"
#include "base/error.h"
#include "base/fault.h"
#include "base/file_io.h"
#include "data/chat.h"
#include "data/chat_template.h"
#include "data/indexed_dataset.h"

namespace mt::engine {
namespace fs = std::filesystem;
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string string_field(const nlohmann::ordered_json& j, const char* key, const std::string& where) {
  MT_CHECK(j.contains(key) && j[key].is_string(), ErrorKind::kInvalidArgument,
           where + ": \"" + key + "\" must be a string");
  return j[key].get<std::string>();
}

CorpusDocument jsonl_document(const nlohmann::ordered_json& j, const std::string& where) {
  MT_CHECK(j.is_object(), ErrorKind::kInvalidArgument, where + ": expected a JSON object");
  CorpusDocument d;
  // TRL's conversational records: laid out by the tokenizer's chat template when the dataset is
  // written (the template is the tokenizer's); checked here, naming the line.
  const bool conversation = j.contains("messages") || (j.contains("prompt") && j["prompt"].is_array());
  // Both forms in one record: which to train is not the record's to leave open (its "text" alone
  // was trained, the conversation dropped without a word).
  MT_CHECK(!(conversation && j.contains("text")), ErrorKind::kInvalidArgument,
           where + ": a record has a \"text\" or a conversation (\"messages\", or \"prompt\" and \"completion\" lists), not both");
  if (j.contains("text")) {
    d.pieces.emplace_back(string_field(j, "text", where), true);
    return d;
  }
  if (conversation) {
    nlohmann::ordered_json rec = nlohmann::ordered_json::object();
    auto messages = [&](const char* key) {
      MT_CHECK(j.contains(key) && j[key].is_array() && !j[key].empty(), ErrorKind::kInvalidArgument,
               where + ": \"" + key + "\" must be a non-empty list of {\"role\", \"content\"} messages");
      nlohmann::ordered_json list = nlohmann::ordered_json::array();
      for (size_t i = 0; i < j[key].size(); ++i)
        list.push_back(data::chat_message_normalized(j[key][i], where + ": " + key + "[" + std::to_string(i) + "]"));
      rec[key] = std::move(list);
    };
    if (j.contains("messages")) {
      MT_CHECK(!j.contains("prompt") && !j.contains("completion") && !j.contains("response"), ErrorKind::kInvalidArgument,
               where + ": a \"messages\" record has no \"prompt\", \"completion\" or \"response\"");
      messages("messages");
    } else {
      MT_CHECK(j.contains("completion"), ErrorKind::kInvalidArgument,
               where + ": a conversational \"prompt\" (a list of messages) needs its \"completion\" (a list of messages)");
      messages("prompt");
      messages("completion");
    }
    if (j.contains("tools") && !j["tools"].is_null()) {
      MT_CHECK(j["tools"].is_array(), ErrorKind::kInvalidArgument, where + ": \"tools\" must be a list");
      rec["tools"] = j["tools"];
    }
    d.chat = std::move(rec);
    d.where = where;
    return d;
  }
  MT_CHECK(j.contains("prompt") && j.contains("response"), ErrorKind::kInvalidArgument,
           where + ": expected a \"text\" field, an SFT record with \"prompt\" and \"response\", or a conversation "
           "(\"messages\", or \"prompt\" and \"completion\" lists of messages)");
  data::ChatHistory history;
  if (j.contains("history")) {
    const nlohmann::ordered_json& h = j["history"];
    MT_CHECK(h.is_array(), ErrorKind::kInvalidArgument, where + ": \"history\" must be a list of [prompt, response]");
    for (const auto& turn : h) {
      MT_CHECK(turn.is_array() && turn.size() == 2 && turn[0].is_string() && turn[1].is_string(),
               ErrorKind::kInvalidArgument, where + ": each \"history\" entry must be [prompt, response] strings");
      history.emplace_back(turn[0].get<std::string>(), turn[1].get<std::string>());
    }
  }
  for (std::string& piece : data::chat_prompt_pieces(history, string_field(j, "prompt", where)))
    d.pieces.emplace_back(std::move(piece), false);
  d.pieces.emplace_back(string_field(j, "response", where), true);
  return d;
}

// A conversation record without a chat template: data/chat.h's layout (each user turn and a
// leading system message content + "\n", each assistant turn its content, then "\n" before the next
// turn), the assistant turns trained (a prompt-completion record's completion ones).
std::vector<std::pair<std::string, bool>> layout_pieces(const CorpusDocument& d) {
  nlohmann::ordered_json all = d.chat.contains("messages") ? d.chat["messages"] : d.chat["prompt"];
  const size_t trained_from = d.chat.contains("messages") ? 0 : all.size();
  if (d.chat.contains("completion"))
    for (const auto& m : d.chat["completion"]) all.push_back(m);
  std::vector<std::pair<std::string, bool>> pieces;
  bool want_user = true;
  const char* rule = ": without a chat template (none in the tokenizer's directory: tokenizer_config.json's chat_template or "
                     "chat_template.jinja), turns alternate user, assistant after an optional leading system message, and "
                     "end with an assistant turn";
  for (size_t i = 0; i < all.size(); ++i) {
    const std::string role = all[i]["role"].get<std::string>();
    const std::string content = all[i]["content"].is_string() ? all[i]["content"].get<std::string>() : std::string();
    const std::string at = d.where + ": message " + std::to_string(i) + " (\"" + role + "\")";
    if ((role == "system" || role == "developer") && i == 0) {
      pieces.emplace_back(content + "\n", false);
    } else if (role == "user" && want_user) {
      pieces.emplace_back(content + "\n", false);
      want_user = false;
    } else if (role == "assistant" && !want_user) {
      pieces.emplace_back(content, i >= trained_from);
      if (i + 1 < all.size()) pieces.emplace_back("\n", false);
      want_user = true;
    } else {
      throw Error(ErrorKind::kInvalidArgument, at + rule);
    }
  }
  MT_CHECK(all.back()["role"] == "assistant", ErrorKind::kInvalidArgument, d.where + rule);
  return pieces;
}

// A conversation laid out by the tokenizer's chat template: the whole text encoded at once (as
// TRL tokenizes the rendered conversation), and a token trained where any of its bytes lies in a
// trained piece (TRL's assistant masks take every token a span's characters touch). Where the
// tokens' bytes are not the text's (a normalizer changed them), each piece is encoded on its own.
void chat_document(const CorpusDocument& d, const data::ChatTemplate& tmpl, const data::Tokenizer& tok,
                   std::vector<int32_t>* ids, std::vector<int32_t>* mask) {
  const nlohmann::ordered_json extra = d.chat.contains("tools") ? nlohmann::ordered_json{{"tools", d.chat["tools"]}} : nlohmann::ordered_json::object();
  std::vector<std::pair<std::string, bool>> pieces;
  try {
    pieces = d.chat.contains("messages") ? tmpl.conversation_pieces(d.chat["messages"], extra)
                                         : tmpl.prompt_completion_pieces(d.chat["prompt"], d.chat["completion"], extra);
  } catch (const Error& e) {
    throw Error(e.kind(), d.where + ": " + e.what());
  }
  std::string text;
  std::vector<uint8_t> trained_byte;
  for (const auto& [piece, trained] : pieces) {
    text += piece;
    trained_byte.insert(trained_byte.end(), piece.size(), trained ? 1 : 0);
  }
  MT_CHECK(std::find(trained_byte.begin(), trained_byte.end(), 1) != trained_byte.end(), ErrorKind::kInvalidArgument,
           d.where + ": the conversation has no assistant turn to train on");
  std::vector<int32_t> all = tok.encode(text);
  size_t at = 0;
  bool same = true;
  std::vector<int32_t> m;
  m.reserve(all.size());
  for (int32_t id : all) {
    const std::string& b = tok.token_bytes(id);
    if (at + b.size() > text.size() || text.compare(at, b.size(), b) != 0) {
      same = false;
      break;
    }
    const bool any = std::find(trained_byte.begin() + static_cast<std::ptrdiff_t>(at),
                               trained_byte.begin() + static_cast<std::ptrdiff_t>(at + b.size()), 1) !=
                     trained_byte.begin() + static_cast<std::ptrdiff_t>(at + b.size());
    m.push_back(any ? 1 : 0);
    at += b.size();
  }
  if (same && at == text.size()) {
    *ids = std::move(all);
    *mask = std::move(m);
    return;
  }
  for (const auto& [piece, trained] : pieces) {
    std::vector<int32_t> p = tok.encode(piece);
    ids->insert(ids->end(), p.begin(), p.end());
    mask->insert(mask->end(), p.size(), trained ? 1 : 0);
  }
}

}  // namespace

std::vector<CorpusDocument> corpus_read(const std::string& path) {
  std::vector<char> bytes = file_read_all(path);
  std::string text(bytes.begin(), bytes.end());
  std::vector<CorpusDocument> docs;
  // A .json file is JSON lines too: Megatron's preprocess_data.py reads its "loose json" input,
  // often named .json, one record a line (it was read as text: braces and keys trained on).
  const bool jsonl = ends_with(path, ".jsonl") || ends_with(path, ".json");
  size_t pos = 0, line_no = 0;
  std::string current;
  auto flush_paragraph = [&] {
    if (!current.empty()) {
      CorpusDocument d;
      d.pieces.emplace_back(std::move(current), true);
      docs.push_back(std::move(d));
    }
    current.clear();
  };
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    std::string line = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    ++line_no;
    if (jsonl) {
      if (line.find_first_not_of(" \t\r") != std::string::npos) {
        std::string where = path + ":" + std::to_string(line_no);
        nlohmann::ordered_json j;
        try {
          j = nlohmann::ordered_json::parse(line);
        } catch (const nlohmann::json::exception&) {
          throw Error(ErrorKind::kInvalidArgument, where + ": not valid JSON" +
                                                       (ends_with(path, ".json") ? " (a .json input is read as JSON lines, a "
                                                                                   "record a line, as Megatron's preprocess_data.py reads it)"
                                                                                 : ""));
        }
        docs.push_back(jsonl_document(j, where));
      }
    } else if (line.find_first_not_of(" \t\r") == std::string::npos) {
      flush_paragraph();
    } else {
      // Text is UTF-8, as Hugging Face's text loader and Megatron's preprocessing decode it: a
      // gzip or binary file, or Latin-1 text, was tokenized byte by byte as junk, exit 0.
      try {
        (void)nlohmann::json(line).dump();
      } catch (const nlohmann::json::exception&) {
        throw Error(ErrorKind::kInvalidArgument, path + ":" + std::to_string(line_no) +
                                                     ": not valid UTF-8 text (a compressed or binary file, or another encoding?)");
      }
      current += line + "\n";
    }
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  flush_paragraph();
  MT_CHECK(!docs.empty(), ErrorKind::kInvalidArgument, path + ": no documents");
  return docs;
}

CorpusStats corpus_write_dataset(const std::vector<CorpusDocument>& docs, const data::Tokenizer& tok,
                                 const std::string& prefix) {
  bool masked = false;
  for (const auto& d : docs) {
    masked |= !d.chat.is_null();
    for (const auto& p : d.pieces) masked |= !p.second;
  }
  // A mask an earlier dataset of this prefix left (an SFT corpus tokenized there before) would be
  // read with these tokens, which it does not fit: removed first (`tokenize` kept it, and the next
  // train failed with "loss mask has 812 values for 40368 tokens").
  fs::remove(data::indexed_dataset_idx_path(prefix + ".mask"));
  fs::remove(data::indexed_dataset_bin_path(prefix + ".mask"));
  data::IndexedDatasetWriter w(prefix, tok.vocab_size());
  std::unique_ptr<data::IndexedDatasetWriter> mw;
  if (masked) mw = std::make_unique<data::IndexedDatasetWriter>(prefix + ".mask", 2);
  CorpusStats st;
  std::vector<double> counts(static_cast<size_t>(tok.vocab_size()), 0.0);
  std::vector<int32_t> ids, mask;
  const data::ChatTemplate* chat_template = tok.chat_template();
  for (const auto& d : docs) {
    ids.clear();
    mask.clear();
    if (!d.chat.is_null() && chat_template != nullptr) {
      chat_document(d, *chat_template, tok, &ids, &mask);
    } else {
      std::vector<std::pair<std::string, bool>> chat_pieces;
      if (!d.chat.is_null()) chat_pieces = layout_pieces(d);
      for (const auto& [text, trained] : d.chat.is_null() ? d.pieces : chat_pieces) {
        std::vector<int32_t> piece = tok.encode(text);
        ids.insert(ids.end(), piece.begin(), piece.end());
        mask.insert(mask.end(), piece.size(), trained ? 1 : 0);
      }
    }
    // A document without text (a JSONL record's "text": "") is a document of no sequences, as
    // Megatron's preprocess_data.py writes it (its end-of-document token follows tokens only); it
    // was a lone <|endoftext|>, which trained one more end-of-document transition per record.
    if (ids.empty()) {
      w.end_document();
      if (mw) mw->end_document();
      continue;
    }
    // The special tokens a tokenizer.json's template puts around a text (Llama 3's
    // <|begin_of_text|>), once a document, as Megatron's preprocess_data.py writes a document with
    // its HuggingFaceTokenizer (tokenizer(text).input_ids, then the end of document); they take the
    // mask of the piece beside them (the prompt's before, the response's after).
    // A chat template writes its own special tokens (apply_chat_template encodes its text without
    // the tokenizer's), and its conversation ends with the template's end of turn, which is trained;
    // the end of document that separates it from the next is not (the model's answers end at the
    // end of turn, not at <|end_of_text|> after it).
    const bool templated = !d.chat.is_null() && chat_template != nullptr;
    if (!templated) {
      const std::vector<int32_t>& before = tok.special_before();
      const std::vector<int32_t>& after = tok.special_after();
      ids.insert(ids.begin(), before.begin(), before.end());
      mask.insert(mask.begin(), before.size(), mask.front());
      ids.insert(ids.end(), after.begin(), after.end());
      mask.insert(mask.end(), after.size(), mask.back());
    }
    ids.push_back(tok.eot_id());
    mask.push_back(templated ? 0 : 1);
    for (size_t i = 0; i < ids.size(); ++i) {
      counts[static_cast<size_t>(ids[i])] += 1.0;
      st.trained_tokens += static_cast<size_t>(mask[i]);
    }
    st.tokens += ids.size();
    w.add_sequence(ids);
    w.end_document();
    if (mw) {
      mw->add_sequence(mask);
      mw->end_document();
    }
  }
  // The mask first: the tokens' .idx is what marks a cached dataset done (corpus_prepare), so a
  // kill between the two leaves no dataset rather than one without its mask (which every later
  // run reused, training on the prompts without a word).
  if (mw) mw->finalize();
  fault_point("corpus.between_finalizes");
  w.finalize();
  st.documents = docs.size();
  for (double c : counts)
    if (c > 0) st.unigram_entropy -= c / static_cast<double>(st.tokens) * std::log(c / static_cast<double>(st.tokens));
  return st;
}

std::string corpus_mask_prefix(const std::string& prefix) {
  return fs::exists(data::indexed_dataset_idx_path(prefix + ".mask")) ? prefix + ".mask" : "";
}

namespace {

// What a file's tokens depend on, as text: its canonical path, size and modification time (for a
// directory, a GPT-2 vocabulary, each of its files' names, sizes and times).
std::string file_stamp(const std::string& path) {
  auto one = [](const fs::path& p) {
    return p.string() + " " + std::to_string(fs::file_size(p)) + " " +
           std::to_string(fs::last_write_time(p).time_since_epoch().count()) + "\n";
  };
  const fs::path canonical = fs::weakly_canonical(path);
  if (!fs::is_directory(canonical)) return one(canonical);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(canonical))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::string s = canonical.string() + "/\n";
  for (const fs::path& f : files) s += one(f);
  return s;
}

}  // namespace

std::string corpus_prepare(const std::string& path, const std::string& tokenizer, const std::string& cache_dir) {
  if (!ends_with(path, ".txt") && !ends_with(path, ".jsonl")) return path;
  MT_CHECK(fs::exists(path), ErrorKind::kNotFound, path + ": no such file");
  MT_CHECK(!tokenizer.empty(), ErrorKind::kInvalidArgument,
           "data.tokenizer: required to tokenize " + path + " (a tokenizer.json or a GPT-2 vocabulary directory)");
  MT_CHECK(fs::exists(tokenizer), ErrorKind::kNotFound, "data.tokenizer: " + tokenizer + ": no such file");
  fs::create_directories(cache_dir);
  // One dataset for each (file, tokenizer) as they are now: the name is the file's stem and a hash
  // of both files' paths, sizes and times, so two files of one name (a train/ and a valid/
  // corpus.txt, x.txt and x.jsonl), another tokenizer, or the file edited, never share a dataset.
  // The encoding's version too: a dataset tokenized before a tokenizer.json's added tokens were
  // matched in text ('<|endoftext|>' written in a document was 7 tokens) is made anew.
  // A tokenizer.json named as a file takes the chat template beside it (data::Tokenizer::load):
  // those files are part of what the tokens depend on.
  std::string key = file_stamp(path) + file_stamp(tokenizer) + "encode:2";
  if (!fs::is_directory(tokenizer))
    for (const char* beside : {"tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"}) {
      const fs::path f = fs::path(tokenizer).parent_path() / beside;
      if (fs::exists(f)) key += file_stamp(f.string());
    }
  std::string prefix = (fs::path(cache_dir) / (fs::path(path).stem().string() + "-" + xxh3_hex(key.data(), key.size()))).string();
  std::string idx = data::indexed_dataset_idx_path(prefix);
  if (fs::exists(idx)) return prefix;
  data::Tokenizer tok = data::Tokenizer::load(tokenizer);
  CorpusStats st = corpus_write_dataset(corpus_read(path), tok, prefix);
  std::fprintf(stderr, "tokenized %s: %zu documents, %zu tokens (%zu trained) -> %s.bin/.idx\n", path.c_str(),
               st.documents, st.tokens, st.trained_tokens, prefix.c_str());
  return prefix;
}

void corpus_check_vocab(const std::string& prefix, const std::string& path, const std::string& tokenizer, int64_t vocab,
                        const std::string& key) {
  if (prefix == path || tokenizer.empty() || vocab <= 0) return;  // not a text file of ours
  static std::map<std::string, int64_t> sizes;  // train, valid, test and the attention share ask alike
  auto known = sizes.find(tokenizer);
  const int64_t size = known != sizes.end() ? known->second : (sizes[tokenizer] = data::Tokenizer::load(tokenizer).vocab_size());
  if (size <= vocab) return;  // every id it gives fits
  data::IndexedDataset ds(prefix);
  std::vector<int32_t> buf(1 << 20);
  for (uint64_t at = 0; at < ds.total_tokens(); at += buf.size()) {
    const uint64_t n = std::min<uint64_t>(buf.size(), ds.total_tokens() - at);
    ds.read_stream(at, n, buf.data());
    for (uint64_t i = 0; i < n; ++i)
      MT_CHECK(buf[i] < vocab, ErrorKind::kInvalidArgument,
               key + ": " + path + " tokenized with " + tokenizer + " (" + std::to_string(size) + " tokens) gives id " +
                   std::to_string(buf[i]) + " at stream position " + std::to_string(at + i) +
                   ", outside the model's vocabulary [0, " + std::to_string(vocab) +
                   "): the model's vocab_size must cover the tokenizer's ids");
  }
}

int32_t corpus_eod_id(const RunConfig& cfg, std::string* from) {
  const int64_t vocab = cfg.model.vocab_size;
  int64_t id = -1;
  if (cfg.eod_id >= 0) {
    id = cfg.eod_id;
    *from = "data.eod_id";
  } else if (!cfg.tokenizer.empty()) {
    data::Tokenizer tok = data::Tokenizer::load(cfg.tokenizer);
    if (tok.has_eot()) {
      id = tok.eot_id();
      *from = "<|endoftext|> of " + cfg.tokenizer;
    }
  }
  if (id < 0 && cfg.model_json.is_object() && cfg.model_json.contains("eos_token_id") &&
      cfg.model_json["eos_token_id"].is_number_integer()) {
    id = cfg.model_json["eos_token_id"].get<int64_t>();
    *from = "the model's eos_token_id";
  }
 // The keys that need the id, for the messages.
  std::string keys;
  for (auto [on, name] : {std::pair<bool, const char*>{cfg.eod_mask_loss, "data.eod_mask_loss"},
                          {cfg.reset_position_ids, "data.reset_position_ids"},
                          {cfg.reset_attention_mask, "data.reset_attention_mask"}})
    if (on) keys += (keys.empty() ? "" : ", ") + std::string(name);
  if (keys.empty()) keys = "data.eod_id";
  MT_CHECK(id >= 0, ErrorKind::kInvalidArgument,
           keys + ": no end-of-document id: give data.eod_id, a data.tokenizer with <|endoftext|>, or the "
           "model's eos_token_id");
  MT_CHECK(id < vocab, ErrorKind::kInvalidArgument,
           keys + ": the end-of-document id " + std::to_string(id) + " (" + *from + ") is outside the vocabulary [0, " +
               std::to_string(vocab) + ")");
  return static_cast<int32_t>(id);
}

}  // namespace mt::engine
