// Byte-level BPE (GPT-2's encoder.py): the pre-tokenizer regex on PCRE2, the rank-ordered merge
// loop with a per-word cache, the GPT-2 / Hugging Face loaders and writer, and BPE training with
// incremental pair counts (only the words holding the merged pair are recounted).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/tokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>

#include "base/checksum.h"
#include "base/error.h"
#include "base/file_io.h"

namespace mt::data {
namespace {

using nlohmann::json;

constexpr const char* kEndOfText = "<|endoftext|>";
constexpr const char* kLlamaEndOfText = "<|end_of_text|>";  // Llama 3's, where there is no <|endoftext|>
constexpr size_t kCacheMaxWords = 1 << 20;  // the cache is cleared when it grows past this
constexpr size_t kCacheMaxWordBytes = 256;   // longer pieces are merged again each time, not kept

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// bytes -> the byte-mapped string vocabulary files use.
std::string bytes_to_mapped(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) append_utf8(out, gpt2_byte_to_unicode()[b]);
  return out;
}

// The byte-mapped string -> bytes; false if it holds a character outside the 256 of the map.
bool mapped_to_bytes(std::string_view mapped, std::string& out) {
  static const std::array<int, 0x144> inverse = [] {
    std::array<int, 0x144> inv;
    inv.fill(-1);
    for (int b = 0; b < 256; ++b) inv[gpt2_byte_to_unicode()[b]] = b;
    return inv;
  }();
  out.clear();
  for (size_t i = 0; i < mapped.size();) {
    auto c = static_cast<unsigned char>(mapped[i]);
    uint32_t cp;
    if (c < 0x80) {
      cp = c, i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < mapped.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(mapped[i + 1]) & 0x3Fu), i += 2;
    } else {
      return false;  // three-byte and longer sequences are all beyond U+0143
    }
    if (cp >= inverse.size() || inverse[cp] < 0) return false;
    out += static_cast<char>(inverse[cp]);
  }
  return true;
}

std::string quoted(const std::string& s) {
  return json(s).dump(-1, ' ', false, json::error_handler_t::replace);
}

json parse_json_file(const std::string& path) {
  std::vector<char> data = file_read_all(path);
  // NOTE: nlohmann parses iteratively but copies and dumps recursively: a file of 200k nested
  // brackets overflowed the stack in value() and dump(). Tokenizer files nest < 10 deep.
  constexpr int kMaxDepth = 1000;
  auto limit_depth = [&](int depth, json::parse_event_t, json&) {
    MT_CHECK(depth <= kMaxDepth, ErrorKind::kCorruption,
             path + ": JSON nested deeper than " + std::to_string(kMaxDepth) + " levels");
    return true;
  };
  try {
    return json::parse(data.begin(), data.end(), limit_depth);
  } catch (const json::exception& e) {
    throw Error(ErrorKind::kCorruption, path + ": not valid JSON: " + e.what());
  }
}

std::pair<std::string, std::string> split_merge(const std::string& where, size_t line,
                                                std::string_view text) {
  size_t sp = text.find(' ');
  MT_CHECK(sp != std::string_view::npos && sp > 0 && sp + 1 < text.size() &&
               text.find(' ', sp + 1) == std::string_view::npos,
           ErrorKind::kCorruption,
           where + ": merge " + std::to_string(line) + " '" + std::string(text) +
               "' is not two tokens separated by one space");
  return {std::string(text.substr(0, sp)), std::string(text.substr(sp + 1))};
}

}  // namespace

const std::array<uint32_t, 256>& gpt2_byte_to_unicode() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t n = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      t[b] = printable ? b : 256 + n++;
    }
    return t;
  }();
  return table;
}

struct Tokenizer::WordCache {
  std::mutex mu;
  std::unordered_map<std::string, std::vector<int32_t>> words;
};

Tokenizer::Tokenizer() : cache_(std::make_unique<WordCache>()) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

bool Tokenizer::is_special(int32_t id) const {
  if (id == eot_id_) return true;
  for (const AddedToken& a : added_)
    if (a.id == id) return a.special;
  return false;
}

int32_t Tokenizer::eot_id() const {
  MT_CHECK(eot_id_ >= 0, ErrorKind::kNotFound,
           std::string("tokenizer: the vocabulary has no ") + kEndOfText + " (nor " + kLlamaEndOfText + ") token");
  return eot_id_;
}

void Tokenizer::add_merge(int32_t left, int32_t right, int32_t id) {
  merges_.emplace(pair_key(left, right), Merge{static_cast<int32_t>(merge_list_.size()), id});
  merge_list_.push_back({left, right});
}

// ---- encode / decode --------------------------------------------------------------------------

