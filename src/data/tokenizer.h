// Tokenizer: byte-level BPE exactly as GPT-2's reference encoder.py (openai/gpt-2, src/encoder.py).
// Text is split by GPT-2's pre-tokenizer regex (PCRE2, UTF-8 + Unicode properties); each piece's
// UTF-8 bytes start as one token per byte, then the adjacent pair with the lowest merge rank is
// merged (every non-overlapping occurrence, left to right) until no ranked pair remains.
// Loads GPT-2's encoder.json + vocab.bpe, Hugging Face tokenizer.json (model BPE; GPT-2's, Llama 3's
// and Qwen2's layouts: tokenizer_pipeline.h) or a directory holding either; writes tokenizer.json;
// trains a new vocabulary.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/chat_template.h"
#include "data/tokenizer_pipeline.h"

namespace mt::data {

class Tokenizer {
 public:
  // Picks the format by what path is: a directory (encoder.json + vocab.bpe, vocab.json +
  // merges.txt, or tokenizer.json inside), a file named *.json (Hugging Face tokenizer.json).
  // Throws Error (kNotFound, kCorruption, kNotSupported) naming the file and what is wrong.
  // Also reads the chat template of the directory (data/chat_template.h): the path's own, or for a
  // tokenizer.json file named, the one it lies in.
  static Tokenizer load(const std::string& path);
  // GPT-2's files: vocab_json maps the byte-mapped token strings to ids; merges_txt holds one
  // "a b" merge per line, by rank, after an optional "#version" first line.
  static Tokenizer load_gpt2(const std::string& vocab_json, const std::string& merges_txt);
  // As Hugging Face's tokenizers reads the file: its normalizer (none or NFC), pre_tokenizer
  // (ByteLevel, Split, a Sequence of them), model.ignore_merges (a piece that is a vocabulary token
  // is that token, whatever its merges would make) and post_processor (none, ByteLevel,
  // TemplateProcessing's single template, a Sequence of them); anything else is refused by name.
  static Tokenizer load_hf_json(const std::string& path);

  // Byte-level BPE training: ids 0..255 are the bytes (id == byte value), then one merge per
  // id, always the pair with the highest count over the pre-tokenized word counts, ties to the
  // lexicographically smallest (left bytes, right bytes); "<|endoftext|>" is the last id.
  // REQUIRES: vocab_size >= 257. Throws kInvalidArgument if the corpus has too few distinct
  // pairs to reach vocab_size. Deterministic: the same corpus gives the same tokenizer.
  static Tokenizer train(std::string_view corpus, int vocab_size);

  // Writes a Hugging Face compatible tokenizer.json (model BPE, ByteLevel pre-tokenizer and
  // decoder, the added tokens such as <|endoftext|>), atomically.
  void save_json(const std::string& path) const;

  // A tokenizer.json's added tokens (and a trained tokenizer's <|endoftext|>) written in the text
  // are each one token, as Hugging Face's tokenizers library splits them out before BPE: leftmost
  // longest, the tokens with normalized false first over the whole text, then those with
  // normalized true over what is left between them, each honouring its single_word, lstrip and
  // rstrip; the text between them is pre-tokenized and merged on its own. GPT-2's own files
  // (encoder.json + vocab.bpe and the other pairs) declare no added tokens: their text is all
  // BPE, as GPT-2's encoder.py and Megatron's GPT2BPETokenizer encode it. Thread-safe (the
  // per-word cache is guarded by a mutex). The text alone: Hugging Face's
  // tokenizer.encode(text, add_special_tokens=False).
  std::vector<int32_t> encode(std::string_view text) const;
  // The text with the special tokens its tokenizer.json's TemplateProcessing puts around one text
  // (Llama 3: <|begin_of_text|> first): tokenizer.encode(text) with add_special_tokens=True, its
  // default, as Hugging Face's tokenizer(text) and Megatron's HuggingFaceTokenizer encode a
  // document or a prompt. The same as encode(text) for a tokenizer without a template.
  std::vector<int32_t> encode_with_special(std::string_view text) const;
  // The template's ids before and after the text (empty without one), for text encoded in pieces.
  const std::vector<int32_t>& special_before() const { return template_.before; }
  const std::vector<int32_t>& special_after() const { return template_.after; }
  // Concatenates the tokens' bytes; a split UTF-8 sequence stays as its bytes. Throws
  // kInvalidArgument for an id outside [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids) const;

