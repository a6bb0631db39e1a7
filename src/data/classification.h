// Sequence-classification data: .jsonl records with one or two texts, a label and an id (the
// fields of the CLUE / AFQMC scripts: sentence1, sentence2, label, id), tokenized into examples,
// and batches in the layout of Hugging Face's *ForSequenceClassification: each row is the
// example's tokens (truncated to T) followed by padding, and the pooled position is its last
// token (HF pools at the last non-pad token). A batch's targets are -100 everywhere but at each
// row's pooled position, which holds the label, so the causal LM's loss path (the mean
// cross-entropy over targets that are not -100) is the classification loss.
//
// Text layout: text_a alone, or text_a + "\n" and text_b tokenized as two pieces.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace mt::data {

struct ClassificationFields {
  std::string text_a = "text";   // texta_name
  std::string text_b;            // textb_name; "" = single texts
  std::string label = "label";   // label_name
  std::string id = "id";         // id_name; a record without it gets its line number
  std::vector<std::string> labels;  // label names in index order; empty: labels are integers
                                    // (or strings of one, as "0" / "1")
};

struct ClassificationExample {
  std::string id;
  std::vector<int32_t> tokens;  // not empty
  int label = -1;               // -1: none (prediction input)
};

// Reads path (one JSON object a line; blank lines skipped). require_labels: every record must have
// a label in [0, num_labels). Throws kInvalidArgument naming path:line and the field.
std::vector<ClassificationExample> classification_read(const std::string& path, const Tokenizer& tokenizer,
                                                       const ClassificationFields& fields, int num_labels,
                                                       bool require_labels);

// tokens (B, T), targets (B, T) for the examples rows[0, B): each row's first min(n, T) tokens,
// then pad; targets -100 except the label at the row's last token. A null row is all padding with
// no target (the end of an epoch).
void classification_batch(const ClassificationExample* const* rows, int B, int T, int32_t pad, int32_t* tokens,
                          int32_t* targets);

// The pooled position of an example in a row of T.
inline int classification_pool(const ClassificationExample& e, int T) {
  return static_cast<int>(std::min<size_t>(e.tokens.size(), static_cast<size_t>(T))) - 1;
}

}  // namespace mt::data