// One piece: start from its bytes, then merge the lowest-ranked adjacent pair, the leftmost first,
// until no adjacent pair has a rank (GPT-2's encoder.py merges every occurrence of the best pair a
// pass, left to right: the same result for a table whose merges build on earlier ones). Hugging
// Face's order (tokenizers' Word::merge_all): a heap of the pairs by (rank, position) over a linked
// list of symbols, so a piece of n bytes takes O(n log n). The rescan of the whole piece per merge
// took O(n^2): a 1 MiB word without spaces (a prompt, a base64 blob in a corpus) ran for minutes.
void Tokenizer::bpe_word(std::string_view word, std::vector<int32_t>& out) const {
  const int n = static_cast<int>(word.size());
  if (n == 0) return;
  if (n == 1) {
    out.push_back(byte_id_[static_cast<unsigned char>(word[0])]);
    return;
  }
  struct Symbol {
    int32_t id;
    int prev, next;  // -1: none
    bool alive;
  };
  std::vector<Symbol> sym(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    sym[static_cast<size_t>(i)] = {byte_id_[static_cast<unsigned char>(word[static_cast<size_t>(i)])], i - 1,
                                   i + 1 < n ? i + 1 : -1, true};
  struct Candidate {  // merging the symbol at pos with its next into `merged`, of this rank
    int32_t rank;
    int pos;
    int32_t merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto offer = [&](int pos) {
    const int next = sym[static_cast<size_t>(pos)].next;
    if (next < 0) return;
    auto it = merges_.find(pair_key(sym[static_cast<size_t>(pos)].id, sym[static_cast<size_t>(next)].id));
    if (it != merges_.end()) heap.push({it->second.rank, pos, it->second.id});
  };
  for (int i = 0; i + 1 < n; ++i) offer(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = sym[static_cast<size_t>(c.pos)];
    if (!left.alive || left.next < 0) continue;
    // The pair at pos may have changed since it was offered (either side merged since): still it?
    auto it = merges_.find(pair_key(left.id, sym[static_cast<size_t>(left.next)].id));
    if (it == merges_.end() || it->second.id != c.merged) continue;
    Symbol& right = sym[static_cast<size_t>(left.next)];
    left.id = c.merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[static_cast<size_t>(right.next)].prev = c.pos;
    if (left.prev >= 0) offer(left.prev);
    offer(c.pos);
  }
  for (int i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) out.push_back(sym[static_cast<size_t>(i)].id);
}

void Tokenizer::set_added(std::vector<AddedToken> added) {
  added_ = std::move(added);
  for (auto& trie : added_trie_) trie.assign(1, TrieNode{});
  for (uint32_t i = 0; i < added_.size(); ++i) {
    if (added_[i].content.empty()) continue;
    std::vector<TrieNode>& trie = added_trie_[added_[i].normalized ? 1 : 0];
    int32_t node = 0;
    for (unsigned char b : added_[i].content) {
      auto& kids = trie[node].children;
      auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(b, int32_t{0}),
                                 [](const auto& x, const auto& y) { return x.first < y.first; });
      if (it == kids.end() || it->first != b) {
        const int32_t fresh = static_cast<int32_t>(trie.size());
        it = kids.insert(it, {b, fresh});
        trie.push_back(TrieNode{});  // may move `kids`: `it` is not used after this
        node = fresh;
      } else {
        node = it->second;
      }
    }
    if (trie[node].token < 0) trie[node].token = static_cast<int32_t>(i);  // the first of equal contents
  }
}

namespace {

std::pair<uint32_t, size_t> code_point_at(std::string_view s, size_t i) { return utf8_code_point_at(s, i); }
// Where the character ending at s[end - 1] starts (the byte itself where that is not valid UTF-8).
size_t code_point_start_before(std::string_view s, size_t end) {
  for (size_t back = 1; back <= 4 && back <= end; ++back) {
    const auto [cp, n] = code_point_at(s, end - back);
    if (cp != kNotACodePoint && n == back) return end - back;
    if ((static_cast<unsigned char>(s[end - back]) & 0xC0) != 0x80) break;  // a lead byte: no longer one
  }
  return end - 1;
}

// Rust's regex \w and \s, which Hugging Face's tokenizers uses (\w: Alphabetic, marks, decimal
// digits, connector punctuation, the join controls; \s: White_Space), by PCRE2 on the one
// character. NOTE: PCRE2's Unicode tables may be older than the library's: letters added since
// are not word characters here.
bool char_class(uint32_t cp, bool word) {
  struct Compiled {
    pcre2_code* code[2] = {nullptr, nullptr};
    Compiled() {
      const char* pats[2] = {"^\\p{White_Space}$", "^[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]$"};
      for (int k = 0; k < 2; ++k) {
        int err = 0;
        PCRE2_SIZE off = 0;
        code[k] = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pats[k]), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err,
                                &off, nullptr);
        MT_INTERNAL_CHECK(code[k] != nullptr);
      }
    }
  };
  static const Compiled compiled;
  if (cp == kNotACodePoint) return false;
  if (cp < 0x80) return word ? (std::isalnum(static_cast<int>(cp)) != 0 || cp == '_') : (cp == ' ' || (cp >= 9 && cp <= 13));
  std::string one;
  if (cp < 0x10000) {
    append_utf8(one, cp);
  } else {
    one += static_cast<char>(0xF0 | (cp >> 18));
    one += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    one += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    one += static_cast<char>(0x80 | (cp & 0x3F));
  }
  const pcre2_code* code = compiled.code[word ? 1 : 0];
  thread_local std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(pcre2_match_data_create(4, nullptr),
                                                                                 pcre2_match_data_free);
  return pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(one.data()), one.size(), 0, 0, md.get(), nullptr) > 0;
}

}  // namespace

