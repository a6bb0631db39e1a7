// A tiny GPT-2 or LLaMA (grouped-query: 4 heads over 2 kv heads, untied head) for the models/ tests.
#pragma once

#include "models/config.h"

namespace mt::models {

inline ModelConfig tiny(Arch arch) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 97;
  c.hidden = 32;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = arch == Arch::kGpt2 ? 4 : 2;
  c.intermediate = arch == Arch::kGpt2 ? 128 : 64;
  c.max_positions = 32;
  c.tie_embeddings = arch == Arch::kGpt2;
  return c;
}

}  // namespace mt::models
