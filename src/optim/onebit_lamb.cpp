// OneBitLamb: see onebit_lamb.h.
#include "optim/onebit_lamb.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "base/error.h"

namespace mt::optim {
namespace {

OneBitLambConfig checked(OneBitLambConfig c) {
  MT_CHECK(c.freeze_step >= 0, ErrorKind::kInvalidArgument, "optimizer.params.freeze_step: must be >= 0");
  MT_CHECK(c.coeff_beta >= 0.0 && c.coeff_beta < 1.0, ErrorKind::kInvalidArgument,
           "optimizer.params.coeff_beta: must be in [0, 1)");
  MT_CHECK(c.factor_min > 0.0 && c.factor_min <= c.factor_max, ErrorKind::kInvalidArgument,
           "optimizer.params.factor_min, factor_max: need 0 < factor_min <= factor_max");
  MT_CHECK(c.factor_threshold >= 0.0, ErrorKind::kInvalidArgument, "optimizer.params.factor_threshold: must be >= 0");
  c.lamb.bias_correction = false;
  c.lamb.eps_inside_sqrt = false;
  c.lamb.max_grad_norm = 0.0;
  return c;
}

}  // namespace

OneBitLamb::OneBitLamb(size_t numel, std::vector<ParamSegment> segments, const OneBitLambConfig& config)
    : Optimizer(numel, segments),
      config_(checked(config)),
      lamb_(numel, std::move(segments), config_.lamb),
      v_fresh_(numel * 4, MemCategory::kOptimizer),
      m_last_(numel * 4, MemCategory::kWorkspace),
      coeff_freeze_(segments_.size(), 0.0),
      last_factor_(segments_.size(), 1.0),
      scaling_(segments_.size(), 1.0),
      coeffs_(segments_.size(), 1.0) {
  std::fill_n(v_fresh_.as<float>(), numel, 0.0f);
}

void OneBitLamb::step(float* master, const float* grad, void* lowp, DType lowp_dtype, float lr, float grad_scale) {
  const int64_t t = ++step_;
  if (compressed_at(t)) {
    compressed_step(master, grad, lr, grad_scale);
    if (lowp) convert(lowp, lowp_dtype, master, DType::kF32, numel_);
    return;
  }
  lamb_.step(master, grad, lowp, lowp_dtype, lr, grad_scale);
  const double beta = config_.coeff_beta;
  for (size_t k = 0; k < segments_.size(); ++k) {
    const double c = lamb_.lamb_coeffs()[k];
    if (c != 1.0) coeff_freeze_[k] = beta * coeff_freeze_[k] + (1.0 - beta) * c;
    coeffs_[k] = c;
  }
  if (t + 1 == config_.freeze_step) {
    const float* v = lamb_.state()[1].data;
    std::copy(v, v + numel_, v_fresh_.as<float>());
  }
}

void OneBitLamb::compressed_step(float* master, const float* grad, float lr, float grad_scale) {
  float* m = lamb_.state()[0].data;
  float* m_last = m_last_.as<float>();
  if (!compressed_at(step_ - 1)) {  // the first: each segment's momentum scale against the mean
    std::vector<double> r(segments_.size(), 0.0);
    double mean = 0.0;
    for (size_t k = 0; k < segments_.size(); ++k) {
      const ParamSegment& sg = segments_[k];
      double sq = 0.0;
      for (size_t i = sg.offset; i < sg.offset + sg.numel; ++i) sq += static_cast<double>(m[i]) * m[i];
      r[k] = sg.numel ? std::sqrt(sq) / std::sqrt(static_cast<double>(sg.numel)) : 0.0;
      mean += r[k];
    }
    mean /= static_cast<double>(std::max<size_t>(segments_.size(), 1));
    for (size_t k = 0; k < segments_.size(); ++k) scaling_[k] = r[k] > 0.0 ? mean / r[k] : 1.0;
  }
  const float b1 = static_cast<float>(lamb_.config().beta1), omb1 = static_cast<float>(1.0 - lamb_.config().beta1);
  std::copy(m, m + numel_, m_last);
  for (size_t k = 0; k < segments_.size(); ++k) {
    const ParamSegment& sg = segments_[k];
    const float sc = static_cast<float>(scaling_[k]);
    for (size_t i = sg.offset; i < sg.offset + sg.numel; ++i) {
      m[i] = b1 * m[i] + omb1 * (grad[i] * grad_scale);
      m[i] *= sc;
    }
  }
  if (exchange_) exchange_->average(m, numel_);
  for (size_t k = 0; k < segments_.size(); ++k) segment_update(k, master, lr);
}

// One segment after the momentum exchange: unscale, refresh v_fresh, the factor, the update.
void OneBitLamb::segment_update(size_t k, float* master, float lr) {
  const ParamSegment& sg = segments_[k];
  float* m = lamb_.state()[0].data;
  const float* v = lamb_.state()[1].data;
  float* vf = v_fresh_.as<float>();
  const float* m_last = m_last_.as<float>();
  const float b1 = static_cast<float>(lamb_.config().beta1), omb1 = static_cast<float>(1.0 - lamb_.config().beta1);
  const float b2 = static_cast<float>(lamb_.config().beta2), omb2 = static_cast<float>(1.0 - lamb_.config().beta2);
  const float eps = static_cast<float>(lamb_.config().eps);
  const float sc = static_cast<float>(scaling_[k]), wd = sg.weight_decay;
  double u_sq = 0.0, prelim_sq = 0.0;
  float ratio_max = -INFINITY;
  for (size_t i = sg.offset; i < sg.offset + sg.numel; ++i) {
    m[i] /= sc;
    const float g = (m[i] - m_last[i] * b1) / omb1;
    vf[i] = b2 * vf[i] + omb2 * g * g;
    const float denom = std::sqrt(v[i]) + eps;
    const float prelim = m[i] / denom;
    const float u = wd > 0.0f ? prelim + wd * master[i] : prelim;
    u_sq += static_cast<double>(u) * u;
    prelim_sq += static_cast<double>(prelim) * prelim;
    ratio_max = std::max(ratio_max, denom / (std::sqrt(vf[i]) + eps));
  }
  double factor = ratio_max;
  if (wd > 0.0f) {
    const double u_norm = std::sqrt(u_sq);
    const double q = u_norm > 0.0 ? std::min(1.0, std::sqrt(prelim_sq) / u_norm) : 1.0;
    factor = factor * q + (1.0 - q);
  }
  factor = std::clamp(factor, config_.factor_min, config_.factor_max);
  factor = std::min(factor, last_factor_[k] * (1.0 + config_.factor_threshold));
  factor = std::max(factor, last_factor_[k] * (1.0 - config_.factor_threshold));
  last_factor_[k] = factor;
  coeffs_[k] = coeff_freeze_[k] * factor;
  const float step = static_cast<float>(static_cast<double>(lr) * coeffs_[k]);
  for (size_t i = sg.offset; i < sg.offset + sg.numel; ++i) {
    const float prelim = m[i] / (std::sqrt(v[i]) + eps);
    const float u = wd > 0.0f ? prelim + wd * master[i] : prelim;
    master[i] -= step * u;
  }
}

std::vector<StateBuffer> OneBitLamb::state() const {
  std::vector<StateBuffer> s = lamb_.state();
  s.push_back({"exp_avg_sq_fresh", v_fresh_.as<float>(), numel_});
  return s;
}

std::vector<ScalarState> OneBitLamb::scalar_state() {
  return {{"lamb_coeff_freeze", &coeff_freeze_}, {"last_factor", &last_factor_}, {"scaling_coeff", &scaling_}};
}

}  // namespace mt::optim