template <typename Fn>
void Tokenizer::split_added(std::string_view sentence, bool normalized, Fn&& fn) const {
  const std::vector<TrieNode>& trie = added_trie_[normalized ? 1 : 0];
  size_t start_offset = 0, pos = 0;
  while (pos < sentence.size()) {
    // Leftmost longest: the first position where a token starts, the longest one there (a walk
    // down the tokens' trie: a position costs the bytes it shares with some token, not a
    // comparison with every token).
    const AddedToken* tok = nullptr;
    for (size_t k = pos, node = 0; k < sentence.size(); ++k) {
      const auto& kids = trie[node].children;
      const auto b = static_cast<unsigned char>(sentence[k]);
      auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(b, int32_t{0}),
                                 [](const auto& x, const auto& y) { return x.first < y.first; });
      if (it == kids.end() || it->first != b) break;
      node = static_cast<size_t>(it->second);
      if (trie[node].token >= 0) tok = &added_[static_cast<size_t>(trie[node].token)];
    }
    if (tok == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + tok->content.size();
    pos = stop;  // matches do not overlap, even one discarded below
    if (tok->single_word) {
      const bool start_space = start == 0 || !char_class(code_point_at(sentence, code_point_start_before(sentence, start)).first, true);
      const bool stop_space = stop == sentence.size() || !char_class(code_point_at(sentence, stop).first, true);
      if (!start_space || !stop_space) continue;
    }
    if (tok->lstrip) {  // the whitespace before it, down to where the previous piece ended
      size_t s = start;
      while (s > start_offset) {
        const size_t b = code_point_start_before(sentence, s);
        if (b < start_offset || !char_class(code_point_at(sentence, b).first, false)) break;
        s = b;
      }
      start = s;
    }
    if (tok->rstrip) {
      while (stop < sentence.size()) {
        const auto [cp, n] = code_point_at(sentence, stop);
        if (!char_class(cp, false)) break;
        stop += n;
      }
      // The search goes on from the token's own end, as the matcher's iterator does upstream.
    }
    if (start_offset < start) fn(-1, sentence.substr(start_offset, start - start_offset));
    fn(tok->id, sentence.substr(start, stop - start));
    start_offset = stop;
  }
  if (start_offset < sentence.size()) fn(-1, sentence.substr(start_offset));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  if (added_.empty()) {
    encode_normalized(text, out);
    return out;
  }
  split_added(text, false, [&](int32_t id, std::string_view piece) {
    if (id >= 0) out.push_back(id);
    else encode_normalized(piece, out);
  });
  return out;
}

std::vector<int32_t> Tokenizer::encode_with_special(std::string_view text) const {
  std::vector<int32_t> out = template_.before;
  const std::vector<int32_t> ids = encode(text);
  out.insert(out.end(), ids.begin(), ids.end());
  out.insert(out.end(), template_.after.begin(), template_.after.end());
  return out;
}

void Tokenizer::encode_normalized(std::string_view text, std::vector<int32_t>& out) const {
  std::string normalized;
  if (nfc_) {
    normalized = nfc(text);
    text = normalized;
  }
  if (added_trie_[1].size() <= 1) {  // no added token with normalized true
    encode_text(text, out);
    return;
  }
  split_added(text, true, [&](int32_t id, std::string_view piece) {
    if (id >= 0) out.push_back(id);
    else encode_text(piece, out);
  });
}

