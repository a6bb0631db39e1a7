#include "engine/ds_config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <limits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <optional>

#include <unistd.h>

#include "base/error.h"
#include "base/text.h"
#include "data/megatron_order.h"
#include "engine/checkpoint_io.h"
#include "engine/json_file.h"
#include "engine/hf_config.h"
#include "comm/comm_log.h"
#include "engine/hf_weights.h"
#include "parallel/pp/partition.h"
#include "parallel/pp/schedule.h"

namespace mt::engine {
namespace {

using nlohmann::json;

// A number as %g writes it (1e+300, 0.001), for messages that quote a value given.
std::string fmt_g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// How a key we do not parse into RunConfig is treated.
//   kWarn            accepted with one warning line (logging, tuning: what is trained is the same)
//   kRefuseIfEnabled a DeepSpeed block with an "enabled" switch (off unless given): refused when on
//                    (a true value, "enabled" true, or any nested "enabled" true, each by Python's
//                    truth); a block without the
//                    switch is off in DeepSpeed too, and says so in one line
//   kRefuseIfEnabledPydantic  the same for a block DeepSpeed reads into a pydantic model with
//                    `enabled: bool`: its switch is pydantic's bool ("false", "off", "0" are off)
enum class Unparsed { kWarn, kRefuseIfEnabled, kRefuseIfEnabledPydantic };

// Python's truth of a JSON value, as DeepSpeed tests its switches (`if enabled:`): 1, "true" and
// even "false" turn a feature on; null, 0, "", [] and {} leave it off.
bool truthy(const nlohmann::json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0.0;
  if (v.is_string() || v.is_array() || v.is_object()) return !v.empty();
  return true;
}

// pydantic's lax bool, as DeepSpeed's config models read `enabled: bool`: true/false, the integers
// (and floats) 0 and 1, and the strings 0/off/f/false/n/no and 1/on/t/true/y/yes in any case;
// nullopt for what pydantic refuses (null, 2, "maybe").
std::optional<bool> pydantic_bool(const nlohmann::json& v) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) {
    const double d = v.get<double>();
    if (d == 0.0 || d == 1.0) return d == 1.0;
    return std::nullopt;
  }
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    for (const char* f : {"0", "off", "f", "false", "n", "no"})
      if (s == f) return false;
    for (const char* t : {"1", "on", "t", "true", "y", "yes"})
      if (s == t) return true;
  }
  return std::nullopt;
}

// Whether v is a true switch, or v or any object inside it has a true "enabled". A nested switch
// counts even under an outer one that is off: DeepSpeed reads data_efficiency's random_ltd and
// curriculum_learning by their own "enabled" alone. Only true counted before: "enabled": 1 and
// "sparse_gradients": 1 were accepted without a word while DeepSpeed turned the feature on.
bool enables_something(const nlohmann::json& v) {
  if (!v.is_object()) return truthy(v);
  if (v.contains("enabled") && truthy(v["enabled"])) return true;
  for (const auto& [k, e] : v.items())
    if (e.is_object() && enables_something(e)) return true;
  return false;
}

// Walks one JSON object: typed getters that record which keys were read, "auto" handling, and a
// final pass that warns about or refuses the rest.
class Section {
 public:
  Section(const json& j, std::string path, std::vector<std::string>& warnings, std::vector<std::string>& notes)
      : j_(j), path_(std::move(path)), warnings_(warnings), notes_(notes) {
    MT_CHECK(j_.is_object(), ErrorKind::kInvalidArgument, where() + " must be a JSON object");
  }

  std::string where(const std::string& key = "") const {
    if (key.empty()) return path_.empty() ? "config" : path_;
    // A control character in a key is written as JSON escapes it: a NUL ended the printed line
    // there ("warning: seq_lengt" and nothing more).
    std::string k;
    for (char ch : key) {
      const auto u = static_cast<unsigned char>(ch);
      if (u >= 0x20 && u != 0x7f) {
        k += ch;
        continue;
      }
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", u);
      k += esc;
    }
    return path_.empty() ? k : path_ + "." + k;
  }
  bool has(const std::string& key) { known_.push_back(key); return j_.contains(key) && !j_[key].is_null(); }
  bool is_auto(const std::string& key) { return has(key) && j_[key].is_string() && j_[key] == "auto"; }
  const json& raw(const std::string& key) { known_.push_back(key); return j_.at(key); }
  // An "auto" resolved to `value`: one line for the user (printed once by config check and train).
  template <typename T>
  T resolved(const std::string& key, T value, const std::string& from) {
    notes_.push_back(where(key) + ": \"auto\" -> " + json(value).dump() + " (" + from + ")");
    return value;
  }
  double number_or_auto(const std::string& key, double fallback, double auto_value, const std::string& from) {
    return is_auto(key) ? resolved(key, auto_value, from) : number(key, fallback);
  }
  int64_t integer_or_auto(const std::string& key, int64_t fallback, int64_t auto_value, const std::string& from) {
    return is_auto(key) ? resolved(key, auto_value, from) : integer(key, fallback);
  }

  double number(const std::string& key, double fallback) {
    if (!has(key)) return fallback;
    MT_CHECK(!is_auto(key), ErrorKind::kInvalidArgument, where(key) + ": \"auto\" cannot be resolved here");
    MT_CHECK(j_[key].is_number(), ErrorKind::kInvalidArgument, where(key) + " must be a number");
    return j_[key].get<double>();
  }
  // integer() for a field held in an int (a stage, a power of two, a count of steps).
  int small_integer(const std::string& key, int fallback) {
    int64_t v = integer(key, fallback);
    MT_CHECK(v >= INT32_MIN && v <= INT32_MAX, ErrorKind::kInvalidArgument,
             where(key) + " is out of range (" + std::to_string(v) + ")");
    return static_cast<int>(v);
  }
  int64_t integer(const std::string& key, int64_t fallback) {
    if (!has(key)) return fallback;
    MT_CHECK(!is_auto(key), ErrorKind::kInvalidArgument, where(key) + ": \"auto\" cannot be resolved here");
    const json& v = j_[key];
    MT_CHECK(v.is_number_integer() || (v.is_number_float() && v.get<double>() == std::floor(v.get<double>())),
             ErrorKind::kInvalidArgument, where(key) + " must be an integer");
    // NOTE: converting a double beyond int64 (1e30) is undefined, an unsigned above INT64_MAX wraps.
    bool fits = v.is_number_float() ? v.get<double>() >= -0x1p63 && v.get<double>() < 0x1p63
                                    : !v.is_number_unsigned() || v.get<uint64_t>() <= INT64_MAX;
    MT_CHECK(fits, ErrorKind::kInvalidArgument, where(key) + " is out of range (" + v.dump() + ")");
    return v.get<int64_t>();
  }
  bool boolean(const std::string& key, bool fallback) {
    if (!has(key)) return fallback;
    MT_CHECK(j_[key].is_boolean(), ErrorKind::kInvalidArgument, where(key) + " must be true or false");
    return j_[key].get<bool>();
  }
  std::string string(const std::string& key, const std::string& fallback) {
    if (!has(key)) return fallback;
    MT_CHECK(j_[key].is_string(), ErrorKind::kInvalidArgument, where(key) + " must be a string");
    return j_[key].get<std::string>();
  }
  // A key that must keep its neutral value: anything else changes training and is refused.
  template <typename T>
  void require_default(const std::string& key, const T& neutral, const std::string& why) {
    if (!has(key)) return;
    MT_CHECK(j_[key] == json(neutral), ErrorKind::kNotSupported, where(key) + ": " + why);
  }
  void unparsed(const std::string& key, Unparsed how) { extra_[key] = how; }
  // A key read and set aside, with one warning line saying why.
  void ignored(const std::string& key, const std::string& why) {
    if (has(key)) warnings_.push_back(where(key) + ": ignored: " + why);
  }

  // Every key not read: refused (when it enables something that changes training) or warned
  // about, with a did-you-mean for near misses of known keys.
  void finish() {
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      const std::string& k = it.key();
      if (std::find(known_.begin(), known_.end(), k) != known_.end()) continue;
      auto e = extra_.find(k);
      if (e != extra_.end()) {
        const json& v = it.value();
        if (e->second == Unparsed::kRefuseIfEnabledPydantic) {
          MT_CHECK(v.is_object(), ErrorKind::kInvalidArgument, where(k) + " must be an object (DeepSpeed's config model)");
          // DeepSpeed's HybridEngineConfig forbids other keys (pydantic's extra="forbid").
          for (const auto& [key, ignored] : v.items())
            MT_CHECK(key == "enabled" || key == "max_out_tokens" || key == "inference_tp_size" ||
                         key == "release_inference_cache" || key == "pin_parameters" || key == "tp_gather_partition_size" ||
                         key == "enable_cuda_graph",
                     ErrorKind::kInvalidArgument, where(k) + "." + key + ": not a key of DeepSpeed's hybrid_engine (it refuses it too)");
          const std::optional<bool> on = v.contains("enabled") ? pydantic_bool(v["enabled"]) : std::optional<bool>(false);
          MT_CHECK(on.has_value(), ErrorKind::kInvalidArgument,
                   where(k) + ".enabled: " + v["enabled"].dump() + " is not a boolean (DeepSpeed's config model refuses it too)");
          if (*on) throw Error(ErrorKind::kNotSupported, where(k) + " is not supported yet (it would change what is trained)");
          continue;  // off
        }
        if (e->second == Unparsed::kRefuseIfEnabled) {
          if (enables_something(v))
            throw Error(ErrorKind::kNotSupported, where(k) + " is not supported yet (it would change what is trained)");
          if (v.is_object() && !v.contains("enabled") && !v.empty())
            warnings_.push_back(where(k) + ": has no \"enabled\" key, so it is off (as in DeepSpeed)");
          continue;  // off: nothing to say
        }
        warnings_.push_back(where(k) + ": accepted but has no effect in meshtrain");
        continue;
      }
      std::string best;
      int best_d = 3;
      std::vector<std::string> candidates = known_;
      for (auto& [name, how] : extra_) candidates.push_back(name);
      for (const auto& c : candidates) {
        int d = edit_distance(k, c);
        if (d < best_d) { best_d = d; best = c; }
      }
      const std::string hint = best.empty() ? "" : " (did you mean '" + best + "'?)";
      // DeepSpeed's config models drop every "auto" value before validating (DeepSpeedConfigModel's
      // non-strict init), so an unknown key set to "auto" passes there: warned.
      const bool dropped = auto_dropped_ && it.value().is_string() && it.value() == "auto";
      MT_CHECK(!refuse_unknown_ || dropped, ErrorKind::kNotSupported, where(k) + ": unknown key" + hint + "; " + refuse_why_);
      warnings_.push_back(where(k) + ": unknown key, ignored" + hint);
    }
  }
  // optimizer.params, scheduler.params and data: an unknown key is refused, not warned about; why
  // ends its line (by default, the arguments' reason).
  void refuse_unknown(std::string why = "") {
    refuse_unknown_ = true;
    refuse_why_ = why.empty() ? where() +
                                    " are the optimizer's or scheduler's arguments, which DeepSpeed passes to its "
                                    "constructor (where an unknown one is an error), and each changes what is trained"
                              : std::move(why);
  }

  // A block DeepSpeed reads into one of its pydantic config models (zero_optimization and its
  // offload blocks, fp16, bf16), which forbid keys they do not have (extra="forbid"): a misspelt
  // one is refused as DeepSpeed refuses it (it was warned about, and the default trained).
  void refuse_unknown_as_deepspeed(const std::string& model) {
    refuse_unknown(where() + " is read by DeepSpeed's " + model + ", which refuses keys it does not have, and a misspelt "
                   "setting would train with the default");
    auto_dropped_ = true;
  }

  // Every key of the object counts as read (a block switched off: its settings are not checked).
  void ignore_rest() {
    for (auto it = j_.begin(); it != j_.end(); ++it) known_.push_back(it.key());
  }
  Section sub(const std::string& key) {
    known_.push_back(key);
    return Section(j_.at(key), where(key), warnings_, notes_);
  }

 private:
  const json& j_;
  std::string path_;
  std::vector<std::string>& warnings_;
  std::vector<std::string>& notes_;
  std::vector<std::string> known_;
  std::map<std::string, Unparsed> extra_;
  bool refuse_unknown_ = false, auto_dropped_ = false;
  std::string refuse_why_;
};

void parse_batch(Section& s, RunConfig& c, int world) {
  // A key given as a number must be positive (0 used to read as "absent"); "auto" or absent is 0
  // here, derived below. NOTE: negative values are refused before any division (INT64_MIN / -1 traps).
  auto get = [&](const char* key) -> int64_t {
    if (s.is_auto(key) || !s.has(key)) return 0;
    int64_t v = s.integer(key, 0);
    MT_CHECK(v > 0, ErrorKind::kInvalidArgument, s.where(key) + ": must be positive (got " + std::to_string(v) + ")");
    return v;
  };
  int64_t tbs = get("train_batch_size"), mb = get("train_micro_batch_size_per_gpu"),
          gas = get("gradient_accumulation_steps");
  // Hugging Face's integration fills an "auto" micro-batch with per_device_train_batch_size (8)
  // and an "auto" accumulation with gradient_accumulation_steps (1), then the train batch with
  // their product over the ranks; where the numbers given determine one, DeepSpeed's rule does.
  const bool tbs_auto = s.is_auto("train_batch_size");
  bool mb_auto = s.is_auto("train_micro_batch_size_per_gpu"), gas_auto = s.is_auto("gradient_accumulation_steps");
  // None of the three given (a Hugging Face config that leaves them to the Trainer): as "auto".
  if (!s.has("train_batch_size") && !s.has("train_micro_batch_size_per_gpu") && !s.has("gradient_accumulation_steps")) {
    mb = s.resolved("train_micro_batch_size_per_gpu", int64_t{8}, "none given: Hugging Face's per_device_train_batch_size default");
    gas = s.resolved("gradient_accumulation_steps", int64_t{1}, "none given: Hugging Face's gradient_accumulation_steps default");
  }
  if (mb_auto && !(tbs && gas)) {
    mb = s.resolved("train_micro_batch_size_per_gpu", int64_t{8}, "Hugging Face's per_device_train_batch_size default");
    mb_auto = false;
  }
  if (gas_auto && !(tbs && mb)) {
    gas = s.resolved("gradient_accumulation_steps", int64_t{1}, "Hugging Face's gradient_accumulation_steps default");
    gas_auto = false;
  }
  // Derived values must divide exactly: say so in terms of what the user gave.
  auto divisible = [&](int64_t by, const std::string& what) {
    MT_CHECK(by > 0 && tbs % by == 0, ErrorKind::kInvalidArgument,
             "train_batch_size (" + std::to_string(tbs) + ") is not a multiple of " + what + " (" + std::to_string(by) + ")");
  };
  const std::string ranks = std::to_string(world) + " data-parallel rank(s)";
  if (tbs && mb && !gas) divisible(mb * world, "train_micro_batch_size_per_gpu x " + ranks);
  if (tbs && gas && !mb) divisible(gas * world, "gradient_accumulation_steps x " + ranks);
  if (tbs && !mb && !gas) divisible(world, ranks);
  // DeepSpeed's rule: any two give the third; one alone sets gas = 1. A missing train_batch_size
  // is the product below.
  if (tbs && mb && gas) {
  } else if (tbs && mb) {
    gas = tbs / mb / world;
  } else if (tbs && gas) {
    mb = tbs / world / gas;
  } else if (mb && gas) {
  } else if (tbs) {
    gas = 1;
    mb = tbs / world;
  } else if (mb) {
    gas = 1;
  } else {
    throw Error(ErrorKind::kInvalidArgument,
                "train_batch_size or train_micro_batch_size_per_gpu must be given (a positive number; \"auto\" needs the other)");
  }
  // The schedules count micro-batches in int: 2^32 + 2 trained a pipeline's step of 2.
  MT_CHECK(gas <= std::numeric_limits<int32_t>::max(), ErrorKind::kInvalidArgument,
           "gradient_accumulation_steps (" + std::to_string(gas) + ") is past 2^31 - 1");
  int64_t product = 0;  // mb · gas · world, refused rather than wrapped when it overflows
  MT_CHECK(!__builtin_mul_overflow(mb, gas, &product) && !__builtin_mul_overflow(product, int64_t{world}, &product),
           ErrorKind::kInvalidArgument,
           "train_micro_batch_size_per_gpu (" + std::to_string(mb) + ") * gradient_accumulation_steps (" +
               std::to_string(gas) + ") * data-parallel size (" + std::to_string(world) + ") overflows");
  if (tbs == 0) tbs = product;
  if (tbs_auto)
    s.resolved("train_batch_size", tbs, "train_micro_batch_size_per_gpu x gradient_accumulation_steps x " + ranks);
  if (mb_auto) s.resolved("train_micro_batch_size_per_gpu", mb, "train_batch_size / gradient_accumulation_steps / " + ranks);
  if (gas_auto) s.resolved("gradient_accumulation_steps", gas, "train_batch_size / train_micro_batch_size_per_gpu / " + ranks);
  MT_CHECK(tbs > 0 && mb > 0 && gas > 0 && tbs == product, ErrorKind::kInvalidArgument,
           "train_batch_size (" + std::to_string(tbs) + ") must equal train_micro_batch_size_per_gpu (" +
               std::to_string(mb) + ") * gradient_accumulation_steps (" + std::to_string(gas) +
               ") * data-parallel size (" + std::to_string(world) + ")");
  c.batch = {tbs, mb, gas};
}

void parse_precision(Section& root, RunConfig& c) {
  bool fp16 = false, bf16 = false;
  if (root.has("fp16")) {
    Section s = root.sub("fp16");
    fp16 = s.is_auto("enabled") ? s.resolved("enabled", false, "Hugging Face's --fp16 default") : s.boolean("enabled", false);
    double ls = s.number("loss_scale", 0.0);
    c.loss_scaler.dynamic = ls == 0.0;
    c.loss_scaler.static_scale = ls;
    c.loss_scaler.initial_scale_power = s.small_integer("initial_scale_power", 16);
    c.loss_scaler.scale_window = s.integer("loss_scale_window", 1000);
    c.loss_scaler.hysteresis = s.small_integer("hysteresis", 2);
    c.loss_scaler.consecutive_hysteresis = s.boolean("consecutive_hysteresis", false);
    c.loss_scaler.min_scale = s.number("min_loss_scale", 1.0);
    // DeepSpeed's dynamic_loss_scale_args: None unless one of these is given.
    for (const char* k : {"initial_scale_power", "loss_scale_window", "min_loss_scale", "hysteresis", "consecutive_hysteresis"})
      c.fp16_dynamic_args_given = c.fp16_dynamic_args_given || s.has(k);
    s.require_default("auto_cast", false, "auto_cast is not supported");
    if (s.boolean("fp16_master_weights_and_grads", false)) c.master_dtype = DType::kF16;
    MT_CHECK(c.loss_scaler.scale_window > 0 && c.loss_scaler.hysteresis > 0, ErrorKind::kInvalidArgument,
             "fp16.loss_scale_window and fp16.hysteresis must be positive");
    // Scales are applied in f32: 2^127 is the largest finite power (2^2000 became inf and every
    // step was skipped, forever).
    MT_CHECK(c.loss_scaler.initial_scale_power >= 0 && c.loss_scaler.initial_scale_power <= 127,
             ErrorKind::kInvalidArgument,
             s.where("initial_scale_power") + ": " + std::to_string(c.loss_scaler.initial_scale_power) +
                 " is outside [0, 127] (the scale 2^power must be a finite f32; DeepSpeed's default is 16)");
    MT_CHECK(std::isfinite(ls) && ls >= 0.0 && ls <= 3.0e38, ErrorKind::kInvalidArgument,
             s.where("loss_scale") + ": must be 0 (dynamic) or a positive finite f32 scale");
    MT_CHECK(std::isfinite(c.loss_scaler.min_scale) && c.loss_scaler.min_scale > 0.0 &&
                 (!c.loss_scaler.dynamic || c.loss_scaler.min_scale <= std::ldexp(1.0, c.loss_scaler.initial_scale_power)),
             ErrorKind::kInvalidArgument,
             s.where("min_loss_scale") + ": must be positive and at most the initial scale 2^initial_scale_power");
    s.refuse_unknown_as_deepspeed("DeepSpeedFP16Config");
    s.finish();
  }
  // DeepSpeed still reads its older name, "bfloat16", where "bf16" is not given (get_bfloat16_config).
  const bool both = root.has("bf16") && root.has("bfloat16");
  MT_CHECK(!both || root.raw("bf16") == root.raw("bfloat16"), ErrorKind::kInvalidArgument,
           "bf16 and bfloat16 (its older name, which DeepSpeed reads only where bf16 is absent) differ: give one");
  const char* bf16_key = root.has("bf16") ? "bf16" : "bfloat16";
  if (root.has(bf16_key)) {
    Section s = root.sub(bf16_key);
    bf16 = s.is_auto("enabled") ? s.resolved("enabled", false, "Hugging Face's --bf16 default") : s.boolean("enabled", false);
    if (s.boolean("bf16_master_weights_and_grads", false)) {
      if (bf16) c.master_dtype = DType::kBF16;
      else c.warnings.push_back("bf16.bf16_master_weights_and_grads: ignored because bf16 is not enabled");
    }
    s.unparsed("immediate_grad_update", Unparsed::kWarn);
    c.bf16_check_grad_overflow = s.boolean("check_grad_overflow", false) && bf16;
    MT_CHECK(!s.boolean("bf16_optimizer_states", false), ErrorKind::kNotSupported,
             s.where("bf16_optimizer_states") + ": true (Adam's moments in bf16) is not supported");
    // fp16's loss-scaling keys copied into bf16 (DeepSpeedExamples' cifar, LLaMA-Factory, Megatron-
    // DeepSpeed configs do): bf16 scales no loss, DeepSpeed before its pydantic bf16 model read
    // none of them, so they change nothing; warned, not refused as a misspelling would be.
    for (const char* k : {"loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "consecutive_hysteresis",
                          "min_loss_scale", "auto_cast", "fp16_master_weights_and_grads"})
      s.ignored(k, "an fp16 key; bf16 has no loss scaling or autocast to set (older DeepSpeed ignored it, the newest refuses it)");
    s.refuse_unknown_as_deepspeed("DeepSpeedBF16Config");
    s.finish();
  }
  MT_CHECK(!(fp16 && bf16), ErrorKind::kInvalidArgument, "fp16.enabled and bf16.enabled cannot both be true");
  if (c.master_dtype == DType::kF16 && !fp16) {  // read by DeepSpeed only with fp16 on
    c.warnings.push_back("fp16.fp16_master_weights_and_grads: ignored because fp16 is not enabled");
    c.master_dtype = DType::kF32;
  }
  c.compute_dtype = fp16 ? DType::kF16 : bf16 ? DType::kBF16 : DType::kF32;
}

