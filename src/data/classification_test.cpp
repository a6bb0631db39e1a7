// GLUE's metrics from a confusion matrix (classification_metrics), against the textbook formulas
// computed by hand: binary F1 of label 1, Matthews' correlation (binary, and Gorodkin's multiclass
// form), and scikit-learn's zero cases (no positives: F1 0; a constant prediction: MCC 0).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include <fstream>
#include <string>

#include "base/error.h"
#include "base/scratch_dir.h"
#include "data/classification.h"

namespace mt::data {
namespace {

// A batch's rows: its longest record cut at T, rounded up to the multiple, at most T; a pair cut at
// that length keeps the tokens it has at T (the pooled position with them).
TEST(ClassificationBatchLength, TheLongestRecordRoundedUpAndAtMostT) {
  ClassificationExample a, b, pair;
  a.tokens.assign(3, 5);
  b.tokens.assign(17, 6);
  pair.tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  pair.first = 12;
  const ClassificationExample* rows[] = {&a, nullptr, &b};
  EXPECT_EQ(classification_batch_length(rows, 3, 48), 24);
  EXPECT_EQ(classification_batch_length(rows, 3, 20), 20);
  EXPECT_EQ(classification_batch_length(rows, 3, 48, 1), 17);
  EXPECT_EQ(classification_batch_length(rows, 1, 48), 8);
  const ClassificationExample* none[] = {nullptr, nullptr};
  EXPECT_EQ(classification_batch_length(none, 2, 48), 8);
  EXPECT_EQ(classification_batch_length(none, 2, 5), 5);
  // Longer rows round coarser: at most about 17 lengths a run.
  EXPECT_EQ(classification_length_multiple(128), 8);
  EXPECT_EQ(classification_length_multiple(512), 32);
  EXPECT_EQ(classification_length_multiple(1024), 64);
  EXPECT_EQ(classification_batch_length(rows, 3, 1024), 64);
  const ClassificationExample* pairs[] = {&pair};
  for (int T : {10, 16, 20, 48}) {
    const int L = classification_batch_length(pairs, 1, T);
    EXPECT_EQ(classification_row(pair, L), classification_row(pair, T)) << T;
    EXPECT_EQ(classification_pool(pair, L, 0), classification_pool(pair, T, 0)) << T;
  }
}

TEST(ClassificationMetrics, GlueF1AndMatthewsAreTheTextbookFormulas) {
  // Rows true, columns predicted: TN 5, FP 2, FN 1, TP 4.
  ClassificationMetrics m = classification_metrics({5, 2, 1, 4}, 2);
  EXPECT_DOUBLE_EQ(m.accuracy, 9.0 / 12.0);
  EXPECT_DOUBLE_EQ(m.f1, 8.0 / 11.0);  // 2TP / (2TP + FP + FN)
  EXPECT_NEAR(m.mcc, (4.0 * 5 - 2.0 * 1) / std::sqrt(6.0 * 5 * 7 * 6), 1e-15);
  // Three labels: c·s − Σ p_k t_k = 8·12 − 48 over sqrt((144 − 48)(144 − 48)) = 0.5; no binary F1.
  m = classification_metrics({3, 1, 0, 1, 2, 1, 0, 1, 3}, 3);
  EXPECT_DOUBLE_EQ(m.accuracy, 8.0 / 12.0);
  EXPECT_DOUBLE_EQ(m.mcc, 0.5);
  EXPECT_TRUE(std::isnan(m.f1));
  // Everything predicted 0: F1 0, and MCC 0 (a constant prediction).
  m = classification_metrics({5, 0, 3, 0}, 2);
  EXPECT_EQ(m.f1, 0.0);
  EXPECT_EQ(m.mcc, 0.0);
  m = classification_metrics({5, 0, 0, 0}, 2);  // no positive anywhere
  EXPECT_EQ(m.f1, 0.0);
  EXPECT_EQ(m.accuracy, 1.0);
  // Perfect and inverted predictions: MCC 1 and -1.
  EXPECT_DOUBLE_EQ(classification_metrics({3, 0, 0, 2}, 2).mcc, 1.0);
  EXPECT_DOUBLE_EQ(classification_metrics({0, 3, 2, 0}, 2).mcc, -1.0);
  EXPECT_THROW(classification_metrics({1, 2, 3}, 2), Error);
}

}  // namespace
}  // namespace mt::data

