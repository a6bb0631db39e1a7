#include "data/classification.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/file_io.h"

namespace mt::data {
namespace {

std::string text_field(const nlohmann::json& j, const std::string& key, const std::string& where) {
  MT_CHECK(j.contains(key) && j[key].is_string(), ErrorKind::kInvalidArgument,
           where + ": \"" + key + "\" must be a string (data.texta_name / textb_name)");
  return j[key].get<std::string>();
}

int label_field(const nlohmann::json& v, const ClassificationFields& f, int num_labels, const std::string& where,
                bool require_labels) {
  int label = -1;
  // GLUE's test splits (Hugging Face datasets) mark an unlabelled row with -1: none, where labels
  // are not required (predict refused the whole file); in training data it is an error below.
  if (v.is_number_integer() && v.get<int64_t>() == -1) {
    MT_CHECK(!require_labels, ErrorKind::kInvalidArgument,
             where + ": label -1 (an unlabelled row, as GLUE's test splits mark them) in data that trains or validates");
    return -1;
  }
  if (v.is_number_integer()) {
    // Checked before it is narrowed: 2^32 + 1 wrapped to label 1 and trained.
    const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() < static_cast<uint64_t>(num_labels)
                                             : v.get<int64_t>() >= 0 && v.get<int64_t>() < num_labels;
    MT_CHECK(fits, ErrorKind::kInvalidArgument,
             where + ": label " + v.dump() + " is outside [0, " + std::to_string(num_labels) + ") (model.num_labels)");
    label = static_cast<int>(v.get<int64_t>());
  } else if (v.is_string()) {
    const std::string s = v.get<std::string>();
    auto it = std::find(f.labels.begin(), f.labels.end(), s);
    if (it != f.labels.end()) {
      label = static_cast<int>(it - f.labels.begin());
    } else {
      auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), label);
      MT_CHECK(ec == std::errc() && end == s.data() + s.size() && f.labels.empty(), ErrorKind::kInvalidArgument,
               where + ": label \"" + s + "\" is " +
                   (f.labels.empty() ? "not an integer (name the labels in data.labels)" : "not one of data.labels"));
    }
  } else {
    throw Error(ErrorKind::kInvalidArgument, where + ": \"" + f.label + "\" must be an integer or a string");
  }
  MT_CHECK(label >= 0 && label < num_labels, ErrorKind::kInvalidArgument,
           where + ": label " + std::to_string(label) + " is outside [0, " + std::to_string(num_labels) +
               ") (model.num_labels)");
  return label;
}

// A regression record's values: a number, a string of one (CLUE writes numbers so), or a list of
// num_labels numbers; finite.
std::vector<float> value_field(const nlohmann::json& v, int num_labels, const std::string& where) {
  auto number = [&](const nlohmann::json& x) {
    double d = 0.0;
    if (x.is_number()) {
      d = x.get<double>();
    } else if (x.is_string()) {
      const std::string s = x.get<std::string>();
      // As Python's float() reads it: surrounding spaces and a leading '+' allowed.
      size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
      if (b != std::string::npos && s[b] == '+' && b < e) ++b;
      const char* first = s.data() + (b == std::string::npos ? s.size() : b);
      const char* last = s.data() + (e == std::string::npos ? s.size() : e + 1);
      auto [end, ec] = std::from_chars(first, last, d);
      MT_CHECK(ec == std::errc() && end == last && first != last, ErrorKind::kInvalidArgument,
               where + ": label \"" + s + "\" is not a number (a regression's value)");
    } else {
      throw Error(ErrorKind::kInvalidArgument, where + ": label " + x.dump() + " is not a number (a regression's value)");
    }
    MT_CHECK(std::isfinite(d) && std::fabs(d) <= std::numeric_limits<float>::max(), ErrorKind::kInvalidArgument,
             where + ": label " + x.dump() + " is not a finite number");
    return static_cast<float>(d);
  };
  std::vector<float> out;
  if (v.is_array()) {
    MT_CHECK(static_cast<int>(v.size()) == num_labels, ErrorKind::kInvalidArgument,
             where + ": label " + v.dump() + " holds " + std::to_string(v.size()) + " values; model.num_labels is " +
                 std::to_string(num_labels));
    for (const auto& x : v) out.push_back(number(x));
  } else {
    MT_CHECK(num_labels == 1, ErrorKind::kInvalidArgument,
             where + ": label " + v.dump() + " is one value; model.num_labels " + std::to_string(num_labels) +
                 " needs a list of that many");
    out.push_back(number(v));
  }
  return out;
}