void Tokenizer::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  std::string key;
  std::vector<int32_t> piece;
  pre_.split(text, [&](std::string_view word) {
    key.assign(word);
    if (!whole_.empty()) {  // ignore_merges: a piece that is a token is it
      auto it = whole_.find(key);
      if (it != whole_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    {
      std::lock_guard<std::mutex> lock(cache_->mu);
      auto it = cache_->words.find(key);
      if (it != cache_->words.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    piece.clear();
    bpe_word(word, piece);
    out.insert(out.end(), piece.begin(), piece.end());
    if (word.size() > kCacheMaxWordBytes) return;  // a long one would hold its bytes for nothing
    std::lock_guard<std::mutex> lock(cache_->mu);
    if (cache_->words.size() >= kCacheMaxWords) cache_->words.clear();
    cache_->words.emplace(key, piece);
  });
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    MT_CHECK(id >= 0 && id < vocab_size(), ErrorKind::kInvalidArgument,
             "Tokenizer::decode: id " + std::to_string(id) + " outside the vocabulary of " +
                 std::to_string(vocab_size()));
    out += token_bytes_[id];
  }
  return out;
}

// ---- loading ----------------------------------------------------------------------------------

// Checks the ids (each in [0, n), none twice), the 256 byte tokens and every merge's tokens.
Tokenizer Tokenizer::build(const std::string& where, const std::vector<Entry>& entries,
                           const std::vector<std::pair<std::string, std::string>>& merges) {
  Tokenizer t;
  const int64_t n = static_cast<int64_t>(entries.size());
  MT_CHECK(n > 0, ErrorKind::kCorruption, where + ": the vocabulary is empty");
  t.token_bytes_.resize(n);
  t.special_.assign(n, 0);
  std::vector<uint8_t> seen(n, 0);
  std::unordered_map<std::string, int32_t> by_text;  // as the merges spell tokens
  for (const Entry& e : entries) {
    MT_CHECK(e.id >= 0 && e.id < n, ErrorKind::kCorruption,
             where + ": token '" + e.text + "' has id " + std::to_string(e.id) +
                 ", outside [0, " + std::to_string(n) + ") for a vocabulary of " +
                 std::to_string(n) + " tokens");
    MT_CHECK(!seen[e.id], ErrorKind::kCorruption,
             where + ": id " + std::to_string(e.id) + " is duplicated (token '" + e.text + "')");
    seen[e.id] = 1;
    bool raw = e.special || !mapped_to_bytes(e.text, t.token_bytes_[e.id]);
    if (raw) t.token_bytes_[e.id] = e.text, t.special_[e.id] = 1;
    by_text.emplace(e.text, static_cast<int32_t>(e.id));
    if (e.text == kEndOfText) t.eot_id_ = static_cast<int32_t>(e.id), t.special_[e.id] = 1;
  }
  if (t.eot_id_ < 0) {
    auto it = by_text.find(kLlamaEndOfText);
    if (it != by_text.end()) t.eot_id_ = it->second, t.special_[it->second] = 1;
  }
  for (int b = 0; b < 256; ++b) {
    std::string mapped;
    append_utf8(mapped, gpt2_byte_to_unicode()[b]);
    auto it = by_text.find(mapped);
    MT_CHECK(it != by_text.end(), ErrorKind::kCorruption,
             where + ": the vocabulary lacks the token for byte " + std::to_string(b) + " ('" +
                 mapped + "')");
    t.byte_id_[b] = it->second;
  }
  auto find_token = [&](const std::string& s, size_t rank) {
    auto it = by_text.find(s);
    MT_CHECK(it != by_text.end(), ErrorKind::kCorruption,
             where + ": merge " + std::to_string(rank) + " refers to the unknown token '" + s +
                 "'");
    return it->second;
  };
  t.merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    int32_t left = find_token(merges[r].first, r), right = find_token(merges[r].second, r);
    auto it = by_text.find(merges[r].first + merges[r].second);
    MT_CHECK(it != by_text.end(), ErrorKind::kCorruption,
             where + ": merge " + std::to_string(r) + " '" + merges[r].first + " " +
                 merges[r].second + "' makes a token that is not in the vocabulary");
    int32_t merged = it->second;
    MT_CHECK(!t.merges_.count(pair_key(left, right)), ErrorKind::kCorruption,
             where + ": merge " + std::to_string(r) + " '" + merges[r].first + " " +
                 merges[r].second + "' is duplicated");
    t.add_merge(left, right, merged);
  }
  return t;
}

Tokenizer Tokenizer::load_gpt2(const std::string& vocab_json, const std::string& merges_txt) {
  json vocab = parse_json_file(vocab_json);
  MT_CHECK(vocab.is_object(), ErrorKind::kCorruption,
           vocab_json + ": expected a JSON object mapping tokens to ids");
  std::vector<Entry> entries;
  entries.reserve(vocab.size());
  for (auto& [text, id] : vocab.items()) {
    MT_CHECK(id.is_number_integer(), ErrorKind::kCorruption,
             vocab_json + ": the id of token '" + text + "' is not an integer");
    entries.push_back({text, id.get<int64_t>(), false});
  }
  std::vector<char> data = file_read_all(merges_txt);
  std::istringstream in(std::string(data.begin(), data.end()));
  std::vector<std::pair<std::string, std::string>> merges;
  std::string line;
  for (size_t n = 0; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (n == 0 && line.rfind("#version", 0) == 0)) continue;
    merges.push_back(split_merge(merges_txt, merges.size(), line));
  }
  return build(merges_txt, entries, merges);
}

