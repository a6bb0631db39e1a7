// serve/tool_parser: the calls vLLM's hermes and llama3_json parsers find in an answer (their
// behaviour read from vllm/entrypoints/openai/tool_parsers/, stop 77), the arguments written as
// Python's json.dumps(ensure_ascii=False) writes them, and the streamed content's hold-back.
#include <gtest/gtest.h>

#include <optional>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "serve/tool_parser.h"

namespace mt::serve {
namespace {

using ojson = nlohmann::ordered_json;

ParsedToolCalls hermes(const std::string& text) { return parse_tool_calls(ToolCallFormat::kHermes, text); }
ParsedToolCalls llama(const std::string& text) { return parse_tool_calls(ToolCallFormat::kLlama3Json, text); }

// The calls found, each {name, arguments} in order, and the content (nullopt: null).
void expect_calls(const ParsedToolCalls& p, const std::vector<std::pair<std::string, std::string>>& calls,
                  const std::optional<std::string>& content = std::nullopt) {
  ASSERT_EQ(p.calls.size(), calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(p.calls[i].name, calls[i].first) << i;
    EXPECT_EQ(p.calls[i].arguments, calls[i].second) << i;
  }
  EXPECT_EQ(p.content, content);
}

void expect_content_only(const ParsedToolCalls& p, const std::string& text) {
  EXPECT_TRUE(p.calls.empty());
  ASSERT_TRUE(p.content.has_value());
  EXPECT_EQ(*p.content, text);
}

TEST(ToolParser, NamesAreHermesAndLlama3Json) {
  EXPECT_EQ(tool_call_format("hermes"), ToolCallFormat::kHermes);
  EXPECT_EQ(tool_call_format("llama3_json"), ToolCallFormat::kLlama3Json);
  try {
    tool_call_format("mistral");
    FAIL() << "mistral was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'mistral'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("hermes, llama3_json"), std::string::npos) << e.what();
  }
}

// Python: json.dumps({"b": [1, 2.5, None, True], "a": {"x": "é\n\""}}, ensure_ascii=False)
TEST(ToolParser, ArgumentsAreWrittenAsPythonsJsonDumps) {
  const ojson v = ojson::parse(R"({"b":[1,2.5,null,true],"a":{"x":"é\n\""},"e":{},"l":[]})");
  EXPECT_EQ(python_json_dumps(v), "{\"b\": [1, 2.5, null, true], \"a\": {\"x\": \"é\\n\\\"\"}, \"e\": {}, \"l\": []}");
  EXPECT_EQ(python_json_dumps(ojson::parse("1e2")), "100.0");      // json.loads("1e2") is a float
  EXPECT_EQ(python_json_dumps(ojson::parse("\"\\u001f\"")), "\"\\u001f\"");
}

TEST(ToolParser, HermesOneCall) {
  // Nothing before the block: the content is null.
  expect_calls(hermes("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
               {{"get_weather", "{\"city\": \"Paris\"}"}});
}

TEST(ToolParser, HermesTwoCallsAndTheTextBeforeThem) {
  expect_calls(hermes("Let me check both.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
                      "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"n\": 2}}\n</tool_call>"),
               {{"a", "{}"}, {"b", "{\"n\": 2}"}}, "Let me check both.\n");
  // The last block may lack its closing tag (the answer ended on the end of turn).
  expect_calls(hermes("<tool_call>\n{\"name\": \"a\", \"arguments\": {\"q\": 1}}\n"), {{"a", "{\"q\": 1}"}});
}

TEST(ToolParser, HermesNestedAndNonAsciiArgumentsKeepTheirOrder) {
  expect_calls(hermes("<tool_call>\n{\"name\": \"book\", \"arguments\": {\"to\": \"Zürich\", \"who\": {\"names\": [\"李雷\", "
                      "\"Ana\"], \"adults\": 2}, \"at\": null}}\n</tool_call>"),
               {{"book", "{\"to\": \"Zürich\", \"who\": {\"names\": [\"李雷\", \"Ana\"], \"adults\": 2}, \"at\": null}"}});
}

TEST(ToolParser, HermesMalformedBlocksLeaveTheAnswerAsContent) {
  for (const std::string text :
       {"<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": }\n</tool_call>",            // not JSON
        "ok <tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call><tool_call>{\"name\"",  // the second cut
        "<tool_call>\n{\"arguments\": {}}\n</tool_call>",                                  // no name
        "<tool_call>\n{\"name\": \"a\"}\n</tool_call>",                                    // no arguments
        "<tool_call>\n{\"name\": 5, \"arguments\": {}}\n</tool_call>",                     // a name that is no string
        "<tool_call>[1, 2]</tool_call>", "<tool_call></tool_call>"}) {
    SCOPED_TRACE(text);
    expect_content_only(hermes(text), text);
  }
  expect_content_only(hermes("No call here: {\"name\": \"a\", \"arguments\": {}}"), "No call here: {\"name\": \"a\", \"arguments\": {}}");
  expect_content_only(hermes(""), "");
}