// A multi-label record's labels: a list of label indices or data.labels names, as 0/1 values.
std::vector<float> label_set_field(const nlohmann::json& v, const ClassificationFields& f, int num_labels,
                                   const std::string& where) {
  MT_CHECK(v.is_array(), ErrorKind::kInvalidArgument,
           where + ": label " + v.dump() + " is not a list of labels (problem_type \"multi_label_classification\")");
  std::vector<float> out(static_cast<size_t>(num_labels), 0.0f);
  for (const auto& x : v) {
    MT_CHECK(!(x.is_number_integer() && x.get<int64_t>() == -1), ErrorKind::kInvalidArgument,
             where + ": label -1 inside a list of labels");
    float& seen = out[static_cast<size_t>(label_field(x, f, num_labels, where, true))];
    // A multi-hot row ([0, 1, 1]: a 0 or 1 per label) read as indices names some twice.
    MT_CHECK(seen == 0.0f, ErrorKind::kInvalidArgument,
             where + ": label " + v.dump() + " names " + x.dump() +
                 " twice; a list holds the labels' indices or names (a 0/1 row per label is not read)");
    seen = 1.0f;
  }
  return out;
}

}  // namespace

std::vector<ClassificationExample> classification_read(const std::string& path, const Tokenizer& tokenizer,
                                                       const ClassificationFields& fields, int num_labels,
                                                       bool require_labels, LabelKind kind) {
  std::vector<char> bytes = file_read_all(path);
  std::string text(bytes.begin(), bytes.end());
  std::vector<ClassificationExample> out;
  size_t pos = 0, line_no = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    nlohmann::json j;
    // nlohmann parses iteratively but dumps recursively: an id of 300000 nested brackets
    // overflowed the stack (a record nests a few levels; json_load_file's bound).
    constexpr int kMaxDepth = 1000;
    auto shallow = [&where](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
      MT_CHECK(depth <= kMaxDepth, ErrorKind::kInvalidArgument,
               where + ": JSON nested deeper than " + std::to_string(kMaxDepth) + " levels");
      return true;
    };
    try {
      j = nlohmann::json::parse(line, shallow);
    } catch (const nlohmann::json::exception&) {
      throw Error(ErrorKind::kInvalidArgument, where + ": not valid JSON");
    }
    MT_CHECK(j.is_object(), ErrorKind::kInvalidArgument, where + ": expected a JSON object");
    ClassificationExample e;
    if (j.contains(fields.id) && !j[fields.id].is_null()) {
      e.id = j[fields.id].is_string() ? j[fields.id].get<std::string>() : j[fields.id].dump();
      e.id_given = true;
    } else
      e.id = std::to_string(line_no);
    if (fields.text_b.empty()) {
      e.tokens = tokenizer.encode(text_field(j, fields.text_a, where));
    } else {
      e.tokens = tokenizer.encode(text_field(j, fields.text_a, where) + "\n");
      e.first = e.tokens.size();
      std::vector<int32_t> b = tokenizer.encode(text_field(j, fields.text_b, where));
      e.tokens.insert(e.tokens.end(), b.begin(), b.end());
    }
    MT_CHECK(!e.tokens.empty(), ErrorKind::kInvalidArgument, where + ": the text is empty");
    if (j.contains(fields.label) && !j[fields.label].is_null()) {
      const nlohmann::json& v = j[fields.label];
      if (kind == LabelKind::kClass) {
        e.label = label_field(v, fields, num_labels, where, require_labels);
      } else if (!require_labels && v.is_number() && v.get<double>() == -1.0 &&
                 (kind == LabelKind::kLabelSet || num_labels > 1)) {
        // GLUE's test splits' unlabelled rows, in data that only predicts (a regression's -1.0
        // is a value unless every record has it: below).
      } else {
        e.values = kind == LabelKind::kValues ? value_field(v, num_labels, where) : label_set_field(v, fields, num_labels, where);
        e.label = 0;
      }
    }
    MT_CHECK(!require_labels || e.label >= 0, ErrorKind::kInvalidArgument,
             where + ": no \"" + fields.label + "\" (data.label_name)");
    out.push_back(std::move(e));
  }
  MT_CHECK(!out.empty(), ErrorKind::kInvalidArgument, path + ": no records");
  // A file whose every label is -1 (STS-B's test split writes -1.0 for each) is unlabelled where
  // labels are not required; a file with other values too reads -1 as a value.
  if (!require_labels && kind == LabelKind::kValues && num_labels == 1 &&
      std::all_of(out.begin(), out.end(), [](const ClassificationExample& e) { return e.label >= 0 && e.values[0] == -1.0f; }))
    for (ClassificationExample& e : out) {
      e.label = -1;
      e.values.clear();
    }
  return out;
}