// Hugging Face TrainingArguments defaults: what its DeepSpeed integration fills "auto" with when
// the user passes nothing.
constexpr double kHfLr = 5e-5, kHfBeta1 = 0.9, kHfBeta2 = 0.999, kHfEps = 1e-8, kHfWd = 0.0;

// betas: [beta1, beta2], or "auto" (HF's defaults).
void parse_betas(Section& p, optim::OptimizerSpec& o) {
  if (p.is_auto("betas")) {
    o.beta1 = kHfBeta1;
    o.beta2 = kHfBeta2;
    p.resolved("betas", json::array({kHfBeta1, kHfBeta2}), "Hugging Face's adam_beta1, adam_beta2 defaults");
  } else if (p.has("betas")) {
    const json& b = p.raw("betas");
    MT_CHECK(b.is_array() && b.size() == 2 && b[0].is_number() && b[1].is_number(), ErrorKind::kInvalidArgument,
             "optimizer.params.betas must be [beta1, beta2]");
    o.beta1 = b[0].get<double>();
    o.beta2 = b[1].get<double>();
    // As torch.optim's Adam/AdamW refuse them: beta 1 divides by zero in the bias correction and a
    // beta past 1 grows the moments without bound (the weights turn non-finite in a few steps).
    for (int i : {0, 1}) {
      const double v = i == 0 ? o.beta1 : o.beta2;
      MT_CHECK(v >= 0.0 && v < 1.0, ErrorKind::kInvalidArgument,
               p.where("betas") + ": beta" + std::to_string(i + 1) + " = " + b[i].dump() + " is outside [0, 1)");
    }
  }
}

// DeepSpeed's 1-bit optimizers (OnebitAdam, ZeroOneAdam, OnebitLamb): their own keys (lr, betas,
// eps, weight_decay are read by the caller; OnebitLamb's max_coeff, min_coeff too).
void parse_onebit(Section& p, const std::string& type, optim::OptimizerSpec& o, std::vector<std::string>& warnings) {
  if (type == "ZeroOneAdam") {
    o.var_freeze_step = p.integer("var_freeze_step", 100000);
    o.var_update_scaler = p.integer("var_update_scaler", 16);
    o.local_step_scaler = p.integer("local_step_scaler", 32678);
    o.local_step_clipper = p.integer("local_step_clipper", 16);
  } else {
    o.freeze_step = p.integer("freeze_step", 100000);
    MT_CHECK(o.freeze_step >= 0, ErrorKind::kInvalidArgument, p.where("freeze_step") + ": must not be negative");
  }
  if (type == "OneBitLamb") {
    o.coeff_beta = p.number("coeff_beta", 0.9);
    o.factor_max = p.number("factor_max", 4.0);
    o.factor_min = p.number("factor_min", 0.5);
    o.factor_threshold = p.number("factor_threshold", 0.1);
  }
  if (type == "OneBitAdam") {
    o.bias_correction = p.boolean("bias_correction", true);
  } else if (p.boolean("bias_correction", true) && p.has("bias_correction")) {
    // DeepSpeed's ZeroOneAdam and OnebitLamb take the key and never apply it.
    warnings.push_back(p.where("bias_correction") + ": true is ignored: DeepSpeed's " + type +
                       " never applies bias correction (nor does meshtrain's)");
  }
  if (type != "OneBitAdam") o.bias_correction = false;
  // DeepSpeed's backends ("nccl", its default, "mpi", "compressed") move the same compressed
  // bytes with the same arithmetic; meshtrain's runs on MPI whichever is named.
  const std::string backend = p.string("comm_backend_name", "mpi");
  MT_CHECK(backend != "hccl", ErrorKind::kNotSupported,
           p.where("comm_backend_name") + ": \"hccl\" (DeepSpeed's backend for Ascend NPUs) is not supported here");
  MT_CHECK(backend == "mpi" || backend == "nccl" || backend == "compressed", ErrorKind::kNotSupported,
           p.where("comm_backend_name") + ": \"" + backend + "\" is not a DeepSpeed backend (nccl, mpi, compressed, hccl)");
  if (backend != "mpi")
    warnings.push_back(p.where("comm_backend_name") + ": \"" + backend +
                       "\": the compressed all-reduce runs on MPI here (the same compressed exchange)");
  if (p.has("cuda_aware"))
    warnings.push_back(p.where("cuda_aware") + ": ignored (the compressed all-reduce runs on host buffers over MPI)");
  p.require_default("eps_inside_sqrt", false, "eps_inside_sqrt is not supported by " + type + " here");
  p.require_default("max_grad_norm", 0.0, "use gradient_clipping (DeepSpeed refuses max_grad_norm as an optimizer parameter)");
}

// 1-bit optimizers (DeepSpeed's rules): ZeRO stage 0 only; no pipeline (DeepSpeed's MPI backend does
// not support it, its nccl one does: not built here), no tensor parallelism, fp16 or fp32 (DeepSpeed wraps them in its fp16
// optimizer only), on CPU ranks.
void check_onebit(const RunConfig& c) {
  if (!optim::optimizer_is_onebit(c.optimizer)) return;
  const std::string t = "optimizer.type " + c.optimizer.type;
  MT_CHECK(c.zero.stage == 0, ErrorKind::kNotSupported,
           "zero_optimization.stage " + std::to_string(c.zero.stage) + " with " + t + ": 1-bit optimizers need stage 0 (as in DeepSpeed)");
  MT_CHECK(c.pp == 1, ErrorKind::kNotSupported,
           "parallel.pp > 1 with " + t + " is not supported here (DeepSpeed runs it on its nccl backend, not on mpi)");
  MT_CHECK(c.tp == 1, ErrorKind::kNotSupported, "parallel.tp > 1 with " + t + " is not supported yet");
  MT_CHECK(c.compute_dtype != DType::kBF16, ErrorKind::kNotSupported,
           "bf16.enabled with " + t + ": DeepSpeed runs its 1-bit optimizers under fp16 or fp32 only");
}

// DeepSpeed resolves the type case-insensitively for its own optimizers (Adam, AdamW, Lamb) and
// looks any other name up in torch.optim (SGD).
void parse_optimizer(Section& root, RunConfig& c) {
  if (!root.has("optimizer")) {
    c.warnings.push_back("optimizer: none given; training with AdamW (lr 0.001, betas [0.9, 0.999], eps 1e-8, weight_decay 0) "
                      "at a constant rate (give an optimizer block, e.g. --set optimizer.params.lr=..., to choose)");
    return;
  }
  Section s = root.sub("optimizer");
  // DeepSpeed builds no optimizer from a block without a type (its params are then not read).
  MT_CHECK(s.has("type"), ErrorKind::kInvalidArgument,
           "optimizer.type: missing (DeepSpeed builds no optimizer from a block without one); give Adam, AdamW, Lamb, SGD, "
           "OneBitAdam, ZeroOneAdam or OneBitLamb");
  std::string type = s.string("type", "AdamW");
  optim::OptimizerSpec& o = c.optimizer;
  std::string lower = type;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  const bool adam = lower == "adam" || lower == "adamw", lamb = lower == "lamb", sgd = lower == "sgd";
  const bool onebit = lower == "onebitadam" || lower == "zerooneadam" || lower == "onebitlamb";
  if (!adam && !lamb && !sgd && !onebit)
    throw Error(ErrorKind::kNotSupported, "optimizer.type: '" + type +
                                              "' is not implemented (Adam, AdamW, Lamb, SGD, OneBitAdam, ZeroOneAdam, OneBitLamb)");
  o.type = adam     ? (lower == "adam" ? "Adam" : "AdamW")
           : lamb   ? "Lamb"
           : onebit ? (lower == "onebitadam" ? "OneBitAdam" : lower == "zerooneadam" ? "ZeroOneAdam" : "OneBitLamb")
                    : "SGD";
  // DeepSpeed builds Adam and AdamW as its FusedAdam (DeepSpeedCPUAdam when offloaded), whose
  // weight_decay defaults to 0; only "torch_adam": true builds torch.optim.AdamW, whose default is
  // 0.01 (this default was 0.01 for every AdamW, a decay DeepSpeed does not apply).
  o.weight_decay = 0.0;
  if (s.has("params")) {
    Section p = s.sub("params");
    p.refuse_unknown();
    o.torch_adam = adam && p.boolean("torch_adam", false);
    if (o.torch_adam && (lower == "adamw" || p.boolean("adam_w_mode", true))) o.weight_decay = 0.01;
    o.lr = p.number_or_auto("lr", 1e-3, kHfLr, "Hugging Face's learning_rate default");
    // The optimizers hold their rates as float: one past its range became inf there.
    MT_CHECK(std::isfinite(o.lr) && o.lr >= 0.0 && o.lr <= std::numeric_limits<float>::max(), ErrorKind::kInvalidArgument,
             p.where("lr") + ": must be a non-negative number a float holds (got " + fmt_g(o.lr) + ")");
    o.weight_decay = p.number_or_auto("weight_decay", o.weight_decay, kHfWd, "Hugging Face's weight_decay default");
    MT_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0.0, ErrorKind::kInvalidArgument,
             p.where("weight_decay") + ": must be a non-negative number (got " + std::to_string(o.weight_decay) + ")");
    if (onebit) parse_onebit(p, o.type, o, c.warnings);
    if (o.type == "OneBitLamb") {
      o.max_coeff = p.number("max_coeff", 10.0);
      o.min_coeff = p.number("min_coeff", 0.01);
    }
    if (adam || lamb || onebit) {
      parse_betas(p, o);
      o.eps = p.number_or_auto("eps", 1e-8, kHfEps, "Hugging Face's adam_epsilon default");
      MT_CHECK(std::isfinite(o.eps) && o.eps >= 0.0, ErrorKind::kInvalidArgument,
               p.where("eps") + ": must be a non-negative number (got " + std::to_string(o.eps) + ")");
      p.require_default("amsgrad", false, "amsgrad is not supported");
      p.require_default("maximize", false, "maximize is not supported");
      // DeepSpeedCPUAdam's (offload_optimizer cpu): states in fp32 is what the runtime keeps.
      p.require_default("fp32_optimizer_states", true, "false (optimizer states in 16 bits) is not supported");
      for (const char* k : {"foreach", "capturable", "differentiable", "set_grad_none"}) p.unparsed(k, Unparsed::kWarn);
    }
    if (adam) {
      // DeepSpeed's engine pops adam_w_mode for both types and builds AdamW's decoupled decay for
      // type AdamW whatever it says; it was an unknown key refused beside AdamW (stop 74, a probe).
      const bool w_mode = p.boolean("adam_w_mode", true);
      if (lower == "adamw" && !w_mode)
        c.warnings.push_back(p.where("adam_w_mode") + ": false is not read for type AdamW: DeepSpeed's engine builds "
                             "AdamW's decoupled weight decay for it, and so does meshtrain");
      o.adam_w_mode = lower == "adamw" || w_mode;
      o.bias_correction = p.boolean("bias_correction", true);
      if (p.boolean("torch_adam", false))  // torch's Adam/AdamW take no bias_correction argument
        MT_CHECK(o.bias_correction, ErrorKind::kInvalidArgument,
                 p.where("bias_correction") + ": false does not go with torch_adam (torch.optim.AdamW has no such argument)");
      p.unparsed("fused", Unparsed::kWarn);
    } else if (lamb) {  // DeepSpeed's FusedLamb
      o.bias_correction = p.boolean("bias_correction", true);
      o.eps_inside_sqrt = p.boolean("eps_inside_sqrt", false);
      o.max_coeff = p.number("max_coeff", 10.0);
      o.min_coeff = p.number("min_coeff", 0.01);
      // FusedLamb clips only when handed grad_norms, which DeepSpeed's engine never does: a positive
      // max_grad_norm fails there. Clipping is gradient_clipping.
      p.require_default("max_grad_norm", 0.0, "use gradient_clipping (DeepSpeed's engine never applies Lamb's own)");
    } else {  // torch.optim.SGD
      o.momentum = p.number("momentum", 0.0);
      o.dampening = p.number("dampening", 0.0);
      o.nesterov = p.boolean("nesterov", false);
      p.require_default("maximize", false, "maximize is not supported");
      p.unparsed("foreach", Unparsed::kWarn);
      p.unparsed("differentiable", Unparsed::kWarn);
      p.unparsed("fused", Unparsed::kWarn);
    }
    p.finish();
  }
  // Adam's L2 decay (adam_w_mode false; torch_adam: torch.optim.Adam) adds weight_decay p to the
  // gradient (kernels::AdamWParams::l2; refused until stop 77): without decay it is AdamW's update.
  if (!o.adam_w_mode && o.weight_decay == 0.0) o.adam_w_mode = true;
  // Built once here so a bad value (negative lr, nesterov without momentum) is a config error.
  optim::make_optimizer(o, 1, optim::single_segment(1, static_cast<float>(o.weight_decay)));
  s.finish();
}

void parse_no_weight_decay(Section& root, RunConfig& c) {
  if (!root.has("no_weight_decay")) return;
  const json& v = root.raw("no_weight_decay");
  if (v.is_string()) {
    MT_CHECK(v.get<std::string>() == "hf", ErrorKind::kInvalidArgument,
             "no_weight_decay must be \"hf\" or a list of parameter-name substrings");
    c.no_weight_decay = {"hf"};
    return;
  }
  MT_CHECK(v.is_array(), ErrorKind::kInvalidArgument, "no_weight_decay must be \"hf\" or a list of parameter-name substrings");
  for (const auto& e : v) {
    MT_CHECK(e.is_string() && !e.get<std::string>().empty(), ErrorKind::kInvalidArgument,
             "no_weight_decay entries must be non-empty strings");
    c.no_weight_decay.push_back(e.get<std::string>());
  }
}

}  // namespace

void ds_config_check_schedule(const RunConfig& c) {
  const optim::LrScheduleConfig& sc = c.scheduler;
  if (c.train_iters <= 0) return;
  // A falling range test lowers the lr through 0 into gradient ascent: refused where the run's
  // last step would get there (the lr is monotone, so the last step is its lowest or highest).
  if (sc.type == optim::LrScheduleType::kLRRangeTest && sc.lr_range_test_step_size > 0) {
    const double last = optim::lr_for_step(sc, c.train_iters);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", last);
    MT_CHECK(last >= 0.0 && last <= std::numeric_limits<float>::max(), ErrorKind::kInvalidArgument,
             "scheduler.params.lr_range_test_step_rate takes the learning rate to " + std::string(buf) + " by step " +
                 std::to_string(c.train_iters) + " (train_iters): it must stay a non-negative number a float holds");
  }
  // (WarmupCosineLR with total_num_steps at or below max(2, warmup_num_steps) was refused here:
  // DeepSpeed divided by zero. It now clamps the cosine's progress at 1: the floor from the warm-up's
  // end, as optim::lr_at_iteration computes.)
}

namespace {

void parse_scheduler(Section& root, RunConfig& c) {
  optim::LrScheduleConfig& sc = c.scheduler;
  sc.base_lr = c.optimizer.lr;
  if (!root.has("scheduler")) return;
  bool total_auto = false;
  Section s = root.sub("scheduler");
  std::string type = s.string("type", "");
  if (type == "WarmupLR") sc.type = optim::LrScheduleType::kWarmupLR;
  else if (type == "WarmupDecayLR") sc.type = optim::LrScheduleType::kWarmupDecayLR;
  else if (type == "WarmupCosineLR") sc.type = optim::LrScheduleType::kWarmupCosineLR;
  else if (type == "OneCycle") sc.type = optim::LrScheduleType::kOneCycle;
  else if (type == "LRRangeTest") sc.type = optim::LrScheduleType::kLRRangeTest;
  else
    throw Error(ErrorKind::kNotSupported,
                "scheduler.type: '" + type + "' is not implemented (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest)");
  const bool one_cycle = sc.type == optim::LrScheduleType::kOneCycle;
  const bool range_test = sc.type == optim::LrScheduleType::kLRRangeTest;
  if (s.has("params")) {
    Section p = s.sub("params");
    p.refuse_unknown();
    if (range_test) {  // LRRangeTest's own arguments (another type's are an unknown key, refused)
      MT_CHECK(!(p.has("lr_range_test_min_lr") && p.raw("lr_range_test_min_lr").is_array()), ErrorKind::kNotSupported,
               p.where("lr_range_test_min_lr") + ": a list (DeepSpeed's one per parameter group) is not supported; give one number");
      sc.lr_range_test_min_lr = p.number("lr_range_test_min_lr", 1e-3);
      sc.lr_range_test_step_size = p.integer("lr_range_test_step_size", 2000);
      sc.lr_range_test_step_rate = p.number("lr_range_test_step_rate", 1.0);
      sc.lr_range_test_staircase = p.boolean("lr_range_test_staircase", false);
    } else if (one_cycle) {
      MT_CHECK(p.has("cycle_min_lr") && p.has("cycle_max_lr"), ErrorKind::kInvalidArgument,
               "scheduler.params.cycle_min_lr and cycle_max_lr are required for OneCycle");
      sc.cycle_min_lr = p.number_or_auto("cycle_min_lr", 0.0, 0.0, "0");
      sc.cycle_max_lr = p.number_or_auto("cycle_max_lr", 0.0, c.optimizer.lr, "optimizer.params.lr");
      sc.decay_lr_rate = p.number("decay_lr_rate", 0.0);
      sc.cycle_first_step_size = p.integer("cycle_first_step_size", 2000);
      sc.cycle_second_step_size = p.has("cycle_second_step_size") ? p.integer("cycle_second_step_size", -1) : -1;  // null: None
      // DeepSpeed's staircase: a count above 0 holds the half cycle in that many stairs; 0 or below
      // none; the second's None (absent) is the first's.
      sc.cycle_first_stair_count = std::max<int64_t>(0, p.integer("cycle_first_stair_count", 0));
      sc.cycle_second_stair_count =
          p.has("cycle_second_stair_count") ? std::max<int64_t>(0, p.integer("cycle_second_stair_count", 0)) : -1;
      sc.decay_step_size = p.integer("decay_step_size", 0);
      sc.cycle_momentum = p.boolean("cycle_momentum", true);
      sc.cycle_min_mom = p.number("cycle_min_mom", 0.8);
      sc.cycle_max_mom = p.number("cycle_max_mom", 0.9);
      sc.decay_mom_rate = p.number("decay_mom_rate", 0.0);
    } else {
      // Each type takes its own constructor's keys in DeepSpeed (WarmupCosineLR(warmup_max_lr=...) is
      // a TypeError there); another type's were read and passed over (a WarmupCosineLR with
      // warmup_max_lr 0.5 trained at the optimizer's lr, its resolved config saying 0.5).
      const bool cosine = sc.type == optim::LrScheduleType::kWarmupCosineLR;
      const std::vector<const char*> foreign =
          cosine ? std::vector<const char*>{"warmup_min_lr", "warmup_max_lr"}
                 : sc.type == optim::LrScheduleType::kWarmupLR
                       ? std::vector<const char*>{"total_num_steps", "warmup_min_ratio", "cos_min_ratio"}
                       : std::vector<const char*>{"warmup_min_ratio", "cos_min_ratio"};
      for (const char* k : foreign)
        MT_CHECK(!p.has(k), ErrorKind::kInvalidArgument,
                 p.where(k) + ": " + type + " takes no " + k + " (DeepSpeed's " + type + " has no such argument)");
      sc.warmup_min_lr = p.number_or_auto("warmup_min_lr", 0.0, 0.0, "Hugging Face: 0");
      // WarmupLR's absent warmup_max_lr is the optimizer's lr (DeepSpeed's default None);
      // WarmupDecayLR's is 0.001 (its own signature's default).
      const double max_lr_default = sc.type == optim::LrScheduleType::kWarmupLR ? c.optimizer.lr : 1e-3;
      sc.warmup_max_lr = p.number_or_auto("warmup_max_lr", max_lr_default, c.optimizer.lr, "optimizer.params.lr");
      // DeepSpeed's constructors raise on a warmup_num_steps that is not a positive integer; "auto"
      // is Hugging Face's warmup_steps, 0 by default (taken as max(2, 0) = 2, as DeepSpeed did).
      MT_CHECK(!p.has("warmup_num_steps") || p.is_auto("warmup_num_steps") || !p.raw("warmup_num_steps").is_number() ||
                   p.raw("warmup_num_steps").get<double>() > 0,
               ErrorKind::kInvalidArgument,
               p.where("warmup_num_steps") + " must be a positive integer (DeepSpeed's " + type + " raises on " +
                   p.raw("warmup_num_steps").dump() + ")");
      sc.warmup_num_steps = p.integer_or_auto("warmup_num_steps", 1000, 0, "Hugging Face's warmup_steps default");
      sc.warmup_log = optim::lr_warmup_type_is_log(p.string("warmup_type", "log"), p.where("warmup_type"));
      // A required argument of DeepSpeed's WarmupDecayLR and WarmupCosineLR (absent, a TypeError there;
      // it was taken from train_iters without a word). "auto" is train_iters, as Hugging Face fills it.
      MT_CHECK(sc.type == optim::LrScheduleType::kWarmupLR || p.has("total_num_steps"), ErrorKind::kInvalidArgument,
               p.where("total_num_steps") + ": required by " + type +
                   " (DeepSpeed's constructor takes no default; give the run's steps, or \"auto\" for train_iters)");
      total_auto = p.is_auto("total_num_steps");
      sc.total_num_steps = p.integer_or_auto("total_num_steps", c.train_iters, c.train_iters, "train_iters");
      sc.warmup_min_ratio = p.number("warmup_min_ratio", 0.0);
      sc.cos_min_ratio = p.number("cos_min_ratio", 1e-4);
    }
    // A learning rate below 0 trains by gradient ascent (the optimizer's lr is checked; these
    // replace it): refused by key, as the rates that scale them.
    auto non_negative = [&](const char* key, double v) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", v);
      MT_CHECK(std::isfinite(v) && v >= 0.0 && v <= std::numeric_limits<float>::max(), ErrorKind::kInvalidArgument,
               p.where(key) + " must be a non-negative number a float holds (got " + buf + ")");
    };
    if (range_test) {
      non_negative("lr_range_test_min_lr", sc.lr_range_test_min_lr);
      MT_CHECK(std::isfinite(sc.lr_range_test_step_rate), ErrorKind::kInvalidArgument,
               p.where("lr_range_test_step_rate") + " must be a number");
    } else if (one_cycle) {
      non_negative("cycle_min_lr", sc.cycle_min_lr);
      non_negative("cycle_max_lr", sc.cycle_max_lr);
      non_negative("decay_lr_rate", sc.decay_lr_rate);
    } else {
      non_negative("warmup_min_lr", sc.warmup_min_lr);
      non_negative("warmup_max_lr", sc.warmup_max_lr);
      non_negative("warmup_min_ratio", sc.warmup_min_ratio);
      non_negative("cos_min_ratio", sc.cos_min_ratio);
      MT_CHECK(sc.warmup_num_steps >= 0, ErrorKind::kInvalidArgument, p.where("warmup_num_steps") + " must not be negative");
    }
    // DeepSpeed's schedulers start from it (500 began mid-warm-up); a number was passed over.
    if (p.has("last_batch_iteration"))
      MT_CHECK(p.raw("last_batch_iteration").is_number_integer() && p.raw("last_batch_iteration").get<int64_t>() == -1,
               ErrorKind::kNotSupported,
               p.where("last_batch_iteration") + ": a schedule started part way is not supported (-1 only; a resume takes its step from the checkpoint)");
    p.finish();
  } else {
    // No params: as an empty block (DeepSpeed's **None is a TypeError; the signatures' defaults are
    // what its users mean). WarmupLR's peak is then the optimizer's lr; it was 0.001, whatever lr was.
    if (sc.type == optim::LrScheduleType::kWarmupLR) sc.warmup_max_lr = c.optimizer.lr;
    MT_CHECK(!one_cycle, ErrorKind::kInvalidArgument, "scheduler.params.cycle_min_lr and cycle_max_lr are required for OneCycle");
    MT_CHECK(sc.type != optim::LrScheduleType::kWarmupDecayLR && sc.type != optim::LrScheduleType::kWarmupCosineLR,
             ErrorKind::kInvalidArgument,
             "scheduler.params.total_num_steps: required by " + type +
                 " (DeepSpeed's constructor takes no default; give the run's steps, or \"auto\" for train_iters)");
  }
  if (range_test) {
    optim::lr_schedule_check(sc);
  } else if (one_cycle) {
    optim::lr_schedule_check(sc);
    if (sc.cycle_momentum && c.optimizer.type == "SGD") {  // DeepSpeed: SGD has no betas
      c.warnings.push_back("scheduler.params.cycle_momentum: disabled because optimizer SGD has no betas (as DeepSpeed does)");
      sc.cycle_momentum = false;
    }
  } else if (sc.type != optim::LrScheduleType::kWarmupLR && !(c.bare && c.train_iters == 0)) {
    // "auto" without train_iters: the omission is train_iters (a DeepSpeed file has none).
    MT_CHECK(sc.total_num_steps > 0 || !total_auto, ErrorKind::kInvalidArgument,
             "scheduler.params.total_num_steps: \"auto\" is train_iters, which is not given (a DeepSpeed config has "
             "none: --set train_iters=N)");
    MT_CHECK(sc.total_num_steps > 0, ErrorKind::kInvalidArgument, "scheduler.params.total_num_steps must be positive");
  }
  ds_config_check_schedule(c);
  s.finish();
}