namespace mt::data {
namespace {

// STS-B's correlations (scipy's pearsonr and spearmanr) on values worked by hand.
TEST(RegressionMetrics, PearsonAndSpearmanAreTheTextbookFormulasWithTiesAtTheirMeanRank) {
  // y is x with two neighbours swapped twice: deviations -2..2 and (-1, -2, 1, 0, 2): 8 / 10.
  RegressionMetrics m = regression_metrics({1, 2, 3, 4, 5}, {2, 1, 4, 3, 5});
  EXPECT_NEAR(m.pearson, 0.8, 1e-15);
  EXPECT_NEAR(m.spearman, 0.8, 1e-15);
  // Ranks of (10, 20, 20, 30) are (1, 2.5, 2.5, 4); of (1, 9, 4, 16) (1, 3, 2, 4): 4.5 / sqrt(4.5 · 5).
  m = regression_metrics({10, 20, 20, 30}, {1, 9, 4, 16});
  EXPECT_NEAR(m.spearman, 3.0 / std::sqrt(10.0), 1e-15);
  // Pearson's of the values themselves: deviations (-10, 0, 0, 10) and (-6.5, 1.5, -3.5, 8.5).
  EXPECT_NEAR(m.pearson, 150.0 / std::sqrt(200.0 * 129.0), 1e-15);
  // A monotone map keeps Spearman's at 1 where Pearson's falls below it.
  m = regression_metrics({1, 2, 3, 4}, {1, 8, 27, 64});
  EXPECT_NEAR(m.spearman, 1.0, 1e-15);
  EXPECT_LT(m.pearson, 0.99);
  // A constant side has no correlation: NaN, as scipy gives.
  m = regression_metrics({3, 3, 3}, {1, 2, 3});
  EXPECT_TRUE(std::isnan(m.pearson));
  EXPECT_TRUE(std::isnan(m.spearman));
  EXPECT_THROW(regression_metrics({1}, {1}), Error);
  // A NaN prediction (a diverged run): both NaN, as scipy gives (its ranks were finite before).
  m = regression_metrics({1, std::nan(""), 3}, {1, 2, 3});
  EXPECT_TRUE(std::isnan(m.pearson));
  EXPECT_TRUE(std::isnan(m.spearman));
  // Multi-label's micro F1: TP 3, FP 1, FN 2 -> 6 / 9; nothing positive -> 0.
  EXPECT_DOUBLE_EQ(micro_f1(3, 1, 2), 6.0 / 9.0);
  EXPECT_EQ(micro_f1(0, 0, 0), 0.0);
}

// Labels as run_classification.py takes them: a regression's number, string of one or list of
// num_labels numbers; a multi-label record's list of indices or names, as 0/1 values; -1 (GLUE's
// unlabelled test rows, STS-B's -1.0) none only where labels are not required; each refusal names
// file:line.
TEST(ClassificationRead, ValuesAndLabelSetsAsRunClassificationTakesThem) {
  ScratchDir d("mt_classification_read");
  const Tokenizer tok = Tokenizer::train("a b c d e f", 260);
  auto read = [&](const std::string& lines, int L, LabelKind kind, bool required = true) {
    std::ofstream(d.file("r.jsonl")) << lines;
    ClassificationFields f;
    f.labels = {"x", "y", "z"};
    return classification_read(d.file("r.jsonl"), tok, f, L, required, kind);
  };
  auto refusal = [&](const std::string& lines, int L, LabelKind kind) {
    try {
      read(lines, L, kind);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  auto v = read("{\"text\": \"a b\", \"label\": 3.25}\n{\"text\": \"c\", \"label\": \"-0.5\"}\n{\"text\": \"d\", \"label\": [4]}\n", 1,
                LabelKind::kValues);
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0].values, std::vector<float>{3.25f});
  EXPECT_EQ(v[1].values, std::vector<float>{-0.5f});
  EXPECT_EQ(v[2].values, std::vector<float>{4.0f});
  EXPECT_EQ(v[0].label, 0);
  v = read("{\"text\": \"a\", \"label\": [1, 2.5]}\n", 2, LabelKind::kValues);
  EXPECT_EQ(v[0].values, (std::vector<float>{1.0f, 2.5f}));
  v = read("{\"text\": \"a\", \"label\": [2, \"x\"]}\n{\"text\": \"b\", \"label\": []}\n", 3, LabelKind::kLabelSet);
  EXPECT_EQ(v[0].values, (std::vector<float>{1.0f, 0.0f, 1.0f}));
  EXPECT_EQ(v[1].values, (std::vector<float>{0.0f, 0.0f, 0.0f}));
  // STS-B's test split: every label -1.0, none a label; beside other values -1 is a value.
  v = read("{\"text\": \"a\", \"label\": -1.0}\n{\"text\": \"b\", \"label\": -1}\n", 1, LabelKind::kValues, false);
  for (const auto& e : v) {
    EXPECT_EQ(e.label, -1);
    EXPECT_TRUE(e.values.empty());
  }
  v = read("{\"text\": \"a\", \"label\": -1.0}\n{\"text\": \"b\", \"label\": 0.5}\n", 1, LabelKind::kValues, false);
  EXPECT_EQ(v[0].values, std::vector<float>{-1.0f});
  EXPECT_EQ(v[1].values, std::vector<float>{0.5f});
  v = read("{\"text\": \"a\", \"label\": -1.0}\n", 1, LabelKind::kValues);  // a value where one is required
  EXPECT_EQ(v[0].values, std::vector<float>{-1.0f});
  v = read("{\"text\": \"a\", \"label\": -1}\n{\"text\": \"b\", \"label\": [1]}\n", 3, LabelKind::kLabelSet, false);
  EXPECT_EQ(v[0].label, -1);
  EXPECT_EQ(v[1].values, (std::vector<float>{0.0f, 1.0f, 0.0f}));
  // Strings of numbers as Python's float() reads them.
  v = read("{\"text\": \"a\", \"label\": \" +1.5 \"}\n", 1, LabelKind::kValues);
  EXPECT_EQ(v[0].values, std::vector<float>{1.5f});
  EXPECT_NE(refusal("{\"text\": \"a\", \"label\": \"+\"}\n", 1, LabelKind::kValues).find("label \"+\" is not a number"), std::string::npos);
  // A multi-hot row read as indices names a label twice: refused, not read as other labels.
  EXPECT_NE(refusal("{\"text\": \"a\", \"label\": [0, 1, 1]}\n", 3, LabelKind::kLabelSet)
                .find("r.jsonl:1: label [0,1,1] names 1 twice; a list holds the labels' indices or names"),
            std::string::npos);
  EXPECT_NE(refusal("{\"text\": \"a\", \"label\": [\"x\", 0]}\n", 3, LabelKind::kLabelSet).find("names 0 twice"), std::string::npos);
  EXPECT_NE(refusal("{\"text\": \"a\", \"label\": [1]}\n", 2, LabelKind::kValues).find("r.jsonl:1: label [1] holds 1 values; model.num_labels is 2"),
            std::string::npos);
  EXPECT_NE(refusal("{\"text\": \"a\", \"label\": 1e300}\n", 1, LabelKind::kValues).find("r.jsonl:1: label 1e+300 is not a finite number"),
            std::string::npos);
  EXPECT_NE(refusal("\n{\"text\": \"a\", \"label\": 2}\n", 2, LabelKind::kValues).find("r.jsonl:2: label 2 is one value; model.num_labels 2"),
            std::string::npos);
  EXPECT_NE(refusal("{\"text\": \"a\", \"label\": [\"w\"]}\n", 3, LabelKind::kLabelSet).find("r.jsonl:1: label \"w\" is not one of data.labels"),
            std::string::npos);
  EXPECT_NE(refusal("{\"text\": \"a\", \"label\": [3]}\n", 3, LabelKind::kLabelSet).find("r.jsonl:1: label 3 is outside [0, 3)"),
            std::string::npos);
  EXPECT_NE(refusal("{\"text\": \"a\", \"label\": \"x\"}\n", 3, LabelKind::kLabelSet).find("is not a list of labels"), std::string::npos);
  EXPECT_NE(refusal("{\"text\": \"a\"}\n", 1, LabelKind::kValues).find("r.jsonl:1: no \"label\""), std::string::npos);
}

}  // namespace
}  // namespace mt::data
