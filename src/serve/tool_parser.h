// Tool calls in a chat answer's text, as vLLM's tool parsers read them (`serve --tool-call-parser`):
//
//   hermes       Hermes 2 Pro / 3 and Qwen2.5: each call a block
//                  <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//                (the last may lack its closing tag); the content is the text before the first
//                block (null when empty); text after or between blocks is dropped.
//   llama3_json  Llama 3.1 / 3.2's JSON tool calling: the answer is an optional <|python_tag|>, then
//                one or more objects {"name": "f", "parameters" (or "arguments"): {...}} separated
//                by ";" (the model writes "; "); the content is null.
//
// A call whose JSON does not parse, or lacks its name or arguments, leaves the whole answer as
// content and no calls, as vLLM's parsers fall back. A call's arguments are written as Python's
// json.dumps(arguments, ensure_ascii=False) writes them (", " and ": " between items, non-ASCII
// kept), which is the string vLLM answers with.
//
// ToolCallStream decides, piece by piece, what of a streamed answer can go out as content before a
// call may have begun (hermes: at "<tool_call>"; llama3_json: an answer that starts with "{" or
// "<|python_tag|>"), so that the content streamed is the content parse_tool_calls finds in the
// whole answer.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::serve {

enum class ToolCallFormat { kHermes, kLlama3Json };

// The names --tool-call-parser takes, for messages: "hermes, llama3_json".
extern const char* const kToolCallParserNames;

// The format a --tool-call-parser name names. Throws Error(kInvalidArgument) for any other name,
// listing the known ones.
ToolCallFormat tool_call_format(const std::string& name);

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text, as python_json_dumps writes it
};

struct ParsedToolCalls {
  std::vector<ToolCall> calls;         // empty: the answer is content alone
  std::optional<std::string> content;  // the message's content; nullopt is JSON null
};

// The calls in an answer's whole text, and the content beside them.
ParsedToolCalls parse_tool_calls(ToolCallFormat format, const std::string& text);

// Python's json.dumps(value, ensure_ascii=False): ", " between items, ": " after keys, keys in the
// value's order, non-ASCII characters as they are.
std::string python_json_dumps(const nlohmann::ordered_json& value);

// A tool call's id as vLLM makes it: "chatcmpl-tool-" and 32 random hex digits (a UUID4's).
std::string tool_call_id();

class ToolCallStream {
 public:
  explicit ToolCallStream(ToolCallFormat format) : format_(format) {}
  // Takes the answer's next piece (the pieces concatenate to the answer); returns the content
  // that can go out now ("" while a call may be under way, or a prefix of its marker is pending).
  std::string add(const std::string& piece);
  // The bytes of the answer that add() has let out so far.
  size_t released() const { return sent_; }

 private:
  ToolCallFormat format_;
  std::string text_;      // the answer so far
  size_t sent_ = 0;       // text_[0, sent_) went out as content
  bool holding_ = false;  // a call may have begun at sent_: nothing more goes out
  bool plain_ = false;    // llama3_json: the answer's start says it is no call
};

}  // namespace mt::serve
