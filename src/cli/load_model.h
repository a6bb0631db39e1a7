// The model sources `generate` and `serve` read: a training checkpoint (step-N directory, or a
// save_dir whose `latest` names one, whole or sharded) or a Hugging Face directory (config.json +
// model.safetensors, as `export --hf` writes).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "models/transformer.h"

namespace mt::cli {

struct LoadedModel {
  std::unique_ptr<models::TransformerLM> model;
  std::string tokenizer;  // the tokenizer the source names; "" when it names none
  // A Hugging Face config.json's eos_token_id (one id or a list): generation stops there as at the
  // tokenizer's <|endoftext|> (it was read past).
  std::vector<int32_t> eos_ids;
  // A Hugging Face classifier's config.json: pad_token_id (-1: none; it pools at the last token
  // that is not this id) and id2label's names where they are not the defaults LABEL_i.
  int32_t pad_id = -1;
  std::vector<std::string> label_names;
};

LoadedModel load_model(const std::string& path);
// generate and serve: a sequence classifier (num_labels > 0) is refused, naming `predict` (it
// generated text from the score head's logits, exit 0).
void require_causal_lm(const LoadedModel& lm, const std::string& path, const char* command);

// The tokenizer for a loaded model: `override` when given, else the one the source names. Throws
// kInvalidArgument when there is none or it has more tokens than the model's vocabulary.
data::Tokenizer load_model_tokenizer(const LoadedModel& lm, const std::string& path, const std::string& override);

// generate's and serve's --dtype: the GEMMs' weights, f32 (fp32, float32) or bf16 (bfloat16).
// Throws kInvalidArgument naming the flag otherwise.
DType weights_dtype(const std::string& name);

}  // namespace mt::cli
