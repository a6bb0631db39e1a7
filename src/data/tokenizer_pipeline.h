// What a Hugging Face tokenizer.json puts around its BPE model, as the tokenizers library runs it:
// the normalizer (none or NFC, by utf8proc), the pre-tokenizer (regex splits on PCRE2: ByteLevel's
// GPT-2 regex, a Split by a Regex or String pattern with behavior Isolated, a Sequence of them) and
// a TemplateProcessing's special tokens around one text (the post_processor, alone or in a
// Sequence with ByteLevel). Anything else is refused with a message that names the key.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mt::data {

struct SplitRegex;  // a compiled PCRE2 pattern

// The code point at s[i] and the bytes it takes; an invalid sequence (a lone continuation byte, a
// missing or bad continuation, an overlong or surrogate form) is one byte that is kNotACodePoint.
// REQUIRES: i < s.size().
constexpr uint32_t kNotACodePoint = 0xFFFFFFFFu;
std::pair<uint32_t, size_t> utf8_code_point_at(std::string_view s, size_t i);

// Splits text into pieces: each step in turn splits every piece the step before left; a step's
// matches and the text between them are pieces alike (Hugging Face's Split with behavior Isolated;
// ByteLevel with use_regex true is a Split by GPT-2's regex; ByteLevel without it splits nothing).
class PreTokenizer {
 public:
  // GPT-2's: ByteLevel, use_regex true.
  static PreTokenizer gpt2();
  // tokenizer.json's "pre_tokenizer". Throws kNotSupported (a type, behavior, flag or pattern it
  // does not run) or kCorruption (a malformed entry), naming where and the key.
  static PreTokenizer from_json(const nlohmann::json& j, const std::string& where);

  // Calls fn(piece) for each non-empty piece of text, covering every byte in order. Bytes that are
  // not valid UTF-8 match no pattern: they fall between matches, into the pieces there.
  void split(std::string_view text, const std::function<void(std::string_view)>& fn) const;
  bool is_gpt2() const;

 private:
  void split_from(size_t step, std::string_view text, const std::function<void(std::string_view)>& fn) const;
  std::vector<std::shared_ptr<const SplitRegex>> steps_;
};

// The normalizer: true for NFC, false for none. Throws kNotSupported naming any other.
bool normalizer_is_nfc(const nlohmann::json& j, const std::string& where);

// Unicode Normalization Form C of text (utf8proc). Runs of invalid UTF-8 stay as they are, and the
// text between them is normalised run by run.
// NOTE: utf8proc's Unicode tables may be newer than the tokenizers library's: a character
// unassigned in the older tables is left as it is there (normalization is stable for assigned ones).
std::string nfc(std::string_view text);

// A TemplateProcessing's "single" template: the ids before and after the one text.
struct SpecialTemplate {
  std::vector<int32_t> before, after;
};
// The post_processor: null, ByteLevel (adds nothing), TemplateProcessing, or a Sequence of ByteLevel
// and at most one TemplateProcessing. Throws kNotSupported naming any other processor.
SpecialTemplate special_template_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace mt::data