void parse_zero(Section& root, RunConfig& c) {
  if (!root.has("zero_optimization")) return;
  Section s = root.sub("zero_optimization");
  ZeroConfig& z = c.zero;
  z.stage = s.small_integer("stage", 0);
  MT_CHECK(z.stage >= 0 && z.stage <= 3, ErrorKind::kInvalidArgument, "zero_optimization.stage must be 0, 1, 2 or 3");
  c.zero_stage = z.stage;
  MT_CHECK(z.stage == 0 || c.optimizer.type != "Lamb", ErrorKind::kNotSupported,
           "zero_optimization.stage " + std::to_string(z.stage) +
               " with optimizer Lamb: Lamb's per-tensor trust ratio needs whole tensors, not ZeRO partitions (use stage 0)");
  z.overlap_comm_given = s.has("overlap_comm");
  z.overlap_comm = s.boolean("overlap_comm", z.stage == 3);
  // Hugging Face Trainer's "auto" rules (its DeepSpeed integration): from the hidden size.
  const int64_t H = c.model.hidden;
  auto size = [&s, &c](const char* key, int64_t fallback, int64_t auto_value) {
    if (c.bare && s.is_auto(key)) {  // no model yet: DeepSpeed's default stands in for the printout
      s.resolved(key, fallback, "Hugging Face's rule from the model's hidden size; no model given, DeepSpeed's default shown");
      return fallback;
    }
    int64_t v = s.integer_or_auto(key, fallback, auto_value, "Hugging Face's rule from the model's hidden size");
    // 0 is DeepSpeed's "none": no persistent parameters, no prefetch; at stages 1-3 meshtrain
    // reduces gradients per ZeRO unit (module), so reduce_bucket_size 0 is allowed there too.
    const std::string k = key;
    const bool zero_ok = k == "stage3_param_persistence_threshold" || k == "stage3_prefetch_bucket_size" ||
                         k == "param_persistence_threshold" || k == "prefetch_bucket_size" ||
                         (k == "reduce_bucket_size" && c.zero.stage >= 1);
    MT_CHECK(v > 0 || (zero_ok && v == 0), ErrorKind::kInvalidArgument, s.where(key) + " must be positive");
    return v;
  };
  z.reduce_bucket_size = size("reduce_bucket_size", z.reduce_bucket_size, H * H);
  if (s.has("allgather_bucket_size"))  // read (resolved JSON shows it), but it tunes nothing here
    c.warnings.push_back(s.where("allgather_bucket_size") +
                         ": no effect; ZeRO gathers each unit (module) whole, in one all-gather");
  z.allgather_bucket_size = size("allgather_bucket_size", z.allgather_bucket_size, H * H);
  // DeepSpeed's config model takes these by their field names too (prefetch_bucket_size, ...; the
  // stage3_ names are its aliases): the field names were warned as unknown and the defaults kept.
  auto named = [&s](const char* alias, const char* field) -> const char* {
    MT_CHECK(!(s.has(alias) && s.has(field)), ErrorKind::kInvalidArgument,
             s.where(field) + " and " + s.where(alias) + " are one setting (DeepSpeed's field and its alias); give one");
    return s.has(field) ? field : alias;
  };
  z.stage3_prefetch_bucket_size =
      size(named("stage3_prefetch_bucket_size", "prefetch_bucket_size"), z.stage3_prefetch_bucket_size, 9 * H * H / 10);
  z.stage3_param_persistence_threshold = size(named("stage3_param_persistence_threshold", "param_persistence_threshold"),
                                              z.stage3_param_persistence_threshold, 10 * H);
  z.stage3_max_live_parameters = size(named("stage3_max_live_parameters", "max_live_parameters"), z.stage3_max_live_parameters,
                                      z.stage3_max_live_parameters);
  auto offload = [&s, &c, &z](const char* k) -> std::string {
    if (!s.has(k)) return "none";
    Section o = s.sub(k);
    std::string device = o.string("device", "none");
    MT_CHECK(device == "none" || device == "cpu" || device == "nvme", ErrorKind::kInvalidArgument,
             o.where("device") + ": '" + device + "' is not a device (none, cpu or nvme)");
    const bool optimizer = std::string(k) == "offload_optimizer";
    if (device == "nvme")
      MT_CHECK(o.has("nvme_path") && o.raw("nvme_path").is_string() && !o.raw("nvme_path").get<std::string>().empty(),
               ErrorKind::kInvalidArgument, o.where("nvme_path") + ": device 'nvme' needs the swap directory");
    if (device == "nvme" && !optimizer) {
      z.param_nvme_path = o.string("nvme_path", "");
      // DeepSpeed's pinned staging buffers and its host-side parameter cache: the swap's own
      // buffers are the unit being gathered and the prefetched one (stage3_* knobs) here.
      for (const char* w : {"buffer_count", "buffer_size", "max_in_cpu"})
        if (o.has(w)) c.warnings.push_back(o.where(w) + ": accepted; parameters are read per ZeRO unit as the "
                                                         "stage-3 prefetch asks (stage3_prefetch_bucket_size)");
    } else if (device == "nvme") {
      z.optimizer_nvme_path = o.string("nvme_path", "");
      const int64_t bc = o.integer("buffer_count", 4);
      MT_CHECK(bc >= 2 && bc <= 64, ErrorKind::kInvalidArgument, o.where("buffer_count") + " must be 2 to 64");
      z.optimizer_buffer_count = static_cast<int>(bc);
      z.pipeline_read = o.boolean("pipeline_read", false);
      z.pipeline_write = o.boolean("pipeline_write", false);
      if (o.has("ratio") && o.number("ratio", 1.0) != 1.0)
        c.warnings.push_back(o.where("ratio") + ": partial offload has no effect with 'nvme'; the whole state is swapped");
      o.boolean("fast_init", false);  // the swap starts from zeros without writing them: always fast
    } else if (optimizer) {
      for (const char* w : {"buffer_count", "fast_init", "ratio", "nvme_path", "pipeline_read", "pipeline_write"})
        o.unparsed(w, Unparsed::kWarn);
    } else {
      for (const char* w : {"buffer_count", "nvme_path", "buffer_size", "max_in_cpu"}) o.unparsed(w, Unparsed::kWarn);
    }
    o.unparsed("pin_memory", Unparsed::kWarn);
    // DeepSpeed's Superchip offload and CPU Adam's share of the cores: where the step runs, not its values.
    if (optimizer)
      for (const char* w : {"super_offload", "cpuadam_cores_perc", "convert_grad_on_cpu"}) o.unparsed(w, Unparsed::kWarn);
    o.refuse_unknown_as_deepspeed(optimizer ? "DeepSpeedZeroOffloadOptimizerConfig" : "DeepSpeedZeroOffloadParamConfig");
    o.finish();
    return device;
  };
  // DeepSpeed's elastic_checkpoint lets stage 1/2 optimizer state load on another dp size; every
  // meshtrain checkpoint loads into any layout, so either value gets that.
  s.boolean("elastic_checkpoint", false);
  z.offload_optimizer = offload("offload_optimizer");
  z.offload_param = offload("offload_param");
  if (z.offload_optimizer == "nvme") {
    z.sub_group_size = s.integer("sub_group_size", z.sub_group_size);
    MT_CHECK(z.sub_group_size > 0, ErrorKind::kInvalidArgument, s.where("sub_group_size") + " must be positive");
    MT_CHECK(c.optimizer.type == "AdamW" || c.optimizer.type == "Adam", ErrorKind::kNotSupported,
             "zero_optimization.offload_optimizer.device 'nvme' with optimizer.type " + c.optimizer.type +
                 ": swapped state is implemented for Adam and AdamW (DeepSpeed's CPU Adam)");
  }
  // DeepSpeed's legacy keys beside the blocks that replace them: its config model refuses the pair
  // (an explicit nvme block was overridden by "cpu" without a word, stop 73). A false one asks for
  // nothing (DeepSpeed's own model_dump writes it beside the blocks).
  for (const auto& [old_key, new_key] : {std::pair{"cpu_offload", "offload_optimizer"}, std::pair{"cpu_offload_param", "offload_param"}})
    MT_CHECK(!(s.has(old_key) && s.boolean(old_key, false) && s.has(new_key)), ErrorKind::kInvalidArgument,
             s.where(old_key) + " is DeepSpeed's deprecated form of " + s.where(new_key) +
                 ", which is given too; give one (DeepSpeed refuses the pair)");
  if (s.boolean("cpu_offload", false)) z.offload_optimizer = "cpu";  // DeepSpeed's legacy key
  if (s.boolean("cpu_offload_param", false)) z.offload_param = "cpu";  // (this was read as "cpu_offload_params")
  MT_CHECK(z.offload_optimizer == "none" || z.stage >= 1, ErrorKind::kInvalidArgument,
           "zero_optimization.offload_optimizer needs stage 1, 2 or 3 (DeepSpeed's rule)");
  if (z.offload_param != "none" && z.stage != 3) {  // DeepSpeed reads it at stage 3 only
    c.warnings.push_back("zero_optimization.offload_param: applies to stage 3 only; ignored at stage " +
                         std::to_string(z.stage) + " (as in DeepSpeed)");
    z.offload_param = "none";
  }
  // Tuning knobs of DeepSpeed's implementation that do not change what is trained.
  for (const char* k : {"allgather_partitions", "reduce_scatter", "contiguous_gradients", "stage3_max_reuse_distance",
                        "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
                        "round_robin_gradients", "memory_efficient_linear", "ignore_unused_parameters", "use_multi_rank_bucket_allreduce",
                        "zero_hpz_partition_size", "max_reuse_distance", "gather_16bit_weights_on_model_save",
                        "stage3_model_persistence_threshold", "model_persistence_threshold", "stage3_module_granularity_threshold",
                        "module_granularity_threshold", "stage3_use_all_reduce_for_fetch_params", "use_all_reduce_for_fetch_params",
                        "cpu_offload_use_pin_memory", "mics_hierarchical_params_gather", "pipeline_loading_checkpoint",
                        "override_module_apply", "allgather_sequential", "stage3_allgather_sequential",
                        "partition_stream_chunk_size", "stage3_partition_stream_chunk_size", "enable_sanity_checks",
                        "log_trace_cache_warnings", "leaf_module", "legacy_stage1", "mics_shard_size",
                        "save_muon_momentum_buffer_in_memory", "zeropp_loco_param"})
    s.unparsed(k, Unparsed::kWarn);
  if (z.offload_optimizer != "nvme") s.unparsed("sub_group_size", Unparsed::kWarn);  // nvme: the swap unit
  // false restores the master weights from the 16-bit model copy in DeepSpeed (rounded): refused.
  MT_CHECK(s.boolean("load_from_fp32_weights", true), ErrorKind::kNotSupported,
           s.where("load_from_fp32_weights") + ": false (master weights restored from the 16-bit copy) is not supported");
  // ZenFlow (its presence enables it: selective, delayed updates) changes what is trained.
  MT_CHECK(!s.has("zenflow") || s.raw("zenflow").is_null(), ErrorKind::kNotSupported,
           s.where("zenflow") + ": ZenFlow's selective, delayed updates are not supported; remove the block");
  // ZeRO++'s quantized exchanges change the values trained on: refused by key when on.
  for (const char* k : {"zero_quantized_weights", "zero_quantized_gradients", "zero_quantized_nontrainable_weights"})
    MT_CHECK(!s.boolean(k, false), ErrorKind::kNotSupported,
             s.where(k) + ": ZeRO++ quantized exchange is not supported (it changes the values trained on); set it false");
  s.refuse_unknown_as_deepspeed("DeepSpeedZeroConfig");
  s.finish();
}

void parse_model(Section& root, RunConfig& c, const std::string& where) {
  MT_CHECK(root.has("model"), ErrorKind::kInvalidArgument, "model: missing (a Hugging Face config object or a path to config.json)");
  const json& m = root.raw("model");
  if (m.is_string()) {
    c.model_json = json_load_file(m.get<std::string>());
    c.model = hf_config_parse(c.model_json, m.get<std::string>(), &c.warnings);
    return;
  }
  MT_CHECK(m.is_object(), ErrorKind::kInvalidArgument, "model must be an object or a path");
  c.model_json = m;
  if (m.contains("init_from")) {
    MT_CHECK(m["init_from"].is_string(), ErrorKind::kInvalidArgument, "model.init_from must be a path");
    c.init_from = m["init_from"].get<std::string>();
    c.model_json.erase("init_from");
  }
  if (m.contains("config")) {  // {"config": "path/to/config.json", "init_from": ..., other keys}
    MT_CHECK(m["config"].is_string(), ErrorKind::kInvalidArgument, "model.config must be a path");
    std::string path = m["config"].get<std::string>();
    json base = json_load_file(path);
    MT_CHECK(base.is_object(), ErrorKind::kInvalidArgument, path + ": a model config is a JSON object");
    // Keys given beside it override the file's (model.resid_pdrop=0 for a hub GPT-2's config.json).
    for (const auto& [k, v] : m.items())
      if (k != "config" && k != "init_from") base[k] = v;
    c.model_json = base;
    c.model = hf_config_parse(c.model_json, path, &c.warnings);
    return;
  }
  // {"init_from": path} without a model_type: the architecture comes from path (a Hugging Face
  // directory's config.json, or a meshtrain checkpoint's model); keys given beside init_from
  // (num_labels, to fine-tune a causal LM as a classifier) override it.
  if (!c.init_from.empty() && !c.model_json.contains("model_type")) {
    std::string path = hf_weights_config_path(c.init_from);
    json base;
    if (!path.empty()) {
      base = json_load_file(path);
      // A Hugging Face directory's causal LM stays one for a causal-LM run (AutoModelForCausalLM),
      // whatever num_labels its config.json carries; a classification run counts its labels.
      const bool classification = root.has("task") && root.raw("task").is_string() && root.raw("task") == "classification";
      if (!classification) hf_directory_drop_num_labels(base);
    } else if (std::filesystem::exists(std::filesystem::path(c.init_from) / "state.json") ||
               std::filesystem::exists(std::filesystem::path(c.init_from) / "latest")) {
      path = c.init_from;
      base = checkpoint_info(c.init_from).model_json;
    }
    MT_CHECK(!base.empty(), ErrorKind::kInvalidArgument,
             "model: no model_type given, and init_from " + c.init_from +
                 " is neither a directory holding config.json nor a meshtrain checkpoint");
    for (const auto& [k, v] : c.model_json.items()) base[k] = v;
    c.model_json = base;
    c.model = hf_config_parse(c.model_json, path, &c.warnings);
    return;
  }
  c.model = hf_config_parse(c.model_json, where + ": model", &c.warnings);
}

// data.train / data.valid: a path, or a Megatron blend list read as its get_blend_from_list reads
// --data-path: weight, prefix pairs when the list is even and every weight is a number, else
// prefixes alone (some weights numbers and some not: refused, as Megatron asserts).
void parse_data_source(Section& d, const char* key, std::string* display, DataSpec* spec) {
  if (!d.has(key)) return;
  const json& v = d.raw(key);
  if (v.is_string()) {
    // "" is none, as the resolved form writes an absent one (--set data.valid= turns validation
    // off); it was a path: train failed opening ".idx", naming neither key.
    if (v.get<std::string>().empty()) return;
    *display = v.get<std::string>();
    spec->paths = {*display};
    return;
  }
  const std::string form = " must be a dataset (an indexed-dataset prefix or a .txt/.jsonl file) or Megatron's blend list: "
                           "[\"0.3\", \"a\", \"0.7\", \"b\"] (weights and prefixes) or [\"a\", \"b\"]";
  MT_CHECK(v.is_array() && !v.empty(), ErrorKind::kInvalidArgument, d.where(key) + form);
  std::vector<std::string> items;
  for (const json& x : v) {
    MT_CHECK(x.is_string() || x.is_number(), ErrorKind::kInvalidArgument, d.where(key) + form);
    items.push_back(x.is_string() ? x.get<std::string>() : x.dump());
  }
  bool out_of_range = false;
  auto number = [&out_of_range](const std::string& t, double* out) {
    size_t a = t.find_first_not_of(" \t"), b = t.find_last_not_of(" \t");
    if (a == std::string::npos) return false;
    const char* first = t.data() + a;
    const char* last = t.data() + b + 1;
    if (*first == '+') ++first;
    auto [end, ec] = std::from_chars(first, last, *out);
    if (ec == std::errc::result_out_of_range && end == last) out_of_range = true;
    return ec == std::errc() && end == last;
  };
  size_t numbers = 0;
  std::vector<double> weights;
  size_t first_bad = items.size();  // the first weight's place that is not a number
  bool bad_out_of_range = false;
  if (items.size() % 2 == 0) {
    for (size_t i = 0; i < items.size(); i += 2) {
      double w = 0.0;
      out_of_range = false;
      if (number(items[i], &w)) ++numbers;
      else if (first_bad == items.size()) first_bad = i, bad_out_of_range = out_of_range;
      weights.push_back(w);
    }
    // The entry is named (two messages ran together, naming none).
    MT_CHECK(numbers == 0 || numbers == weights.size(), ErrorKind::kInvalidArgument,
             d.where(key) + "[" + std::to_string(first_bad) + "]: \"" + items[first_bad] + "\" is " +
                 (bad_out_of_range ? "a number past a double's range" : "not a number") +
                 ", but the blend's other weights are numbers; a blend is [\"0.3\", \"a\", \"0.7\", \"b\"] (weights and "
                 "prefixes) or [\"a\", \"b\"] (prefixes alone)");
  }
  if (numbers > 0) {
    for (size_t i = 0; i < items.size(); i += 2) {
      // Megatron's BlendedDataset asserts every weight > 0 (a zero one was still drawn from on ties).
      MT_CHECK(weights[i / 2] > 0.0 && std::isfinite(weights[i / 2]), ErrorKind::kInvalidArgument,
               d.where(key) + ": the weight " + items[i] + " of " + items[i + 1] + " must be a finite number > 0");
      spec->paths.push_back(items[i + 1]);
    }
    spec->weights = weights;
    spec->weighted = true;
    spec->blend = true;
  } else {
    spec->paths = items;
    spec->blend = items.size() > 1;  // one prefix without a weight: Megatron builds it alone
  }
  for (std::string& p : spec->paths) {
    const size_t a = p.find_first_not_of(" \t"), b = p.find_last_not_of(" \t");
    p = a == std::string::npos ? std::string() : p.substr(a, b - a + 1);  // Megatron strips them
    MT_CHECK(!p.empty(), ErrorKind::kInvalidArgument, d.where(key) + ": an empty dataset path in the blend");
  }
  for (const std::string& t : items) *display += (display->empty() ? "" : " ") + t;
}