  // What the tokenizer is, whatever files it came from: XXH3-64 (hex) of its tokens' bytes, their
  // special flags, its merges by rank and its added tokens' matching flags. The same tokenizer
  // read from tokenizer.json or a GPT-2 pair, at any path, has the same fingerprint.
  std::string fingerprint() const;

  int vocab_size() const { return static_cast<int>(token_bytes_.size()); }
  int num_merges() const { return static_cast<int>(merge_list_.size()); }
  // The id of "<|endoftext|>", or where the vocabulary has none, of Llama 3's "<|end_of_text|>" (its
  // documents' end: Meta's tokenizer and Llama-3's tokenizer_config.json eos_token); throws
  // kNotFound if the vocabulary has neither.
  int32_t eot_id() const;
  bool has_eot() const { return eot_id_ >= 0; }
  // A special token (Hugging Face's: an added token marked special, and <|endoftext|>), which
  // answers leave out of their text (skip_special_tokens); other added tokens are text.
  bool is_special(int32_t id) const;
  // The chat template load() found beside the vocabulary, or nullptr.
  const ChatTemplate* chat_template() const { return chat_.get(); }
  // The id of the chat template's eos_token (tokenizer_config.json's: an Instruct model's end of
  // turn) when it is one special token of this vocabulary; -1 otherwise.
  int32_t chat_end_of_turn_id() const;
  // The bytes a token decodes to. REQUIRES: 0 <= id < vocab_size().
  const std::string& token_bytes(int32_t id) const { return token_bytes_[id]; }

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

 private:
  struct Merge {
    int32_t rank;
    int32_t id;  // the token the pair becomes
  };
  struct Entry {  // one vocabulary entry as a file spells it
    std::string text;
    int64_t id;
    bool special;  // an added token: text is its content, not byte-mapped
  };
  struct WordCache;
  struct AddedToken {  // tokenizer.json's added_tokens entry
    std::string content;
    int32_t id;
    bool single_word, lstrip, rstrip, normalized, special;
  };

  Tokenizer();
  static Tokenizer load_files(const std::string& path);  // load() without the chat template
  static Tokenizer build(const std::string& where, const std::vector<Entry>& entries,
                         const std::vector<std::pair<std::string, std::string>>& merges);
  void add_merge(int32_t left, int32_t right, int32_t id);
  void bpe_word(std::string_view word, std::vector<int32_t>& out) const;
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;  // no added tokens
  // Normalizes text (between added tokens with normalized false), then splits out those with
  // normalized true and encodes the rest.
  void encode_normalized(std::string_view text, std::vector<int32_t>& out) const;
  void set_added(std::vector<AddedToken> added);
  // Splits sentence at the added tokens of one class (normalized or not), as Hugging Face's
  // AddedVocabulary::find_matches: fn(id, piece) in order, id -1 for text between them.
  template <typename Fn>
  void split_added(std::string_view sentence, bool normalized, Fn&& fn) const;

  std::vector<std::string> token_bytes_;        // id -> the bytes it decodes to
  std::vector<uint8_t> special_;                // id -> 1 for added tokens
  std::array<int32_t, 256> byte_id_{};          // byte -> its single-byte token
  std::unordered_map<uint64_t, Merge> merges_;  // (left << 32 | right) -> rank and result
  std::vector<std::array<int32_t, 2>> merge_list_;  // by rank: (left, right)
  int32_t eot_id_ = -1;
  std::vector<AddedToken> added_;  // matched in text before BPE
  struct TrieNode {
    std::vector<std::pair<uint8_t, int32_t>> children;  // by byte, sorted
    int32_t token = -1;                                  // the added token ending here (index in added_)
  };
  // By class (0: normalized false, 1: true): a byte trie of the added tokens' contents.
  std::array<std::vector<TrieNode>, 2> added_trie_;
  // tokenizer.json's steps around the BPE model (GPT-2's by default).
  bool nfc_ = false;
  PreTokenizer pre_ = PreTokenizer::gpt2();
  std::unordered_map<std::string, int32_t> whole_;  // ignore_merges: model.vocab's tokens by their bytes
  SpecialTemplate template_;
  std::string layout_json_;  // the normalizer, pre_tokenizer, post_processor and ignore_merges as read, if not GPT-2's
  std::unique_ptr<WordCache> cache_;
  std::shared_ptr<const ChatTemplate> chat_;
};

// GPT-2's bytes_to_unicode(): byte b -> the code point that stands for it in vocabulary files
// (printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100..U+0143).
const std::array<uint32_t, 256>& gpt2_byte_to_unicode();

}  // namespace mt::data