Tokenizer Tokenizer::load_hf_json(const std::string& path) {
  json root = parse_json_file(path);
  try {
    MT_CHECK(root.is_object() && root.contains("model") && root["model"].is_object(),
             ErrorKind::kCorruption, path + ": no \"model\" object");
    const json& model = root["model"];
    std::string type = model.value("type", std::string("BPE"));
    MT_CHECK(type == "BPE", ErrorKind::kNotSupported,
             path + ": model type '" + type + "' is not supported (only BPE)");
    // The steps around the model, each refused by name where it is not run (tokenizer_pipeline.h).
    const json& pre = root.value("pre_tokenizer", json());
    MT_CHECK(!pre.is_null(), ErrorKind::kNotSupported, path + ": a tokenizer.json without a pre_tokenizer is not supported");
    PreTokenizer pre_tokenizer = PreTokenizer::from_json(pre, path + ": pre_tokenizer");
    const json& normalizer = root.value("normalizer", json());
    const bool use_nfc = normalizer_is_nfc(normalizer, path + ": normalizer");
    const json& post = root.value("post_processor", json());
    SpecialTemplate special_template = special_template_from_json(post, path + ": post_processor");
    const json& ignore_merges = model.value("ignore_merges", json(false));
    MT_CHECK(ignore_merges.is_boolean(), ErrorKind::kCorruption,
             path + ": model.ignore_merges " + ignore_merges.dump() + " is not true or false");
    // Settings that change the ids and were read past without a word: refused unless neutral.
    const json& dropout = model.value("dropout", json());
    MT_CHECK(dropout.is_null() || (dropout.is_number() && dropout.get<double>() == 0.0), ErrorKind::kNotSupported,
             path + ": model.dropout " + dropout.dump() + " is not supported (BPE dropout)");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const json& v = model.value(k, json());
      MT_CHECK(v.is_null() || (v.is_string() && v.get<std::string>().empty()), ErrorKind::kNotSupported,
               path + ": model." + k + " " + v.dump() + " is not supported (byte-level BPE has none)");
    }
    MT_CHECK(model.contains("vocab") && model["vocab"].is_object(), ErrorKind::kCorruption,
             path + ": model.vocab is not an object");
    std::vector<Entry> entries;
    std::vector<AddedToken> added_tokens;
    std::unordered_map<int64_t, std::string> vocab_ids;
    for (auto& [text, id] : model["vocab"].items()) {
      MT_CHECK(id.is_number_integer(), ErrorKind::kCorruption,
               path + ": the id of token '" + text + "' is not an integer");
      entries.push_back({text, id.get<int64_t>(), false});
      vocab_ids.emplace(id.get<int64_t>(), text);
    }
    for (const json& added : root.value("added_tokens", json::array())) {
      // NOTE: get<int64_t>() of a float is a cast: undefined beyond int64 (1e30), truncating below.
      MT_CHECK(added.at("id").is_number_integer(), ErrorKind::kCorruption,
               path + ": added token id " + added.at("id").dump() + " is not an integer");
      int64_t id = added.at("id").get<int64_t>();
      std::string content = added.at("content").get<std::string>();
      // One content under two ids: the later id took it, where Hugging Face's added vocabulary keeps
      // one id a content (stop 73): refused as the damage it is.
      for (const AddedToken& seen : added_tokens)
        MT_CHECK(seen.content != content || seen.id == id, ErrorKind::kCorruption,
                 path + ": added token '" + content + "' appears twice, with ids " + std::to_string(seen.id) + " and " +
                     std::to_string(id));
      // Hugging Face's AddedToken defaults for flags a file leaves out.
      added_tokens.push_back({content, static_cast<int32_t>(id), added.value("single_word", false),
                              added.value("lstrip", false), added.value("rstrip", false),
                              added.value("normalized", true), added.value("special", false)});
      auto it = vocab_ids.find(id);
      if (it == vocab_ids.end()) {
        entries.push_back({content, id, true});
      } else {
        MT_CHECK(it->second == content, ErrorKind::kCorruption,
                 path + ": added token '" + content + "' has id " + std::to_string(id) +
                     ", which model.vocab gives to '" + it->second + "'");
      }
    }
    std::vector<std::pair<std::string, std::string>> merges;
    for (const json& m : model.value("merges", json::array())) {
      if (m.is_string()) {
        merges.push_back(split_merge(path, merges.size(), m.get<std::string>()));
      } else {
        MT_CHECK(m.is_array() && m.size() == 2, ErrorKind::kCorruption,
                 path + ": merge " + std::to_string(merges.size()) + " " + m.dump() +
                     " is neither \"a b\" nor [a, b]");
        merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      }
    }
    Tokenizer t = build(path, entries, merges);
    t.set_added(std::move(added_tokens));
    for (const std::vector<int32_t>* ids : {&special_template.before, &special_template.after})
      for (int32_t id : *ids)
        MT_CHECK(id < t.vocab_size(), ErrorKind::kCorruption,
                 path + ": post_processor's template adds the id " + std::to_string(id) + ", outside the vocabulary of " +
                     std::to_string(t.vocab_size()));
    if (ignore_merges.get<bool>()) {
      std::string bytes;
      for (const Entry& e : entries)
        if (!e.special && mapped_to_bytes(e.text, bytes)) t.whole_.emplace(bytes, static_cast<int32_t>(e.id));
    }
    t.nfc_ = use_nfc;
    t.pre_ = std::move(pre_tokenizer);
    t.template_ = std::move(special_template);
    if (use_nfc || !t.pre_.is_gpt2() || ignore_merges.get<bool>() || !t.template_.before.empty() ||
        !t.template_.after.empty())
      t.layout_json_ = json{{"normalizer", normalizer}, {"pre_tokenizer", pre}, {"post_processor", post},
                            {"ignore_merges", ignore_merges}}.dump();
    return t;
  } catch (const json::exception& e) {
    throw Error(ErrorKind::kCorruption, path + ": unexpected tokenizer.json layout: " + e.what());
  }
}

