// Fuzzes the chat-template interpreter (data/jinja.h, through data/chat_template.h as training and
// serving use it). Input: a template's source, then optionally a NUL byte and a JSON list of
// messages (the default conversation otherwise). The template is parsed, rendered with and without
// the generation prompt, and its conversation cut into trained pieces: each must return or throw
// mt::Error, and the pieces must join to the rendered text.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "data/chat_template.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* text = reinterpret_cast<const char*>(data);
  const void* nul = std::memchr(data, 0, size);
  const size_t split = nul ? static_cast<size_t>(static_cast<const uint8_t*>(nul) - data) : size;
  const std::string source(text, split);
  nlohmann::ordered_json messages = nlohmann::ordered_json::parse(
      R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi \"there\""},
          {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "東京?"},
          {"role": "assistant", "content": null, "tool_calls": [{"type": "function",
           "function": {"name": "f", "arguments": {"b": 1, "a": [true, 1.5]}}}]}])");
  if (split < size) {
    messages = nlohmann::ordered_json::parse(text + split + 1, text + size, nullptr, false);
    if (messages.is_discarded()) return 0;
  }
  const nlohmann::ordered_json special = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  auto t = mt::data::ChatTemplate::from_source(source, special, "fuzz");
  const nlohmann::ordered_json extra = {{"tools", nlohmann::ordered_json::array({{{"type", "function"}, {"name", "f"}}})}};
  mt::fuzz::expect_ok_or_error([&] { (void)t->render(messages, true, extra); });
  mt::fuzz::expect_ok_or_error([&] {
    const auto pieces = t->conversation_pieces(messages, extra);
    std::string joined;
    for (const auto& p : pieces) joined += p.first;
    if (joined != t->render(messages, false, extra)) __builtin_trap();  // the pieces are the text
  });
  return 0;
}