void parse_data(Section& root, RunConfig& c) {
  if (!root.has("data")) return;
  Section d = root.sub("data");
  parse_data_source(d, "train", &c.data_train, &c.train_spec);
  parse_data_source(d, "valid", &c.data_valid, &c.valid_spec);
  c.tokenizer = d.string("tokenizer", "");
  c.shuffle = d.boolean("shuffle", true);
  // Sequence classification's fields (the CLUE scripts' --texta_name ... names).
  data::ClassificationFields& f = c.cls_fields;
  f.text_a = d.string("texta_name", f.text_a);
  f.text_b = d.string("textb_name", f.text_b);
  f.label = d.string("label_name", f.label);
  f.id = d.string("id_name", f.id);
  c.pad_to_max_length = d.boolean("pad_to_max_length", false);
  if (d.has("labels")) {
    const json& l = d.raw("labels");
    MT_CHECK(l.is_array() && !l.empty(), ErrorKind::kInvalidArgument, d.where("labels") + " must be a list of label names");
    for (const json& x : l) {
      MT_CHECK(x.is_string(), ErrorKind::kInvalidArgument, d.where("labels") + " must be a list of label names");
      f.labels.push_back(x.get<std::string>());
    }
  }
  // The order's own seed: it replaced `seed`, and so the initial weights (data.seed 7 trained as
  // seed 7 did).
  const int64_t data_seed = d.integer("seed", static_cast<int64_t>(c.seed));
  MT_CHECK(data_seed >= 0, ErrorKind::kInvalidArgument,
           d.where("seed") + ": " + std::to_string(data_seed) + " is negative (numpy's and Hugging Face's set_seed refuse one too)");
  c.data_seed = static_cast<uint64_t>(data_seed);
  c.sample_order = d.string("sample_order", c.sample_order);
  // Megatron's --eod-mask-loss: the token after an end-of-document is not a target.
  c.eod_mask_loss = d.boolean("eod_mask_loss", false);
  c.eod_id = d.integer("eod_id", -1);
  // Megatron's --reset-position-ids and --reset-attention-mask: the documents a sample packs.
  c.reset_position_ids = d.boolean("reset_position_ids", false);
  c.reset_attention_mask = d.boolean("reset_attention_mask", false);
  MT_CHECK(c.eod_id >= -1, ErrorKind::kInvalidArgument, d.where("eod_id") + ": must be a token id (>= 0)");
  // Given, it is checked whether or not it is read, and said when nothing reads it (500 beside a
  // vocabulary of 97, or -1, passed in silence without eod_mask_loss: stop 73).
  if (d.has("eod_id")) {
    MT_CHECK(c.eod_id >= 0, ErrorKind::kInvalidArgument,
             d.where("eod_id") + ": " + std::to_string(c.eod_id) + " is not a token id (>= 0)");
    MT_CHECK(c.bare || c.model.vocab_size <= 0 || c.eod_id < c.model.vocab_size, ErrorKind::kInvalidArgument,
             d.where("eod_id") + ": " + std::to_string(c.eod_id) + " is outside the model's vocabulary [0, " +
                 std::to_string(c.model.vocab_size) + ")");
    if (!c.eod_mask_loss && !c.reset_position_ids && !c.reset_attention_mask)
      c.warnings.push_back(d.where("eod_id") +
                           ": read by data.eod_mask_loss, reset_position_ids and reset_attention_mask, none of which is on: "
                           "it has no effect");
  }
  MT_CHECK(c.sample_order == "meshtrain" || c.sample_order == "megatron", ErrorKind::kInvalidArgument,
           d.where("sample_order") + ": \"" + c.sample_order + "\" is not an order (\"meshtrain\" or \"megatron\")");
  if (d.has("split")) {
    // Megatron's --split: one dataset cut into training, validation and test sequences.
    c.split = d.string("split", "");
    try {
      c.split_weights = data::megatron_split_parse(c.split);
    } catch (const Error& e) {
      throw Error(ErrorKind::kInvalidArgument, d.where("split") + ": " + e.what());
    }
    MT_CHECK(c.data_valid.empty(), ErrorKind::kInvalidArgument,
             d.where("split") + " cuts data.train into training and validation sequences; data.valid names another "
             "validation set (Megatron refuses --split with per-split paths too): give one or the other");
  }
  // A weighted list of one dataset: Megatron blends it (with the surplus) only from --data-path,
  // which data.split stands for; its per-split paths (--train-data-path, --valid-data-path: data.train
  // without data.split, data.valid) build a single dataset alone, its weight unused.
  if (c.train_spec.paths.size() == 1 && c.split.empty()) c.train_spec.blend = false;
  if (c.valid_spec.paths.size() == 1) c.valid_spec.blend = false;
  if (c.sample_order == "megatron") {
    // Megatron's GPTDataset always shuffles, from numpy.random.RandomState(seed).
    MT_CHECK(c.shuffle, ErrorKind::kInvalidArgument,
             d.where("shuffle") + ": false with sample_order \"megatron\": Megatron's GPTDataset order is always shuffled");
    MT_CHECK(c.data_seed <= 0xffffffffull, ErrorKind::kInvalidArgument,
             d.where("seed") + ": " + std::to_string(c.data_seed) +
                 " with sample_order \"megatron\": numpy's RandomState takes a seed in [0, 2^32 - 1]");
  }
  // Every key of this block selects data: an unknown one (Megatron's "split", a misspelt "valid")
  // was warned about and the whole corpus trained.
  d.refuse_unknown("every key of data selects what is trained (train, valid, tokenizer, seed, ...: CONFIG.md)");
  d.finish();
}

// parallel: {tp, pp, dp, sequence_parallel, make_vocab_size_divisible_by, pipeline_schedule,
// virtual_stages, partition}. Sets c.tp, c.pp and c.world_size (the data-parallel size,
// processes / (tp pp)). DeepSpeed's `pipeline` block is read into the same fields.
void parse_parallel(Section& root, RunConfig& c, int world) {
  c.processes = world;
  c.world_size = world;
  // DeepSpeed's name for Ulysses sequence parallelism (parallel.sp); its data parallelism takes
  // world / sequence_parallel_size.
  int64_t ds_sp = 0;  // sequence_parallel_size, when given
  if (root.has("sequence_parallel_size")) {
    ds_sp = root.integer("sequence_parallel_size", 1);
    MT_CHECK(ds_sp >= 1 && ds_sp <= 65536, ErrorKind::kInvalidArgument,
             "sequence_parallel_size: must be from 1 to 65536 (got " + std::to_string(ds_sp) + ")");
  }
  c.sp = static_cast<int>(std::max<int64_t>(ds_sp, 1));
  int64_t stages = 0;  // pipeline.stages, when given
  std::string pipeline_partition;  // pipeline.partition, when given
  if (root.has("pipeline")) {
    // DeepSpeed's pipeline block (PipelineModule's arguments in the config): read key by key.
    Section q = root.sub("pipeline");
    if (q.has("stages") && !q.is_auto("stages")) {
      stages = q.integer("stages", 1);  // (0 and -3 ran one stage; 2^32 wrapped)
      MT_CHECK(stages >= 1 && stages <= 65536, ErrorKind::kInvalidArgument,
               q.where("stages") + ": must be from 1 to 65536 (got " + std::to_string(stages) + ")");
    }
    // (both given and different: partition won without a word, stop 73)
    MT_CHECK(!(q.has("partition") && q.has("partition_method")) || q.string("partition", "") == q.string("partition_method", ""),
             ErrorKind::kInvalidArgument,
             q.where("partition") + " and " + q.where("partition_method") + " differ: they are one setting; give one");
    const char* partition_key = q.has("partition_method") && !q.has("partition") ? "partition_method" : "partition";
    c.partition = q.string("partition", q.string("partition_method", c.partition));
    // DeepSpeed's own default for this key (get_pipeline_config's "best"), which its PipelineModule
    // does not read: what trains there is PipelineModule's partition_method, "parameters" by default.
    // Copied configs carry it; it was refused.
    if (c.partition == "best") c.partition = "parameters";
    MT_CHECK(c.partition == "parameters" || c.partition == "uniform" || c.partition == "time", ErrorKind::kNotSupported,
             q.where(partition_key) + ": \"" + c.partition + "\" is not supported (\"parameters\", \"uniform\" or \"time\"; DeepSpeed's \"type:regex\" needs named layer types)");
    pipeline_partition = c.partition;
    // Recompute every block (our activation checkpointing's granularity) or none.
    int64_t aci = q.integer("activation_checkpoint_interval", 0);
    MT_CHECK(aci == 0 || aci == 1, ErrorKind::kNotSupported,
             q.where("activation_checkpoint_interval") + ": " + std::to_string(aci) +
                 " is not supported (0: none, 1: every layer; meshtrain recomputes per block)");
    if (aci == 1) c.activation_checkpointing = true;
    // DeepSpeed splits the activations and gradients it sends between stages over the tp group
    // (a transfer-size optimisation; what is trained is the same): meshtrain sends each tp rank's
    // own rows under sequence parallelism and the whole activation otherwise.
    for (const char* k : {"pipe_partitioned", "grad_partitioned"})
      if (q.boolean(k, false)) c.warnings.push_back(q.where(k) + ": accepted; stages exchange whole activations (or each tp rank's rows under sequence parallelism)");
    // Per-layer seeds: meshtrain's initialisation is already keyed on (seed, parameter name,
    // element), so every layout starts from the same weights with or without it.
    q.boolean("seed_layers", false);
    if (q.has("seed_fn")) throw Error(ErrorKind::kNotSupported, q.where("seed_fn") + ": a Python callable cannot be given to meshtrain");
    // A misspelt key (DeepSpeed PipelineModule's num_stages) left one stage: the processes trained as
    // data-parallel ranks, a global batch twice the one meant, with a warning (stop 73).
    q.refuse_unknown(q.where() + " sets the pipeline, and with it the data-parallel size and the global batch: an unread key "
                     "would train another layout and batch");
    q.finish();
  }
  // DeepSpeed's AutoTP training (tensor_parallel.autotp_size, 0 off): its tp group splits the
  // linear layers as Megatron's does and data parallelism takes world / tp, as parallel.tp here.
  // It was warned as an unknown key while every process trained as a data-parallel rank: the
  // global batch tp times DeepSpeed's.
  int64_t autotp = 0;
  if (root.has("tensor_parallel")) {
    Section t = root.sub("tensor_parallel");
    autotp = t.integer("autotp_size", 0);
    MT_CHECK(autotp >= 0 && autotp <= 65536, ErrorKind::kInvalidArgument,
             t.where("autotp_size") + ": must be from 0 (off) to 65536 (got " + std::to_string(autotp) + ")");
    // The inference engine's split (tp.tp_size, tp_grain_size) and the model's cast (dtype, the bf16
    // and fp16 blocks here) do not act on DeepSpeed's training either.
    for (const char* k : {"tp", "tensor_parallel", "dtype", "injection_policy_tuple"}) t.unparsed(k, Unparsed::kWarn);
    t.finish();
  }
  if (!root.has("parallel")) {
    if (stages > 0) c.pp = static_cast<int>(stages);
    if (autotp > 1) {
      MT_CHECK(world % autotp == 0 && world % (autotp * c.pp) == 0, ErrorKind::kInvalidArgument,
               "tensor_parallel.autotp_size (" + std::to_string(autotp) + ") does not divide the " + std::to_string(world) +
                   " process(es) (data parallelism takes processes / autotp_size)");
      c.tp = static_cast<int>(autotp);
    }
  } else {
    MT_CHECK(!root.is_auto("parallel"), ErrorKind::kNotSupported, "parallel: \"auto\" is chosen by the planner in meshtrain train, plan and estimate (planner.calibration)");
    Section p = root.sub("parallel");
    // Counts of processes, bounded before they are narrowed to int (2^32 + 1 trained as tp 1, and
    // tp x pp of 2^16 each wrapped to 0: SIGFPE).
    int64_t tp = p.integer("tp", autotp > 1 ? autotp : 1);
    MT_CHECK(tp >= 1 && tp <= 65536, ErrorKind::kInvalidArgument, p.where("tp") + ": must be from 1 to 65536 (got " + std::to_string(tp) + ")");
    MT_CHECK(autotp <= 1 || autotp == tp, ErrorKind::kInvalidArgument,
             "tensor_parallel.autotp_size (" + std::to_string(autotp) + ") and parallel.tp (" + std::to_string(tp) + ") disagree");
    c.tp = static_cast<int>(tp);
    int64_t pp = p.integer("pp", stages > 0 ? stages : 1);
    MT_CHECK(pp >= 1 && pp <= 65536, ErrorKind::kInvalidArgument, p.where("pp") + ": must be from 1 to 65536 (got " + std::to_string(pp) + ")");
    MT_CHECK(tp * pp <= world, ErrorKind::kInvalidArgument,  // in int64: the int product below wrapped
             "parallel.tp (" + std::to_string(tp) + ") x parallel.pp (" + std::to_string(pp) + ") does not divide the " +
                 std::to_string(world) + " process(es) (data parallelism takes processes / (tp x pp))");
    MT_CHECK(stages == 0 || stages == pp, ErrorKind::kInvalidArgument,
             "pipeline.stages (" + std::to_string(stages) + ") and parallel.pp (" + std::to_string(pp) + ") disagree");
    c.pp = static_cast<int>(pp);
    int64_t sp = p.integer("sp", c.sp);
    MT_CHECK(sp >= 1 && sp <= 65536, ErrorKind::kInvalidArgument, p.where("sp") + ": must be from 1 to 65536 (got " + std::to_string(sp) + ")");
    MT_CHECK(ds_sp == 0 || ds_sp == sp, ErrorKind::kInvalidArgument,
             "sequence_parallel_size (" + std::to_string(ds_sp) + ") and parallel.sp (" + std::to_string(sp) + ") disagree");
    c.sp = static_cast<int>(sp);
    c.sequence_parallel = p.boolean("sequence_parallel", false) && c.tp > 1;
    int64_t vd = p.integer("make_vocab_size_divisible_by", 128);
    // (Times tp, in int: 2^30 x 2 was a division by zero on a rank.)
    MT_CHECK(vd >= 1 && vd * tp <= (int64_t{1} << 24), ErrorKind::kInvalidArgument,
             p.where("make_vocab_size_divisible_by") + ": must be >= 1, and times parallel.tp at most 2^24 (got " +
                 std::to_string(vd) + ")");
    c.vocab_divisible = static_cast<int>(vd);
    c.pipeline_schedule = p.string("pipeline_schedule", c.pipeline_schedule);
    parallel::pp::parse_schedule(c.pipeline_schedule);  // throws naming the key
    c.virtual_stages = p.small_integer("virtual_stages", 1);
    // A pipeline's own (config check passed 3 with pp 1 and 0 or -1 anywhere; train then failed
    // without naming the key).
    MT_CHECK(c.virtual_stages >= 1 && c.virtual_stages <= 65536 && (c.virtual_stages == 1 || c.pp > 1),
             ErrorKind::kInvalidArgument,
             p.where("virtual_stages") + ": must be 1, or from 2 to 65536 with parallel.pp > 1 (got " + std::to_string(c.virtual_stages) + ")");
    c.partition = p.string("partition", c.partition);
    // (parallel's won over pipeline's without a word, stop 73)
    MT_CHECK(pipeline_partition.empty() || !p.has("partition") || pipeline_partition == c.partition, ErrorKind::kInvalidArgument,
             p.where("partition") + " (\"" + c.partition + "\") and pipeline.partition (\"" + pipeline_partition +
                 "\") differ: give one");
    parallel::pp::parse_partition(c.partition, p.where("partition"));
    if (static_cast<int64_t>(c.tp) * c.pp * c.sp <= world && world % (c.tp * c.pp * c.sp) == 0) {
      const int dp_size = world / (c.tp * c.pp * c.sp);
      int64_t dp = p.integer("dp", dp_size);
      MT_CHECK(dp == dp_size, ErrorKind::kInvalidArgument,
               p.where("dp") + ": " + std::to_string(dp) + " does not match the " + std::to_string(world) + " process(es) / (tp " +
                   std::to_string(c.tp) + " x pp " + std::to_string(c.pp) + (c.sp > 1 ? " x sp " + std::to_string(c.sp) : std::string()) +
                   ") = " + std::to_string(dp_size));
    }
    // Every key here sets the layout, and so the data-parallel size and the global batch: parallel.ppp
    // was warned and the run trained dp 2 at twice the batch (stop 73).
    p.has("dp");  // read above where the processes divide; checked by the line below the block otherwise
    p.refuse_unknown(p.where() + " sets the layout, and with it the data-parallel size and the global batch: an unread key "
                     "would train another layout and batch");
    p.finish();
  }
  // Named by the keys given: DeepSpeed's pipeline.stages was said as parallel.tp x parallel.pp (stop 73's note).
  const bool own = root.has("parallel");
  const std::string tp_name = own || autotp <= 1 ? "parallel.tp" : "tensor_parallel.autotp_size";
  const std::string pp_name = own || stages == 0 ? "parallel.pp" : "pipeline.stages";
  MT_CHECK(world % (c.tp * c.pp) == 0, ErrorKind::kInvalidArgument,
           (c.tp == 1 && !own ? pp_name + " (" + std::to_string(c.pp) + ")"
                              : tp_name + " (" + std::to_string(c.tp) + ") x " + pp_name + " (" + std::to_string(c.pp) + ")") +
               " does not divide the " + std::to_string(world) + " process(es) (data parallelism takes processes / (tp x pp))");
  MT_CHECK(static_cast<int64_t>(c.tp) * c.pp * c.sp <= world && world % (c.tp * c.pp * c.sp) == 0, ErrorKind::kInvalidArgument,
           (own ? std::string("parallel.sp (") : std::string("sequence_parallel_size (")) + std::to_string(c.sp) + ") x " + tp_name +
               " (" + std::to_string(c.tp) + ") x " + pp_name + " (" + std::to_string(c.pp) + ") does not divide the " +
               std::to_string(world) + " process(es) (data parallelism takes processes / (tp x pp x sp))");
  c.world_size = world / (c.tp * c.pp * c.sp);
}

