// Jinja2, as Hugging Face transformers renders a chat template (tokenizer_config.json's
// "chat_template", or chat_template.jinja): Jinja2's ImmutableSandboxedEnvironment with
// trim_blocks and lstrip_blocks on, the loopcontrols extension (break, continue), transformers'
// {% generation %} block (the assistant's spans, for a loss on them only), its globals
// raise_exception(message) and strftime_now(format), and its tojson filter (json.dumps with
// ensure_ascii false; indent, separators and sort_keys taken). Values are JSON values (a template's
// context is JSON: the messages, tools, the special tokens' strings), printed as Python prints
// them (True, None, ['a', 1]). An undefined name is Jinja2's default Undefined: it prints as "",
// is false, and fails on an attribute or a call. What the interpreter does not implement is refused
// when the template is parsed, by name and line; a template that fails renders nothing.
// Dict order: insertion order, as Python's dicts keep it: the context is an nlohmann::ordered_json,
// so tojson of a context object (a tool's schema, a call's arguments) lists its keys as the record
// gave them, as transformers does. Values are never mutated: list.pop and
// list.clear, which Jinja2 3.1's sandbox lets through, fail here like append. strftime_now uses the
// local time. Guards: macro calls nest at most 64 deep, a render takes at most 5M loop steps and
// calls, and no text or string exceeds 64 MiB (each an Error, not a crash).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::data {

class JinjaTemplate {
 public:
  // Parses source. Throws Error(kInvalidArgument) for a syntax error and Error(kNotSupported) for a
  // construct this interpreter lacks (extends, include, import, ...), each "chat template line N:
  // what".
  static JinjaTemplate parse(std::string_view source);

  struct Output {
    std::string text;
    // The byte ranges [begin, end) of text rendered inside {% generation %} ... {% endgeneration %}
    // blocks, in order (transformers' return_assistant_tokens_mask spans).
    std::vector<std::pair<size_t, size_t>> generation;
  };
  // Renders with context's keys as the template's variables (context must be a JSON object).
  // Throws Error(kInvalidArgument) "chat template: <message>" for raise_exception(message), and
  // for a runtime error (an undefined value's attribute, a type mismatch), naming the line.
  Output render(const nlohmann::ordered_json& context) const;

  // Whether the template has a {% generation %} block.
  bool has_generation() const;

  JinjaTemplate(JinjaTemplate&&) noexcept;
  JinjaTemplate& operator=(JinjaTemplate&&) noexcept;
  ~JinjaTemplate();

 private:
  struct Impl;
  explicit JinjaTemplate(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mt::data
