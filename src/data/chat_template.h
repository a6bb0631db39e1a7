// An Instruct model's chat template, as Hugging Face transformers reads and applies it: the Jinja
// source from the tokenizer's directory (chat_template.jinja, which transformers writes since 4.43
// and prefers; else tokenizer_config.json's "chat_template", a string or a list of named ones of
// which "default" is taken), rendered by data/jinja.h with the special tokens' strings
// (tokenizer_config.json's bos_token, eos_token, unk_token, pad_token, or special_tokens_map.json's)
// as apply_chat_template passes them. Its text is tokenized without the tokenizer's own special
// tokens (the template writes them: apply_chat_template's add_special_tokens false).
//
// Training (engine/corpus.h) takes two record forms of TRL's SFTTrainer:
//   {"messages": [{"role", "content"}, ...]}            conversational language modelling;
//   {"prompt": [messages], "completion": [messages]}    conversational prompt-completion.
// What is trained: in a conversation, each assistant turn as the template renders it (its content
// and the end-of-turn tokens after it: Llama 3's <|eot_id|>, ChatML's <|im_end|>), everything else
// masked, as TRL's assistant_only_loss (and axolotl's roles_to_train ["assistant"]) trains; in a
// prompt-completion record, everything after the prompt with its generation prompt, as TRL's
// completion_only_loss. A template with {% generation %} blocks marks the assistant's spans itself
// (transformers' return_assistant_tokens_mask); one without them is cut by rendering each
// conversation prefix (the conversation before an assistant turn with the generation prompt, then
// with the turn) and taking what the turn adds, which needs each prefix's text to begin the next's:
// a template that rewrites earlier turns (one that drops a past turn's reasoning) is refused so.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

// The messages, tools and special tokens are nlohmann::ordered_json: their keys keep the order the
// record gave them, as Python's dicts keep it (a tool's schema printed by tojson).
namespace mt::data {

class JinjaTemplate;

class ChatTemplate {
 public:
  // The template of a tokenizer's directory (dir: the directory of tokenizer.json or a GPT-2
  // vocabulary); nullptr when it has none. A template that does not parse is kept with its error,
  // which every render throws (a tokenizer used for plain text still loads).
  static std::shared_ptr<const ChatTemplate> load_dir(const std::string& dir);
  // A template from its source; special_tokens: {"bos_token": "<s>", ...} (strings).
  static std::shared_ptr<const ChatTemplate> from_source(const std::string& source, const nlohmann::ordered_json& special_tokens,
                                                         const std::string& origin);

  // Where it was read from (a file), for messages.
  const std::string& origin() const { return origin_; }
  const std::string& source() const { return source_; }
  // tokenizer_config.json's eos_token as a string ("" without one): an Instruct model's end of turn
  // (<|eot_id|>, <|im_end|>), which generation stops on as vLLM stops on the tokenizer's eos.
  std::string eos_token() const;

  // transformers' apply_chat_template(messages, tokenize=False, add_generation_prompt), with extra
  // keys (tools, ...) in the template's context. Throws Error(kInvalidArgument) with the template's
  // own message (raise_exception) or the render's error, naming origin().
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  // A conversation as text pieces that concatenate to render(messages, false, extra), each marked
  // trained (an assistant turn's) or not.
  std::vector<std::pair<std::string, bool>> conversation_pieces(const nlohmann::ordered_json& messages,
                                                                const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  // A prompt-completion record: render(prompt + completion, false), the part after
  // render(prompt, true) trained.
  std::vector<std::pair<std::string, bool>> prompt_completion_pieces(const nlohmann::ordered_json& prompt,
                                                                     const nlohmann::ordered_json& completion,
                                                                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  ChatTemplate(const ChatTemplate&) = delete;
  ChatTemplate& operator=(const ChatTemplate&) = delete;
  ~ChatTemplate();

 private:
  ChatTemplate();
  std::string origin_, source_, parse_error_;
  nlohmann::ordered_json special_;  // the special tokens' strings, as the template's variables
  std::unique_ptr<JinjaTemplate> tmpl_;
};

// Checks one message as OpenAI's API, TRL's records and the templates take it: an object with a
// string "role" and a "content" that is a string, or a list of {"type": "text", "text": str} parts
// (joined by "\n", as vLLM joins them), or null on an assistant turn. Returns the message with its
// content a string. Throws Error(kInvalidArgument) naming where.
nlohmann::ordered_json chat_message_normalized(const nlohmann::ordered_json& message, const std::string& where);

}  // namespace mt::data
