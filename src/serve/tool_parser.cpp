#include "serve/tool_parser.h"

#include <algorithm>
#include <random>
#include <string_view>

#include "base/error.h"

namespace mt::serve {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

// Deeper than this, a call's JSON is taken as malformed: the answer stays content (python_json_dumps
// recurses, and a context of brackets would overflow a worker's stack).
constexpr int kMaxDepth = 500;

// One JSON value (with whitespace around it), or nullopt where it does not parse.
std::optional<ojson> parse_json(std::string_view text) {
  bool deep = false;
  auto bounded = [&deep](int depth, ojson::parse_event_t, ojson&) {
    if (depth > kMaxDepth) deep = true;
    return !deep;
  };
  ojson j = ojson::parse(text.begin(), text.end(), bounded, /*allow_exceptions=*/false);
  if (deep || j.is_discarded()) return std::nullopt;
  return j;
}

// A call object's name and arguments: `args` (and, without it, `fallback_args`) must be there, the
// name a string. Returns false otherwise.
bool read_call(const ojson& obj, const char* args, const char* fallback_args, std::vector<ToolCall>& out) {
  if (!obj.is_object() || !obj.contains("name") || !obj["name"].is_string()) return false;
  const ojson* a = nullptr;
  if (obj.contains(args)) a = &obj[args];
  else if (fallback_args != nullptr && obj.contains(fallback_args)) a = &obj[fallback_args];
  if (a == nullptr) return false;
  out.push_back(ToolCall{obj["name"].get<std::string>(), python_json_dumps(*a)});
  return true;
}

ParsedToolCalls as_content(const std::string& text) { return ParsedToolCalls{{}, text}; }

ParsedToolCalls parse_hermes(const std::string& text) {
  const size_t first = text.find(kCallOpen);
  if (first == std::string::npos) return as_content(text);
  ParsedToolCalls out;
  for (size_t at = first; at != std::string::npos; at = text.find(kCallOpen, at)) {
    const size_t body = at + kCallOpen.size();
    const size_t close = text.find(kCallClose, body);
    // The last block may be cut short of its closing tag: its body runs to the end.
    const std::string_view json(text.data() + body, (close == std::string::npos ? text.size() : close) - body);
    const std::optional<ojson> call = parse_json(json);
    if (!call || !read_call(*call, "arguments", nullptr, out.calls)) return as_content(text);
    if (close == std::string::npos) break;
    at = close + kCallClose.size();
  }
  if (first > 0) out.content = text.substr(0, first);
  return out;
}

bool json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The end (one past) of the object or array that opens at text[at], or npos where it does not
// close: brackets counted outside strings (their escapes skipped). Which brackets match is the
// parser's to check.
size_t json_value_end(const std::string& text, size_t at) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = at; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return i + 1;
    }
  }
  return std::string::npos;
}

ParsedToolCalls parse_llama3_json(const std::string& text) {
  size_t i = 0;
  if (text.compare(0, kPythonTag.size(), kPythonTag) == 0) i = kPythonTag.size();
  else if (text.empty() || text[0] != '{') return as_content(text);
  ParsedToolCalls out;  // content null
  for (;;) {
    if (i >= text.size() || text[i] != '{') return as_content(text);
    const size_t end = json_value_end(text, i);
    if (end == std::string::npos) return as_content(text);
    const std::optional<ojson> call = parse_json(std::string_view(text.data() + i, end - i));
    if (!call || !read_call(*call, "arguments", "parameters", out.calls)) return as_content(text);
    i = end;
    while (i < text.size() && json_space(text[i])) ++i;
    if (i == text.size()) break;
    if (text[i] != ';') return as_content(text);
    ++i;
    while (i < text.size() && json_space(text[i])) ++i;
    if (i == text.size()) break;  // a trailing separator
  }
  return out;
}

void dumps(const ojson& v, std::string& out) {
  if (v.is_object()) {
    out += '{';
    const char* sep = "";
    for (auto it = v.begin(); it != v.end(); ++it) {
      out += sep;
      out += ojson(it.key()).dump(-1, ' ', false, ojson::error_handler_t::replace);
      out += ": ";
      dumps(it.value(), out);
      sep = ", ";
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    const char* sep = "";
    for (const ojson& x : v) {
      out += sep;
      dumps(x, out);
      sep = ", ";
    }
    out += ']';
  } else {
    out += v.dump(-1, ' ', false, ojson::error_handler_t::replace);
  }
}

}  // namespace

const char* const kToolCallParserNames = "hermes, llama3_json";

ToolCallFormat tool_call_format(const std::string& name) {
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "llama3_json") return ToolCallFormat::kLlama3Json;
  throw Error(ErrorKind::kInvalidArgument,
              "--tool-call-parser: unknown parser '" + name + "' (known: " + kToolCallParserNames + ")");
}

ParsedToolCalls parse_tool_calls(ToolCallFormat format, const std::string& text) {
  return format == ToolCallFormat::kHermes ? parse_hermes(text) : parse_llama3_json(text);
}

std::string python_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  dumps(value, out);
  return out;
}

std::string tool_call_id() {
  thread_local std::mt19937_64 rng([] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }());
  static const char* const kHex = "0123456789abcdef";
  std::string id = "chatcmpl-tool-";
  for (int half = 0; half < 2; ++half) {
    uint64_t bits = rng();
    for (int k = 0; k < 16; ++k, bits >>= 4) id += kHex[bits & 15];
  }
  return id;
}

std::string ToolCallStream::add(const std::string& piece) {
  text_ += piece;
  if (holding_) return "";
  size_t upto = text_.size();  // what can go out
  if (format_ == ToolCallFormat::kHermes) {
    const size_t open = text_.find(kCallOpen, sent_);
    if (open != std::string::npos) {
      upto = open;
      holding_ = true;
    } else {
      // The longest end of the text that may begin the marker stays: "<tool" of "<tool_call>".
      for (size_t k = std::min(kCallOpen.size() - 1, text_.size() - sent_); k > 0; --k)
        if (text_.compare(text_.size() - k, k, kCallOpen, 0, k) == 0) {
          upto = text_.size() - k;
          break;
        }
    }
  } else if (!plain_) {
    if (text_.empty()) return "";
    if (text_[0] == '{' || text_.compare(0, kPythonTag.size(), kPythonTag) == 0) {
      holding_ = true;
      return "";
    }
    if (text_.size() < kPythonTag.size() && kPythonTag.compare(0, text_.size(), text_) == 0) return "";
    plain_ = true;
  }
  std::string out = text_.substr(sent_, upto - sent_);
  sent_ = upto;
  return out;
}

}  // namespace mt::serve