Tokenizer Tokenizer::load(const std::string& path) {
  Tokenizer t = load_files(path);
  // The chat template beside the vocabulary (tokenizer_config.json or chat_template.jinja in the
  // directory, or beside the tokenizer.json named), as AutoTokenizer reads a model's directory.
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir = fs::is_directory(path, ec) ? fs::path(path) : fs::path(path).parent_path();
  t.chat_ = ChatTemplate::load_dir(dir.empty() ? std::string(".") : dir.string());
  return t;
}

int32_t Tokenizer::chat_end_of_turn_id() const {
  if (chat_ == nullptr || chat_->eos_token().empty()) return -1;
  const std::vector<int32_t> ids = encode(chat_->eos_token());
  return ids.size() == 1 && is_special(ids[0]) ? ids[0] : -1;
}

Tokenizer Tokenizer::load_files(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    auto in = [&](const char* name) { return (fs::path(path) / name).string(); };
    // tokenizer.json first, as Hugging Face's AutoTokenizer (its fast tokenizer) reads a model
    // directory: vocab.json + merges.txt lack the tokens added since (a chat's end-of-turn id), and
    // a directory with both lost them.
    if (file_exists(in("tokenizer.json"))) return load_hf_json(in("tokenizer.json"));
    if (file_exists(in("encoder.json")) && file_exists(in("vocab.bpe")))
      return load_gpt2(in("encoder.json"), in("vocab.bpe"));
    if (file_exists(in("vocab.json")) && file_exists(in("merges.txt")))
      return load_gpt2(in("vocab.json"), in("merges.txt"));
    // Megatron-LM's names for the same two files (its --vocab-file and --merge-file, as its GPT-2
    // recipes download them).
    if (file_exists(in("gpt2-vocab.json")) && file_exists(in("gpt2-merges.txt")))
      return load_gpt2(in("gpt2-vocab.json"), in("gpt2-merges.txt"));
    throw Error(ErrorKind::kNotFound,
                path + ": holds none of encoder.json + vocab.bpe, vocab.json + merges.txt, "
                       "gpt2-vocab.json + gpt2-merges.txt, tokenizer.json");
  }
  MT_CHECK(file_exists(path), ErrorKind::kNotFound, path + ": no such tokenizer file or directory");
  return load_hf_json(path);
}

// ---- saving -----------------------------------------------------------------------------------

std::string Tokenizer::fingerprint() const {
  Xxh3Stream h;
  auto number = [&h](int64_t v) { h.update(&v, sizeof v); };
  number(vocab_size());
  for (int32_t id = 0; id < vocab_size(); ++id) {
    number(static_cast<int64_t>(token_bytes_[id].size()));
    h.update(token_bytes_[id].data(), token_bytes_[id].size());
    number(special_[id]);
  }
  number(static_cast<int64_t>(merge_list_.size()));
  for (const auto& m : merge_list_) {
    number(m[0]);
    number(m[1]);
  }
  number(static_cast<int64_t>(added_.size()));
  for (const AddedToken& a : added_) {
    number(a.id);
    number((a.single_word ? 1 : 0) | (a.lstrip ? 2 : 0) | (a.rstrip ? 4 : 0) | (a.normalized ? 8 : 0) | (a.special ? 16 : 0));
  }
  if (!layout_json_.empty()) h.update(layout_json_.data(), layout_json_.size());  // GPT-2's adds nothing
  return h.hex();
}

