// GLUE's metrics from a confusion matrix (classification_metrics), against the textbook formulas
// computed by hand: binary F1 of label 1, Matthews' correlation (binary, and Gorodkin's multiclass
// form), and scikit-learn's zero cases (no positives: F1 0; a constant prediction: MCC 0).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "base/error.h"
#include "data/classification.h"

namespace mt::data {
namespace {

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
