// OneBitLamb: see onebit_lamb.h.
#include "optim/onebit_lamb.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/ops.h"

namespace mt::optim {
namespace {

constexpr size_t kChunk = size_t{1} << 14;  // elements a task of segment_update's sums

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
  const size_t n = numel_;
#pragma omp parallel for simd schedule(static) if (parallel: n > kParallelElements)
  for (size_t i = 0; i < n; ++i) m_last[i] = m[i];
  for (size_t k = 0; k < segments_.size(); ++k) {
    const ParamSegment& sg = segments_[k];
    const float sc = static_cast<float>(scaling_[k]);
    const size_t s0 = sg.offset, s1 = sg.offset + sg.numel;
#pragma omp parallel for simd schedule(static) if (parallel: sg.numel > kParallelElements)
    for (size_t i = s0; i < s1; ++i) {
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
  // Per chunk of kChunk elements over the threads, the chunks' sums then added in order (the same
  // on any thread count).
  const size_t s0 = sg.offset, s1 = sg.offset + sg.numel;
  const int64_t chunks = static_cast<int64_t>((sg.numel + kChunk - 1) / kChunk);
  std::vector<double> u_part(static_cast<size_t>(chunks)), prelim_part(static_cast<size_t>(chunks));
  std::vector<float> max_part(static_cast<size_t>(chunks));
  kernels::OneBitLambScalars ks;
  ks.scale = sc;
  ks.beta1 = b1;
  ks.beta2 = b2;
  ks.one_minus_beta1 = omb1;
  ks.one_minus_beta2 = omb2;
  ks.eps = eps;
  ks.weight_decay = wd;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t c0 = s0 + static_cast<size_t>(c) * kChunk, c1 = std::min(s1, c0 + kChunk);
    const kernels::OneBitLambSums sums = kernels::onebit_lamb_refresh(m + c0, vf + c0, m_last + c0, v + c0, master + c0, c1 - c0, ks);
    u_part[static_cast<size_t>(c)] = sums.u;
    prelim_part[static_cast<size_t>(c)] = sums.prelim;
    max_part[static_cast<size_t>(c)] = sums.ratio_max;
  }
  double u_sq = 0.0, prelim_sq = 0.0;
  float ratio_max = -INFINITY;
  for (int64_t c = 0; c < chunks; ++c) {
    u_sq += u_part[static_cast<size_t>(c)];
    prelim_sq += prelim_part[static_cast<size_t>(c)];
    ratio_max = std::max(ratio_max, max_part[static_cast<size_t>(c)]);
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
#pragma omp parallel for simd schedule(static) if (parallel: sg.numel > kParallelElements)
  for (size_t i = s0; i < s1; ++i) {
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
