// Sequence-classification data: .jsonl records with one or two texts, a label and an id (the
// fields of the CLUE / AFQMC scripts: sentence1, sentence2, label, id), tokenized into examples,
// and batches in the layout of Hugging Face's *ForSequenceClassification: each row is the
// example's tokens (truncated to T as HF truncates) followed by padding, and the pooled position
// is its last token that is not the pad id (as HF pools). A batch's targets are -100 everywhere but at each
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

// What a record's label is (the classifier's problem_type): one class of num_labels; num_labels
// real values (regression: a number, a string of one, or a list of num_labels numbers); a set of
// the num_labels labels (multi-label: a list of label indices or data.labels names, any order, as
// run_classification.py takes them), kept as num_labels 0/1 values.
enum class LabelKind { kClass, kValues, kLabelSet };

struct ClassificationExample {
  std::string id;
  bool id_given = false;        // the record has the id field (else id is its line number)
  std::vector<int32_t> tokens;  // not empty
  size_t first = 0;             // a pair: the first text's tokens (text_a + "\n"); 0: one text
  int label = -1;               // -1: none (prediction input); kValues / kLabelSet: 0 when labelled
  std::vector<float> values;    // kValues / kLabelSet: num_labels values (the 0/1 labels of a set)
};

// Reads path (one JSON object a line; blank lines skipped). require_labels: every record must have
// a label (in [0, num_labels) for kClass); without it, a label of -1 (GLUE's test splits mark
// unlabelled rows so, STS-B's too) is none. Throws kInvalidArgument naming path:line and the field.
std::vector<ClassificationExample> classification_read(const std::string& path, const Tokenizer& tokenizer,
                                                       const ClassificationFields& fields, int num_labels,
                                                       bool require_labels, LabelKind kind = LabelKind::kClass);

// tokens (B, T), targets (B, T) for the examples rows[0, B): each row's first min(n, T) tokens,
// then pad; targets -100 except the label at the row's last token. A null row is all padding with
// no target (the end of an epoch).
// values (kValues / kLabelSet examples; null for kClass): the target at a labelled row's pooled
// position is first_value_row + b, and row b of values (num_labels each) gets the example's values
// (TransformerLM::set_label_values' rows).
void classification_batch(const ClassificationExample* const* rows, int B, int T, int32_t pad, int32_t* tokens,
                          int32_t* targets, float* values = nullptr, int num_labels = 0, int32_t first_value_row = 0);

// The tokens of an example in a row of T, truncated as Hugging Face's tokenizer(a, b,
// truncation=True, max_length=T) truncates (its default, "longest_first", in the tokenizers
// library's rule): one text keeps its first T; of a pair longer than T the shorter text is kept
// whole where it fits in half, the longer cut to the rest, else each keeps T / 2 and the odd one
// goes to the longer (to the second where the shorter alone fills T). A pair was cut at T as one
// text (a long first text left no second).
std::vector<int32_t> classification_row(const ClassificationExample& e, int T);

// The pooled position of an example in a row of T, as Hugging Face's *ForSequenceClassification
// finds it: the last token of the row that is not `pad` (the first position when every one is).
int classification_pool(const ClassificationExample& e, int T, int32_t pad);

// The row length a batch of records needs: its longest row (each cut at T), rounded up to a
// multiple of `multiple` (0: classification_length_multiple(T)), at most T and at least 1 (Hugging
// Face's DataCollatorWithPadding pads to the longest, and to a multiple with pad_to_multiple_of).
// Null rows count nothing. A row's tokens are the same cut at this length as at T (no record is
// longer than it unless it is T).
int classification_batch_length(const ClassificationExample* const* rows, size_t n, int T, int multiple = 0);
// The rounding of those lengths: 8, or T / 16 rounded up to 8 from T 144 on, so that a run meets
// at most about 17 lengths (each its own set of GEMM primitives, which oneDNN's cache keeps).
int classification_length_multiple(int T);

// The id rows are padded with: the tokenizer's <|endoftext|> (Hugging Face's GPT-2 fine-tuning
// sets pad_token_id = eos_token_id), else its last id. `export --hf` writes it as pad_token_id.
int32_t classification_pad(const Tokenizer& tokenizer);

// GLUE's metrics from a confusion matrix (confusion[true · L + predicted], counts), as Hugging
// Face's run_glue computes them with scikit-learn: accuracy; F1 of label 1 (f1_score's binary
// average, MRPC's and QQP's metric; only for L = 2, else NaN), 0 when it has no true or predicted
// positives (zero_division); Matthews' correlation (matthews_corrcoef, CoLA's metric; Gorodkin's
// form for L > 2), 0 when a marginal is constant.
struct ClassificationMetrics {
  double accuracy = 0.0, f1 = 0.0, mcc = 0.0;
};
ClassificationMetrics classification_metrics(const std::vector<double>& confusion, int L);

// STS-B's metrics as run_glue computes them (scipy's pearsonr and spearmanr over the predicted and
// true values): Pearson's correlation, and Spearman's (Pearson's of their ranks, ties at their
// mean rank); NaN where a side is constant, as scipy gives. Sizes equal, at least 2.
struct RegressionMetrics {
  double pearson = 0.0, spearman = 0.0;
};
RegressionMetrics regression_metrics(const std::vector<double>& predicted, const std::vector<double>& truth);

// Multi-label's metric as run_classification.py computes it (evaluate's f1, config "multilabel",
// average "micro": every label of every record counted together): 2 TP / (2 TP + FP + FN), 0 with
// no true or predicted positives (scikit-learn's zero_division).
double micro_f1(double tp, double fp, double fn);

}  // namespace mt::data