void Tokenizer::save_json(const std::string& path) const {
  auto spelled = [&](int32_t id) {
    return special_[id] ? token_bytes_[id] : bytes_to_mapped(token_bytes_[id]);
  };
  // The added tokens as read (their flags kept), then any other raw token (a GPT-2 file's
  // <|endoftext|>), by id.
  std::map<int32_t, json> by_id;
  for (const AddedToken& a : added_)
    by_id[a.id] = {{"id", a.id},         {"content", a.content},       {"single_word", a.single_word},
                   {"lstrip", a.lstrip}, {"rstrip", a.rstrip},         {"normalized", a.normalized},
                   {"special", a.special}};
  for (int32_t id = 0; id < vocab_size(); ++id) {
    if (!special_[id] || by_id.count(id)) continue;
    by_id[id] = {{"id", id},         {"content", token_bytes_[id]}, {"single_word", false},
                 {"lstrip", false},  {"rstrip", false},             {"normalized", true},
                 {"special", true}};
  }
  json added = json::array();
  for (auto& [id, a] : by_id) added.push_back(std::move(a));
  json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false},
                     {"trim_offsets", true}, {"use_regex", true}};
  // The steps around the model as read (a Llama 3 or Qwen2 file), else GPT-2's.
  const json layout = layout_json_.empty() ? json{{"normalizer", nullptr}, {"pre_tokenizer", byte_level},
                                                  {"post_processor", byte_level}, {"ignore_merges", false}}
                                           : json::parse(layout_json_);
  std::string s = "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n";
  s += "  \"added_tokens\": " + added.dump() + ",\n  \"normalizer\": " + layout["normalizer"].dump() + ",\n";
  s += "  \"pre_tokenizer\": " + layout["pre_tokenizer"].dump() + ",\n";
  s += "  \"post_processor\": " + layout["post_processor"].dump() + ",\n";
  s += "  \"decoder\": " + byte_level.dump() + ",\n";
  s += "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n";
  s += "    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n";
  s += "    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n";
  if (layout["ignore_merges"].get<bool>()) s += "    \"ignore_merges\": true,\n";
  // The added tokens only in added_tokens (as Llama 3's and Qwen2's files have them): read back,
  // each is a token of its own text again, not of the bytes a vocabulary entry spells.
  s += "    \"vocab\": {";
  const char* sep = "\n";
  for (int32_t id = 0; id < vocab_size(); ++id) {
    if (special_[id]) continue;
    s += sep + std::string("      ") + quoted(spelled(id)) + ": " + std::to_string(id);
    sep = ",\n";
  }
  s += "\n";
  s += "    },\n    \"merges\": [\n";
  for (size_t r = 0; r < merge_list_.size(); ++r) {
    s += "      " + quoted(spelled(merge_list_[r][0]) + " " + spelled(merge_list_[r][1]));
    s += r + 1 < merge_list_.size() ? ",\n" : "\n";
  }
  s += "    ]\n  }\n}\n";
  file_write_atomic(path, s.data(), s.size());
}

// ---- training ---------------------------------------------------------------------------------

namespace {

// The corpus as distinct pre-tokenized words with counts, and the weighted count of every
// adjacent token pair. Invariant: where[p] lists (at least) every word that holds pair p.
struct TrainWords {
  std::vector<std::vector<int32_t>> ids;  // each distinct word as its current tokens
  std::vector<int64_t> counts;            // how often the word occurs
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> where;
};

TrainWords count_words(std::string_view corpus) {
  std::unordered_map<std::string, int64_t> word_counts;
  PreTokenizer::gpt2().split(corpus, [&](std::string_view w) { ++word_counts[std::string(w)]; });
  std::vector<std::pair<std::string, int64_t>> sorted(word_counts.begin(), word_counts.end());
  std::sort(sorted.begin(), sorted.end());
  TrainWords tw;
  tw.ids.resize(sorted.size());
  tw.counts.resize(sorted.size());
  for (int32_t w = 0; w < static_cast<int32_t>(sorted.size()); ++w) {
    std::vector<int32_t>& ids = tw.ids[w];
    for (unsigned char c : sorted[w].first) ids.push_back(c);
    tw.counts[w] = sorted[w].second;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      uint64_t k = pair_key(ids[i], ids[i + 1]);
      tw.pair_count[k] += tw.counts[w];
      auto& list = tw.where[k];
      if (list.empty() || list.back() != w) list.push_back(w);
    }
  }
  return tw;
}