// sparse_attention: DeepSpeed's keys per mode (its get_sparse_attention), checked as its
// SparsityConfig classes check them; with a model, the layout for seq_length is built once here so
// its length-dependent errors are config errors.
void parse_sparse_attention(Section& root, RunConfig& c) {
  if (!root.has("sparse_attention")) return;
  Section s = root.sub("sparse_attention");
  kernels::SparsityConfig sc;
  const std::string mode = s.string("mode", "fixed");
  sc.block = s.small_integer("block", 16);
  sc.different_layout_per_head = s.boolean("different_layout_per_head", false);
  auto direction = [&s] { return kernels::sparse_direction_from_name(s.string("attention", "bidirectional")); };
  auto ints = [&s](const std::string& key, std::vector<int> fallback) {
    if (!s.has(key)) return fallback;
    const json& v = s.raw(key);
    MT_CHECK(v.is_array(), ErrorKind::kInvalidArgument, s.where(key) + " must be a list of integers");
    std::vector<int> out;
    for (const json& e : v) {
      MT_CHECK(e.is_number_integer(), ErrorKind::kInvalidArgument, s.where(key) + " must be a list of integers");
      out.push_back(e.get<int>());
    }
    return out;
  };
  if (mode == "dense") {
    sc.pattern = kernels::DenseSparsity{};
  } else if (mode == "fixed") {
    kernels::FixedSparsity f;
    f.num_local_blocks = s.small_integer("num_local_blocks", f.num_local_blocks);
    f.num_global_blocks = s.small_integer("num_global_blocks", f.num_global_blocks);
    f.attention = direction();
    f.horizontal_global_attention = s.boolean("horizontal_global_attention", false);
    f.num_different_global_patterns = s.small_integer("num_different_global_patterns", 1);
    sc.pattern = f;
  } else if (mode == "variable") {
    kernels::VariableSparsity v;
    v.num_random_blocks = s.small_integer("num_random_blocks", v.num_random_blocks);
    v.local_window_blocks = ints("local_window_blocks", v.local_window_blocks);
    v.global_block_indices = ints("global_block_indices", v.global_block_indices);
    if (s.has("global_block_end_indices")) v.global_block_end_indices = ints("global_block_end_indices", {});
    v.attention = direction();
    v.horizontal_global_attention = s.boolean("horizontal_global_attention", false);
    sc.pattern = v;
  } else if (mode == "bigbird") {
    kernels::BigBirdSparsity b;
    // 0 when absent: DeepSpeed's config reader (SPARSE_NUM_RANDOM_BLOCKS_DEFAULT), not its class's 1.
    b.num_random_blocks = s.small_integer("num_random_blocks", 0);
    b.num_sliding_window_blocks = s.small_integer("num_sliding_window_blocks", b.num_sliding_window_blocks);
    b.num_global_blocks = s.small_integer("num_global_blocks", b.num_global_blocks);
    // DeepSpeed's reader does not pass `attention` to BigBird and BSLongformer: bidirectional always.
    s.ignored("attention", "DeepSpeed's bigbird layout is bidirectional whatever it says (its config reader does not "
                           "pass the key on); the model's causal mask applies");
    sc.pattern = b;
  } else if (mode == "bslongformer") {
    kernels::BSLongformerSparsity b;
    b.num_sliding_window_blocks = s.small_integer("num_sliding_window_blocks", b.num_sliding_window_blocks);
    b.global_block_indices = ints("global_block_indices", b.global_block_indices);
    if (s.has("global_block_end_indices")) b.global_block_end_indices = ints("global_block_end_indices", {});
    s.ignored("attention", "DeepSpeed's bslongformer layout is bidirectional whatever it says (its config reader does "
                           "not pass the key on); the model's causal mask applies");
    sc.pattern = b;
  } else {
    throw Error(ErrorKind::kInvalidArgument, s.where("mode") + ": '" + mode +
                                                 "' is not a DeepSpeed sparsity mode (dense, fixed, variable, bigbird, bslongformer)");
  }
  sc.seed = c.seed;
  sc.num_heads = c.bare ? 1 : c.model.n_head;
  kernels::sparsity_config_validate(sc);
  if (!c.bare) {
    MT_CHECK(c.seq_length % sc.block == 0, ErrorKind::kInvalidArgument,
             "sparse_attention.block (" + std::to_string(sc.block) + ") must divide seq_length (" +
                 std::to_string(c.seq_length) + ")");
    kernels::sparse_layout_for_length(sc, static_cast<int>(c.seq_length));
  }
  MT_CHECK(c.device == "cpu", ErrorKind::kNotSupported, "sparse_attention: not implemented on device \"cuda\" yet");
  s.finish();
  c.sparse_attention = sc;
}

// The last step a curriculum's lengths are checked to: past its last step the schedule holds its
// difficulty, so one step beyond it (every step to train_iters took hours at 1e13, before the
// first step), or train_iters if sooner.
int64_t curriculum_last_checked_step(const RunConfig& c) {
  const CurriculumConfig& k = c.curriculum;
  const int64_t horizon = k.schedule_type == "fixed_discrete" ? (k.max_step.empty() ? 1 : k.max_step.back()) : k.total_curriculum_step;
  return std::min(std::max<int64_t>(c.train_iters, 1), std::max<int64_t>(horizon, 1) + 1);
}

// curriculum_learning (DeepSpeed's legacy block): what its CurriculumScheduler asserts, plus what
// would make a step's sequence empty or longer than the data's.
void parse_curriculum(Section& root, RunConfig& c) {
  if (!root.has("curriculum_learning")) return;
  Section s = root.sub("curriculum_learning");
  if (!s.has("enabled")) {
    if (!root.raw("curriculum_learning").empty())
      c.warnings.push_back("curriculum_learning: has no \"enabled\" key, so it is off (as in DeepSpeed)");
    s.ignore_rest();
    return;
  }
  if (!s.boolean("enabled", false)) {
    s.ignore_rest();
    return;
  }
  CurriculumConfig& k = c.curriculum;
  k.enabled = true;
  for (const char* req : {"curriculum_type", "min_difficulty", "max_difficulty", "schedule_type"})
    MT_CHECK(s.has(req), ErrorKind::kInvalidArgument, s.where(req) + ": required (as DeepSpeed asserts)");
  const std::string type = s.string("curriculum_type", "");
  MT_CHECK(type == "seqlen", ErrorKind::kNotSupported,
           s.where("curriculum_type") + ": '" + type + "' is not supported (\"seqlen\": sequences truncated to the difficulty, as Megatron-DeepSpeed does)");
  k.min_difficulty = s.integer("min_difficulty", 0);
  k.max_difficulty = s.integer("max_difficulty", 0);
  k.schedule_type = s.string("schedule_type", "");
  MT_CHECK(s.has("schedule_config"), ErrorKind::kInvalidArgument, s.where("schedule_config") + ": required");
  Section sc = s.sub("schedule_config");
  auto need = [&sc](const char* key) {
    MT_CHECK(sc.has(key), ErrorKind::kInvalidArgument, sc.where(key) + ": required by schedule_type");
  };
  auto list = [&sc](const char* key) {
    const json& v = sc.raw(key);
    MT_CHECK(v.is_array() && !v.empty(), ErrorKind::kInvalidArgument, sc.where(key) + " must be a non-empty list of integers");
    std::vector<int64_t> out;
    for (const json& e : v) {
      MT_CHECK(e.is_number_integer(), ErrorKind::kInvalidArgument, sc.where(key) + " must be a list of integers");
      out.push_back(e.get<int64_t>());
    }
    return out;
  };
  if (k.schedule_type == "fixed_discrete") {
    need("difficulty");
    need("max_step");
    k.difficulty = list("difficulty");
    k.max_step = list("max_step");
    MT_CHECK(k.difficulty.size() == k.max_step.size() + 1, ErrorKind::kInvalidArgument,
             sc.where("difficulty") + ": needs one entry more than max_step (the last applies to every later step)");
    // DeepSpeed reads the list as ascending: past its last entry every step takes the last
    // difficulty, whatever the earlier entries say ([6, 3] trained 16 tokens at steps 4-6 here and
    // 64 there, stop 74). Out of order, one of the two readings is not what was meant: refused.
    for (size_t i = 1; i < k.max_step.size(); ++i)
      MT_CHECK(k.max_step[i] > k.max_step[i - 1], ErrorKind::kInvalidArgument,
               sc.where("max_step") + ": must increase (entry " + std::to_string(i) + " is " + std::to_string(k.max_step[i]) +
                   " after " + std::to_string(k.max_step[i - 1]) + "); each entry is the last step of its difficulty");
  } else if (k.schedule_type == "fixed_linear" || k.schedule_type == "fixed_root") {
    need("total_curriculum_step");
    need("difficulty_step");
    k.total_curriculum_step = sc.integer("total_curriculum_step", 0);
    k.difficulty_step = sc.integer("difficulty_step", 0);
    MT_CHECK(k.total_curriculum_step > 0 && k.difficulty_step > 0, ErrorKind::kInvalidArgument,
             sc.where("total_curriculum_step") + " and difficulty_step must be positive");
    if (k.schedule_type == "fixed_root") {
      need("root_degree");
      k.root_degree = sc.number("root_degree", 1.0);
      MT_CHECK(k.root_degree > 0.0, ErrorKind::kInvalidArgument, sc.where("root_degree") + " must be positive");
    }
  } else {
    throw Error(k.schedule_type == "custom" ? ErrorKind::kNotSupported : ErrorKind::kInvalidArgument,
                s.where("schedule_type") + ": '" + k.schedule_type +
                    "' is not supported (fixed_linear, fixed_root, fixed_discrete; \"custom\" needs a Python function)");
  }
  sc.finish();
  s.finish();
  MT_CHECK(k.min_difficulty >= 1 && k.min_difficulty <= k.max_difficulty, ErrorKind::kInvalidArgument,
           s.where("min_difficulty") + " must be at least 1 and at most max_difficulty");
  MT_CHECK(k.max_difficulty <= c.seq_length, ErrorKind::kInvalidArgument,
           s.where("max_difficulty") + " (" + std::to_string(k.max_difficulty) + ") exceeds seq_length (" +
               std::to_string(c.seq_length) + "): a sample has no more tokens");
  // Every step of the run trains on 1..seq_length tokens (DeepSpeed's rounding down to
  // difficulty_step can reach 0 when min_difficulty is not a multiple of it).
  CurriculumSchedule sched(k);
  for (int64_t step = 1; step <= curriculum_last_checked_step(c); ++step) {
    const int64_t d = sched.at(step);
    MT_CHECK(d >= 1 && d <= c.seq_length, ErrorKind::kInvalidArgument,
             "curriculum_learning: the schedule gives " + std::to_string(d) + " tokens at step " + std::to_string(step) +
                 " (min_difficulty should be a multiple of difficulty_step)");
  }
  MT_CHECK(c.device == "cpu", ErrorKind::kNotSupported, "curriculum_learning: not implemented on device \"cuda\" yet");
  MT_CHECK(!c.sparse_attention, ErrorKind::kNotSupported,
           "curriculum_learning with sparse_attention is not supported yet (the block layout is built for seq_length)");
}

// csv_monitor: DeepSpeed's keys (enabled, output_path, job_name), top-level as DeepSpeed reads them
// or inside a monitor_config block (enabled there too) as some configs carry them.
void parse_csv_monitor(Section& root, RunConfig& c);

}  // namespace

std::vector<std::string> classification_metric_names(const models::ModelConfig& m) {
  if (m.problem_type == models::ProblemType::kRegression)
    return m.num_labels == 1 ? std::vector<std::string>{"val_loss", "val_pearson", "val_spearmanr"} : std::vector<std::string>{"val_loss"};
  if (m.problem_type == models::ProblemType::kMultiLabel) return {"val_loss", "val_f1"};
  if (m.num_labels == 2) return {"val_loss", "val_acc", "val_f1", "val_mcc"};
  return {"val_loss", "val_acc", "val_mcc"};
}

namespace {

void parse_csv_monitor(Section& root, RunConfig& c) {
  auto read = [&c](Section& s, bool on) {
    c.csv_monitor.enabled = s.boolean("enabled", false) && on;
    c.csv_monitor.output_path = s.string("output_path", c.csv_monitor.output_path);
    c.csv_monitor.job_name = s.string("job_name", c.csv_monitor.job_name);
    MT_CHECK(!c.csv_monitor.job_name.empty(), ErrorKind::kInvalidArgument, s.where("job_name") + " must not be empty");
    s.finish();
  };
  if (root.has("csv_monitor")) {
    Section s = root.sub("csv_monitor");
    read(s, true);
  }
  if (root.has("monitor_config")) {
    Section m = root.sub("monitor_config");
    const bool on = m.boolean("enabled", false);
    m.string("tag", "");
    if (m.has("csv_monitor")) {
      Section s = m.sub("csv_monitor");
      read(s, on);
    }
    for (const char* k : {"tensorboard", "wandb", "comet"}) m.unparsed(k, Unparsed::kWarn);
    m.finish();
  }
}

// DeepSpeed's comms_logger block: what the communicator's counters print (engine/ds_config.h).
void parse_comms_logger(Section& root, RunConfig& c) {
  if (!root.has("comms_logger")) return;
  Section s = root.sub("comms_logger");
  CommsLoggerConfig& l = c.comms_logger;
  l.enabled = s.boolean("enabled", false);
  l.verbose = s.boolean("verbose", false);
  l.prof_all = s.boolean("prof_all", true);
  l.debug = s.boolean("debug", false);
  if (s.has("prof_ops")) {
    const json& ops = s.raw("prof_ops");
    MT_CHECK(ops.is_array(), ErrorKind::kInvalidArgument, "comms_logger.prof_ops must be a list of op names");
    for (const json& op : ops) {
      comm::CommOp k;
      MT_CHECK(op.is_string() && comm::comm_op_from_name(op.get<std::string>(), &k), ErrorKind::kInvalidArgument,
               "comms_logger.prof_ops: " + op.dump() + " is not an op (all_reduce, reduce_scatter, all_gather, broadcast, ...)");
      l.prof_ops.push_back(op.get<std::string>());
    }
  }
  s.finish();
}

// DeepSpeed's flops_profiler block (engine/ds_config.h). Off on a GPU: the module timers are the
// CPU model's.
void parse_flops_profiler(Section& root, RunConfig& c) {
  if (!root.has("flops_profiler")) return;
  Section s = root.sub("flops_profiler");
  FlopsProfilerConfig& f = c.flops_profiler;
  f.enabled = s.boolean("enabled", false);
  f.recompute_fwd_factor = s.number("recompute_fwd_factor", 0.0);
  f.profile_step = s.integer("profile_step", 1);
  f.module_depth = s.small_integer("module_depth", -1);
  f.top_modules = s.small_integer("top_modules", 1);
  f.detailed = s.boolean("detailed", true);
  f.output_file = s.string("output_file", "");
  MT_CHECK(std::isfinite(f.recompute_fwd_factor) && f.recompute_fwd_factor >= 0.0, ErrorKind::kInvalidArgument,
           s.where("recompute_fwd_factor") + " must be >= 0 (the share of the forward a backward recomputes)");
  // DeepSpeed reads both without a check: module_depth below -1 and top_modules 0 print no depths.
  MT_CHECK(f.top_modules >= 0, ErrorKind::kInvalidArgument, s.where("top_modules") + " must be >= 0");
  s.finish();
  // DeepSpeed's count: the step run when profile_step steps are done (1: the second step, after a
  // warm-up one). It accepts any value (Megatron-DeepSpeed's configs give -1: never).
  if (f.enabled && f.profile_step < 0)
    c.warnings.push_back(s.where("profile_step") + " (" + std::to_string(f.profile_step) +
                         "): no step has that many steps before it, so nothing will be profiled (as in DeepSpeed)");
  else if (f.enabled && c.train_iters > 0 && f.profile_step >= c.train_iters)
    c.warnings.push_back(s.where("profile_step") + " (" + std::to_string(f.profile_step) + ") is after the last step (train_iters " +
                         std::to_string(c.train_iters) + "): nothing will be profiled");
  if (f.enabled && c.device == "cuda") {
    c.warnings.push_back("flops_profiler: off on device \"cuda\" (its module timers are the CPU model's)");
    f.enabled = false;
  }
}

// device: "cpu" | "cuda". What the GPU path does not implement is refused here, by its key.
void parse_device(Section& root, RunConfig& c) {
  c.device = root.string("device", "cpu");
  MT_CHECK(c.device == "cpu" || c.device == "cuda", ErrorKind::kInvalidArgument,
           "device: \"" + c.device + "\" is not a device (\"cpu\" or \"cuda\")");
  c.comm_backend = root.string("comm_backend", "mpi");
  MT_CHECK(c.comm_backend == "mpi" || c.comm_backend == "nccl", ErrorKind::kInvalidArgument,
           "comm_backend: \"" + c.comm_backend + "\" is not a backend (\"mpi\" or \"nccl\")");
  MT_CHECK(c.comm_backend == "mpi" || c.device == "cuda", ErrorKind::kInvalidArgument,
           "comm_backend: \"nccl\" reduces GPU buffers: it needs \"device\": \"cuda\"");
#ifndef MT_NCCL
  MT_CHECK(c.comm_backend == "mpi", ErrorKind::kNotSupported,
           "comm_backend: \"nccl\": this meshtrain was built without NCCL (-DMT_CUDA=ON where libnccl is installed)");
#endif
  if (c.device != "cuda") return;
  MT_CHECK(c.zero.offload_optimizer != "nvme", ErrorKind::kNotSupported,
           "zero_optimization.offload_optimizer.device: 'nvme' is not implemented on device \"cuda\" yet");
  MT_CHECK(c.compute_dtype != DType::kF16, ErrorKind::kNotSupported,
           "fp16.enabled: fp16 is not implemented on device \"cuda\"; use bf16.enabled or fp32");
  std::string t = c.optimizer.type;
  for (char& ch : t) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  MT_CHECK(t == "adam" || t == "adamw", ErrorKind::kNotSupported,
           "optimizer.type: " + c.optimizer.type + " is not implemented on device \"cuda\" (Adam/AdamW are)");
  if (c.processes > 1) {  // one GPU per process, a replica each, gradients all-reduced (NCCL, or MPI through the host)
    const std::string n = std::to_string(c.processes);
    MT_CHECK(c.tp == 1 && c.pp == 1, ErrorKind::kNotSupported,
             "parallel.tp/pp on device \"cuda\": not implemented yet (data parallelism over GPUs is)");
    MT_CHECK(c.zero.stage == 0, ErrorKind::kNotSupported,
             "zero_optimization.stage " + std::to_string(c.zero.stage) + " over " + n +
                 " GPUs: not implemented yet (stage 0: a replica on every GPU, gradients all-reduced)");
    MT_CHECK(c.prescale_gradients || c.gradient_predivide_factor == 1.0, ErrorKind::kNotSupported,
             "gradient_predivide_factor on device \"cuda\" over several GPUs: not implemented (use 1.0 or prescale_gradients)");
  }
}

}  // namespace

int64_t curriculum_lengths_gcd(const RunConfig& c) {
  if (!c.curriculum.enabled) return 0;
  CurriculumSchedule sched(c.curriculum);
  int64_t g = 0;
  for (int64_t step = 1; step <= curriculum_last_checked_step(c); ++step) g = std::gcd(g, sched.at(step));
  return g;
}

std::string ulysses_unsupported(const RunConfig& c) {
  if (optim::optimizer_is_onebit(c.optimizer)) return "optimizer.type " + c.optimizer.type + " (1-bit)";
  if (c.device != "cpu") return "device \"" + c.device + "\"";
  return "";
}

// parallel.sp > 1 (Ulysses): what it runs with so far, the rest refused by name.
void check_ulysses(const RunConfig& c) {
  if (c.sp == 1) return;
  const std::string sp = "parallel.sp " + std::to_string(c.sp) + " (Ulysses sequence parallelism)";
  auto refuse = [&](bool bad, const std::string& what) {
    MT_CHECK(!bad, ErrorKind::kNotSupported, sp + " with " + what + " is not implemented yet");
  };
  const std::string other = ulysses_unsupported(c);
  refuse(!other.empty(), other);
  if (c.bare) return;
  MT_CHECK(c.seq_length % c.sp == 0, ErrorKind::kInvalidArgument,
           sp + " splits each sample's seq_length (" + std::to_string(c.seq_length) + ") tokens over " + std::to_string(c.sp) +
               " ranks: they must divide evenly");
  // With tp, each tp rank's heads (n_head / tp) are what the sp group splits (Megatron-DeepSpeed's
  // DistributedAttention around its tp-sharded attention).
  const bool gpt2 = c.model.arch == models::Arch::kGpt2;
  const int split = c.sp * c.tp;
  const std::string by = c.tp > 1 ? "parallel.tp x parallel.sp (" + std::to_string(split) + ")" : std::to_string(c.sp);
  MT_CHECK(c.model.n_head % split == 0 && c.model.n_kv_head % split == 0, ErrorKind::kInvalidArgument,
           sp + " splits the attention heads over its ranks: model." + (gpt2 ? "n_head (" : "num_attention_heads (") +
               std::to_string(c.model.n_head) + ")" + (gpt2 ? "" : " and model.num_key_value_heads (" + std::to_string(c.model.n_kv_head) + ")") +
               " must be divisible by " + by);
}