void classification_batch(const ClassificationExample* const* rows, int B, int T, int32_t pad, int32_t* tokens,
                          int32_t* targets, float* values, int num_labels, int32_t first_value_row) {
  for (int b = 0; b < B; ++b) {
    int32_t* tk = tokens + static_cast<size_t>(b) * T;
    int32_t* tg = targets + static_cast<size_t>(b) * T;
    std::fill(tk, tk + T, pad);
    std::fill(tg, tg + T, -100);
    if (rows[b] == nullptr) continue;
    const ClassificationExample& e = *rows[b];
    const std::vector<int32_t> row = classification_row(e, T);
    std::copy(row.begin(), row.end(), tk);
    if (e.label < 0) continue;
    if (values == nullptr) {  // a valued example without a table (logits only): no target
      if (e.values.empty()) tg[classification_pool(e, T, pad)] = e.label;
      continue;
    }
    MT_CHECK(e.values.size() == static_cast<size_t>(num_labels), ErrorKind::kInternal,
             "classification batch: record " + e.id + " has " + std::to_string(e.values.size()) + " values for " +
                 std::to_string(num_labels) + " labels");
    std::copy(e.values.begin(), e.values.end(), values + static_cast<size_t>(b) * static_cast<size_t>(num_labels));
    tg[classification_pool(e, T, pad)] = first_value_row + b;
  }
}

std::vector<int32_t> classification_row(const ClassificationExample& e, int T) {
  const size_t L = static_cast<size_t>(std::max(T, 0));
  if (e.first == 0 || e.tokens.size() <= L) {
    return std::vector<int32_t>(e.tokens.begin(), e.tokens.begin() + static_cast<std::ptrdiff_t>(std::min(e.tokens.size(), L)));
  }
  // The tokenizers library's LongestFirst for a pair, as its release (0.23) cuts it (checked over
  // every pair of lengths to 9 and cut below their sum: tools/make_tokenizer_golden.js): where the
  // shorter text fits in half, it is kept whole and the longer cut to the rest; else each keeps
  // L / 2 and the odd one goes to the longer, unless the shorter alone fills L (then the second).
  const size_t len1 = e.first, len2 = e.tokens.size() - e.first;
  const size_t lo = std::min(len1, len2);
  size_t n1, n2;
  if (2 * lo <= L) {
    n1 = len1 == lo ? len1 : L - lo;
    n2 = len1 == lo ? L - lo : len2;
  } else {
    const bool first_gets_odd = len1 > len2 && lo < L;
    n1 = L / 2 + (first_gets_odd ? L % 2 : 0);
    n2 = L / 2 + (first_gets_odd ? 0 : L % 2);
  }
  std::vector<int32_t> row(e.tokens.begin(), e.tokens.begin() + static_cast<std::ptrdiff_t>(std::min(n1, len1)));
  row.insert(row.end(), e.tokens.begin() + static_cast<std::ptrdiff_t>(e.first),
             e.tokens.begin() + static_cast<std::ptrdiff_t>(e.first + std::min(n2, len2)));
  return row;
}

int classification_pool(const ClassificationExample& e, int T, int32_t pad) {
  const std::vector<int32_t> row = classification_row(e, T);
  for (size_t i = row.size(); i-- > 0;)
    if (row[i] != pad) return static_cast<int>(i);
  return 0;
}

int classification_length_multiple(int T) { return std::max(8, (T / 16 + 7) / 8 * 8); }

int classification_batch_length(const ClassificationExample* const* rows, size_t n, int T, int multiple) {
  if (multiple == 0) multiple = classification_length_multiple(T);
  MT_CHECK(T >= 1 && multiple >= 1, ErrorKind::kInternal, "classification_batch_length: T and multiple must be positive");
  size_t longest = 1;
  for (size_t i = 0; i < n; ++i)
    if (rows[i] != nullptr) longest = std::max(longest, std::min(rows[i]->tokens.size(), static_cast<size_t>(T)));
  const size_t m = static_cast<size_t>(multiple);
  return static_cast<int>(std::min((longest + m - 1) / m * m, static_cast<size_t>(T)));
}

