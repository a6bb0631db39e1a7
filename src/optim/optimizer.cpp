#include "optim/optimizer.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <utility>

#include "base/error.h"
#include "optim/adamw.h"
#include "optim/lamb.h"
#include "optim/onebit_adam.h"
#include "optim/onebit_lamb.h"
#include "optim/swapped_adamw.h"
#include "optim/sgd.h"
#include "optim/zero_one_adam.h"

namespace mt::optim {

Optimizer::Optimizer(size_t numel, std::vector<ParamSegment> segments)
    : numel_(numel), segments_(std::move(segments)) {
  size_t next = 0;
  for (const ParamSegment& s : segments_) {
    MT_CHECK(s.offset == next, ErrorKind::kInvalidArgument,
             "optimizer: parameter segment '" + s.name + "' starts at " + std::to_string(s.offset) +
                 ", expected " + std::to_string(next) + " (segments must cover the flat buffer in order)");
    next = s.offset + s.numel;
  }
  MT_CHECK(next == numel, ErrorKind::kInvalidArgument,
           "optimizer: parameter segments cover " + std::to_string(next) + " of " + std::to_string(numel) +
               " elements");
}

void Optimizer::set_betas(double, double) {
  throw Error(ErrorKind::kNotSupported, std::string("optimizer ") + type_name() + " has no betas");
}

void Optimizer::read_state(const std::string& name, float* dst) {
  for (const StateBuffer& b : state())
    if (b.name == name) {
      std::copy(b.data, b.data + b.numel, dst);
      return;
    }
  throw Error(ErrorKind::kInvalidArgument, std::string("optimizer ") + type_name() + " has no state '" + name + "'");
}

void Optimizer::write_state(const std::string& name, const float* src) {
  for (const StateBuffer& b : state())
    if (b.name == name) {
      std::copy(src, src + b.numel, b.data);
      return;
    }
  throw Error(ErrorKind::kInvalidArgument, std::string("optimizer ") + type_name() + " has no state '" + name + "'");
}

std::vector<ParamSegment> single_segment(size_t numel, float weight_decay) {
  return {ParamSegment{0, numel, weight_decay, "all"}};
}

std::vector<DecayRun> decay_runs(const std::vector<ParamSegment>& segments) {
  std::vector<DecayRun> runs;
  for (const ParamSegment& s : segments) {
    if (s.numel == 0) continue;
    if (!runs.empty() && runs.back().weight_decay == s.weight_decay &&
        runs.back().offset + runs.back().numel == s.offset) {
      runs.back().numel += s.numel;
    } else {
      runs.push_back({s.offset, s.numel, s.weight_decay});
    }
  }
  return runs;
}

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

AdamWConfig adamw_config(const OptimizerSpec& spec) {
  AdamWConfig c;
  c.lr = static_cast<float>(spec.lr);
  c.beta1 = static_cast<float>(spec.beta1);
  c.beta2 = static_cast<float>(spec.beta2);
  c.eps = static_cast<float>(spec.eps);
  c.weight_decay = static_cast<float>(spec.weight_decay);
  c.bias_correction = spec.bias_correction;
  c.l2 = lower(spec.type) == "adam" && !spec.adam_w_mode;  // AdamW ignores the flag, as DeepSpeed's engine
  return c;
}

}  // namespace

std::unique_ptr<Optimizer> make_swapped_optimizer(const OptimizerSpec& spec, size_t numel, std::vector<ParamSegment> segments,
                                                  const SwapOptions& swap) {
  make_optimizer(spec, 1, single_segment(1, 0.0f));  // the spec's own checks
  const std::string t = lower(spec.type);
  MT_CHECK(t == "adam" || t == "adamw", ErrorKind::kNotSupported,
           "optimizer.type " + spec.type + ": swapped (nvme) state is implemented for Adam and AdamW");
  return std::make_unique<SwappedAdamW>(numel, std::move(segments), adamw_config(spec), swap);
}

bool optimizer_is_onebit(const OptimizerSpec& spec) {
  const std::string t = lower(spec.type);
  return t == "onebitadam" || t == "zerooneadam" || t == "onebitlamb";
}

bool optimizer_is_onebit_lamb(const OptimizerSpec& spec) { return lower(spec.type) == "onebitlamb"; }

std::unique_ptr<Optimizer> make_optimizer(const OptimizerSpec& spec, size_t numel,
                                          std::vector<ParamSegment> segments) {
  const std::string type = lower(spec.type);
  if (type == "adam" || type == "adamw") {
    return std::make_unique<AdamW>(numel, std::move(segments), adamw_config(spec));
  }
  if (type == "onebitadam") {
    OneBitAdamConfig c;
    c.adam = adamw_config(spec);
    c.freeze_step = spec.freeze_step;
    c.bias_correction = spec.bias_correction;
    MT_CHECK(spec.freeze_step >= 0, ErrorKind::kInvalidArgument,
             "optimizer.params.freeze_step: must be >= 0 (got " + std::to_string(spec.freeze_step) + ")");
    return std::make_unique<OneBitAdam>(numel, std::move(segments), c);
  }
  if (type == "zerooneadam") {
    ZeroOneAdamConfig c;
    c.adam = adamw_config(spec);
    c.var_freeze_step = spec.var_freeze_step;
    c.var_update_scaler = spec.var_update_scaler;
    c.local_step_scaler = spec.local_step_scaler;
    c.local_step_clipper = spec.local_step_clipper;
    return std::make_unique<ZeroOneAdam>(numel, std::move(segments), c);
  }
  if (type == "onebitlamb") {
    OneBitLambConfig c;
    c.lamb.lr = spec.lr;
    c.lamb.beta1 = spec.beta1;
    c.lamb.beta2 = spec.beta2;
    c.lamb.eps = spec.eps;
    c.lamb.weight_decay = spec.weight_decay;
    c.lamb.max_coeff = spec.max_coeff;
    c.lamb.min_coeff = spec.min_coeff;
    c.freeze_step = spec.freeze_step;
    c.coeff_beta = spec.coeff_beta;
    c.factor_max = spec.factor_max;
    c.factor_min = spec.factor_min;
    c.factor_threshold = spec.factor_threshold;
    return std::make_unique<OneBitLamb>(numel, std::move(segments), c);
  }
  if (type == "sgd") {
    SgdConfig c;
    c.lr = spec.lr;
    c.momentum = spec.momentum;
    c.dampening = spec.dampening;
    c.weight_decay = spec.weight_decay;
    c.nesterov = spec.nesterov;
    return std::make_unique<Sgd>(numel, std::move(segments), c);
  }
  if (type == "lamb") {
    LambConfig c;
    c.lr = spec.lr;
    c.bias_correction = spec.bias_correction;
    c.beta1 = spec.beta1;
    c.beta2 = spec.beta2;
    c.eps = spec.eps;
    c.eps_inside_sqrt = spec.eps_inside_sqrt;
    c.weight_decay = spec.weight_decay;
    c.max_grad_norm = spec.max_grad_norm;
    c.max_coeff = spec.max_coeff;
    c.min_coeff = spec.min_coeff;
    return std::make_unique<Lamb>(numel, std::move(segments), c);
  }
  throw Error(ErrorKind::kNotSupported,
              "optimizer.type: '" + spec.type + "' is not implemented (Adam, AdamW, SGD, Lamb, OneBitAdam, ZeroOneAdam, OneBitLamb)");
}

}  // namespace mt::optim