RunConfig ds_config_parse(json j, const std::string& where, int world_size, bool allow_bare) {
  RunConfig c;
  Section root(j, "", c.warnings, c.notes);
  // A bare DeepSpeed config (no model block): its keys are checked alone, nothing model-dependent.
  c.bare = allow_bare && !root.has("model");
  if (!c.bare) parse_model(root, c, where);
  c.seq_length = root.integer("seq_length", c.bare ? 1024 : std::min(1024, c.model.max_positions));
  MT_CHECK(c.seq_length > 0, ErrorKind::kInvalidArgument, "seq_length must be positive");
  // LLaMA's too (generate, serve and predict refuse past it: a model trained longer could not be
  // served at its own length, and its config.json kept the shorter one).
  MT_CHECK(c.bare || c.seq_length <= c.model.max_positions, ErrorKind::kInvalidArgument,
           "seq_length " + std::to_string(c.seq_length) + " exceeds model " +
               (c.model.arch == models::Arch::kGpt2 ? "n_positions " : "max_position_embeddings ") + std::to_string(c.model.max_positions));
  c.train_iters = root.integer("train_iters", 0);
  c.loss_normalization = root.string("loss_normalization", c.loss_normalization);
  MT_CHECK(c.loss_normalization == "micro_batch" || c.loss_normalization == "tokens", ErrorKind::kInvalidArgument,
           "loss_normalization: \"" + c.loss_normalization + "\" is not a normalization (\"micro_batch\" or \"tokens\")");
  // Megatron's and Hugging Face's seeding (numpy's RandomState) refuse a negative seed; it wrapped
  // to 2^64 - 1 here, and a later message named that.
  const int64_t seed = root.integer("seed", 1234);
  MT_CHECK(seed >= 0, ErrorKind::kInvalidArgument,
           "seed: " + std::to_string(seed) + " is negative (numpy's and Hugging Face's set_seed refuse one too)");
  c.seed = static_cast<uint64_t>(seed);
  c.data_seed = c.seed;
  c.save_dir = root.string("save_dir", "");
  c.save_interval = root.integer("save_interval", 0);
  c.eval_interval = root.integer("eval_interval", 0);
  c.eval_iters = root.integer("eval_iters", 10);
  c.keep_last = root.integer("keep_last", 3);
  for (auto [key, v] : {std::pair<const char*, int64_t>{"save_interval", c.save_interval}, {"eval_interval", c.eval_interval},
                        {"eval_iters", c.eval_iters}, {"keep_last", c.keep_last}, {"train_iters", c.train_iters}})
    MT_CHECK(v >= 0, ErrorKind::kInvalidArgument, std::string(key) + ": must not be negative (got " + std::to_string(v) + ")");
  parse_data(root, c);
  if (c.eval_interval > 0 && c.eval_iters > 0 && c.data_valid.empty() && c.split.empty())
    c.warnings.push_back("eval_interval: " + std::to_string(c.eval_interval) +
                         ", but neither data.valid nor data.split gives a validation set: no validation runs");
  c.task = root.string("task", c.task);
  MT_CHECK(c.task == "causal_lm" || c.task == "classification", ErrorKind::kInvalidArgument,
           "task: \"" + c.task + "\" is not a task (\"causal_lm\" or \"classification\")");
  if (!c.bare) {
    // Hugging Face's PretrainedConfig: num_labels is id2label's size (2 when it has none). A causal
    // LM's config.json carries id2label too, so it counts only here, for a classifier.
    if (c.task == "classification" && c.model.num_labels == 0)
      c.model.num_labels = c.model_json.is_object() && c.model_json.contains("id2label") && c.model_json["id2label"].is_object() &&
                                   c.model_json["id2label"].size() >= 2
                               ? static_cast<int>(c.model_json["id2label"].size())
                               : 2;
    // run_classification.py counts the labels it is given: data.labels' names where neither
    // num_labels nor id2label says otherwise.
    const bool counted = c.model_json.is_object() && (c.model_json.contains("num_labels") || c.model_json.contains("id2label"));
    if (c.task == "classification" && !counted && !c.cls_fields.labels.empty() &&
        c.model.problem_type != models::ProblemType::kRegression)
      c.model.num_labels = static_cast<int>(c.cls_fields.labels.size());
    MT_CHECK(c.task == "classification" || c.model.num_labels == 0, ErrorKind::kInvalidArgument,
             "model.num_labels (" + std::to_string(c.model.num_labels) +
                 ", a sequence classifier) needs \"task\": \"classification\"");
    MT_CHECK(c.cls_fields.labels.empty() || c.model.problem_type != models::ProblemType::kRegression, ErrorKind::kInvalidArgument,
             "data.labels names labels; a regression (model.problem_type \"regression\", or num_labels 1) has values");
    MT_CHECK(c.cls_fields.labels.empty() || static_cast<int>(c.cls_fields.labels.size()) == c.model.num_labels,
             ErrorKind::kInvalidArgument,
             "data.labels names " + std::to_string(c.cls_fields.labels.size()) + " labels; model.num_labels is " +
                 std::to_string(c.model.num_labels));
  }
  c.num_train_epochs = root.number("num_train_epochs", 0.0);
  MT_CHECK(c.num_train_epochs >= 0, ErrorKind::kInvalidArgument, "num_train_epochs must not be negative");
  // The monitor's default is the problem's first metric past the loss (val_acc; STS-B's
  // val_pearson for a regression of one value, val_loss past it; multi-label's val_f1), its mode
  // "min" for val_loss, else "max".
  if (c.task == "classification" && !c.bare) {
    const std::vector<std::string> logged = classification_metric_names(c.model);
    c.model_checkpoint.monitor = logged.size() > 1 ? logged[1] : logged[0];
  }
  if (root.has("model_checkpoint")) {
    Section mc = root.sub("model_checkpoint");
    c.model_checkpoint.monitor = mc.string("monitor", c.model_checkpoint.monitor);
    c.model_checkpoint.mode = mc.string("mode", c.model_checkpoint.monitor == "val_loss" ? "min" : "max");
    c.model_checkpoint.save_top_k = mc.integer("save_top_k", 1);
    const std::string& monitor = c.model_checkpoint.monitor;
    MT_CHECK(monitor == "val_acc" || monitor == "val_loss" || monitor == "val_f1" || monitor == "val_mcc" ||
                 monitor == "val_pearson" || monitor == "val_spearmanr",
             ErrorKind::kInvalidArgument,
             mc.where("monitor") + ": \"" + monitor +
                 "\" is not a metric meshtrain logs (\"val_acc\", \"val_loss\", \"val_f1\", \"val_mcc\", \"val_pearson\", \"val_spearmanr\")");
    if (c.task == "classification") {
      const std::vector<std::string> logged = classification_metric_names(c.model);
      std::string names;
      for (const auto& n : logged) names += (names.empty() ? "" : ", ") + n;
      MT_CHECK(std::find(logged.begin(), logged.end(), monitor) != logged.end(), ErrorKind::kInvalidArgument,
               mc.where("monitor") + ": " + monitor + " is not logged for a " + models::problem_type_name(c.model.problem_type) +
                   " model of " + std::to_string(c.model.num_labels) + " label(s) (" + names + ")" +
                   (monitor == "val_f1" && c.model.problem_type == models::ProblemType::kSingleLabel
                        ? "; val_f1 is the F1 of label 1 of two (MRPC's, QQP's)"
                        : ""));
    }
    MT_CHECK(c.model_checkpoint.mode == "max" || c.model_checkpoint.mode == "min", ErrorKind::kInvalidArgument,
             mc.where("mode") + " must be \"max\" or \"min\"");
    MT_CHECK(c.model_checkpoint.save_top_k >= 0, ErrorKind::kInvalidArgument, mc.where("save_top_k") + " must not be negative");
    MT_CHECK(c.task == "classification" || c.model_checkpoint.monitor == "val_loss", ErrorKind::kNotSupported,
             mc.where("monitor") + ": " + monitor + " is logged by task \"classification\" only");
    MT_CHECK(c.task == "classification", ErrorKind::kNotSupported,
             mc.where() + ": kept by task \"classification\" runs for now (causal LMs rotate by save_interval / keep_last)");
    mc.finish();
  }
  parse_parallel(root, c, world_size);
  if (c.tp > 1 && !c.bare) {  // Megatron's split gives each rank whole heads and equal MLP slices
    const bool gpt2 = c.model.arch == models::Arch::kGpt2;
    for (auto [key, v] : {std::pair<const char*, int>{gpt2 ? "n_head" : "num_attention_heads", c.model.n_head},
                          {gpt2 ? "n_head" : "num_key_value_heads", c.model.n_kv_head},
                          {gpt2 ? "n_inner" : "intermediate_size", c.model.intermediate}})
      MT_CHECK(v % c.tp == 0, ErrorKind::kInvalidArgument,
               std::string("model.") + key + " (" + std::to_string(v) + ") is not divisible by parallel.tp (" +
                   std::to_string(c.tp) + "): Megatron's split gives each rank whole heads and equal MLP slices");
  }
  c.comm_timeout_s = root.number("comm_timeout", c.comm_timeout_s);
  // Counted in milliseconds as int64: past 1e9 s (31 years) the deadline overflowed and every
  // collective timed out at once, blaming a healthy rank.
  MT_CHECK(c.comm_timeout_s > 0 && c.comm_timeout_s <= 1e9, ErrorKind::kInvalidArgument,
           "comm_timeout must be positive and at most 1e9 seconds (got " + fmt_g(c.comm_timeout_s) + ")");
  parse_batch(root, c, c.world_size);
  // A micro-batch's tokens are counted in int (the kernels' row counts): more is a size no rank
  // could hold anyway, said by its keys rather than as an overflow further on.
  MT_CHECK(c.batch.micro_batch_per_gpu <= std::numeric_limits<int32_t>::max() / c.seq_length, ErrorKind::kInvalidArgument,
           "train_micro_batch_size_per_gpu (" + std::to_string(c.batch.micro_batch_per_gpu) + ") x seq_length (" +
               std::to_string(c.seq_length) + ") is more than 2^31 - 1 tokens a micro-batch");
  {  // and its activations are counted in bytes (DESIGN-NOTES 76)
    const double tokens = static_cast<double>(c.batch.micro_batch_per_gpu) * static_cast<double>(c.seq_length);
    const double values = tokens * std::max(static_cast<double>(c.model.hidden) * c.model.n_layer,
                                            static_cast<double>(c.model.vocab_size));
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3g", values);
    MT_CHECK(values <= models::ModelConfig::kMaxActivationValues, ErrorKind::kInvalidArgument,
             "train_micro_batch_size_per_gpu (" + std::to_string(c.batch.micro_batch_per_gpu) + ") x seq_length (" +
                 std::to_string(c.seq_length) + ") x the model's width and layers (or vocabulary) is " + buf +
                 " activation values a micro-batch, more than the 2^50 the runtime's byte counts hold");
  }
  c.gradient_clipping = root.number_or_auto("gradient_clipping", 0.0, 1.0, "Hugging Face's max_grad_norm default");
  MT_CHECK(std::isfinite(c.gradient_clipping) && c.gradient_clipping >= 0.0, ErrorKind::kInvalidArgument,
           "gradient_clipping must be a non-negative number, 0 for none (got " + std::to_string(c.gradient_clipping) + ")");
  parse_precision(root, c);
  parse_optimizer(root, c);
  parse_no_weight_decay(root, c);
  parse_scheduler(root, c);
  parse_zero(root, c);
  // The fp16 scaler DeepSpeed's engine builds (optim/loss_scaler.h): ZeRO's DynamicLossScaler stops
  // at the minimum scale; at stage 0 FP16_Optimizer (FusedAdam, OneBitAdam, ZeroOneAdam) and
  // FP16_UnfusedOptimizer (the others, torch_adam's included) hold it there and skip on, the
  // unfused one without hysteresis and, where the fp16 block gives none of the dynamic keys, with
  // its own minimum of 0.25.
  if (c.zero.stage == 0) {
    const bool fused = ((c.optimizer.type == "Adam" || c.optimizer.type == "AdamW") && !c.optimizer.torch_adam) ||
                       c.optimizer.type == "OneBitAdam" || c.optimizer.type == "ZeroOneAdam";
    c.loss_scaler.raise_error_at_min_scale = false;
    c.loss_scaler.honour_hysteresis = fused;
    if (!fused && !c.fp16_dynamic_args_given) c.loss_scaler.min_scale = 0.25;
  }
  MT_CHECK(c.master_dtype == DType::kF32 || c.zero.stage >= 1, ErrorKind::kNotSupported,
           std::string(c.master_dtype == DType::kF16 ? "fp16.fp16_master_weights_and_grads" : "bf16.bf16_master_weights_and_grads") +
               " needs zero_optimization.stage 1, 2 or 3 (as DeepSpeed asserts)");
  MT_CHECK(c.master_dtype == DType::kF32 || c.device == "cpu", ErrorKind::kNotSupported,
           "16-bit master weights are not implemented on device \"cuda\" yet");
  check_onebit(c);
  parse_device(root, c);
  parse_sparse_attention(root, c);
  parse_curriculum(root, c);
  if (c.pp > 1) {
    // ZeRO under pipeline parallelism: stage 1 (as DeepSpeed); stages 2 and 3 reduce or gather
    // per micro-batch use, which the interleaving of forwards and backwards of a pipeline breaks.
    MT_CHECK(c.zero.stage <= 1, ErrorKind::kNotSupported,
             "zero_optimization.stage " + std::to_string(c.zero.stage) +
                 " with parallel.pp > 1 is not supported (stage 0 or 1, as in DeepSpeed's pipeline engine)");
    parallel::pp::ScheduleSpec spec{parallel::pp::parse_schedule(c.pipeline_schedule), c.pp, c.virtual_stages,
                                    static_cast<int>(c.batch.gradient_accumulation_steps)};
    parallel::pp::check_schedule_spec(spec);
    MT_CHECK(c.bare || c.model.n_layer >= c.pp * c.virtual_stages, ErrorKind::kInvalidArgument,
             "the model's " + std::to_string(c.model.n_layer) + " layer(s) cannot fill parallel.pp (" + std::to_string(c.pp) +
                 ") x parallel.virtual_stages (" + std::to_string(c.virtual_stages) + ") pipeline stages");
  }
  const bool sp_asked = c.sequence_parallel;  // parallel.sequence_parallel, before partition_activations
  if (root.has("activation_checkpointing")) {
    Section a = root.sub("activation_checkpointing");
    const bool from_pipeline = c.activation_checkpointing;  // pipeline.activation_checkpoint_interval 1
    c.activation_checkpointing = a.boolean("enabled", true);  // our extension; the block alone enables it
    // (the block's false won over the pipeline's interval 1 without a word, stop 73)
    MT_CHECK(!from_pipeline || c.activation_checkpointing, ErrorKind::kInvalidArgument,
             a.where("enabled") + ": false, and pipeline.activation_checkpoint_interval 1 recomputes every layer; give one");
    // DeepSpeed partitions the checkpointed activations over the tp group: Megatron's sequence
    // parallelism here (a no-op with tp = 1, as in DeepSpeed).
    c.partition_activations = a.boolean("partition_activations", false);
    if (c.partition_activations && c.tp > 1) c.sequence_parallel = true;
    a.require_default("cpu_checkpointing", false, "CPU checkpointing is not supported yet");
    // Where the recomputed inputs are kept and when the ranks meet, and a timer: not what is trained.
    // Said only when set away from DeepSpeed's defaults (false, null), which used to print four
    // "no effect" lines for a block copied from DeepSpeed's documentation; checked for their type.
    for (const char* k : {"contiguous_memory_optimization", "synchronize_checkpoint_boundary", "profile"})
      if (a.boolean(k, false)) c.warnings.push_back(a.where(k) + ": true has no effect in meshtrain (memory layout, "
                                                    "synchronisation and timing of the recompute; what is trained is the same)");
    if (a.has("number_checkpoints")) {
      const int64_t n = a.integer("number_checkpoints", 0);
      MT_CHECK(n >= 1, ErrorKind::kInvalidArgument, a.where("number_checkpoints") + ": must be null or a count >= 1 (got " +
                                                        std::to_string(n) + ")");
      c.warnings.push_back(a.where("number_checkpoints") + ": has no effect in meshtrain (it sizes DeepSpeed's contiguous "
                           "buffer; recompute is per block here)");
    }
    a.finish();
  }
  // The key the user gave (partition_activations' errors were said as parallel.sequence_parallel's).
  const std::string sp_key = sp_asked ? "parallel.sequence_parallel"
                                      : "activation_checkpointing.partition_activations (sequence parallelism with tp > 1)";
  // (Ulysses: each rank's seq_length / sp tokens of each sample; check_ulysses names an sp that
  // does not divide seq_length.)
  const int64_t rank_seq = c.sp > 1 && c.seq_length % c.sp == 0 ? c.seq_length / c.sp : c.seq_length;
  if (c.sequence_parallel && (c.batch.micro_batch_per_gpu * rank_seq) % c.tp != 0)
    throw Error(ErrorKind::kInvalidArgument,
                sp_key + " splits train_micro_batch_size_per_gpu x seq_length" + (c.sp > 1 ? " / parallel.sp" : "") + " (" +
                    std::to_string(c.batch.micro_batch_per_gpu * rank_seq) + " tokens) over parallel.tp (" +
                    std::to_string(c.tp) + "): they must divide evenly");
  // A curriculum's shorter steps too: a length the split fails ended the run at that step (exit 2,
  // naming seq_length), hours in.
  // Ulysses: each step's length over the sp ranks (stop 80), then each rank's share over tp.
  if ((c.sequence_parallel || c.sp > 1) && c.curriculum.enabled) {
    const CurriculumConfig& k = c.curriculum;
    CurriculumSchedule sched(k);
    const std::string difficulties = k.schedule_type == "fixed_discrete" ? "schedule_config.difficulty" : "min_difficulty, difficulty_step";
    for (int64_t step = 1; step <= curriculum_last_checked_step(c); ++step) {
      int64_t d = sched.at(step);
      MT_CHECK(d % c.sp == 0, ErrorKind::kInvalidArgument,
               "curriculum_learning with parallel.sp " + std::to_string(c.sp) + " (Ulysses): step " + std::to_string(step) +
                   " trains " + std::to_string(d) + " tokens a sample, which do not split over the " + std::to_string(c.sp) +
                   " ranks: give difficulties (" + difficulties + ") that they divide");
      d /= c.sp;
      if (!c.sequence_parallel) continue;
      MT_CHECK((c.batch.micro_batch_per_gpu * d) % c.tp == 0, ErrorKind::kInvalidArgument,
               "curriculum_learning with " + sp_key + ": step " + std::to_string(step) + " trains " +
                   std::to_string(d) + (c.sp > 1 ? " tokens of a sample on each sp rank" : " tokens a sample") +
                   ", and train_micro_batch_size_per_gpu x that (" +
                   std::to_string(c.batch.micro_batch_per_gpu * d) + ") does not divide over parallel.tp (" +
                   std::to_string(c.tp) + "): give difficulties (" + difficulties + ") that it does");
    }
  }
  c.steps_per_print = root.integer("steps_per_print", 10);
  // The step counter is taken modulo it (0 killed a run with SIGFPE at its first step).
  MT_CHECK(c.steps_per_print >= 1, ErrorKind::kInvalidArgument,
           "steps_per_print: must be at least 1 (got " + std::to_string(c.steps_per_print) + ")");
  c.wall_clock_breakdown = root.boolean("wall_clock_breakdown", false);
  // Megatron's data and length arguments, in a config: meshtrain's are data.train / data.valid and
  // train_iters (they were warned about as unknown, and the whole corpus trained).
  MT_CHECK(!root.has("split"), ErrorKind::kNotSupported,
           "split: Megatron's --split is data.split here (it cuts data.train into training and validation sequences)");
  for (const char* k : {"data_path", "train_data_path", "valid_data_path", "test_data_path", "train_samples"})
    MT_CHECK(!root.has(k), ErrorKind::kNotSupported,
             std::string(k) + ": Megatron's argument is not read here (data.train and data.valid name the datasets, "
                              "data.split cuts one, train_iters is the length)");
  // Megatron-LM's training arguments (arguments.py's names), written into a config: each changes
  // what is trained, and was warned about as an unknown key while the run trained meshtrain's
  // default (a clip_grad of 1.0 trained unclipped). Refused, naming meshtrain's key where one exists.
  struct MegatronArg {
    const char* name;
    const char* ours;
  };
  static const MegatronArg kMegatronArgs[] = {
      {"global_batch_size", "train_batch_size"},
      {"micro_batch_size", "train_micro_batch_size_per_gpu"},
      {"rampup_batch_size", nullptr},
      {"clip_grad", "gradient_clipping"},
      {"lr", "optimizer.params.lr"},
      {"min_lr", "a scheduler's minimum (WarmupCosineLR's cos_min_ratio, WarmupDecayLR decays to 0)"},
      {"lr_decay_style", "scheduler.type"},
      {"lr_decay_iters", "scheduler.params.total_num_steps"},
      {"lr_decay_samples", "scheduler.params.total_num_steps"},
      {"lr_warmup_iters", "scheduler.params.warmup_num_steps"},
      {"lr_warmup_fraction", "scheduler.params.warmup_num_steps"},
      {"lr_warmup_samples", "scheduler.params.warmup_num_steps"},
      {"lr_warmup_init", "scheduler.params.warmup_min_lr"},
      {"weight_decay", "optimizer.params.weight_decay"},
      {"start_weight_decay", nullptr},
      {"end_weight_decay", nullptr},
      {"weight_decay_incr_style", nullptr},
      {"adam_beta1", "optimizer.params.betas"},
      {"adam_beta2", "optimizer.params.betas"},
      {"adam_eps", "optimizer.params.eps"},
      {"init_method_std", "model.initializer_range"},
      {"hidden_dropout", "the model's dropout keys (GPT-2's resid_pdrop and embd_pdrop)"},
      {"attention_dropout", "the model's attn_pdrop (GPT-2) or attention_dropout (LLaMA)"},
      {"untie_embeddings_and_output_weights", "model.tie_word_embeddings"},
      {"num_layers", "the model's n_layer or num_hidden_layers"},
      {"hidden_size", "the model's n_embd or hidden_size"},
      {"ffn_hidden_size", "the model's n_inner or intermediate_size"},
      {"num_attention_heads", "the model's n_head or num_attention_heads"},
      {"num_query_groups", "the model's num_key_value_heads"},
      {"group_query_attention", "the model's num_key_value_heads"},
      {"kv_channels", "the model's head_dim"},
      {"max_position_embeddings", "the model's n_positions or max_position_embeddings"},
      {"swiglu", "the model's model_type (llama)"},
      {"normalization", "the model's model_type (gpt2: LayerNorm, llama: RMSNorm)"},
      {"norm_epsilon", "the model's layer_norm_epsilon or rms_norm_eps"},
      {"position_embedding_type", "the model's model_type (gpt2: learned, llama: rope)"},
      {"use_rotary_position_embeddings", "the model's model_type (llama)"},
      {"rotary_base", "the model's rope_theta"},
      {"rotary_percent", nullptr},
      {"add_bias_linear", nullptr},
      {"openai_gelu", "the model's activation_function"},
      {"squared_relu", nullptr},
      {"apply_query_key_layer_scaling", nullptr},
      {"make_vocab_size_divisible_by", "parallel.make_vocab_size_divisible_by"},
      {"tensor_model_parallel_size", "parallel.tp"},
      {"pipeline_model_parallel_size", "parallel.pp"},
      {"num_layers_per_virtual_pipeline_stage", "parallel.virtual_stages"},
      {"recompute_granularity", "activation_checkpointing"},
      {"recompute_method", "activation_checkpointing"},
      {"recompute_num_layers", "activation_checkpointing"},
      // (warned as unknown keys, stop 73)
      {"recompute_activations", "activation_checkpointing"},
      {"checkpoint_activations", "activation_checkpointing"},
      {"distribute_saved_activations", "activation_checkpointing.partition_activations"},
      {"virtual_pipeline_model_parallel_size", "parallel.virtual_stages"},
      {"pipeline_model_parallel_split_rank", nullptr},
      {"use_distributed_optimizer", "zero_optimization.stage 1"},
      {"accumulate_allreduce_grads_in_fp32", "data_types.grad_accum_dtype"},
      {"initial_loss_scale", "fp16.initial_scale_power"},
      {"min_loss_scale", "fp16.min_loss_scale"},
      {"loss_scale", "fp16.loss_scale"},
      {"loss_scale_window", "fp16.loss_scale_window"},
      {"hysteresis", "fp16.hysteresis"},
      {"eod_mask_loss", "data.eod_mask_loss"},
      {"reset_position_ids", "data.reset_position_ids"},
      {"reset_attention_mask", "data.reset_attention_mask"},
      {"tokenizer_type", "data.tokenizer"},
      {"vocab_file", "data.tokenizer"},
      {"merge_file", "data.tokenizer"},
      {"exit_interval", "train_iters"},
      {"calculate_per_token_loss", "loss_normalization \"tokens\""},
  };
  for (const MegatronArg& a : kMegatronArgs)
    MT_CHECK(!root.has(a.name), ErrorKind::kNotSupported,
             std::string(a.name) + ": Megatron-LM's argument is not read here" +
                 (a.ours != nullptr ? std::string(" (meshtrain's is ") + a.ours + ")" : std::string(" (not implemented)")));
  // Hugging Face's TrainingArguments at the top level (a Trainer's arguments pasted in): those that
  // change what is trained are refused as Megatron's are; the others get one line naming meshtrain's
  // key (save_total_limit was "unknown key, ignored", with no hint, and 3 checkpoints were kept; stop 73).
  static const MegatronArg kTrainerTraining[] = {
      {"learning_rate", "optimizer.params.lr"},
      {"max_steps", "train_iters"},
      {"per_device_train_batch_size", "train_micro_batch_size_per_gpu"},
      {"warmup_steps", "scheduler.params.warmup_num_steps"},
      {"warmup_ratio", "scheduler.params.warmup_num_steps"},
      {"lr_scheduler_type", "scheduler.type"},
      {"max_grad_norm", "gradient_clipping"},
      {"adam_epsilon", "optimizer.params.eps"},
  };
  for (const MegatronArg& a : kTrainerTraining)
    MT_CHECK(!root.has(a.name), ErrorKind::kNotSupported,
             std::string(a.name) + ": Hugging Face's TrainingArguments field is not read here (meshtrain's is " + a.ours + ")");
  static const MegatronArg kTrainerOther[] = {
      {"save_total_limit", "keep_last"}, {"save_steps", "save_interval"},   {"output_dir", "save_dir"},
      {"logging_steps", "steps_per_print"}, {"eval_steps", "eval_interval"},
  };
  for (const MegatronArg& a : kTrainerOther)
    if (root.has(a.name))  // (has() marks it read: one line, not also "unknown key")
      c.warnings.push_back(std::string(a.name) + ": Hugging Face's TrainingArguments field is not read here; meshtrain's is " +
                           a.ours);
  // Current DeepSpeed's gradient_allreduce_op: "sum" leaves the gradients unaveraged over the ranks.
  if (root.has("gradient_allreduce_op"))
    MT_CHECK(root.raw("gradient_allreduce_op") == "mean", ErrorKind::kNotSupported,
             "gradient_allreduce_op: " + root.raw("gradient_allreduce_op").dump() + " is not supported (\"mean\", the default, only)");
  // DeepSpeed keys that change what is trained: refused when enabled.
  for (const char* k : {"amp", "data_efficiency", "compression_training", "progressive_layer_drop", "eigenvalue",
                        "quantize_training", "elasticity", "torch_autocast", "weight_quantization"})
    root.unparsed(k, Unparsed::kRefuseIfEnabled);
  // DeepSpeed's sparse_gradients changes how, not what: at stage 0 its engine all-gathers each
  // nn.Embedding gradient's non-zero rows (pre-divided by the ranks) and sums them, the same mean
  // as the dense all-reduce in another order of additions (its ZeRO optimizers reduce them dense).
  if (root.has("sparse_gradients") && truthy(root.raw("sparse_gradients")))
    c.warnings.push_back("sparse_gradients: the embeddings' gradients are all-reduced dense (the same mean as DeepSpeed's "
                         "all-gather of their non-zero rows, summed in another order)");
  // DeepSpeed reads this one into a pydantic model (HybridEngineConfig): "false" is off there.
  root.unparsed("hybrid_engine", Unparsed::kRefuseIfEnabledPydantic);
  if (root.has("data_types")) {  // DeepSpeed's gradient accumulation dtype: ours is fp32
    Section d = root.sub("data_types");
    if (d.has("grad_accum_dtype")) {
      const std::string t = d.string("grad_accum_dtype", "fp32");
      MT_CHECK(t == "fp32" || t == "float32" || t == "float", ErrorKind::kNotSupported,
               d.where("grad_accum_dtype") + ": \"" + t + "\" is not supported (gradients accumulate in fp32)");
    }
    d.finish();
  }
  parse_comms_logger(root, c);
  parse_flops_profiler(root, c);
  // DeepSpeed's gradient averaging: prescale divides by the dp size before the all-reduce;
  // otherwise the gradients are divided by gradient_predivide_factor before it and multiplied by
  // factor / dp size after it.
  c.prescale_gradients = root.boolean("prescale_gradients", false);
  c.gradient_predivide_factor = root.number("gradient_predivide_factor", 1.0);
  MT_CHECK(std::isfinite(c.gradient_predivide_factor) && c.gradient_predivide_factor > 0.0, ErrorKind::kInvalidArgument,
           "gradient_predivide_factor: must be a positive number");
  if (c.prescale_gradients && c.gradient_predivide_factor != 1.0)
    c.warnings.push_back("gradient_predivide_factor: ignored because prescale_gradients is true (as in DeepSpeed)");
  MT_CHECK(c.gradient_predivide_factor == 1.0 || c.prescale_gradients || !optim::optimizer_is_onebit(c.optimizer),
           ErrorKind::kNotSupported, "gradient_predivide_factor with optimizer.type " + c.optimizer.type +
                                         ": the compressed momentum exchange averages by itself (give 1.0)");
  if (c.zero.offload_param == "nvme") {  // ZeRO-Infinity: master and gradient shards on disk
    const std::string k = "zero_optimization.offload_param.device 'nvme'";
    MT_CHECK(c.zero.offload_optimizer == "nvme", ErrorKind::kNotSupported,
             k + " needs zero_optimization.offload_optimizer.device 'nvme' (the master weights are the optimizer's)");
    MT_CHECK(c.tp == 1 && c.pp == 1, ErrorKind::kNotSupported, k + " with parallel.tp or parallel.pp > 1 is not supported yet");
    MT_CHECK(c.master_dtype == DType::kF32, ErrorKind::kNotSupported, k + " with 16-bit master weights is not supported yet");
    MT_CHECK(c.world_size == 1 || c.prescale_gradients || c.gradient_predivide_factor == 1.0, ErrorKind::kNotSupported,
             k + " with gradient_predivide_factor is not supported yet");
  }
  // DeepSpeed refuses client optimizers it has not tested with ZeRO unless this is true; every
  // optimizer meshtrain builds is either tested with ZeRO or refused by name, so it permits nothing.
  root.boolean("zero_allow_untested_optimizer", false);
  // disable_allgather: DeepSpeed's stage-1/2 parameter refresh by broadcasts instead of all-gathers;
  // the same parameters either way.
  if (root.boolean("disable_allgather", false))
    c.warnings.push_back("disable_allgather: accepted; ZeRO refreshes parameters by all-gathers (the same values)");
  // communication_data_type: the dtype data-parallel gradients are reduced in (DeepSpeed: fp16,
  // bf16 or fp32; older versions spelt bf16 "bfp16"). 16-bit: rounded to it and summed in it on the
  // wire (parallel::GradBuckets, ZeroRuntime), half the bytes of fp32.
  auto comm_type = [&root](const std::string& key) {
    std::string t = root.string(key, "fp32");
    std::transform(t.begin(), t.end(), t.begin(), ::tolower);
    MT_CHECK(t == "fp32" || t == "fp16" || t == "bf16" || t == "bfp16", ErrorKind::kInvalidArgument,
             key + ": '" + t + "' is not a DeepSpeed communication type (fp16, bf16, fp32)");
    return t == "fp32" ? DType::kF32 : t == "fp16" ? DType::kF16 : DType::kBF16;
  };
  auto type_name = [](DType t) { return std::string(t == DType::kF32 ? "fp32" : t == DType::kF16 ? "fp16" : "bf16"); };
  if (root.has("communication_data_type")) {
    c.comm_dtype = comm_type("communication_data_type");
    MT_CHECK(c.comm_dtype == DType::kF32 || !optim::optimizer_is_onebit(c.optimizer), ErrorKind::kNotSupported,
             "communication_data_type: '" + type_name(c.comm_dtype) + "' with optimizer.type " + c.optimizer.type +
                 ": the 1-bit exchange sends signs and f32 scales; give \"fp32\" or leave it out");
  }
  // seq_parallel_communication_data_type (DeepSpeed's key; the shorter seq_parallel_comm_data_type
  // is read too): with Ulysses (sp > 1) DeepSpeed's engine reduces the gradients in it, fp32 unless
  // given, in place of communication_data_type (its convergence fix: the sp ranks' partial weight
  // gradients are summed in f32). It is not the all-to-all's dtype.
  std::string seq_key;
  for (const char* k : {"seq_parallel_communication_data_type", "seq_parallel_comm_data_type"}) {
    if (!root.has(k)) continue;
    const DType t = comm_type(k);
    MT_CHECK(seq_key.empty() || t == c.seq_comm_dtype, ErrorKind::kInvalidArgument,
             std::string(k) + " ('" + type_name(t) + "') and " + seq_key + " ('" + type_name(c.seq_comm_dtype) +
                 "') disagree: give one");
    c.seq_comm_dtype = t;
    if (seq_key.empty()) seq_key = k;
  }
  if (c.sp == 1 && !seq_key.empty())
    c.warnings.push_back(seq_key + ": accepted; it sets the gradients' reduction dtype with parallel.sp > 1 (Ulysses), and parallel.sp is 1 here");
  if (c.sp > 1 && root.has("communication_data_type") && c.comm_dtype != c.seq_comm_dtype)
    c.warnings.push_back("communication_data_type: '" + type_name(c.comm_dtype) + "' is not used: with parallel.sp " +
                         std::to_string(c.sp) + " the gradients are reduced in " +
                         (seq_key.empty() ? std::string("seq_parallel_communication_data_type (fp32 unless given)")
                                          : seq_key + " ('" + type_name(c.seq_comm_dtype) + "')") +
                         ", as DeepSpeed does");
  // Logging, monitoring and tuning: accepted with a warning.
  parse_csv_monitor(root, c);
  if (root.has("aio")) {  // the swap I/O engine (offload to nvme); read whether or not it is used
    Section a = root.sub("aio");
    c.aio.block_size = a.integer("block_size", c.aio.block_size);
    MT_CHECK(c.aio.block_size >= 4096 && c.aio.block_size % 4096 == 0 && c.aio.block_size <= (int64_t{1} << 30),
             ErrorKind::kInvalidArgument, a.where("block_size") + " must be a multiple of 4096 bytes, at most 1 GiB");
    c.aio.queue_depth = a.small_integer("queue_depth", c.aio.queue_depth);
    MT_CHECK(c.aio.queue_depth >= 1 && c.aio.queue_depth <= 4096, ErrorKind::kInvalidArgument,
             a.where("queue_depth") + " must be 1 to 4096");
    c.aio.thread_count = a.small_integer("thread_count", c.aio.thread_count);
    MT_CHECK(c.aio.thread_count >= 1 && c.aio.thread_count <= 64, ErrorKind::kInvalidArgument,
             a.where("thread_count") + " must be 1 to 64");
    c.aio.single_submit = a.boolean("single_submit", false);
    c.aio.overlap_events = a.boolean("overlap_events", true);
    if (!c.aio.overlap_events)  // a tuning key: the swap submits its next requests before it reaps, always
      c.warnings.push_back(a.where("overlap_events") +
                           ": false has no effect: the swap always submits its next requests before it reaps completions");
    MT_CHECK(!a.boolean("use_gds", false), ErrorKind::kNotSupported,
             a.where("use_gds") + ": GPUDirect Storage is not supported (the swap goes through host memory)");
    a.unparsed("intra_op_parallelism", Unparsed::kWarn);
    a.finish();
  }
  if (root.has("planner")) {  // our key: what "auto" layouts are planned with (cli/plan.cpp)
    Section p = root.sub("planner");
    c.planner.calibration = p.string("calibration", c.planner.calibration);
    c.planner.memory_gib = p.number("memory_gib", 0.0);
    MT_CHECK(std::isfinite(c.planner.memory_gib) && c.planner.memory_gib >= 0.0, ErrorKind::kInvalidArgument,
             p.where("memory_gib") + ": must be a non-negative number of GiB (0: physical memory / processes)");
    p.finish();
  }
  for (const char* k : {"tensorboard", "wandb", "comet", "autotuning",
                        "checkpoint", "memory_breakdown", "dump_state", "zero_force_ds_cpu_optimizer",
                        "timers", "train_micro_batch_size_per_gpu_auto", "compile", "graph_harvesting", "nebula"})
    root.unparsed(k, Unparsed::kWarn);
  root.finish();
  if (c.reset_position_ids || c.reset_attention_mask) {
    const std::string key = c.reset_position_ids ? "data.reset_position_ids" : "data.reset_attention_mask";
    MT_CHECK(c.device == "cpu", ErrorKind::kNotSupported, key + ": not on device \"cuda\" yet (the CUDA kernels take no documents)");
    MT_CHECK(!(c.reset_attention_mask && c.sparse_attention), ErrorKind::kNotSupported,
             "data.reset_attention_mask: not with sparse_attention (its block layout takes no documents)");
  }
  if (c.loss_normalization == "tokens") {
    MT_CHECK(c.device == "cpu", ErrorKind::kNotSupported, "loss_normalization \"tokens\": not on device \"cuda\" yet");
    MT_CHECK(!c.curriculum.enabled, ErrorKind::kNotSupported,
             "loss_normalization \"tokens\": not with curriculum_learning yet (its steps train a prefix of each sample)");
  }
  check_ulysses(c);
  if (c.task != "classification" && j.contains("data") && j["data"].is_object()) {
    // A classifier's record fields and padding, given to a causal LM (which reads token windows,
    // seq_length long): they change nothing there, so one line names them.
    std::string given;
    for (const char* k : {"texta_name", "textb_name", "label_name", "id_name", "labels", "pad_to_max_length"})
      if (j["data"].contains(k) && !j["data"][k].is_null()) given += std::string(given.empty() ? "" : ", ") + "data." + k;
    if (!given.empty())
      c.warnings.push_back(given + ": apply to \"task\": \"classification\"; a causal LM reads token windows of seq_length "
                           "tokens and does not use them");
  }
  if (c.task == "classification") {  // what the classification loop (cli/classify.cpp) does not do yet, by name
    MT_CHECK(c.device == "cpu", ErrorKind::kNotSupported, "task \"classification\": device \"cuda\" is not supported yet");
    MT_CHECK(!c.curriculum.enabled, ErrorKind::kNotSupported, "task \"classification\": curriculum_learning does not apply");
    MT_CHECK(c.sample_order == "meshtrain", ErrorKind::kNotSupported,
             "task \"classification\": data.sample_order \"megatron\" orders token windows; records are shuffled by data.seed");
    MT_CHECK(c.loss_normalization == "micro_batch", ErrorKind::kNotSupported,
             "task \"classification\": loss_normalization \"tokens\" counts token targets; a record has one label");
    MT_CHECK(!c.eod_mask_loss, ErrorKind::kNotSupported,
             "task \"classification\": data.eod_mask_loss masks token windows; a record's label is its only target");
    MT_CHECK(!c.reset_position_ids && !c.reset_attention_mask, ErrorKind::kNotSupported,
             "task \"classification\": data.reset_position_ids and data.reset_attention_mask split token windows into "
             "documents; a record is one");
    MT_CHECK(!c.train_spec.blend && !c.valid_spec.blend && c.split.empty(), ErrorKind::kNotSupported,
             "task \"classification\": data.train and data.valid are one .jsonl file each (blends and data.split are for token datasets)");
  }
  return c;
}

