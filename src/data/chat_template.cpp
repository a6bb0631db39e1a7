#include "data/chat_template.h"

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>

#include "base/error.h"
#include "data/jinja.h"

namespace mt::data {
namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  MT_CHECK(in.good(), ErrorKind::kIOError, p.string() + ": cannot be read");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

json read_json(const fs::path& p) {
  try {
    return json::parse(read_text(p));
  } catch (const json::exception& e) {
    throw Error(ErrorKind::kCorruption, p.string() + ": not valid JSON (" + e.what() + ")");
  }
}

// A special token as tokenizer_config.json spells it: a string, or an AddedToken's dict.
bool token_string(const json& v, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return true;
  }
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    *out = v["content"].get<std::string>();
    return true;
  }
  return false;
}

}  // namespace

ChatTemplate::ChatTemplate() = default;
ChatTemplate::~ChatTemplate() = default;

std::shared_ptr<const ChatTemplate> ChatTemplate::from_source(const std::string& source, const json& special_tokens,
                                                              const std::string& origin) {
  std::shared_ptr<ChatTemplate> t(new ChatTemplate());
  t->origin_ = origin;
  t->source_ = source;
  t->special_ = special_tokens.is_object() ? special_tokens : json::object();
  try {
    t->tmpl_ = std::make_unique<JinjaTemplate>(JinjaTemplate::parse(source));
  } catch (const Error& e) {
    t->parse_error_ = e.what();
  }
  return t;
}

std::shared_ptr<const ChatTemplate> ChatTemplate::load_dir(const std::string& dir) {
  const fs::path d(dir);
  const fs::path config = d / "tokenizer_config.json", jinja_file = d / "chat_template.jinja",
                 special_map = d / "special_tokens_map.json";
  std::error_code ec;
  json cfg = fs::is_regular_file(config, ec) ? read_json(config) : json::object();
  if (!cfg.is_object()) cfg = json::object();
  std::string source, origin;
  if (fs::is_regular_file(jinja_file, ec)) {
    source = read_text(jinja_file);
    origin = jinja_file.string();
  } else if (cfg.contains("chat_template") && !cfg["chat_template"].is_null()) {
    const json& ct = cfg["chat_template"];
    origin = config.string();
    if (ct.is_string()) {
      source = ct.get<std::string>();
    } else if (ct.is_array()) {
      // Named templates (Cohere's "default", "tool_use", "rag"): the default one, as
      // apply_chat_template takes it when no name is given.
      for (const json& named : ct)
        if (named.is_object() && named.value("name", json()) == "default" && named.contains("template") &&
            named["template"].is_string())
          source = named["template"].get<std::string>();
      MT_CHECK(!source.empty(), ErrorKind::kNotSupported,
               origin + ": \"chat_template\" is a list of named templates without a \"default\" one");
    } else {
      throw Error(ErrorKind::kCorruption, origin + ": \"chat_template\" must be a string or a list of {name, template}");
    }
  } else {
    return nullptr;
  }
  json special = json::object();
  const json map = fs::is_regular_file(special_map, ec) ? read_json(special_map) : json::object();
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    std::string s;
    // tokenizer_config.json's first (transformers' init kwargs), then special_tokens_map.json's.
    if ((cfg.contains(key) && token_string(cfg[key], &s)) || (map.is_object() && map.contains(key) && token_string(map[key], &s)))
      special[key] = s;
  }
  for (const json* src : std::initializer_list<const json*>{&cfg, &map}) {
    if (!src->is_object() || !src->contains("additional_special_tokens") || special.contains("additional_special_tokens"))
      continue;
    json list = json::array();
    for (const json& v : (*src)["additional_special_tokens"]) {
      std::string s;
      if (token_string(v, &s)) list.push_back(s);
    }
    special["additional_special_tokens"] = list;
  }
  return from_source(source, special, origin);
}

std::string ChatTemplate::eos_token() const {
  return special_.contains("eos_token") ? special_["eos_token"].get<std::string>() : std::string();
}

std::string ChatTemplate::render(const json& messages, bool add_generation_prompt, const json& extra) const {
  MT_CHECK(tmpl_ != nullptr, ErrorKind::kNotSupported, origin_ + ": the chat template cannot be used: " + parse_error_);
  json ctx = special_;
  for (auto it = extra.begin(); it != extra.end(); ++it) ctx[it.key()] = it.value();
  ctx["messages"] = messages;
  ctx["add_generation_prompt"] = add_generation_prompt;
  try {
    return tmpl_->render(ctx).text;
  } catch (const Error& e) {
    throw Error(e.kind() == ErrorKind::kNotSupported ? ErrorKind::kNotSupported : ErrorKind::kInvalidArgument,
                origin_ + ": " + e.what());
  }
}

