// The normalizer, pre-tokenizer and post-processor of a tokenizer.json (tokenizer_pipeline.h): PCRE2
// for the splits (its syntax covers the Oniguruma patterns the Hub's files use: (?i:...), \p{L},
// \p{N}{1,3}, lookahead), utf8proc for NFC, and the parsing that refuses what is not run.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/tokenizer_pipeline.h"

#include <pcre2.h>
#include <utf8proc.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "base/error.h"

namespace mt::data {

using nlohmann::json;

struct SplitRegex {
  pcre2_code* code = nullptr;
  bool gpt2 = false;  // ByteLevel's own regex
  ~SplitRegex() { pcre2_code_free(code); }
};

namespace {

constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Compiled with JIT; MATCH_INVALID_UTF lets invalid UTF-8 through (it matches nothing and falls
// between matches), so encoding never throws on bytes. literal: a String pattern, matched as it is.
std::shared_ptr<const SplitRegex> compile(const std::string& pattern, bool literal, const std::string& where) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  auto r = std::make_shared<SplitRegex>();
  r->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP), &err,
                          &err_offset, nullptr);
  if (r->code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    throw Error(ErrorKind::kNotSupported, where + ": the pattern " + json(pattern).dump() + " does not compile in PCRE2 (" +
                                              reinterpret_cast<const char*>(msg) + " at offset " +
                                              std::to_string(err_offset) + ")");
  }
  pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is absent
  return r;
}

const std::shared_ptr<const SplitRegex>& gpt2_regex() {
  static const std::shared_ptr<const SplitRegex> r = [] {
    auto c = std::const_pointer_cast<SplitRegex>(compile(kGpt2Pattern, false, "tokenizer: GPT-2's regex"));
    c->gpt2 = true;
    return std::shared_ptr<const SplitRegex>(c);
  }();
  return r;
}