void ds_config_set(json& j, const std::string& assignment) {
  size_t eq = assignment.find('=');
  MT_CHECK(eq != std::string::npos && eq > 0, ErrorKind::kInvalidArgument, "--set '" + assignment + "': expected key.path=value");
  std::string path = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  MT_CHECK(j.is_object(), ErrorKind::kInvalidArgument,
           "--set '" + path + "=...': the configuration is not a JSON object");
  // JSON text read from a file is checked for UTF-8 by the parser; a --set key or plain-string
  // value is not, and would make every later dump() of the configuration throw.
  try {
    json(assignment).dump();
  } catch (const json::exception&) {
    throw Error(ErrorKind::kInvalidArgument, "--set '" + path + "=...': not valid UTF-8");
  }
  json value;
  try {
    value = json::parse(text);
  } catch (const json::exception&) {
    value = text;
  }
  json* node = &j;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    MT_CHECK(!key.empty(), ErrorKind::kInvalidArgument, "--set '" + assignment + "': empty key in the path");
    if (dot == std::string::npos) {
      (*node)[key] = value;
      return;
    }
    // "model": "path/config.json" with --set model.KEY=V: {"config": path, KEY: V}, the file's
    // keys overridden (it replaced the path, and the model lost its model_type).
    if (node == &j && key == "model" && node->contains(key) && (*node)[key].is_string())
      (*node)[key] = json{{"config", (*node)[key]}};
    if (!node->contains(key) || !(*node)[key].is_object()) {
      (*node)[key] = json::object();
      // --set optimizer.params.lr=... on a run without an optimizer block tunes the default the
      // run trains with (an optimizer block in a file must name its type).
      if (node == &j && key == "optimizer") (*node)[key]["type"] = "AdamW";
    }
    node = &(*node)[key];
    start = dot + 1;
  }
}

namespace {

std::string lowercase(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// The DeepSpeed file's keys into the run file's: objects merge key by key; a value given in both
// must agree, except that "auto" yields to the other file's value (Hugging Face's integration
// refuses mismatches between its arguments and the ds_config the same way).
// A key a --set gives (or one under it) is the --set's: the files' disagreement there is settled
// by it, as the message says (the merge refused it before the --set was applied).
void merge_deepspeed(json& into, const json& from, const std::string& path, const std::string& a, const std::string& b,
                     const std::vector<std::string>& set_paths) {
  for (const auto& [k, v] : from.items()) {
    const std::string kp = path.empty() ? k : path + "." + k;
    const bool decided = std::any_of(set_paths.begin(), set_paths.end(), [&kp](const std::string& p) {
      return kp == p || (kp.size() > p.size() && kp.starts_with(p) && kp[p.size()] == '.');
    });
    if (!into.contains(k)) {
      into[k] = v;
      continue;
    }
    json& cur = into[k];
    if (cur.is_object() && v.is_object()) {
      merge_deepspeed(cur, v, kp, a, b, set_paths);
    } else if (cur == "auto" || decided) {
      cur = v;
    } else if (kp == "optimizer.type" && cur.is_string() && v.is_string() && lowercase(cur.get<std::string>()) == lowercase(v.get<std::string>())) {
      continue;  // DeepSpeed reads the type case-blind: "AdamW" and "adamw" are one optimizer
    } else if (v != "auto" && cur != v) {
      throw Error(ErrorKind::kInvalidArgument, kp + ": " + a + " says " + cur.dump() + " and " + b + " says " + v.dump() +
                                                   " (a key given in both files must agree; --set decides)");
    }
  }
}

// --model: an HF directory with weights (init_from), one with config.json only, or a config file.
json model_from_flag(const std::string& m) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(m, ec)) {
    MT_CHECK(fs::exists(fs::path(m) / "config.json", ec), ErrorKind::kNotFound,
             "--model " + m + ": a directory without config.json");
    for (const auto& e : fs::directory_iterator(m, ec))
      if (e.path().extension() == ".safetensors") return {{"init_from", m}};
    return {{"config", (fs::path(m) / "config.json").string()}};
  }
  MT_CHECK(fs::is_regular_file(m, ec), ErrorKind::kNotFound, "--model " + m + ": no such file or directory");
  return {{"config", m}};
}

}  // namespace

std::string ConfigSources::deepspeed_file() const { return deepspeed.empty() ? deepspeed_config : deepspeed; }

std::string ConfigSources::name() const {
  return !config.empty() ? config : !deepspeed_file().empty() ? deepspeed_file() : std::string("the command line");
}

