// meshtrain generate MODEL --prompt TEXT: samples a continuation with the KV-cache generator
// (serve/generator.h). MODEL is a training checkpoint (step-N directory, or a save_dir whose
// `latest` names one) or a Hugging Face directory (config.json + model.safetensors, as `export
// --hf` writes). The tokenizer is --tokenizer, else the run's data.tokenizer recorded in the
// checkpoint, else the tokenizer files in MODEL. Sampling: --temperature 0 is greedy; --top-k, --top-p
// as Hugging Face's warpers; --seed makes a draw reproducible. Stops at <|endoftext|>, the model's
// eos ids and the chat template's end of turn. --chat takes the prompt as a user's message (with
// --system before it), laid out by the tokenizer's chat template with its generation prompt, or by
// data/chat.h's layout without one, and prints the answer alone.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "base/error.h"
#include "base/timer.h"
#include "cli/commands.h"
#include "cli/load_model.h"
#include "data/chat.h"
#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "serve/generator.h"

namespace mt::cli {
namespace fs = std::filesystem;
namespace {

struct GenerateArgs {
  std::string model, prompt, tokenizer, system;
  bool chat = false;
  int max_new_tokens = 100;
  serve::SamplingOptions sampling;
  bool quiet = false;
  std::string dtype = "f32";  // the matrices' dtype in the GEMMs (f32, bf16)
};

void run_generate(const GenerateArgs& a) {
  MT_CHECK(a.max_new_tokens > 0, ErrorKind::kInvalidArgument, "--max-new-tokens must be positive");
  const DType weights = weights_dtype(a.dtype);  // before the checkpoint loads
  serve::sampling_options_validate(a.sampling);
  LoadedModel lm = load_model(a.model);
  require_causal_lm(lm, a.model, "generate");
  data::Tokenizer tok = load_model_tokenizer(lm, a.model, a.tokenizer);
  // With the special tokens a tokenizer.json's template adds (Llama 3's <|begin_of_text|>), as
  // Hugging Face's tokenizer(prompt) and vLLM's completions encode a prompt.
  MT_CHECK(a.chat || a.system.empty(), ErrorKind::kInvalidArgument, "--system needs --chat");
  std::vector<int32_t> prompt;
  if (!a.chat) {
    prompt = tok.encode_with_special(a.prompt);
  } else if (tok.chat_template() != nullptr) {
    // As transformers' apply_chat_template(add_generation_prompt=True) and vLLM's chat: the text
    // encoded without the tokenizer's special tokens, which the template writes.
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
    messages.push_back({{"role", "user"}, {"content", a.prompt}});
    prompt = tok.encode(tok.chat_template()->render(messages, true));
  } else {
    std::vector<std::string> pieces;
    if (!a.system.empty()) pieces.push_back(a.system + "\n");
    for (std::string& p : data::chat_prompt_pieces({}, a.prompt)) pieces.push_back(std::move(p));
    prompt = tok.special_before();
    for (const std::string& p : pieces) {
      const std::vector<int32_t> part = tok.encode(p);
      prompt.insert(prompt.end(), part.begin(), part.end());
    }
    prompt.insert(prompt.end(), tok.special_after().begin(), tok.special_after().end());
  }
  if (prompt.empty()) prompt.push_back(tok.eot_id());  // an empty prompt starts a new document (refused without one)
  if (const int32_t turn = tok.chat_end_of_turn_id();
      turn >= 0 && std::find(lm.eos_ids.begin(), lm.eos_ids.end(), turn) == lm.eos_ids.end())
    lm.eos_ids.push_back(turn);  // an Instruct tokenizer's end of turn, as vLLM stops on its eos
  serve::GeneratorOptions go;
  go.weights = weights;
  serve::Generator gen(*lm.model, go);
  MT_CHECK(static_cast<int>(prompt.size()) < gen.capacity(), ErrorKind::kInvalidArgument,
           "generate: the prompt is " + std::to_string(prompt.size()) + " tokens; the context of " +
               std::to_string(gen.capacity()) + " leaves no room for an answer");
  serve::Sampler sampler(a.sampling);
  Timer t;
  std::span<const float> logits = gen.prefill(prompt);
  if (!a.chat) std::printf("%s", a.prompt.c_str());
  int n = 0;
  bool full = false;
  for (; n < a.max_new_tokens; ++n) {
    // Never an id past the tokenizer's (a model vocabulary padded past it): it could not be decoded.
    int32_t id = sampler.sample(logits.first(std::min(logits.size(), static_cast<size_t>(tok.vocab_size()))));
    // A tokenizer without <|endoftext|> stops on the model's eos ids alone (it failed at the first token).
    if ((tok.has_eot() && id == tok.eot_id()) || std::find(lm.eos_ids.begin(), lm.eos_ids.end(), id) != lm.eos_ids.end())
      break;
    std::string piece = tok.decode(std::span<const int32_t>(&id, 1));
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    // The context holds the prompt and the answer, as vLLM's max_model_len and serve count it (the
    // token after a full context was drawn too: one more than serve's and the warning's count).
    if (gen.position() + 1 >= gen.capacity()) {  // the context is full: this token counted, none more
      ++n;
      full = n < a.max_new_tokens;
      break;
    }
    logits = gen.decode(id);
  }
  std::printf("\n");
  std::fflush(stdout);  // before stderr's lines: through one pipe they ran into the text
  // Said even with --quiet: the answer is shorter than asked for a reason other than the text's end.
  if (full)
    std::fprintf(stderr, "warning: the context is full at %d positions (the model's %s): stopped after %d of %d new tokens\n",
                 gen.capacity(), lm.model->config().arch == models::Arch::kGpt2 ? "n_positions" : "max_position_embeddings", n,
                 a.max_new_tokens);
  if (!a.quiet)
    std::fprintf(stderr, "%d prompt + %d new tokens in %.2f s (%.1f tokens/s)\n", static_cast<int>(prompt.size()), n,
                 t.seconds(), n / std::max(t.seconds(), 1e-9));
}

}  // namespace

void register_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate", "Sample text from a checkpoint or a Hugging Face model directory");
  cmd->add_option("MODEL", a->model, "checkpoint (step-N or save_dir) or HF directory (config.json + model.safetensors)")
      ->required();
  cmd->add_option("--prompt", a->prompt, "text to continue (with --chat: the user's message)")->required();
  cmd->add_flag("--chat", a->chat,
                "the prompt is a user's message, laid out by the tokenizer's chat template (tokenizer_config.json); "
                "prints the answer alone");
  cmd->add_option("--system", a->system, "with --chat: a system message before the user's");
  cmd->add_option("--max-new-tokens", a->max_new_tokens, "tokens to generate at most (default 100)");
  cmd->add_option("--temperature", a->sampling.temperature, "0 = greedy (default 1)");
  cmd->add_option("--top-k", a->sampling.top_k, "keep the k most likely tokens (0 = all)");
  cmd->add_option("--top-p", a->sampling.top_p, "keep the smallest set with this much probability (1 = all)");
  cmd->add_option("--seed", a->sampling.seed, "sampling seed (default 0)");
  cmd->add_option("--tokenizer", a->tokenizer, "tokenizer.json or GPT-2 vocabulary directory");
  cmd->add_flag("--quiet", a->quiet, "no timing line on stderr");
  cmd->add_option("--dtype", a->dtype, "the GEMMs' weights: f32 (default) or bf16 (copied once; half the bytes a step reads)");
  cmd->callback([a] { run_generate(*a); });
}

}  // namespace mt::cli