// Calls fn(piece) for the matches of re in text and the text between them. An empty match is no
// piece: the search goes on a character later, as the tokenizers library's find_matches does.
void regex_split(const SplitRegex& re, std::string_view text, const std::function<void(std::string_view)>& fn) {
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(
      pcre2_match_data_create_from_pattern(re.code, nullptr), pcre2_match_data_free);
  MT_CHECK(md != nullptr, ErrorKind::kOutOfMemory, "tokenizer: cannot allocate PCRE2 match data");
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0, from = 0;  // pos: the start of what no piece holds yet; from: where to search
  while (from < text.size()) {
    const int rc = pcre2_match(re.code, subject, text.size(), from, 0, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    MT_CHECK(rc > 0, ErrorKind::kInternal, "tokenizer: PCRE2 match failed with code " + std::to_string(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t begin = ov[0], end = ov[1];
    MT_INTERNAL_CHECK(begin >= from && end >= begin);
    if (end == begin) {
      from = begin + utf8_code_point_at(text, begin).second;
      continue;
    }
    if (begin > pos) fn(text.substr(pos, begin - pos));
    fn(text.substr(begin, end - begin));
    pos = from = end;
  }
  if (pos < text.size()) fn(text.substr(pos));
}

std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : std::string();
}

void pre_tokenizer_steps(const json& j, const std::string& where, std::vector<std::shared_ptr<const SplitRegex>>& steps) {
  const std::string type = type_of(j);
  if (type == "ByteLevel") {
    MT_CHECK(!j.value("add_prefix_space", false), ErrorKind::kNotSupported,
             where + ": ByteLevel add_prefix_space true is not supported (it adds a space before the text)");
    if (j.value("use_regex", true)) steps.push_back(gpt2_regex());
  } else if (type == "Split") {
    const std::string behavior = j.value("behavior", std::string());
    MT_CHECK(behavior == "Isolated", ErrorKind::kNotSupported,
             where + ": Split behavior '" + behavior + "' is not supported (only Isolated)");
    MT_CHECK(!j.value("invert", false), ErrorKind::kNotSupported, where + ": Split invert true is not supported");
    const json& pattern = j.value("pattern", json());
    const bool regex = pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string();
    const bool literal = pattern.is_object() && pattern.contains("String") && pattern["String"].is_string();
    MT_CHECK(pattern.is_object() && pattern.size() == 1 && (regex || literal), ErrorKind::kCorruption,
             where + ": Split pattern " + pattern.dump() + " is neither {\"Regex\": ...} nor {\"String\": ...}");
    MT_CHECK(!literal || !pattern["String"].get<std::string>().empty(), ErrorKind::kNotSupported,
             where + ": Split by the empty String is not supported");
    steps.push_back(compile(pattern[regex ? "Regex" : "String"].get<std::string>(), literal, where + ": Split"));
  } else if (type == "Sequence") {
    MT_CHECK(j.contains("pretokenizers") && j["pretokenizers"].is_array(), ErrorKind::kCorruption,
             where + ": a Sequence without a \"pretokenizers\" list");
    for (const json& p : j["pretokenizers"]) pre_tokenizer_steps(p, where, steps);
  } else {
    throw Error(ErrorKind::kNotSupported, where + " " + j.dump().substr(0, 120) +
                                              " is not supported (only ByteLevel, Split and a Sequence of them)");
  }
}

// A TemplateProcessing's "single": the special tokens' ids before and after the one Sequence A.
SpecialTemplate template_single(const json& j, const std::string& where) {
  const json& single = j.value("single", json());
  const json& specials = j.value("special_tokens", json::object());
  MT_CHECK(single.is_array() && specials.is_object(), ErrorKind::kCorruption,
           where + ": TemplateProcessing needs a \"single\" list and a \"special_tokens\" object");
  SpecialTemplate t;
  int sequences = 0;
  for (const json& piece : single) {
    if (piece.is_object() && piece.contains("Sequence")) {
      MT_CHECK(piece["Sequence"].value("id", std::string()) == "A", ErrorKind::kCorruption,
               where + ": TemplateProcessing single " + piece.dump() + ": a single text is Sequence A");
      ++sequences;
      continue;
    }
    MT_CHECK(piece.is_object() && piece.contains("SpecialToken") && piece["SpecialToken"].contains("id"), ErrorKind::kCorruption,
             where + ": TemplateProcessing single " + piece.dump() + " is neither a SpecialToken nor a Sequence");
    const std::string name = piece["SpecialToken"]["id"].get<std::string>();
    MT_CHECK(specials.contains(name) && specials[name].contains("ids") && specials[name]["ids"].is_array(), ErrorKind::kCorruption,
             where + ": TemplateProcessing special token '" + name + "' has no ids in special_tokens");
    for (const json& id : specials[name]["ids"]) {
      MT_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() <= INT32_MAX, ErrorKind::kCorruption,
               where + ": TemplateProcessing special token '" + name + "' has the id " + id.dump());
      (sequences == 0 ? t.before : t.after).push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  MT_CHECK(sequences == 1, ErrorKind::kCorruption,
           where + ": TemplateProcessing single holds Sequence A " + std::to_string(sequences) + " times, not once");
  return t;
}

}  // namespace

std::pair<uint32_t, size_t> utf8_code_point_at(std::string_view s, size_t i) {
  constexpr std::pair<uint32_t, size_t> kBad{kNotACodePoint, 1};
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return n == 1 ? std::pair<uint32_t, size_t>{c, 1} : kBad;
  uint32_t cp = n == 1 ? c : c & (0x7Fu >> n);
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return kBad;
    cp = (cp << 6) | (b & 0x3Fu);
  }
  const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < least[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return kBad;
  return {cp, n};
}

PreTokenizer PreTokenizer::gpt2() {
  PreTokenizer p;
  p.steps_.push_back(gpt2_regex());
  return p;
}

PreTokenizer PreTokenizer::from_json(const json& j, const std::string& where) {
  PreTokenizer p;
  pre_tokenizer_steps(j, where, p.steps_);
  return p;
}

bool PreTokenizer::is_gpt2() const { return steps_.size() == 1 && steps_[0]->gpt2; }

void PreTokenizer::split(std::string_view text, const std::function<void(std::string_view)>& fn) const {
  if (!text.empty()) split_from(0, text, fn);
}

void PreTokenizer::split_from(size_t step, std::string_view text, const std::function<void(std::string_view)>& fn) const {
  if (step == steps_.size()) {
    fn(text);
    return;
  }
  regex_split(*steps_[step], text, [&](std::string_view piece) { split_from(step + 1, piece, fn); });
}

bool normalizer_is_nfc(const json& j, const std::string& where) {
  if (j.is_null()) return false;
  const std::string type = type_of(j);
  MT_CHECK(type == "NFC", ErrorKind::kNotSupported,
           where + " " + j.dump().substr(0, 120) + " is not supported (only none or NFC)");
  return true;
}

std::string nfc(std::string_view text) {
  size_t ascii = 0;
  while (ascii < text.size() && static_cast<unsigned char>(text[ascii]) < 0x80) ++ascii;
  if (ascii == text.size()) return std::string(text);  // ASCII is its own NFC
  // The last ASCII character may compose with what follows it (e + U+0301 is é).
  const size_t stable = ascii == 0 ? 0 : ascii - 1;
  std::string out(text.substr(0, stable));
  size_t i = stable;
  while (i < text.size()) {
    size_t end = i;  // the run of valid UTF-8 from i
    while (end < text.size() && utf8_code_point_at(text, end).first != kNotACodePoint)
      end += utf8_code_point_at(text, end).second;
    if (end > i) {
      utf8proc_uint8_t* mapped = nullptr;
      const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                                              static_cast<utf8proc_ssize_t>(end - i), &mapped,
                                              static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
      if (n < 0) {
        std::free(mapped);
        throw Error(ErrorKind::kInternal, std::string("tokenizer: utf8proc cannot normalise valid UTF-8: ") +
                                              utf8proc_errmsg(n));
      }
      out.append(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
      std::free(mapped);
      i = end;
    }
    while (i < text.size() && utf8_code_point_at(text, i).first == kNotACodePoint) out += text[i++];
  }
  return out;
}

SpecialTemplate special_template_from_json(const json& j, const std::string& where) {
  const std::string type = type_of(j);
  if (j.is_null() || type == "ByteLevel") return {};  // ByteLevel trims offsets: no ids
  if (type == "TemplateProcessing") return template_single(j, where);
  MT_CHECK(type == "Sequence", ErrorKind::kNotSupported,
           where + " " + j.dump().substr(0, 120) +
               " is not supported (only none, ByteLevel, TemplateProcessing, or a Sequence of them)");
  MT_CHECK(j.contains("processors") && j["processors"].is_array(), ErrorKind::kCorruption,
           where + ": a Sequence without a \"processors\" list");
  SpecialTemplate t;
  int templates = 0;
  for (const json& p : j["processors"]) {
    const std::string ptype = type_of(p);
    if (ptype == "ByteLevel") continue;
    MT_CHECK(ptype == "TemplateProcessing", ErrorKind::kNotSupported,
             where + ": Sequence processor " + p.dump().substr(0, 120) +
                 " is not supported (only ByteLevel and TemplateProcessing)");
    MT_CHECK(++templates == 1, ErrorKind::kNotSupported, where + ": a Sequence of two TemplateProcessing is not supported");
    t = template_single(p, where);
  }
  return t;
}

}  // namespace mt::data