json ds_config_compose(const ConfigSources& s) {
  json j = s.config.empty() ? json::object() : json_load_file(s.config);
  MT_CHECK(j.is_object(), ErrorKind::kInvalidArgument, s.config + ": the configuration is not a JSON object");
  MT_CHECK(s.deepspeed.empty() || s.deepspeed_config.empty() || s.deepspeed == s.deepspeed_config,
           ErrorKind::kInvalidArgument,
           "--deepspeed " + s.deepspeed + " and --deepspeed_config " + s.deepspeed_config + " name two files: give one");
  const std::string ds_file = s.deepspeed_file();
  if (!ds_file.empty()) {
    json ds = json_load_file(ds_file);
    MT_CHECK(ds.is_object(), ErrorKind::kInvalidArgument, ds_file + ": a DeepSpeed config is a JSON object");
    std::vector<std::string> set_paths;
    for (const auto& o : s.sets) set_paths.push_back(o.substr(0, o.find('=')));
    merge_deepspeed(j, ds, "", s.config.empty() ? "the run file" : s.config, ds_file, set_paths);
  }
  if (!s.model.empty()) j["model"] = model_from_flag(s.model);
  if (!s.data.empty()) {
    if (!j.contains("data") || !j["data"].is_object()) j["data"] = json::object();
    j["data"]["train"] = s.data;
  }
  if (!s.tokenizer.empty()) {
    if (!j.contains("data") || !j["data"].is_object()) j["data"] = json::object();
    j["data"]["tokenizer"] = s.tokenizer;
  }
  for (const auto& o : s.sets) ds_config_set(j, o);
  return j;
}

RunConfig ds_config_load(const ConfigSources& s, int world_size, bool allow_bare) {
  const std::string where = s.name();
  bool composed = false;  // past the files' merge: a message naming a --set key is about its value
  try {
    json j = ds_config_compose(s);
    composed = true;
    return ds_config_parse(std::move(j), where, world_size, allow_bare);
  } catch (const Error& e) {
    std::string msg = e.what();
    // A value a --set gave is that --set's, not the file's ("base.json: train_iters must be an
    // integer" for --set train_iters=): the last --set whose path begins the message is named.
    const std::string body = msg.rfind(where + ": ", 0) == 0 ? msg.substr(where.size() + 2) : msg;
    for (auto it = s.sets.rbegin(); composed && it != s.sets.rend(); ++it) {
      const std::string path = it->substr(0, it->find('='));
      if (path.empty()) continue;
      const char next = body.rfind(path, 0) != 0 ? 'x' : body.size() > path.size() ? body[path.size()] : ':';
      // or the key shown with the --set's value further on ("parallel.tp (1) x parallel.pp (8) does
      // not divide" for --set parallel.pp=8 blamed the file)
      const size_t eq = it->find('=');
      const std::string shown = eq == std::string::npos ? "" : path + " (" + it->substr(eq + 1) + ")";
      const size_t at = shown.empty() ? std::string::npos : body.find(shown);
      const bool shown_whole = at != std::string::npos && (at == 0 || body[at - 1] == ' ');
      if (next == ':' || next == ' ' || next == '.' || next == '[' || shown_whole)
        throw Error(e.kind(), "--set " + (it->size() > 80 ? it->substr(0, 77) + "..." : *it) + ": " + body);
    }
    if (msg.rfind(where, 0) == 0 || (!s.deepspeed_file().empty() && msg.rfind(s.deepspeed_file(), 0) == 0) || msg.rfind("--", 0) == 0)
      throw;
    throw Error(e.kind(), where + ": " + msg);
  }
}

RunConfig ds_config_load(const std::string& path, const std::vector<std::string>& overrides, int world_size) {
  ConfigSources s;
  s.config = path;
  s.sets = overrides;
  return ds_config_load(s, world_size);
}

json ds_config_resolved(const RunConfig& c) {
  json j;
  j["model"] = hf_config_to_json(c.model);
  if (!c.init_from.empty()) j["model"]["init_from"] = c.init_from;
  j["data"] = {{"train", c.data_train}, {"valid", c.data_valid}, {"tokenizer", c.tokenizer}, {"shuffle", c.shuffle},
               {"seed", c.data_seed}, {"sample_order", c.sample_order}};
  if (!c.split.empty()) j["data"]["split"] = c.split;
  if (c.eod_mask_loss) j["data"]["eod_mask_loss"] = true;
  if (c.reset_position_ids) j["data"]["reset_position_ids"] = true;
  if (c.reset_attention_mask) j["data"]["reset_attention_mask"] = true;
  if (c.loss_normalization != "micro_batch") j["loss_normalization"] = c.loss_normalization;
  if (c.eod_id >= 0) j["data"]["eod_id"] = c.eod_id;
  for (auto [key, spec] : {std::pair<const char*, const DataSpec*>{"train", &c.train_spec}, {"valid", &c.valid_spec}}) {
    if (!spec->blend) continue;
    json list = json::array();
    for (size_t i = 0; i < spec->paths.size(); ++i) {
      if (spec->weighted) list.push_back(spec->weights[i]);
      list.push_back(spec->paths[i]);
    }
    j["data"][key] = list;
  }
  if (c.task == "classification") {
    j["task"] = c.task;
    j["data"]["texta_name"] = c.cls_fields.text_a;
    j["data"]["textb_name"] = c.cls_fields.text_b;
    j["data"]["label_name"] = c.cls_fields.label;
    j["data"]["id_name"] = c.cls_fields.id;
    if (!c.cls_fields.labels.empty()) j["data"]["labels"] = c.cls_fields.labels;
    j["data"]["pad_to_max_length"] = c.pad_to_max_length;
    if (c.num_train_epochs > 0) j["num_train_epochs"] = c.num_train_epochs;
    if (c.model_checkpoint.save_top_k > 0)
      j["model_checkpoint"] = {{"monitor", c.model_checkpoint.monitor}, {"mode", c.model_checkpoint.mode},
                               {"save_top_k", c.model_checkpoint.save_top_k}};
  }
  j["seed"] = c.seed;
  j["seq_length"] = c.seq_length;
  j["train_iters"] = c.train_iters;
  j["save_dir"] = c.save_dir;
  j["save_interval"] = c.save_interval;
  j["eval_interval"] = c.eval_interval;
  j["train_batch_size"] = c.batch.train_batch_size;
  j["train_micro_batch_size_per_gpu"] = c.batch.micro_batch_per_gpu;
  j["gradient_accumulation_steps"] = c.batch.gradient_accumulation_steps;
  j["gradient_clipping"] = c.gradient_clipping;
  j["fp16"] = {{"enabled", c.compute_dtype == DType::kF16},
               {"loss_scale", c.loss_scaler.dynamic ? 0.0 : c.loss_scaler.static_scale},
               {"initial_scale_power", c.loss_scaler.initial_scale_power},
               {"loss_scale_window", c.loss_scaler.scale_window},
               {"hysteresis", c.loss_scaler.hysteresis},
               {"min_loss_scale", c.loss_scaler.min_scale}};
  j["bf16"] = {{"enabled", c.compute_dtype == DType::kBF16},
               {"bf16_master_weights_and_grads", c.master_dtype == DType::kBF16}};
  j["fp16"]["fp16_master_weights_and_grads"] = c.master_dtype == DType::kF16;
  j["communication_data_type"] = c.comm_dtype == DType::kF32 ? "fp32" : c.comm_dtype == DType::kF16 ? "fp16" : "bf16";
  if (c.sp > 1 || c.seq_comm_dtype != DType::kF32)  // (read only with Ulysses; warned without it)
    j["seq_parallel_communication_data_type"] = c.seq_comm_dtype == DType::kF32 ? "fp32" : c.seq_comm_dtype == DType::kF16 ? "fp16" : "bf16";
  const optim::OptimizerSpec& o = c.optimizer;
  json op = {{"lr", o.lr}, {"weight_decay", o.weight_decay}};
  if (o.type == "SGD") {
    op["momentum"] = o.momentum;
    op["dampening"] = o.dampening;
    op["nesterov"] = o.nesterov;
  } else {
    op["betas"] = {o.beta1, o.beta2};
    op["eps"] = o.eps;
    op["bias_correction"] = o.bias_correction;
  }
  if (optim::optimizer_is_onebit(o)) op["comm_backend_name"] = "mpi";
  if (o.type == "OneBitAdam" || o.type == "OneBitLamb") op["freeze_step"] = o.freeze_step;
  if (o.type == "ZeroOneAdam") {
    op["var_freeze_step"] = o.var_freeze_step;
    op["var_update_scaler"] = o.var_update_scaler;
    op["local_step_scaler"] = o.local_step_scaler;
    op["local_step_clipper"] = o.local_step_clipper;
  }
  if (o.type == "OneBitLamb") {
    op["coeff_beta"] = o.coeff_beta;
    op["factor_max"] = o.factor_max;
    op["factor_min"] = o.factor_min;
    op["factor_threshold"] = o.factor_threshold;
    op["max_coeff"] = o.max_coeff;
    op["min_coeff"] = o.min_coeff;
  }
  if (o.type == "Lamb") {
    op["eps_inside_sqrt"] = o.eps_inside_sqrt;
    op["max_coeff"] = o.max_coeff;
    op["min_coeff"] = o.min_coeff;
  }
  j["optimizer"] = {{"type", o.type}, {"params", op}};
  const optim::LrScheduleConfig& sc = c.scheduler;
  switch (sc.type) {
    case optim::LrScheduleType::kConstant:
      break;
    case optim::LrScheduleType::kLRRangeTest:
      j["scheduler"] = {{"type", "LRRangeTest"},
                        {"params", {{"lr_range_test_min_lr", sc.lr_range_test_min_lr},
                                    {"lr_range_test_step_size", sc.lr_range_test_step_size},
                                    {"lr_range_test_step_rate", sc.lr_range_test_step_rate},
                                    {"lr_range_test_staircase", sc.lr_range_test_staircase}}}};
      break;
    case optim::LrScheduleType::kOneCycle:
      j["scheduler"] = {{"type", "OneCycle"},
                        {"params", {{"cycle_min_lr", sc.cycle_min_lr}, {"cycle_max_lr", sc.cycle_max_lr},
                                    {"decay_lr_rate", sc.decay_lr_rate}, {"cycle_first_step_size", sc.cycle_first_step_size},
                                    {"cycle_second_step_size", sc.cycle_second_step_size < 0 ? sc.cycle_first_step_size
                                                                                            : sc.cycle_second_step_size},
                                    {"cycle_first_stair_count", sc.cycle_first_stair_count},
                                    {"cycle_second_stair_count", sc.cycle_second_stair_count < 0 ? sc.cycle_first_stair_count
                                                                                                : sc.cycle_second_stair_count},
                                    {"decay_step_size", sc.decay_step_size}, {"cycle_momentum", sc.cycle_momentum},
                                    {"cycle_min_mom", sc.cycle_min_mom}, {"cycle_max_mom", sc.cycle_max_mom},
                                    {"decay_mom_rate", sc.decay_mom_rate}}}};
      break;
    default:
      j["scheduler"] = {{"type", sc.type == optim::LrScheduleType::kWarmupLR        ? "WarmupLR"
                                 : sc.type == optim::LrScheduleType::kWarmupDecayLR ? "WarmupDecayLR"
                                                                                     : "WarmupCosineLR"},
                        {"params", {{"warmup_num_steps", sc.warmup_num_steps}, {"warmup_type", sc.warmup_log ? "log" : "linear"}}}};
      // Each type's own keys, as its DeepSpeed constructor takes them (parsing refuses the others).
      if (sc.type != optim::LrScheduleType::kWarmupCosineLR) {
        j["scheduler"]["params"]["warmup_min_lr"] = sc.warmup_min_lr;
        j["scheduler"]["params"]["warmup_max_lr"] = sc.warmup_max_lr;
      } else {
        j["scheduler"]["params"]["warmup_min_ratio"] = sc.warmup_min_ratio;
        j["scheduler"]["params"]["cos_min_ratio"] = sc.cos_min_ratio;
      }
      if (sc.type != optim::LrScheduleType::kWarmupLR) j["scheduler"]["params"]["total_num_steps"] = sc.total_num_steps;
  }
  if (!c.no_weight_decay.empty()) j["no_weight_decay"] = c.no_weight_decay;
  j["zero_optimization"] = {{"stage", c.zero.stage},
                            {"overlap_comm", c.zero.overlap_comm},
                            {"reduce_bucket_size", c.zero.reduce_bucket_size},
                            {"stage3_prefetch_bucket_size", c.zero.stage3_prefetch_bucket_size},
                            {"stage3_param_persistence_threshold", c.zero.stage3_param_persistence_threshold},
                            {"stage3_max_live_parameters", c.zero.stage3_max_live_parameters},
                            {"offload_optimizer", {{"device", c.zero.offload_optimizer}}},
                            {"offload_param", {{"device", c.zero.offload_param}}}};
  if (c.zero.offload_optimizer == "nvme") {
    j["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"},
                                                   {"nvme_path", c.zero.optimizer_nvme_path},
                                                   {"buffer_count", c.zero.optimizer_buffer_count},
                                                   {"pipeline_read", c.zero.pipeline_read},
                                                   {"pipeline_write", c.zero.pipeline_write}};
    j["zero_optimization"]["sub_group_size"] = c.zero.sub_group_size;
    if (c.zero.offload_param == "nvme")
      j["zero_optimization"]["offload_param"] = {{"device", "nvme"}, {"nvme_path", c.zero.param_nvme_path}};
    j["aio"] = {{"block_size", c.aio.block_size}, {"queue_depth", c.aio.queue_depth},
                {"thread_count", c.aio.thread_count}, {"single_submit", c.aio.single_submit},
                {"overlap_events", c.aio.overlap_events}};
  }
  if (c.activation_checkpointing) j["activation_checkpointing"] = {{"enabled", true}};
  if (c.sparse_attention)
    j["sparse_attention"] = {{"mode", kernels::sparsity_mode_name(c.sparse_attention->pattern)},
                             {"block", c.sparse_attention->block},
                             {"different_layout_per_head", c.sparse_attention->different_layout_per_head}};
  if (c.prescale_gradients) j["prescale_gradients"] = true;
  if (c.gradient_predivide_factor != 1.0) j["gradient_predivide_factor"] = c.gradient_predivide_factor;
  j["parallel"] = {{"tp", c.tp}, {"pp", c.pp}, {"sp", c.sp}, {"sequence_parallel", c.sequence_parallel},
                   {"make_vocab_size_divisible_by", c.vocab_divisible}, {"pipeline_schedule", c.pipeline_schedule},
                   {"virtual_stages", c.virtual_stages}, {"partition", c.partition}};
  j["steps_per_print"] = c.steps_per_print;
  j["comm_timeout"] = c.comm_timeout_s;
  j["device"] = c.device;
  return j;
}

}  // namespace mt::engine

namespace mt::engine {

void ds_config_check_trainable(const RunConfig& c) {
  if (c.bare) return;
  const bool gpt2 = c.model.arch == models::Arch::kGpt2;
  // LLaMA's padding row (pad_token_id) is kept out of the CPU lookup's backward only.
  MT_CHECK(c.device != "cuda" || c.model.padding_idx < 0, ErrorKind::kNotSupported,
           "model.pad_token_id: " + std::to_string(c.model.padding_idx) +
               (c.init_from.empty() ? "" : " (the value is " + c.init_from + "'s)") +
               ": LLaMA's padding row (nn.Embedding's padding_idx, which trains nothing) is not supported on the CUDA "
               "backend (device \"cuda\"); remove it (null) or train on the CPU");
  MT_CHECK(c.device != "cuda" || (!c.model.qkv_bias && !c.model.o_bias), ErrorKind::kNotSupported,
           std::string(c.model.model_type == "qwen2" ? "model.model_type qwen2 (q/k/v biases)" : "model.attention_bias true") +
               ": attention biases are not supported on the CUDA backend (device \"cuda\"); train on the CPU");
  // Dropout trains on the CPU runtime (models/block.h, kernels/cpu/dropout.h). The CUDA backend and
  // the block-sparse attention kernels have none: a run asking for it there would train another
  // model than the one configured (a GPT-2 config.json from the hub has 0.1 in each key).
  for (auto [p, key] : {std::pair<float, const char*>{c.model.embd_pdrop, "embd_pdrop"}, {c.model.resid_pdrop, "resid_pdrop"},
                        {c.model.attn_pdrop, gpt2 ? "attn_pdrop" : "attention_dropout"}}) {
    if (p == 0.0f) continue;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", static_cast<double>(p));
    const std::string what = std::string("model.") + key + ": " + buf +
                             (c.init_from.empty() ? "" : " (the value is " + c.init_from + "'s)");
    const std::string off = gpt2 ? " (--set model.embd_pdrop=0 --set model.resid_pdrop=0 --set model.attn_pdrop=0 for a "
                                   "Hugging Face GPT-2)"
                                 : "";
    MT_CHECK(c.device != "cuda", ErrorKind::kNotSupported,
             what + ": dropout is not supported on the CUDA backend (device \"cuda\"); set it to 0" + off +
                 " or train on the CPU");
    MT_CHECK(!(c.sparse_attention && (std::string(key) == "attn_pdrop" || std::string(key) == "attention_dropout")),
             ErrorKind::kNotSupported,
             what + ": attention dropout is not supported with sparse_attention; set it to 0");
  }
}

void ds_config_check_paths(const RunConfig& c, bool create_save_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto text = [](const std::string& p) { return p.ends_with(".txt") || p.ends_with(".jsonl"); };
  std::vector<std::pair<const char*, std::string>> paths;
  for (const std::string& p : c.train_spec.paths) paths.push_back({"data.train", p});
  for (const std::string& p : c.valid_spec.paths) paths.push_back({"data.valid", p});
  for (auto [key, path] : paths) {
    if (path.empty()) continue;
    if (text(path)) {
      MT_CHECK(fs::is_regular_file(path, ec), ErrorKind::kNotFound, std::string(key) + ": " + path + ": no such file");
      MT_CHECK(!c.tokenizer.empty(), ErrorKind::kInvalidArgument,
               std::string(key) + ": " + path + " is text: data.tokenizer is needed to tokenize it");
      continue;
    }
    for (const char* ext : {".bin", ".idx"}) {
      std::string f = path + ext;
      // (d.bin said "d.bin.bin does not exist", corpus.json "corpus.json.bin": the likely slip named, stop 73)
      const bool suffixed = (path.ends_with(".bin") || path.ends_with(".idx")) && fs::exists(path, ec);
      const std::string hint = suffixed ? "; give the prefix, without " + path.substr(path.size() - 4)
                               : path.ends_with(".json") && fs::is_regular_file(path, ec)
                                   ? "; JSON lines are read from a .jsonl file (meshtrain tokenize reads .json too)"
                                   : "";
      MT_CHECK(fs::exists(f, ec), ErrorKind::kNotFound,
               std::string(key) + ": " + f + " does not exist (an indexed-dataset prefix, or a .txt/.jsonl file)" + hint);
      MT_CHECK(fs::is_regular_file(f, ec), ErrorKind::kInvalidArgument,
               std::string(key) + ": " + f + " is not a regular file");
    }
  }
  if (!c.tokenizer.empty())
    MT_CHECK(fs::exists(c.tokenizer, ec), ErrorKind::kNotFound, "data.tokenizer: " + c.tokenizer + " does not exist");
  // An offload's nvme_path: a directory there, or one this process can create (a file there failed
  // at the swap's start naming the derived rank directory, and config check passed it, stop 73).
  for (const auto& [key, path] : {std::pair{"zero_optimization.offload_optimizer.nvme_path",
                                            c.zero.offload_optimizer == "nvme" ? c.zero.optimizer_nvme_path : std::string()},
                                  std::pair{"zero_optimization.offload_param.nvme_path",
                                            c.zero.offload_param == "nvme" ? c.zero.param_nvme_path : std::string()}}) {
    if (path.empty()) continue;
    fs::path p = fs::absolute(path, ec);
    while (!p.empty() && !fs::exists(p, ec) && p.has_relative_path()) p = p.parent_path();
    MT_CHECK(fs::is_directory(p, ec), ErrorKind::kInvalidArgument,
             std::string(key) + ": " + path + " is not a directory and cannot be one (" + p.string() + " is not a directory)");
    MT_CHECK(::access(p.c_str(), W_OK | X_OK) == 0, ErrorKind::kInvalidArgument,
             std::string(key) + ": " + path + " is not writable (" + p.string() + ": " + std::strerror(errno) + ")");
  }
  if (!c.save_dir.empty() && !create_save_dir) {
    // config check writes nothing (it created the save_dir's directories): the nearest directory
    // that is there must be one this process can create in or write to.
    fs::path p = fs::absolute(c.save_dir, ec);
    while (!p.empty() && !fs::exists(p, ec) && p.has_relative_path()) p = p.parent_path();
    MT_CHECK(fs::is_directory(p, ec), ErrorKind::kInvalidArgument,
             "save_dir: " + c.save_dir + " cannot be created (" + p.string() + " is not a directory)");
    MT_CHECK(::access(p.c_str(), W_OK | X_OK) == 0, ErrorKind::kInvalidArgument,
             "save_dir: " + c.save_dir + " is not writable (" + p.string() + ": " + std::strerror(errno) + ")");
  } else if (!c.save_dir.empty()) {
    fs::create_directories(c.save_dir, ec);
    MT_CHECK(!ec && fs::is_directory(c.save_dir), ErrorKind::kInvalidArgument,
             "save_dir: " + c.save_dir + " cannot be created (" + (ec ? ec.message() : std::string("not a directory")) + ")");
    std::string probe = (fs::path(c.save_dir) / ".meshtrain-write-probe").string();
    std::FILE* f = std::fopen(probe.c_str(), "wb");
    MT_CHECK(f != nullptr, ErrorKind::kInvalidArgument,
             "save_dir: " + c.save_dir + " is not writable (" + std::strerror(errno) + ")");
    std::fclose(f);
    fs::remove(probe, ec);
  }
}

}  // namespace mt::engine