TEST(ToolParser, Llama3JsonWithAndWithoutThePythonTag) {
  for (const std::string text : {"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
                                 "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}"}) {
    SCOPED_TRACE(text);
    expect_calls(llama(text), {{"get_weather", "{\"city\": \"Oslo\"}"}});
  }
}

TEST(ToolParser, Llama3JsonCallsSeparatedBySemicolonsParametersOrArguments) {
  // c: "arguments" first, as vLLM reads it.
  expect_calls(llama("{\"name\": \"a\", \"parameters\": {\"s\": \"x; y {z}\"}}; {\"name\": \"b\", \"arguments\": {\"n\": [1, {\"m\": 2}]}}"
                     ";{\"name\": \"c\", \"arguments\": {\"k\": 1}, \"parameters\": {\"k\": 2}}"),
               {{"a", "{\"s\": \"x; y {z}\"}"}, {"b", "{\"n\": [1, {\"m\": 2}]}"}, {"c", "{\"k\": 1}"}});
  EXPECT_EQ(llama("{\"name\": \"a\", \"parameters\": {}}; ").calls.size(), 1u);  // a trailing separator
}

TEST(ToolParser, Llama3JsonThatIsNotACallStaysContent) {
  for (const std::string text :
       {"The weather in Oslo is mild.", " {\"name\": \"a\", \"parameters\": {}}",  // text before the object
        "{\"name\": \"a\", \"parameters\": {}} and more", "{\"name\": \"a\", \"parameters\": {\"x\": 1}",  // cut short
        "{\"name\": \"a\"}", "{\"parameters\": {}}", "{\"name\": \"a\", \"parameters\": {}}; not json",
        "<|python_tag|>brave_search.call(query=\"x\")", "<|python_tag|>", "{not json}"}) {
    SCOPED_TRACE(text);
    expect_content_only(llama(text), text);
  }
}

TEST(ToolParser, CallIdsAreVllmsForm) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string id = tool_call_id();
    EXPECT_TRUE(std::regex_match(id, std::regex("chatcmpl-tool-[0-9a-f]{32}"))) << id;
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 100u);
}

// The streamed content, piece by piece, joined with what the end adds, is the content
// parse_tool_calls finds in the whole answer.
std::string stream(ToolCallFormat f, const std::vector<std::string>& pieces, std::vector<std::string>* out = nullptr) {
  ToolCallStream s(f);
  std::string joined;
  for (const std::string& p : pieces) {
    std::string got = s.add(p);
    if (out) out->push_back(got);
    joined += got;
  }
  EXPECT_EQ(s.released(), joined.size());
  return joined;
}

TEST(ToolParser, HermesStreamHoldsFromTheTagAndAPrefixOfIt) {
  std::vector<std::string> out;
  const std::string sent =
      stream(ToolCallFormat::kHermes, {"Sure", ", let me look. <to", "ol_c", "all>\n{\"name\"", ": \"a\", \"arguments\": {}}\n</tool_call>"}, &out);
  EXPECT_EQ(sent, "Sure, let me look. ");
  EXPECT_EQ(out[1], ", let me look. ");  // "<to" held
  EXPECT_EQ(out[2], "");
  // A "<" that turns out not to begin the tag goes out with the next piece.
  EXPECT_EQ(stream(ToolCallFormat::kHermes, {"a <", "b> c"}), "a <b> c");
  EXPECT_EQ(stream(ToolCallFormat::kHermes, {"x <tool_call"}), "x ");
}

TEST(ToolParser, Llama3JsonStreamDecidesAtTheStart) {
  EXPECT_EQ(stream(ToolCallFormat::kLlama3Json, {"{\"name\"", ": \"a\"}"}), "");
  EXPECT_EQ(stream(ToolCallFormat::kLlama3Json, {"<|py", "thon_tag|>{", "}"}), "");
  EXPECT_EQ(stream(ToolCallFormat::kLlama3Json, {"<|py", "x {"}), "<|pyx {");
  EXPECT_EQ(stream(ToolCallFormat::kLlama3Json, {"", "It is ", "{mild}"}), "It is {mild}");
}

}  // namespace
}  // namespace mt::serve