int32_t classification_pad(const Tokenizer& tokenizer) {
  return tokenizer.has_eot() ? tokenizer.eot_id() : tokenizer.vocab_size() - 1;
}

ClassificationMetrics classification_metrics(const std::vector<double>& confusion, int L) {
  MT_CHECK(L >= 1 && confusion.size() == static_cast<size_t>(L) * static_cast<size_t>(L), ErrorKind::kInvalidArgument,
           "classification metrics: a confusion matrix of " + std::to_string(confusion.size()) + " for " + std::to_string(L) +
               " labels");
  ClassificationMetrics m;
  std::vector<double> t(static_cast<size_t>(L), 0.0), p(static_cast<size_t>(L), 0.0);  // true and predicted counts
  double s = 0.0, c = 0.0;                                                               // samples, correct
  for (int i = 0; i < L; ++i)
    for (int j = 0; j < L; ++j) {
      const double n = confusion[static_cast<size_t>(i * L + j)];
      t[static_cast<size_t>(i)] += n;
      p[static_cast<size_t>(j)] += n;
      s += n;
      if (i == j) c += n;
    }
  m.accuracy = s > 0.0 ? c / s : 0.0;
  if (L == 2) {
    const double tp = confusion[3], fp = confusion[1], fn = confusion[2];
    m.f1 = 2.0 * tp + fp + fn > 0.0 ? 2.0 * tp / (2.0 * tp + fp + fn) : 0.0;
  } else {
    m.f1 = std::numeric_limits<double>::quiet_NaN();
  }
  double tp_sum = 0.0, pp = 0.0, tt = 0.0;
  for (int k = 0; k < L; ++k) {
    tp_sum += p[static_cast<size_t>(k)] * t[static_cast<size_t>(k)];
    pp += p[static_cast<size_t>(k)] * p[static_cast<size_t>(k)];
    tt += t[static_cast<size_t>(k)] * t[static_cast<size_t>(k)];
  }
  const double cov_tp = c * s - tp_sum, cov_pp = s * s - pp, cov_tt = s * s - tt;
  m.mcc = cov_pp * cov_tt > 0.0 ? cov_tp / std::sqrt(cov_tt * cov_pp) : 0.0;
  return m;
}

namespace {

// Ranks from 1, ties at their mean (scipy's rankdata "average").
std::vector<double> mean_ranks(const std::vector<double>& v) {
  std::vector<size_t> order(v.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  std::vector<double> r(v.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && v[order[j + 1]] == v[order[i]]) ++j;
    const double mean = (static_cast<double>(i) + static_cast<double>(j)) / 2.0 + 1.0;
    for (size_t k = i; k <= j; ++k) r[order[k]] = mean;
    i = j + 1;
  }
  return r;
}

double pearson(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  double mx = 0.0, my = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    mx += x[i];
    my += y[i];
  }
  mx /= n;
  my /= n;
  double sxy = 0.0, sxx = 0.0, syy = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  if (sxx == 0.0 || syy == 0.0) return std::numeric_limits<double>::quiet_NaN();  // a constant side
  return std::clamp(sxy / std::sqrt(sxx * syy), -1.0, 1.0);
}

}  // namespace

RegressionMetrics regression_metrics(const std::vector<double>& predicted, const std::vector<double>& truth) {
  MT_CHECK(predicted.size() == truth.size() && predicted.size() >= 2, ErrorKind::kInvalidArgument,
           "regression metrics: " + std::to_string(predicted.size()) + " predictions for " + std::to_string(truth.size()) +
               " values (at least 2 needed)");
  RegressionMetrics m;
  // A NaN prediction (a run that diverged) has no rank: both NaN, as scipy gives (the ranks of the
  // rest were finite, and a NaN in the sort is no ordering).
  for (size_t i = 0; i < predicted.size(); ++i)
    if (std::isnan(predicted[i]) || std::isnan(truth[i])) {
      m.pearson = m.spearman = std::numeric_limits<double>::quiet_NaN();
      return m;
    }
  m.pearson = pearson(predicted, truth);
  m.spearman = pearson(mean_ranks(predicted), mean_ranks(truth));
  return m;
}

double micro_f1(double tp, double fp, double fn) { return 2.0 * tp + fp + fn > 0.0 ? 2.0 * tp / (2.0 * tp + fp + fn) : 0.0; }

}  // namespace mt::data