// Replaces (left, right) by merged in every word that holds it, left to right, and adds the net
// change of each pair's count to delta (the caller applies it to pair_count).
void merge_in_words(TrainWords& tw, int32_t left, int32_t right, int32_t merged,
                    std::unordered_map<uint64_t, int64_t>& delta) {
  uint64_t key = pair_key(left, right);
  std::vector<int32_t> holders = std::move(tw.where[key]);
  tw.where.erase(key);
  for (int32_t w : holders) {
    std::vector<int32_t>& ids = tw.ids[w];
    const int64_t count = tw.counts[w];
    for (size_t i = 0; i + 1 < ids.size(); ++i) delta[pair_key(ids[i], ids[i + 1])] -= count;
    size_t out = 0;
    for (size_t r = 0; r < ids.size(); ++out) {
      bool hit = r + 1 < ids.size() && ids[r] == left && ids[r + 1] == right;
      ids[out] = hit ? merged : ids[r];
      r += hit ? 2 : 1;
    }
    ids.resize(out);
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      uint64_t k = pair_key(ids[i], ids[i + 1]);
      delta[k] += count;
      if (ids[i] == merged || ids[i + 1] == merged) {  // a new pair: w holds it now
        auto& list = tw.where[k];
        if (list.empty() || list.back() != w) list.push_back(w);
      }
    }
  }
}

}  // namespace

// Each merge recounts only the words holding the merged pair, applies the net change to the pair
// counts and pushes the changed pairs on a max-heap; entries whose count is out of date are
// skipped when popped. The heap orders by count, then by the smallest (left, right) bytes.
Tokenizer Tokenizer::train(std::string_view corpus, int vocab_size) {
  MT_CHECK(vocab_size >= 257, ErrorKind::kInvalidArgument,
           "Tokenizer::train: vocab_size " + std::to_string(vocab_size) +
               " is below 257 (256 bytes + <|endoftext|>)");
  Tokenizer t;
  for (int b = 0; b < 256; ++b) t.token_bytes_.push_back(std::string(1, static_cast<char>(b)));
  for (int b = 0; b < 256; ++b) t.byte_id_[b] = b;
  TrainWords tw = count_words(corpus);

  struct Cand {
    int64_t count;
    int32_t left, right;
  };
  const auto& bytes = t.token_bytes_;
  auto pops_after = [&bytes](const Cand& x, const Cand& y) {
    if (x.count != y.count) return x.count < y.count;
    int c = bytes[x.left].compare(bytes[y.left]);
    return c != 0 ? c > 0 : bytes[x.right] > bytes[y.right];
  };
  std::priority_queue<Cand, std::vector<Cand>, decltype(pops_after)> heap(pops_after);
  auto push = [&heap](uint64_t k, int64_t c) {
    heap.push({c, static_cast<int32_t>(k >> 32), static_cast<int32_t>(k & 0xFFFFFFFFu)});
  };
  for (auto& [k, c] : tw.pair_count) push(k, c);

  const int target_merges = vocab_size - 257;
  std::unordered_map<uint64_t, int64_t> delta;
  while (t.num_merges() < target_merges) {
    MT_CHECK(!heap.empty(), ErrorKind::kInvalidArgument,
             "Tokenizer::train: the corpus allows only " + std::to_string(t.num_merges()) +
                 " merges; vocab_size " + std::to_string(vocab_size) + " needs " +
                 std::to_string(target_merges));
    Cand top = heap.top();
    heap.pop();
    auto pc = tw.pair_count.find(pair_key(top.left, top.right));
    if (pc == tw.pair_count.end() || pc->second != top.count) continue;  // out of date
    const int32_t merged = static_cast<int32_t>(t.token_bytes_.size());
    t.token_bytes_.push_back(t.token_bytes_[top.left] + t.token_bytes_[top.right]);
    t.add_merge(top.left, top.right, merged);
    delta.clear();
    merge_in_words(tw, top.left, top.right, merged, delta);
    for (auto& [k, d] : delta) {
      if (d == 0) continue;
      int64_t c = tw.pair_count[k] += d;
      if (c <= 0) {
        tw.pair_count.erase(k);
      } else {
        push(k, c);
      }
    }
  }
  t.eot_id_ = static_cast<int32_t>(t.token_bytes_.size());
  t.token_bytes_.push_back(kEndOfText);
  t.special_.assign(t.token_bytes_.size(), 0);
  t.special_[t.eot_id_] = 1;
  // Declared in the tokenizer.json it saves: so matched in text here too, as once loaded.
  t.set_added({{kEndOfText, t.eot_id_, false, false, false, true, true}});
  return t;
}

}  // namespace mt::data
