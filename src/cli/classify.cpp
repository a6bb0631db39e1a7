// `meshtrain train` with "task": "classification": fine-tunes a GPT-2 or LLaMA sequence classifier
// (Hugging Face's *ForSequenceClassification: score.weight on the last non-pad token) on .jsonl
// records, on one process or any layout (data, tensor, sequence and pipeline parallel; ZeRO 0-3
// where the layout takes it: docs/TASKS.md). Epochs over a shuffled order (each
// epoch a new permutation of the records; the global batch is the one-process run's, each rank
// reading its share); validation loss and accuracy every eval_interval steps and at the end;
// checkpoints every save_interval steps (keep_last rotation) and, with model_checkpoint, the
// save_top_k best by val_acc / val_loss under save_dir/top_k/ (top_k.json lists them, best
// first). The progress is Lightning's bar: "Epoch 0: 12% 1121/9664 [07:18<55:44, 2.55it/s, loss=1.44]".
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/file_io.h"
#include "base/fault.h"
#include "base/log.h"
#include "base/timer.h"
#include "cli/commands.h"
#include "data/classification.h"
#include "data/token_stream.h"
#include "data/tokenizer.h"
#include "engine/checkpoint_io.h"
#include "engine/engine.h"

namespace mt::cli {
namespace fs = std::filesystem;
namespace {

std::string clock_text(double s) {  // Lightning's mm:ss (h:mm:ss past an hour)
  char buf[32];
  const long t = static_cast<long>(s);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%02ld:%02ld", t / 60, t % 60);
  return buf;
}

// The tokenizer of a classification run: data.tokenizer, else the one model.init_from names (a
// meshtrain checkpoint's run, or tokenizer files in a Hugging Face directory).
data::Tokenizer run_tokenizer(const engine::RunConfig& cfg) {
  std::string path = cfg.tokenizer;
  if (path.empty() && !cfg.init_from.empty()) {
    fs::path d = cfg.init_from;
    if (fs::exists(d / "state.json") || fs::exists(d / "latest")) path = engine::checkpoint_info(cfg.init_from).tokenizer;
    else if (fs::exists(d / "tokenizer.json") || fs::exists(d / "encoder.json") || fs::exists(d / "vocab.json"))
      path = cfg.init_from;
  }
  MT_CHECK(!path.empty(), ErrorKind::kInvalidArgument,
           "task \"classification\": data.tokenizer is needed (or a model.init_from that names one)");
  data::Tokenizer tok = data::Tokenizer::load(path);
  MT_CHECK(tok.vocab_size() <= cfg.model.vocab_size, ErrorKind::kInvalidArgument,
           path + ": " + std::to_string(tok.vocab_size()) + " tokens, more than the model's vocab_size " +
               std::to_string(cfg.model.vocab_size));
  return tok;
}

std::string fixed4(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

// Global sample k of the training order: epoch k / n, a permutation per epoch when shuffling.
class SampleOrder {
 public:
  SampleOrder(uint64_t n, bool shuffle, uint64_t seed) : n_(n), shuffle_(shuffle), seed_(seed) {}
  uint64_t operator()(uint64_t k) {
    if (!shuffle_) return k % n_;
    const uint64_t e = k / n_;
    if (e != epoch_ || perm_.empty()) {
      perm_ = data::sample_permutation(n_, seed_, e);
      epoch_ = e;
    }
    return perm_[k % n_];
  }

 private:
  uint64_t n_;
  bool shuffle_;
  uint64_t seed_, epoch_ = 0;
  std::vector<uint64_t> perm_;
};

struct Validation {
  double loss = 0.0, acc = 0.0, f1 = 0.0, mcc = 0.0;  // f1: two labels, or multi-label's micro F1 (else NaN)
  double pearson = 0.0, spearman = 0.0;               // regression of one value (STS-B's)
  int64_t count = 0;
};

// The label kind of a classifier's problem_type.
data::LabelKind label_kind(const models::ModelConfig& m) {
  return m.problem_type == models::ProblemType::kRegression   ? data::LabelKind::kValues
         : m.problem_type == models::ProblemType::kMultiLabel ? data::LabelKind::kLabelSet
                                                              : data::LabelKind::kClass;
}

// Loss and metrics over every validation record: batch i on rank i mod W; every rank runs the same
// number of batches; sums (the confusion matrix, multi-label's counts, regression's predictions)
// over the ranks. Single label: the cross-entropy, accuracy, F1 and Matthews' correlation;
// regression: the mean squared error and, of one value, Pearson's and Spearman's correlations;
// multi-label: the mean binary cross-entropy and the micro F1 of the labels whose logit is > 0.
Validation validate(engine::Engine& eng, models::TransformerLM& model, const std::vector<data::ClassificationExample>& valid,
                    int B, int T, int32_t pad, int DW, int DR, const std::function<int(const data::ClassificationExample* const*, size_t)>& length,
                    bool counts = true) {
  const int L = model.config().num_labels;
  const models::ProblemType problem = model.config().problem_type;
  std::vector<int32_t> tokens(static_cast<size_t>(B) * T), targets(tokens.size());
  std::vector<float> logits(tokens.size() * static_cast<size_t>(L));
  const int64_t batches = (static_cast<int64_t>(valid.size()) + B - 1) / B;
  double loss = 0.0, count = 0.0;
  std::vector<double> confusion(static_cast<size_t>(L) * static_cast<size_t>(L), 0.0);  // [true · L + predicted]
  std::vector<double> label_counts(3, 0.0);                                               // multi-label: TP, FP, FN
  std::vector<float> predicted(problem == models::ProblemType::kRegression && L == 1 ? valid.size() : 0, 0.0f);
  for (int64_t j = 0; j < (batches + DW - 1) / DW; ++j) {
    const int64_t i = DR + j * DW;
    std::vector<const data::ClassificationExample*> rows(B, nullptr);
    for (int b = 0; b < B && i < batches; ++b) {
      const size_t k = static_cast<size_t>(i * B + b);
      if (k < valid.size()) rows[b] = &valid[k];
    }
    // The batch's rows at its own length (T with data.pad_to_max_length): a record's tokens and
    // pooled position are the same at any length its row fits in.
    const int Tb = length(rows.data(), rows.size());
    data::classification_batch(rows.data(), B, Tb, pad, tokens.data(), targets.data());
    eng.classifier_logits(logits.data(), tokens.data(), Tb);
    for (int b = 0; b < B; ++b) {
      if (rows[b] == nullptr) continue;
      const float* z = logits.data() + (static_cast<size_t>(b) * Tb + data::classification_pool(*rows[b], Tb, pad)) * L;
      count += 1;
      if (problem == models::ProblemType::kSingleLabel) {
        const float m = *std::max_element(z, z + L);
        double sum = 0.0;
        for (int c = 0; c < L; ++c) sum += std::exp(static_cast<double>(z[c] - m));
        loss += std::log(sum) - (z[rows[b]->label] - m);
        confusion[static_cast<size_t>(rows[b]->label * L + (std::max_element(z, z + L) - z))] += 1.0;
        continue;
      }
      const std::vector<float>& y = rows[b]->values;
      double row = 0.0;
      for (int c = 0; c < L; ++c) {
        const double zc = z[c], yc = y[static_cast<size_t>(c)];
        if (problem == models::ProblemType::kRegression) {
          row += (zc - yc) * (zc - yc);
        } else {
          row += std::max(zc, 0.0) - zc * yc + std::log1p(std::exp(-std::fabs(zc)));
          const bool said = zc > 0.0, is = yc > 0.5;
          label_counts[said && is ? 0 : said ? 1 : 2] += said || is ? 1.0 : 0.0;
        }
      }
      loss += row / L;
      if (!predicted.empty()) predicted[static_cast<size_t>(i * B + b)] = z[0];
    }
  }
  // Ulysses: the ranks of an sp group ran the same records; one of them adds its counts and
  // predictions to the sums (the means below are alike on each).
  if (!counts) {
    std::fill(confusion.begin(), confusion.end(), 0.0);
    std::fill(label_counts.begin(), label_counts.end(), 0.0);
    std::fill(predicted.begin(), predicted.end(), 0.0f);
  }
  Validation v;
  const double n = eng.mean_over_ranks(count) * DW;
  v.loss = eng.mean_over_ranks(loss) * DW / n;
  v.count = static_cast<int64_t>(n + 0.5);
  if (problem == models::ProblemType::kSingleLabel) {
    eng.sum_counts_over_ranks(&confusion);  // one exact all-reduce (a mean per cell was L² of them, in f32)
    const data::ClassificationMetrics m = data::classification_metrics(confusion, L);
    v.acc = m.accuracy;
    v.f1 = m.f1;
    v.mcc = m.mcc;
  } else if (problem == models::ProblemType::kMultiLabel) {
    eng.sum_counts_over_ranks(&label_counts);
    v.f1 = data::micro_f1(label_counts[0], label_counts[1], label_counts[2]);
  } else if (!predicted.empty()) {
    eng.gather_slots_over_ranks(&predicted);  // each record's prediction, from the rank that ran it
    std::vector<double> p(predicted.begin(), predicted.end()), t;
    for (const auto& e : valid) t.push_back(e.values[0]);
    if (p.size() >= 2) {
      const data::RegressionMetrics m = data::regression_metrics(p, t);
      v.pearson = m.pearson;
      v.spearman = m.spearman;
    } else {
      v.pearson = v.spearman = std::numeric_limits<double>::quiet_NaN();
    }
  }
  return v;
}

// The value of a logged metric (the names model_checkpoint.monitor takes).
double metric_value(const Validation& v, const std::string& what) {
  return what == "val_acc" ? v.acc : what == "val_f1" ? v.f1 : what == "val_mcc" ? v.mcc
         : what == "val_pearson" ? v.pearson : what == "val_spearmanr" ? v.spearman : v.loss;
}

struct TopEntry {
  int64_t step;
  double value;
  std::string path;
};

}  // namespace

void classify_loop(const ClassifyArgs& args, engine::RunConfig& cfg, const std::shared_ptr<comm::Backend>& world,
                   bool& started) {
  const int R = world ? world->rank() : 0;
  const bool lead = R == 0;
  if (lead) {
    for (const auto& w : cfg.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
    for (const auto& n : cfg.notes) std::fprintf(stderr, "auto: %s\n", n.c_str());
  }
  engine::ds_config_check_paths(cfg);
  engine::ds_config_check_trainable(cfg);
  MT_CHECK(!cfg.save_dir.empty() || cfg.model_checkpoint.save_top_k == 0, ErrorKind::kInvalidArgument,
           "model_checkpoint.save_top_k needs a save_dir");
  // One run saves to a save_dir at a time (checkpoint_dir_hold): rank 0 holds it to the end, before
  // the check below (a run beside a live one is told so, not told to pass --resume).
  std::unique_ptr<HeldLock> save_hold;
  if (lead && !cfg.save_dir.empty()) save_hold = engine::checkpoint_dir_hold(cfg.save_dir);
  engine::checkpoint_dir_check_run(cfg.save_dir, args.resume, args.overwrite);
  if (lead) check_metrics_path(args.metrics);  // rank 0's file (another host may lack its directory)
  if (fault_active("train.sigterm_in_setup")) sigterm_self_for_test();  // test seam: a scheduler's signal during the setup
  data::Tokenizer tok = run_tokenizer(cfg);
  // GPT-2's pad_token_id = eos_token_id, as HF fine-tuning sets it; a LLaMA whose config gives one
  // pools at it, as LlamaForSequenceClassification does (its padding row: export writes that id).
  const int32_t pad = cfg.model.padding_idx >= 0 ? cfg.model.padding_idx : data::classification_pad(tok);
  const int L = cfg.model.num_labels;
  const data::LabelKind kind = label_kind(cfg.model);
  std::vector<data::ClassificationExample> train = data::classification_read(cfg.data_train, tok, cfg.cls_fields, L, true, kind);
  std::vector<data::ClassificationExample> valid;
  if (!cfg.data_valid.empty()) valid = data::classification_read(cfg.data_valid, tok, cfg.cls_fields, L, true, kind);
  const int B = static_cast<int>(cfg.batch.micro_batch_per_gpu);
  const int T = static_cast<int>(cfg.seq_length);
  const int64_t tbs = cfg.batch.train_batch_size, gas = cfg.batch.gradient_accumulation_steps;
  const int64_t steps_per_epoch = std::max<int64_t>(1, (static_cast<int64_t>(train.size()) + tbs - 1) / tbs);
  // The progress bar's steps of this batch before the resumed run's first (its epoch and step).
  int64_t bar_steps_before = 0;
  if (cfg.train_iters == 0 && cfg.num_train_epochs > 0) {
    cfg.train_iters = static_cast<int64_t>(std::ceil(cfg.num_train_epochs * static_cast<double>(steps_per_epoch)));
    // A resume with another batch size (the checkpoint's consumed samples are not its steps x this
    // batch): the epochs its steps trained are counted at its batch, and the epochs left at this
    // one. train_iters in this batch's steps trained 4 epochs where 2 were asked, or nothing.
    engine::CheckpointProgress done;
    if (!args.resume.empty()) {
      try {
        done = engine::checkpoint_progress(args.resume);
      } catch (const Error&) {  // checkpoint_load says what is wrong with it
      }
    }
    if (done.global_step > 0 && done.consumed_samples > 0 && done.consumed_samples != done.global_step * tbs) {
      const double records = static_cast<double>(train.size());
      const double their_batch = static_cast<double>(done.consumed_samples) / static_cast<double>(done.global_step);
      const double epochs_done = static_cast<double>(done.global_step) / std::max(1.0, std::ceil(records / their_batch));
      const double left = std::max(0.0, (cfg.num_train_epochs - epochs_done) * static_cast<double>(steps_per_epoch));
      cfg.train_iters = done.global_step + static_cast<int64_t>(std::ceil(left - 1e-9));
      bar_steps_before = static_cast<int64_t>(std::floor(epochs_done * static_cast<double>(steps_per_epoch) + 1e-9));
      if (lead)
        std::fprintf(stderr,
                     "%s: its %lld steps trained %.3f epochs at a batch of %.4g; the %.3f left of num_train_epochs %g "
                     "are %lld steps of this batch (%lld): train_iters %lld\n",
                     args.resume.c_str(), static_cast<long long>(done.global_step), epochs_done, their_batch,
                     cfg.num_train_epochs - epochs_done, cfg.num_train_epochs,
                     static_cast<long long>(cfg.train_iters - done.global_step), static_cast<long long>(tbs),
                     static_cast<long long>(cfg.train_iters));
    }
  }
  MT_CHECK(cfg.train_iters > 0, ErrorKind::kInvalidArgument,
           args.source + ": give train_iters or num_train_epochs");
  engine::ds_config_check_schedule(cfg);  // the steps were counted from the epochs, after parsing
  MT_CHECK(cfg.model_checkpoint.save_top_k == 0 || !valid.empty(), ErrorKind::kInvalidArgument,
           "model_checkpoint monitors " + cfg.model_checkpoint.monitor + ": data.valid is needed");
  size_t truncated = 0;
  for (const auto& e : train) truncated += e.tokens.size() > static_cast<size_t>(T);
  started = true;
  auto ctx = engine::engine_parallel_context(cfg, world);
  auto model = engine::engine_build_model(cfg, ctx);
  engine::Engine eng(cfg, *model, ctx);
  const int DW = ctx->data_dp(), DR = ctx->data_rank();
  // The rows' length of a batch of records: T with data.pad_to_max_length (or sparse attention,
  // whose block layout is built for T), else its longest record rounded up to 8, and further until
  // Ulysses' sp ranks divide it (Hugging Face's pad_to_multiple_of = sp) and B rows of a rank's
  // share divide over the tp group under sequence parallelism.
  const bool cut = !cfg.pad_to_max_length && !cfg.sparse_attention;
  const int tp_rows = ctx->sequence_parallel ? ctx->tp() : 1, usp = ctx->sp();
  auto length = [&](const data::ClassificationExample* const* batch, size_t n) {
    if (!cut) return T;
    int L = data::classification_batch_length(batch, n, T);
    while (L < T && (L % usp != 0 || (static_cast<int64_t>(B) * (L / usp)) % tp_rows != 0)) ++L;
    return L;
  };
  if (train_resume(eng, args.resume, lead)) return;
  if (lead) {  // (train's line: a disk that cannot hold one checkpoint)
    const std::string room = engine::checkpoint_space_warning(eng, cfg.save_dir);
    if (!room.empty()) log_warning(room);
  }
  if (lead) {
    std::fprintf(stderr,
                 "model %s; %zu training records (%zu longer than seq_length %d, truncated), %zu validation; batch %lld = "
                 "%d x %lld accumulation x %d data-parallel rank(s); %lld steps = %.2f epochs of %lld steps\n",
                 cfg.model.describe().c_str(), train.size(), truncated, T, valid.size(), static_cast<long long>(tbs), B,
                 static_cast<long long>(gas), DW, static_cast<long long>(cfg.train_iters),
                 static_cast<double>(cfg.train_iters) / static_cast<double>(steps_per_epoch),
                 static_cast<long long>(steps_per_epoch));
  }
  MetricsFile metrics;
  if (lead && !args.metrics.empty()) metrics.open(args.metrics);
  const std::vector<std::string> logged = engine::classification_metric_names(cfg.model);
  const char* launcher_tty = std::getenv("MT_STDOUT_TTY");
  const bool tty = lead && (launcher_tty ? std::strcmp(launcher_tty, "1") == 0 : isatty(fileno(stdout)));
  SampleOrder order(train.size(), cfg.shuffle, cfg.data_seed);
  std::vector<const data::ClassificationExample*> rows(B);
  const bool maximize = cfg.model_checkpoint.mode == "max";
  std::vector<TopEntry> top;
  const fs::path top_dir = fs::path(cfg.save_dir) / "top_k";
  // An earlier run's best under --overwrite: removed by this run's first save, top-k or step (they
  // were removed at the start, and a run that failed before it saved left none of either).
  bool earlier_top = args.overwrite && !cfg.save_dir.empty();
  // A resumed run keeps its best; under --overwrite they are the earlier run's, on their way out
  // (counted, they kept the new run's own out, and named directories its first save removed).
  if (!args.resume.empty() && !earlier_top && fs::exists(top_dir / "top_k.json")) {
    std::ifstream in(top_dir / "top_k.json");
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (lead && !(j.is_object() && j.contains("best") && j["best"].is_array()))  // (it was passed over without a word)
      std::fprintf(stderr,
                   "warning: %s: not the list a run writes; the best checkpoints it named are not counted (nor rotated) "
                   "by this run\n",
                   (top_dir / "top_k.json").c_str());
    if (j.is_object() && j.value("monitor", "") == cfg.model_checkpoint.monitor && j.contains("best"))
      for (const auto& e : j["best"])
        if (e.contains("step") && e.contains(cfg.model_checkpoint.monitor) && e.contains("path") &&
            fs::exists(e["path"].get<std::string>()))
          top.push_back({e["step"].get<int64_t>(), e[cfg.model_checkpoint.monitor].get<double>(), e["path"].get<std::string>()});
    // Best first by this run's mode: the list was sorted by the run that wrote it, whose mode may
    // differ (val_loss's default mode was "max" before it was "min"), and the worst is dropped first.
    std::stable_sort(top.begin(), top.end(),
                     [&](const TopEntry& a, const TopEntry& b) { return maximize ? a.value > b.value : a.value < b.value; });
    while (static_cast<int64_t>(top.size()) > cfg.model_checkpoint.save_top_k) top.pop_back();
  }
  bool first_save = true;
  Timer total;
  const int64_t start_step = eng.global_step();
  if (bar_steps_before == 0) bar_steps_before = start_step;  // the same batch: its steps are this batch's
  stop_before_first_step(world.get(), cfg.comm_timeout_s, lead);
  // Regression and multi-label: the step's label values, a row per sample of its micro-batches
  // (each micro-batch's targets name its rows).
  const bool valued = kind != data::LabelKind::kClass;
  std::vector<float> step_values(valued ? static_cast<size_t>(gas) * B * L : 0);
  if (valued) model->set_label_values(step_values.data(), gas * B);
  std::vector<const data::ClassificationExample*> step_rows;
  while (eng.global_step() < cfg.train_iters) {
    if (cut) {  // the step's length, from the whole global batch: every rank and layout cuts alike
      step_rows.clear();
      for (int64_t k = 0; k < tbs; ++k) step_rows.push_back(&train[order(static_cast<uint64_t>(eng.consumed_samples() + k))]);
      eng.set_step_seq_length(length(step_rows.data(), step_rows.size()));
    }
    uint64_t next = static_cast<uint64_t>(eng.consumed_samples() + DR * gas * B);
    int32_t filled = 0;  // this step's micro-batches so far
    Timer t;
    engine::StepResult r = eng.train_batch([&](int32_t* tokens, int32_t* targets) {
      for (int b = 0; b < B; ++b) rows[b] = &train[order(next + static_cast<uint64_t>(b))];
      data::classification_batch(rows.data(), B, T, pad, tokens, targets,
                                 valued ? step_values.data() + static_cast<size_t>(filled) * B * L : nullptr, L, filled * B);
      next += static_cast<uint64_t>(B);
      ++filled;
    });
    const double secs = t.seconds();
    const int64_t done = eng.global_step();
    const bool have_val = !valid.empty() && ((cfg.eval_interval > 0 && done % cfg.eval_interval == 0) || done == cfg.train_iters);
    Validation v;
    if (have_val) v = validate(eng, *model, valid, B, T, pad, DW, DR, length, ctx->sp_rank() == 0);
    // Lightning's bar: the epoch, this epoch's step, elapsed<remaining, it/s, the loss.
    const int64_t bar_done = bar_steps_before + (done - start_step);
    const int64_t epoch = (bar_done - 1) / steps_per_epoch, in_epoch = (bar_done - 1) % steps_per_epoch + 1;
    const double elapsed = total.seconds();
    const double rate = static_cast<double>(done - start_step) / std::max(elapsed, 1e-9);
    const double left = static_cast<double>(cfg.train_iters - done) / std::max(rate, 1e-9);
    char bar[256];
    std::snprintf(bar, sizeof bar, "Epoch %lld: %3d%% %lld/%lld [%s<%s, %.2fit/s, loss=%.3g]", static_cast<long long>(epoch),
                  static_cast<int>(100 * in_epoch / steps_per_epoch), static_cast<long long>(in_epoch),
                  static_cast<long long>(steps_per_epoch), clock_text(elapsed).c_str(), clock_text(left).c_str(), rate, r.loss);
    if (tty) {
      std::printf("\r%s   ", bar);
      std::fflush(stdout);
    } else if (lead && (done % cfg.steps_per_print == 0 || done == cfg.train_iters)) {
      std::printf("%s\n", bar);
    }
    if (lead && have_val) {
      std::string line = "val_loss " + fixed4(v.loss);
      for (const std::string& name : logged)
        if (name != "val_loss" && !(name == "val_f1" && std::isnan(v.f1))) line += " " + name + " " + fixed4(metric_value(v, name));
      std::printf("%sstep %lld %s (%lld records)\n", tty ? "\n" : "", static_cast<long long>(done), line.c_str(),
                  static_cast<long long>(v.count));
    }
    if (metrics.is_open()) {
      nlohmann::json m = {{"step", done}, {"epoch", epoch}, {"loss", r.loss}, {"lr", r.lr}, {"grad_norm", r.grad_norm},
                          {"samples_per_s", static_cast<double>(tbs) / secs}, {"seq_length", r.seq_length}};
      if (have_val)
        for (const std::string& name : logged) {
          const double value = metric_value(v, name);
          if (std::isnan(value)) m[name] = nullptr;  // JSON has no NaN (a constant prediction's correlation)
          else m[name] = value;
          if (name == "val_f1" && std::isnan(value)) m.erase(name);  // F1 of label 1: two labels only
        }
      metrics.write(m, done);
    }
    // The top k by the monitored metric (every rank has the same values: they were all-reduced).
    if (have_val && cfg.model_checkpoint.save_top_k > 0) {
      const std::string& what = cfg.model_checkpoint.monitor;
      const double value = metric_value(v, what);
      auto better = [&](double a, double b) { return maximize ? a > b : a < b; };
      // NaN (a correlation of a constant prediction) ranks with nothing: never kept.
      const bool enters = !std::isnan(value) && (static_cast<int64_t>(top.size()) < cfg.model_checkpoint.save_top_k ||
                                                 better(value, top.back().value));
      if (enters) {
        const std::string where = engine::checkpoint_save(eng, top_dir.string(), 0, earlier_top);  // collective
        earlier_top = false;
        // A step saved again (a run resumed before it re-reaches it) replaces its entry: two named one
        // directory, and dropping one removed what the other still named.
        std::erase_if(top, [&](const TopEntry& e) { return e.path == where; });
        top.push_back({done, value, where});
        std::stable_sort(top.begin(), top.end(), [&](const TopEntry& a, const TopEntry& b) { return better(a.value, b.value); });
        if (static_cast<int64_t>(top.size()) > cfg.model_checkpoint.save_top_k) {
          if (lead) fs::remove_all(top.back().path);
          top.pop_back();
        }
        if (lead) {
          nlohmann::json list = nlohmann::json::array();
          for (const TopEntry& e : top)
            list.push_back({{"step", e.step}, {cfg.model_checkpoint.monitor, e.value}, {"path", e.path}});
          const std::string text =
              nlohmann::json{{"monitor", cfg.model_checkpoint.monitor}, {"mode", cfg.model_checkpoint.mode}, {"best", list}}.dump(2) +
              "\n";
          file_write_atomic((top_dir / "top_k.json").string(), text.data(), text.size());
          std::printf("%s %.4f: kept in %s (top %lld)\n", cfg.model_checkpoint.monitor.c_str(), value,
                      where.c_str(), static_cast<long long>(cfg.model_checkpoint.save_top_k));
        }
      }
    }
    const int stop = agreed_stop_signal(world.get(), cfg.comm_timeout_s);
    const bool save_now = (cfg.save_interval > 0 && done % cfg.save_interval == 0) || done == cfg.train_iters || stop != 0;
    std::string where;
    if (!cfg.save_dir.empty() && save_now) {
      where = engine::checkpoint_save(eng, cfg.save_dir, cfg.keep_last, args.overwrite && first_save);
      first_save = false;
      if (earlier_top) {  // this run has a checkpoint of its own
        if (lead) fs::remove_all(top_dir);
        earlier_top = false;
      }
      if (lead && !tty && stop == 0) std::printf("saved %s\n", where.c_str());
    }
    if (lead) std::fflush(stdout);
    if (stop != 0) {
      if (lead) {
        if (tty) std::printf("\n");
        std::fprintf(stderr, "meshtrain: %s: stopped after step %lld; %s\n", stop_signal_name(stop),
                     static_cast<long long>(done), where.empty() ? "no save_dir, nothing saved" : ("saved " + where).c_str());
        std::fflush(stdout);
        std::fflush(stderr);
      }
      throw StopRequested{stop};
    }
  }
  if (tty) std::printf("\n");
  eng.settle();
  if (lead && !top.empty())
    std::printf("best %s %.4f at step %lld: %s\n", cfg.model_checkpoint.monitor.c_str(), top.front().value,
                static_cast<long long>(top.front().step), top.front().path.c_str());
}

}  // namespace mt::cli
