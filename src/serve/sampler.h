// Next-token sampling from logits, with Hugging Face generate()'s warpers in its order:
// temperature, then top-k, then top-p (TopPLogitsWarper), then a draw.
//
//   temperature == 0: greedy, the argmax (ties: the lowest id); nothing is drawn.
//   otherwise       p = softmax(logits / temperature);
//                   top_k > 0: keep the top_k most likely ids (0: all);
//                   top_p < 1: renormalise the kept ids, sort them by probability, descending, and
//                              keep the shortest prefix whose mass reaches top_p (an id is kept
//                              iff the mass strictly before it is < top_p; the first always is);
//                   draw from the kept ids, renormalised.
// Ids are ranked by logit, descending, ties to the lower id, so top_k == 1 is greedy at any
// temperature. Draws use SplitMix64 (data/token_stream.h) seeded with `seed`: the same seed and
// logits give the same ids on every platform and thread count.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace mt::serve {

struct SamplingOptions {
  float temperature = 1.0f;  // >= 0; 0 = greedy
  int top_k = 0;             // >= 0; 0 = no limit
  float top_p = 1.0f;        // in [0, 1]; 1 = no limit
  uint64_t seed = 0;
  // Before temperature, in vLLM's order: logit_bias added (OpenAI's, each in [-100, 100]); then
  // repetition_penalty (Hugging Face's and vLLM's, > 0) over the prompt's and the drawn ids, each
  // such logit divided by it where positive and multiplied where not; then OpenAI's
  // frequency_penalty and presence_penalty (each in [-2, 2]) over the drawn ids: logit -= count ·
  // frequency + (count > 0) · presence. After top-k and top-p, min_p (vLLM's and HF's, in [0, 1])
  // keeps the ids whose probability is at least min_p times the largest's. The neutral values
  // change nothing (the draws are the same bits as without them).
  std::vector<std::pair<int32_t, float>> logit_bias = {};
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f, presence_penalty = 0.0f;
  float min_p = 0.0f;
  // Hugging Face's and TGI's typical_p (locally typical sampling, Meister et al.), in (0, 1], 1 =
  // off, after min_p: the ids ranked by how far their information -log p lies from the
  // distribution's entropy, closest first, and the shortest such prefix whose mass reaches
  // typical_p kept (the ids as far as the one where it is reached; at least one).
  float typical_p = 1.0f;
};

// Throws kInvalidArgument naming the field that is out of range.
void sampling_options_validate(const SamplingOptions& options);

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);  // validates

  // The prompt, whose ids repetition_penalty counts as seen.
  void set_prompt(std::span<const int32_t> prompt);
  // Returns the next id for logits (V), never one of `banned` (min_tokens' stop ids), and counts it
  // as drawn (the penalties). Throws kNumerical when a logit is NaN, kInvalidArgument when every id
  // is banned.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> banned = {});

  // probs (V) = the distribution sample() would draw from now (0 outside the kept ids; one 1 when
  // greedy).
  void distribution(std::span<const float> logits, std::vector<double>& probs, std::span<const int32_t> banned = {});

 private:
  // Fills kept_ (ids, in rank order when ranking is needed) and weights_ (unnormalised
  // probabilities of kept_). Returns their sum.
  double warp(std::span<const float> logits);
  // logits with logit_bias, the penalties and `banned` applied (into adjusted_), or logits itself
  // when none applies.
  std::span<const float> adjust(std::span<const float> logits, std::span<const int32_t> banned);
  bool adjusts() const;
  // A draw from kept_ / weights_ (their sum `total`).
  int32_t draw(double total);

  SamplingOptions options_;
  uint64_t state_;
  std::vector<int32_t> drawn_count_;  // per id: times drawn (frequency, presence)
  std::vector<char> seen_;            // per id: in the prompt or drawn (repetition)
  std::vector<float> adjusted_;
  std::vector<int32_t> kept_;
  std::vector<double> weights_;
};

// A token's log-probability under the model's own distribution (the log-softmax of the raw logits:
// before temperature, top-k and top-p, as vLLM reports them by default and as a loglikelihood
// evaluation needs them) and the `top` most likely ids with theirs (by logit, descending, ties to
// the lower id). OpenAI's logprobs / top_logprobs.
struct TokenLogprobs {
  int32_t id = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;
};
// The log-softmax is over every logit (the model's whole vocabulary, as Hugging Face's and vLLM's);
// the top ids are taken among the first `candidates` (the tokenizer's ids of a padded vocabulary;
// 0: all). Throws kNumerical when a logit is NaN or every logit is -inf.
// REQUIRES: 0 <= id < logits.size().
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t id, int top, size_t candidates = 0);

// The argmax of logits; ties go to the lowest id. REQUIRES: !logits.empty().
int32_t argmax(std::span<const float> logits);

}  // namespace mt::serve
