// meshtrain predict MODEL DATA.jsonl -o predict.json: runs a sequence classifier (a checkpoint of a
// "task": "classification" run, or a Hugging Face *ForSequenceClassification directory) over
// .jsonl records and writes one JSON object a line, {"id", "label", "probabilities"} (the CLUE
// submission layout plus the softmax), in the input's order; a regression's "label" is its value
// (a list of num_labels values past one), a multi-label classifier's the list of labels whose
// logit is > 0 with each label's sigmoid as "probabilities". The text, id and label fields and the
// label names come from the checkpoint's run unless given; records with a label are also scored
// on stderr (accuracy; a regression's mean squared error and Pearson's and Spearman's
// correlations; multi-label's micro F1).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/file_io.h"
#include "cli/commands.h"
#include "cli/load_model.h"
#include "data/classification.h"
#include "engine/checkpoint_io.h"

namespace mt::cli {
namespace fs = std::filesystem;
namespace {

struct PredictArgs {
  std::string model, data, output, tokenizer;
  std::string texta, textb, label, id;
  int batch = 16;
  int seq_length = 0;  // 0: the run's (a checkpoint), else the model's n_positions
};

void run_predict(const PredictArgs& a) {
  MT_CHECK(a.batch >= 1, ErrorKind::kInvalidArgument, "--batch must be at least 1");
  MT_CHECK(a.seq_length >= 0, ErrorKind::kInvalidArgument, "--seq-length must be positive (0: the run's)");
  MT_CHECK(!a.output.empty(), ErrorKind::kInvalidArgument, "-o FILE: where the predictions go");
  // Refused before any record is predicted (it predicted them all, then the rename failed with a
  // filesystem error).
  MT_CHECK(!fs::is_directory(a.output), ErrorKind::kInvalidArgument, "-o " + a.output + ": is a directory; give a file");
  LoadedModel lm = load_model(a.model);
  const models::ModelConfig& cfg = lm.model->config();
  MT_CHECK(cfg.num_labels > 0, ErrorKind::kInvalidArgument,
           a.model + ": not a sequence classifier (a causal LM; train with \"task\": \"classification\")");
  MT_CHECK(a.seq_length <= cfg.max_positions, ErrorKind::kInvalidArgument,
           "--seq-length " + std::to_string(a.seq_length) + " is more than the model's " + std::to_string(cfg.max_positions) +
               " positions");
  data::Tokenizer tok = load_model_tokenizer(lm, a.model, a.tokenizer);
  // The run's fields, then the flags.
  data::ClassificationFields f;
  int run_T = 0;  // the run's seq_length: records are truncated as training truncated them
  const fs::path p = a.model;
  if (fs::exists(p / "state.json") || fs::exists(p / "latest")) {
    const engine::CheckpointInfo info = engine::checkpoint_info(a.model);
    std::ifstream in(fs::path(info.dir) / "state.json");
    nlohmann::json state = nlohmann::json::parse(in, nullptr, false);
    if (state.is_object() && state.contains("classification")) {
      const nlohmann::json& c = state["classification"];
      f.text_a = c.value("texta_name", f.text_a);
      f.text_b = c.value("textb_name", f.text_b);
      f.label = c.value("label_name", f.label);
      f.id = c.value("id_name", f.id);
      if (c.contains("labels")) f.labels = c["labels"].get<std::vector<std::string>>();
      run_T = c.value("seq_length", 0);
    }
  }
  // A Hugging Face classifier's label names (config.json's id2label), as its pipeline prints them.
  if (f.labels.empty()) f.labels = lm.label_names;
  // Rows are padded with the model's pad_token_id where its config.json gives one (Hugging Face
  // pools at the last token that is not it), else with what training padded them with.
  const int32_t pad = lm.pad_id >= 0 ? lm.pad_id : data::classification_pad(tok);
  if (!a.texta.empty()) f.text_a = a.texta;
  if (!a.textb.empty()) f.text_b = a.textb == "-" ? "" : a.textb;
  if (!a.label.empty()) f.label = a.label;
  if (!a.id.empty()) f.id = a.id;
  const int L = cfg.num_labels;
  const data::LabelKind kind = cfg.problem_type == models::ProblemType::kRegression   ? data::LabelKind::kValues
                               : cfg.problem_type == models::ProblemType::kMultiLabel ? data::LabelKind::kLabelSet
                                                                                      : data::LabelKind::kClass;
  std::vector<data::ClassificationExample> recs = data::classification_read(a.data, tok, f, L, false, kind);
  // A label field named on the command line that no record has (a misspelling) read as unlabelled
  // records: no accuracy, exit 0.
  MT_CHECK(a.label.empty() || std::any_of(recs.begin(), recs.end(), [](const auto& e) { return e.label >= 0; }),
           ErrorKind::kInvalidArgument, "predict: --label-name '" + a.label + "': no record of " + a.data + " has that field");
  // (an id field no record has numbered the predictions by line, without a word)
  MT_CHECK(a.id.empty() || std::any_of(recs.begin(), recs.end(), [](const auto& e) { return e.id_given; }),
           ErrorKind::kInvalidArgument, "predict: --id-name '" + a.id + "': no record of " + a.data + " has that field");
  size_t longest = 0;
  for (const auto& e : recs) longest = std::max(longest, e.tokens.size());
  // Records are cut as training cut them: at the run's seq_length, which a Hugging Face directory
  // does not carry (it cut at n_positions there, without a word: other probabilities for long
  // records); --seq-length gives it, and the records cut are said.
  if (a.seq_length > 0) run_T = a.seq_length;
  const int limit = run_T > 0 ? run_T : cfg.max_positions;
  const int T = static_cast<int>(std::min<size_t>(longest, static_cast<size_t>(limit)));
  size_t cut = 0;
  for (const auto& e : recs) cut += e.tokens.size() > static_cast<size_t>(limit);
  if (cut > 0)
    std::fprintf(stderr, "%zu of %zu records are longer than %d tokens (%s) and are truncated as training truncated them\n",
                 cut, recs.size(), limit,
                 a.seq_length > 0 ? "--seq-length" : run_T > 0 ? "the run's seq_length" : "the model's n_positions; --seq-length sets the run's");
  const int B = std::min<int>(a.batch, static_cast<int>(recs.size()));
  lm.model->prepare(B, T);
  std::vector<int32_t> tokens(static_cast<size_t>(B) * T), targets(tokens.size());
  std::vector<float> logits(tokens.size() * static_cast<size_t>(L));
  // The predictions go into a temporary of this run's own (AtomicFile), a batch at a time, renamed
  // over the output at the end: two runs to one output each write a whole file, a failure on the
  // way leaves none, and an output that cannot be written is refused before any record is run.
  AtomicFile file(a.output);
  std::ostringstream out;
  size_t labelled = 0, correct = 0;
  double squared = 0.0, tp = 0.0, fp = 0.0, fn = 0.0;  // regression's squared error; multi-label's counts
  std::vector<double> predicted, truth;                // a regression of one value's labelled records
  for (size_t i = 0; i < recs.size(); i += static_cast<size_t>(B)) {
    if (const std::string lines = out.str(); !lines.empty()) {  // the last batch's
      file.append(lines.data(), lines.size());
      out.str("");
    }
    std::vector<const data::ClassificationExample*> rows(B, nullptr);
    for (int b = 0; b < B && i + b < recs.size(); ++b) rows[b] = &recs[i + b];
    // Each batch at its longest record (rounded up to 8), as training's validation cut it.
    const int Tb = data::classification_batch_length(rows.data(), rows.size(), T);
    if (Tb != lm.model->seq()) lm.model->prepare(B, Tb);
    data::classification_batch(rows.data(), B, Tb, pad, tokens.data(), targets.data());
    lm.model->logits(logits.data(), tokens.data());
    for (int b = 0; b < B && rows[b]; ++b) {
      const float* z = logits.data() + (static_cast<size_t>(b) * Tb + data::classification_pool(*rows[b], Tb, pad)) * L;
      const data::ClassificationExample& e = *rows[b];
      if (kind == data::LabelKind::kValues) {  // the values themselves (run_glue writes STS-B's so)
        nlohmann::json o = {{"id", e.id}};
        if (L == 1) o["label"] = z[0];
        else o["label"] = std::vector<float>(z, z + L);
        out << o.dump() << "\n";
        if (e.label < 0) continue;
        ++labelled;
        for (int c = 0; c < L; ++c) squared += (z[c] - e.values[c]) * static_cast<double>(z[c] - e.values[c]) / L;
        if (L == 1) {
          predicted.push_back(z[0]);
          truth.push_back(e.values[0]);
        }
        continue;
      }
      if (kind == data::LabelKind::kLabelSet) {  // each label's sigmoid; the labels whose logit is > 0
        std::vector<double> prob(L);
        nlohmann::json said = nlohmann::json::array();
        for (int c = 0; c < L; ++c) {
          prob[c] = 1.0 / (1.0 + std::exp(-static_cast<double>(z[c])));
          if (z[c] > 0.0f) {
            if (f.labels.empty()) said.push_back(c);
            else said.push_back(f.labels[c]);
          }
          if (e.label < 0) continue;
          const bool is = e.values[c] > 0.5f;
          tp += z[c] > 0.0f && is;
          fp += z[c] > 0.0f && !is;
          fn += z[c] <= 0.0f && is;
        }
        out << nlohmann::json{{"id", e.id}, {"label", said}, {"probabilities", prob}}.dump() << "\n";
        labelled += e.label >= 0;
        continue;
      }
      const float m = *std::max_element(z, z + L);
      std::vector<double> prob(L);
      double sum = 0;
      for (int c = 0; c < L; ++c) sum += prob[c] = std::exp(static_cast<double>(z[c] - m));
      for (double& q : prob) q /= sum;
      const int best = static_cast<int>(std::max_element(z, z + L) - z);
      nlohmann::json o = {{"id", rows[b]->id}, {"probabilities", prob}};
      if (f.labels.empty()) o["label"] = best;
      else o["label"] = f.labels[best];
      out << o.dump() << "\n";
      if (rows[b]->label >= 0) {
        ++labelled;
        correct += best == rows[b]->label;
      }
    }
  }
  const std::string rest = out.str();
  file.append(rest.data(), rest.size());
  file.commit();
  std::fprintf(stderr, "predict: %zu records -> %s", recs.size(), a.output.c_str());
  if (labelled > 0 && kind == data::LabelKind::kClass)
    std::fprintf(stderr, "; accuracy %.4f on the %zu with a label", static_cast<double>(correct) / labelled, labelled);
  if (labelled > 0 && kind == data::LabelKind::kLabelSet)
    std::fprintf(stderr, "; micro F1 %.4f on the %zu with labels", data::micro_f1(tp, fp, fn), labelled);
  if (labelled > 0 && kind == data::LabelKind::kValues) {
    std::fprintf(stderr, "; mean squared error %.4f", squared / labelled);
    if (predicted.size() >= 2) {
      const data::RegressionMetrics m = data::regression_metrics(predicted, truth);
      std::fprintf(stderr, ", Pearson %.4f, Spearman %.4f", m.pearson, m.spearman);
    }
    std::fprintf(stderr, " on the %zu with a value", labelled);
  }
  std::fprintf(stderr, "\n");
}

}  // namespace

void register_predict(CLI::App& app) {
  auto a = std::make_shared<PredictArgs>();
  auto* cmd = app.add_subcommand("predict", "Classify .jsonl records with a sequence classifier");
  cmd->add_option("MODEL", a->model, "checkpoint of a classification run (step-N or save_dir) or HF directory")->required();
  cmd->add_option("DATA", a->data, ".jsonl records")->required();
  cmd->add_option("-o,--output", a->output, "predictions, one JSON object a line: id, label, probabilities")->required();
  cmd->add_option("--batch", a->batch, "records a forward (default 16)");
  cmd->add_option("--seq-length", a->seq_length, "truncate records to this many tokens (default: the run's seq_length; a Hugging Face directory: n_positions)");
  cmd->add_option("--tokenizer", a->tokenizer, "tokenizer.json or GPT-2 vocabulary directory (default: the run's)");
  cmd->add_option("--texta-name", a->texta, "text field (default: the run's data.texta_name)");
  cmd->add_option("--textb-name", a->textb, "second text field (default: the run's; - for none)");
  cmd->add_option("--label-name", a->label, "label field (default: the run's)");
  cmd->add_option("--id-name", a->id, "id field (default: the run's)");
  cmd->callback([a] { run_predict(*a); });
}

}  // namespace mt::cli