namespace {

// Cuts text into pieces at the trained spans (sorted, disjoint byte ranges).
std::vector<std::pair<std::string, bool>> cut(const std::string& text, const std::vector<std::pair<size_t, size_t>>& spans) {
  std::vector<std::pair<std::string, bool>> pieces;
  size_t at = 0;
  for (const auto& [b, e] : spans) {
    if (b > at) pieces.emplace_back(text.substr(at, b - at), false);
    if (e > b) pieces.emplace_back(text.substr(b, e - b), true);
    at = std::max(at, e);
  }
  if (at < text.size()) pieces.emplace_back(text.substr(at), false);
  return pieces;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

std::vector<std::pair<std::string, bool>> ChatTemplate::conversation_pieces(const json& messages, const json& extra) const {
  MT_CHECK(messages.is_array() && !messages.empty(), ErrorKind::kInvalidArgument,
           "\"messages\" must be a non-empty list of {\"role\", \"content\"}");
  MT_CHECK(tmpl_ != nullptr, ErrorKind::kNotSupported, origin_ + ": the chat template cannot be used: " + parse_error_);
  if (tmpl_->has_generation()) {
    json ctx = special_;
    for (auto it = extra.begin(); it != extra.end(); ++it) ctx[it.key()] = it.value();
    ctx["messages"] = messages;
    ctx["add_generation_prompt"] = false;
    JinjaTemplate::Output out;
    try {
      out = tmpl_->render(ctx);
    } catch (const Error& e) {
      throw Error(ErrorKind::kInvalidArgument, origin_ + ": " + e.what());
    }
    return cut(out.text, out.generation);
  }
  const std::string full = render(messages, false, extra);
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].is_object() || messages[i].value("role", json()) != "assistant") continue;
    const json before(json::array_t(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i)));
    const json upto(json::array_t(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i) + 1));
    // Before a first assistant turn, the empty conversation with the generation prompt (it was
    // taken as "", and the template's default system prompt and header were trained with the turn).
    std::string asked;
    try {
      asked = render(before, true, extra);
    } catch (const Error& e) {
      if (i != 0) throw;
      throw Error(ErrorKind::kNotSupported,
                  origin_ + ": messages[0] is an assistant turn, and the template cannot render the empty conversation "
                            "before it, so the turn's tokens cannot be told apart (" + e.what() + ")");
    }
    const std::string answered = render(upto, false, extra);
    MT_CHECK(starts_with(answered, asked) && starts_with(full, answered), ErrorKind::kNotSupported,
             origin_ + ": the chat template does not render messages[" + std::to_string(i) +
                 "] (an assistant turn) after the conversation before it as that conversation's text continued (it "
                 "rewrites earlier turns, or writes the generation prompt whatever add_generation_prompt says, as the "
                 "base Llama 3's does), so the turn's tokens cannot be told apart; an Instruct model's template, or one "
                 "with {% generation %} blocks around the assistant's turns, marks them");
    spans.emplace_back(asked.size(), answered.size());
  }
  return cut(full, spans);
}

std::vector<std::pair<std::string, bool>> ChatTemplate::prompt_completion_pieces(const json& prompt, const json& completion,
                                                                                 const json& extra) const {
  MT_CHECK(prompt.is_array() && completion.is_array() && !completion.empty(), ErrorKind::kInvalidArgument,
           "a conversational prompt-completion record has \"prompt\" and \"completion\" lists of messages");
  json all = prompt;
  for (const json& m : completion) all.push_back(m);
  const std::string asked = render(prompt, true, extra), full = render(all, false, extra);
  MT_CHECK(starts_with(full, asked), ErrorKind::kNotSupported,
           origin_ + ": the chat template does not render the completion after the prompt as the prompt's text continued, "
                     "so the completion's tokens cannot be told apart");
  return cut(full, {{asked.size(), full.size()}});
}

json chat_message_normalized(const json& m, const std::string& where) {
  const std::string form = where + " must be {\"role\": string, \"content\": string or a list of text parts}";
  MT_CHECK(m.is_object() && m.contains("role") && m["role"].is_string() && m.contains("content"), ErrorKind::kInvalidArgument,
           form);
  json out = m;
  const json& c = m["content"];
  if (c.is_string()) return out;
  if (c.is_null()) {
    MT_CHECK(m["role"] == "assistant", ErrorKind::kInvalidArgument, where + ": only an assistant turn may have a null content");
    return out;
  }
  MT_CHECK(c.is_array(), ErrorKind::kInvalidArgument, form);
  std::string text;
  for (size_t k = 0; k < c.size(); ++k) {
    const json& part = c[k];
    MT_CHECK(part.is_object() && part.value("type", json()) == "text" && part.contains("text") && part["text"].is_string(),
             ErrorKind::kInvalidArgument,
             where + ".content[" + std::to_string(k) + "]: only {\"type\": \"text\", \"text\": string} parts are supported");
    if (k > 0) text += "\n";
    text += part["text"].get<std::string>();
  }
  out["content"] = text;
  return out;
}

}  // namespace mt::data
