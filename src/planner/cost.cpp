#include "planner/cost.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string_view>
#include <string>

#include "base/error.h"
#include "kernels/cpu/attention.h"
#include "models/module_profile.h"
#include "optim/zero_one_adam.h"
#include "planner/memory.h"

namespace mt::planner {
namespace {

// f16 on this machine's runtime: oneDNN has no f16 matmul without AVX512-FP16, so kernels::gemm
// widens both operands to f32 (2 bytes read, 4 written an element, at the "convert" line's rate)
// and runs the f32 matmul. A described cluster's devices, and a machine whose calibration found an
// f16 matmul (Calibration::f16_native), multiply f16 as bf16. bf16 alike on a machine without a
// bf16 matmul (Calibration::bf16_native false: AVX2 alone).
bool widened(const Calibration& cal, DType cd) {
  if (cal.has_network) return false;
  return (cd == DType::kF16 && !cal.f16_native) || (cd == DType::kBF16 && !cal.bf16_native);
}
double widen_seconds(const Calibration& cal, double elements) {
  const double rate = cal.fits.count("convert") ? cal.fits.at("convert").per_unit
                      : cal.fits.count("memory") ? cal.fits.at("memory").per_unit : 0.0;
  return rate * 6.0 * elements;
}
DType gemm_dtype(const Calibration& cal, DType cd) {
  return cd == DType::kF32 || widened(cal, cd) ? DType::kF32 : DType::kBF16;
}

// X (m x k) W^T (n x k).
double gemm(const Calibration& cal, DType cd, double m, double k, double n) {
  return cal.gemm_seconds(static_cast<long>(m), static_cast<long>(n), static_cast<long>(k), gemm_dtype(cal, cd)) +
         (widened(cal, cd) ? widen_seconds(cal, m * k + n * k) : 0.0);
}

// The backward's two GEMMs of a forward GEMM's shape (Calibration::gemm_backward_seconds): dX = dY W
// widens dY (m x n) and W, dW = dY^T X widens dY and X.
double gemm_backward(const Calibration& cal, DType cd, double m, double k, double n) {
  return cal.gemm_backward_seconds(static_cast<long>(m), static_cast<long>(n), static_cast<long>(k), gemm_dtype(cal, cd)) +
         (widened(cal, cd) ? widen_seconds(cal, 2 * m * n + n * k + m * k) : 0.0);
}

}  // namespace

double block_gemm_flops(const StepShape& s) {
  const models::BlockDims d = block_dims(s.model, s.micro_batch, s.seq_length);
  const double N = d.N, C = d.C;
  return models::gemm_flops(N, C, d.QKV) + models::gemm_flops(N, d.A, C) + models::gemm_flops(N, C, d.H) +
         models::gemm_flops(N, d.G, C);
}

UpdateKind update_kind(const optim::OptimizerSpec& spec) {
  std::string t = spec.type;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (t == "lamb" || t == "onebitlamb") return UpdateKind::kLamb;
  if (t == "sgd") return spec.momentum != 0.0 ? UpdateKind::kSgdMomentum : UpdateKind::kSgd;
  return UpdateKind::kAdamW;
}

const char* update_line(UpdateKind u, bool bf16_copy) {
  switch (u) {
    case UpdateKind::kLamb: return bf16_copy ? "lamb bf16" : "lamb";
    case UpdateKind::kSgd: return bf16_copy ? "sgd bf16" : "sgd";
    case UpdateKind::kSgdMomentum: return bf16_copy ? "sgd momentum bf16" : "sgd momentum";
    case UpdateKind::kOneBitAdamCompressed: return bf16_copy ? "onebitadam compressed bf16" : "onebitadam compressed";
    case UpdateKind::kOneBitLambCompressed: return bf16_copy ? "onebitlamb compressed bf16" : "onebitlamb compressed";
    case UpdateKind::kZeroOneCompressed: return bf16_copy ? "zerooneadam compressed bf16" : "zerooneadam compressed";
    case UpdateKind::kZeroOneLocal: return bf16_copy ? "zerooneadam local bf16" : "zerooneadam local";
    case UpdateKind::kZeroOneSync: return bf16_copy ? "zerooneadam sync bf16" : "zerooneadam sync";
    case UpdateKind::kAdamW: break;
  }
  return bf16_copy ? "adamw bf16" : "adamw";
}

bool update_keeps_gradients_local(UpdateKind u) {
  return u == UpdateKind::kOneBitAdamCompressed || u == UpdateKind::kOneBitLambCompressed || u == UpdateKind::kZeroOneCompressed ||
         u == UpdateKind::kZeroOneLocal || u == UpdateKind::kZeroOneSync;
}

bool update_exchanges(UpdateKind u) { return update_keeps_gradients_local(u) && u != UpdateKind::kZeroOneLocal; }

namespace {

// Multiples of i in [a, b] (1 <= a, i >= 1).
int64_t multiples(int64_t a, int64_t b, int64_t i) { return b < a ? 0 : b / i - (a - 1) / i; }

// 0/1 Adam's steps of each kind over updates 1..T (by optim::ZeroOnePolicy::Kind), counted an
// interval at a time (its rules, optim/zero_one_adam.h, in DeepSpeed's step numbers s = t + 1): a
// loop over the steps took seconds at 1e9 train_iters. CostModel's test checks it against the
// policy itself step by step.
std::array<int64_t, 4> zero_one_counts(const optim::ZeroOneAdamConfig& c, int64_t T) {
  std::array<int64_t, 4> n{};
  int64_t& variance = n[0];
  int64_t& compressed = n[1];
  int64_t& local = n[2];
  int64_t& sync = n[3];
  if (T <= 0) return n;
  // Phase 1: updates 1..min(T, max(var_freeze_step, 1)); a variance step at multiples of the
  // interval, which doubles at every var_update_scaler-th of them (never with scaler 0).
  const int64_t freeze = std::max<int64_t>(c.var_freeze_step, 1);
  const int64_t s1 = std::min(T, freeze) + 1;
  int64_t s = 2, interval = 1;
  while (s <= s1) {
    const int64_t first = (s + interval - 1) / interval * interval;  // the epoch's first variance step
    const int64_t avail = multiples(s, s1, interval);
    if (c.var_update_scaler == 0 || avail < c.var_update_scaler) {
      variance += avail;
      compressed += s1 - s + 1 - avail;
      break;
    }
    const int64_t last = first + (c.var_update_scaler - 1) * interval;  // the doubling step
    variance += c.var_update_scaler;
    compressed += last - s + 1 - c.var_update_scaler;
    s = last + 1;
    interval *= 2;
  }
  // Phase 2: later updates; a sync at multiples of the interval, which becomes min(clipper, 2 x
  // interval) after every local_step_scaler steps (never with scaler 0).
  if (T <= freeze) return n;  // (freeze + 2 would overflow at a var_freeze_step of "never")
  s = freeze + 2;
  const int64_t s2 = T + 1;
  interval = 1;
  while (s <= s2) {
    const bool fixed = c.local_step_scaler == 0 || interval == c.local_step_clipper;
    const int64_t end = fixed || s2 - s < c.local_step_scaler ? s2 : s + c.local_step_scaler - 1;
    const int64_t k = multiples(s, end, interval);
    sync += k;
    local += end - s + 1 - k;
    s = end + 1;
    interval = interval > c.local_step_clipper / 2 ? c.local_step_clipper : interval * 2;
  }
  return n;
}

}  // namespace

std::vector<std::pair<UpdateKind, double>> zero_one_mix(const optim::OptimizerSpec& spec, int64_t first, int64_t last) {
  MT_CHECK(first >= 1 && last >= first, ErrorKind::kInvalidArgument,
           "plan: 0/1 Adam's steps " + std::to_string(first) + " to " + std::to_string(last));
  optim::ZeroOneAdamConfig c;
  c.var_freeze_step = spec.var_freeze_step;
  c.var_update_scaler = spec.var_update_scaler;
  c.local_step_scaler = spec.local_step_scaler;
  c.local_step_clipper = spec.local_step_clipper;
  c = optim::zero_one_checked(c);  // what the optimizer refuses, the plan does
  const std::array<int64_t, 4> to = zero_one_counts(c, last), before = zero_one_counts(c, first - 1);
  const UpdateKind kinds[] = {UpdateKind::kAdamW, UpdateKind::kZeroOneCompressed, UpdateKind::kZeroOneLocal,
                              UpdateKind::kZeroOneSync};
  static_assert(static_cast<int>(optim::ZeroOnePolicy::Kind::kVariance) == 0 &&
                static_cast<int>(optim::ZeroOnePolicy::Kind::kCompressedGradient) == 1 &&
                static_cast<int>(optim::ZeroOnePolicy::Kind::kLocal) == 2 && static_cast<int>(optim::ZeroOnePolicy::Kind::kSync) == 3);
  std::vector<std::pair<UpdateKind, double>> mix;
  const double n = static_cast<double>(last - first + 1);
  for (size_t k = 0; k < 4; ++k)
    if (to[k] - before[k] > 0) mix.emplace_back(kinds[k], static_cast<double>(to[k] - before[k]) / n);
  return mix;
}

bool zero_one_variance_after_exchange(const optim::OptimizerSpec& spec, int64_t last) {
  optim::ZeroOneAdamConfig c;
  c.var_freeze_step = spec.var_freeze_step;
  c.var_update_scaler = spec.var_update_scaler;
  c.local_step_scaler = spec.local_step_scaler;
  c.local_step_clipper = spec.local_step_clipper;
  c = optim::zero_one_checked(c);
  const int64_t k = c.var_update_scaler;
  if (k == 0 || last < 3 || k > last - 2) return false;  // the interval stays 1, or no room (and no overflow below)
  const int64_t variance = k % 2 == 1 ? k + 2 : k + 3;  // the variance step after the first compressed one
  return variance <= last && variance <= std::max<int64_t>(c.var_freeze_step, 1);  // ZeroOnePolicy::frozen_at
}

std::vector<std::pair<UpdateKind, double>> update_mix(const optim::OptimizerSpec& spec, int64_t first, int64_t last) {
  std::string t = spec.type;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (t == "zerooneadam") return zero_one_mix(spec, first, last);
  if (t != "onebitadam" && t != "onebitlamb") return {};
  MT_CHECK(first >= 1 && last >= first, ErrorKind::kInvalidArgument,
           "plan: the optimizer's steps " + std::to_string(first) + " to " + std::to_string(last));
  MT_CHECK(spec.freeze_step >= 0, ErrorKind::kInvalidArgument, "optimizer.params.freeze_step: must not be negative");
  const int64_t warm_up = std::max<int64_t>(spec.freeze_step, 2) - 1;  // optim/onebit_adam.h, onebit_lamb.h
  const int64_t warm = std::max<int64_t>(0, std::min(last, warm_up) - first + 1), n = last - first + 1;
  std::vector<std::pair<UpdateKind, double>> mix;
  if (warm > 0) mix.emplace_back(t == "onebitadam" ? UpdateKind::kAdamW : UpdateKind::kLamb, static_cast<double>(warm) / static_cast<double>(n));
  if (warm < n)
    mix.emplace_back(t == "onebitadam" ? UpdateKind::kOneBitAdamCompressed : UpdateKind::kOneBitLambCompressed,
                     static_cast<double>(n - warm) / static_cast<double>(n));
  return mix;
}

int sparse_attention_line(const Calibration& cal, int block) {
  int above = 0, largest = 0;
  for (const auto& [family, fit] : cal.fits) {
    constexpr std::string_view prefix = "sparse attention forward b";
    if (family.rfind(prefix, 0) != 0) continue;
    const int b = std::atoi(family.c_str() + prefix.size());
    if (b <= 0 || !cal.fits.count("sparse attention backward b" + std::to_string(b))) continue;
    largest = std::max(largest, b);
    if (b >= block && (above == 0 || b < above)) above = b;
  }
  return above > 0 ? above : largest;
}

ZeroStepCosts zero_step_costs(const StepShape& s, const Calibration& cal) {
  MT_CHECK(s.micro_batch >= 1 && s.seq_length >= 1 && s.world >= 1, ErrorKind::kInvalidArgument,
           "cost model: micro-batch, sequence length and world must be positive");
  MT_CHECK(s.tp >= 1, ErrorKind::kInvalidArgument, "cost model: tp must be positive");
  MT_CHECK(s.usp >= 1 && (s.usp == 1 || (s.seq_length % s.usp == 0 && s.model.n_head % (s.tp * s.usp) == 0 &&
                                         s.model.n_kv_head % (s.tp * s.usp) == 0)),
           ErrorKind::kInvalidArgument,
           "cost model: Ulysses' sp must divide T, and tp x sp the heads and the kv heads");
  const models::BlockDims d = block_dims(s.model, s.micro_batch, s.seq_length, s.tp, s.sequence_parallel, s.usp);
  // Attention's shape: all T tokens of NH/usp heads under Ulysses, else the rank's own.
  const int Ta = d.T * s.usp, NHa = d.NH / s.usp, NKVa = d.NKV / s.usp;
  const double N = d.N, C = d.C, e = static_cast<double>(dtype_size(s.compute));
  const double Nl = d.rows();  // the residual stream's rows on this rank (N / tp under sequence parallelism)
  const double V = models::head_rows_per_rank(s.model, s.tp, s.vocab_divisible);  // this rank's head rows
  const bool llama = s.model.arch != models::Arch::kGpt2;
  const double mem = cal.fits.count("memory") ? cal.fits.at("memory").per_unit : 0.0;
  const DType cd = s.compute;

  // A block: its GEMMs, attention's core, and the bytes of its elementwise work.
  const double gemms = gemm(cal, cd, N, C, d.QKV) + gemm(cal, cd, N, d.A, C) + gemm(cal, cd, N, C, d.H) +
                       gemm(cal, cd, N, d.G, C);
  const double gemms_bwd = gemm_backward(cal, cd, N, C, d.QKV) + gemm_backward(cal, cd, N, d.A, C) +
                           gemm_backward(cal, cd, N, C, d.H) + gemm_backward(cal, cd, N, d.G, C);
  // Attention's core: its own lines where calibrated (else the f32 GEMM rate, the backward twice).
  // Documents compute their share of the causal tiles; a sparse layout its pairs (this rank's heads:
  // 1/tp of the model's), at the sparse kernel's lines where calibrated.
  MT_CHECK(s.attention_share > 0 && s.attention_share <= 1, ErrorKind::kInvalidArgument,
           "cost model: the attention's share of the causal tiles must be in (0, 1]");
  double att_flops = models::attention_core_flops(d.B, Ta, NHa, d.HS, nullptr) * s.attention_share;
  std::string fwd_line = "attention forward", bwd_line = "attention backward";
  if (s.sparse) {  // the rank with the most pairs (a layout may differ by head), as the model slices its heads
    // (tp rank r's, and of those Ulysses' sp rank j's sp-th)
    const int per = s.sparse->num_heads / (s.tp * s.usp);
    double most = 0.0;
    for (int r = 0; r < s.tp * s.usp; ++r) most = std::max(most, models::sparse_attention_pairs(*s.sparse, r * per, (r + 1) * per));
    att_flops = 2.0 * 2.0 * d.B * d.HS * most;
    if (const int b = sparse_attention_line(cal, s.sparse->block); b > 0) {
      fwd_line = "sparse attention forward b" + std::to_string(b);
      bwd_line = "sparse attention backward b" + std::to_string(b);
    }
  }
  const bool att_cal = cal.fits.count(fwd_line) && cal.fits.count(bwd_line);
  double attention = att_cal ? cal.seconds(fwd_line, att_flops) : cal.seconds("gemm f32", att_flops);
  double attention_bwd = att_cal ? cal.seconds(bwd_line, att_flops) : 2 * attention;
  // Documents skip pairs, not query tiles: where the calibration split the kernel's time into a
  // query tile's fixed work and a pair's (DESIGN-NOTES 105), the causal time at this T scaled by
  // the share of that split the run keeps (a query tile each 64 rows, all of them kept).
  // (The calibration's heads each have their kv head; the backward's fixed work is a key tile's of
  // a kv head, so grouped-query heads share it: NKV / NH of it a query head.)
  auto kept = [&](const char* dir, double fixed_share) {
    const std::string tile = std::string("attention ") + dir + " query tile", pair = std::string("attention ") + dir + " pair";
    if (!cal.fits.count(tile) || !cal.fits.count(pair)) return -1.0;
    const double q = std::ceil(Ta / 64.0), pc = kernels::attention_tile_pairs(Ta);
    const double fixed = cal.fits.at(tile).per_unit * q * fixed_share, pairs = cal.fits.at(pair).per_unit * pc;
    return fixed + pairs > 0 ? (fixed + pairs * s.attention_share) / (fixed + pairs) : -1.0;
  };
  if (!s.sparse && att_cal && s.attention_share < 1) {
    const double kept_fwd = kept("forward", 1.0), kept_bwd = kept("backward", static_cast<double>(NKVa) / NHa);
    if (kept_fwd > 0 && kept_bwd > 0) {
      const double causal = models::attention_core_flops(d.B, Ta, NHa, d.HS, nullptr);
      attention = cal.seconds(fwd_line, causal) * kept_fwd;
      attention_bwd = cal.seconds(bwd_line, causal) * kept_bwd;
    }
  }
  // The elementwise work: the blocks' own kernels where calibrated (by elements), else every byte
  // they read and write at the memory rate (older calibrations).
  const bool own = cal.fits.count("add") && cal.fits.count("gelu backward") && cal.fits.count("swiglu backward") &&
                   cal.fits.count(llama ? "rmsnorm backward" : "layernorm backward");
  double elem_fwd = 0.0, elem_bwd = 0.0;
  if (own) {
    const std::string norm = llama ? "rmsnorm" : "layernorm";
    const double NC = Nl * C, NG = N * d.G;
    const bool lp = e < 4;
    // Casts to the compute dtype of what the GEMMs read: the two norms' outputs (this rank's rows:
    // under sequence parallelism the rest arrive gathered in the compute dtype) and attention's
    // output (forward; the activation's is fused with it below), the same gradients and the
    // activation's (backward).
    const double casts_fwd = lp ? (4 + e) * (2 * Nl * C + N * d.A) : 0.0;
    const double casts_bwd = lp ? (4 + e) * (2 * N * C + N * d.A + NG) : 0.0;
    // The saved q, k, v rounded to the compute dtype in place (read f32, write both); in the
    // backward their f32 copy and the attention output's compute-dtype copy again (DESIGN-NOTES 69).
    const double saved_fwd = lp ? (8 + e) * N * d.QKV : 0.0;
    const double saved_bwd = lp ? (e + 4) * N * d.QKV + (4 + e) * N * d.A : 0.0;
    // The activation. f32: GELU reads and writes 4 bytes an element. Low precision, fused with the
    // saved pre-activation (kernels::*_lp): GELU reads 4 and writes the two copies, e each; SwiGLU
    // is its f32 kernel and the two copies' writes (its f32 values stay in cache).
    const double act_fwd = llama ? cal.seconds("swiglu forward", NG) + (lp ? mem * e * (N * d.H + NG) : 0.0)
                                 : mem * (lp ? 4 + 2 * e : 8) * NG;
    const double rope = llama ? 8 * N * (d.A + d.NKV * d.HS) : 0.0;
    elem_fwd = 2 * cal.seconds(norm + " forward", NC) + 2 * cal.seconds("add", NC) + act_fwd +
               mem * (casts_fwd + rope + saved_fwd);
    elem_bwd = 2 * cal.seconds(norm + " backward", NC) + 2 * cal.seconds("add", NC) +
               (llama ? cal.seconds("swiglu backward", NG) : cal.seconds("gelu backward", NG)) +
               mem * (casts_bwd + rope + saved_bwd);
  } else {
    double bytes = 2 * (4 + e) * N * C       // two norms: f32 in, compute dtype out
                   + 2 * 12 * N * C          // two residual adds: read two, write one (f32)
                   + (4 + e) * N * d.A       // attention output and its compute-dtype copy
                   + (8 + e) * N * d.G;      // the activation: f32 in (GELU) or gate and up (SwiGLU)
    if (llama) bytes += 8 * N * (d.A + d.NKV * d.HS);  // RoPE on q and k
    elem_fwd = mem * bytes;
    elem_bwd = 2 * mem * bytes;
    // The saved q, k, v rounded and the pre-activation's copy written, and in the backward the
    // f32 copy of q, k, v and the attention output's compute-dtype copy (as the branch above).
    if (e < 4) {
      elem_fwd += mem * ((8 + e) * N * d.QKV + e * N * d.H);
      elem_bwd += mem * ((e + 4) * N * d.QKV + (4 + e) * N * d.A);
    }
  }
  // Dropout (models/block.cpp): the mask made and applied on each residual branch's rows (resid_pdrop)
  // and on the attention probabilities of this rank's heads (attn_pdrop, the causal half of each
  // T x T) in the forward; in the backward the branches' gradients copied and masked, and the
  // probabilities' gradient and the probabilities masked again. At the calibrated "dropout" line by
  // elements (a calibration without it: 8 bytes an element at the memory rate).
  auto dropout = [&cal, mem](double elements) {
    return cal.fits.count("dropout") ? cal.seconds("dropout", elements) : mem * 8 * elements;
  };
  const double probs = static_cast<double>(d.B) * NHa * Ta * (Ta + 1.0) / 2.0 * s.attention_share;
  if (s.model.resid_pdrop > 0) {
    elem_fwd += 2 * dropout(Nl * C);
    elem_bwd += 2 * dropout(Nl * C) + mem * 2 * 8 * Nl * C;
  }
  if (s.model.attn_pdrop > 0) {
    elem_fwd += dropout(probs);
    elem_bwd += 2 * dropout(probs);
  }
  // Sequence parallelism keeps the norms' outputs as this rank's rows (Block::forward), saved in the
  // compute dtype; the forward and the backward gather that copy as it is, so no pass is added.
  // The block's kernels as a step runs them: the calibration's in-situ factor for the architecture
  // and dtype (a real block against this sum), where measured.
  // (Widened f16 blocks run f32 GEMMs: the f32 factor. Widened bf16 ones have their own, which
  // the calibration measured against this same sum, widening and all.)
  const std::string what = std::string(llama ? "llama " : "gpt2 ") + dtype_name(cd == DType::kF16 ? gemm_dtype(cal, cd) : cd);
  const double in_fwd = cal.fits.count("in situ forward " + what) ? cal.fits.at("in situ forward " + what).per_unit : 1.0;
  const double in_bwd = cal.fits.count("in situ backward " + what) ? cal.fits.at("in situ backward " + what).per_unit : 1.0;
  // Ulysses: each exchange packs its rows into the send buffer and unpacks the received ones (two
  // copies of the N·W floats, parallel::ulysses_pack_*), W = QKV or A: forward q, k, v and the
  // output, backward the output twice and q, k, v (the forward's again under recompute).
  if (s.usp > 1) {
    const double copy = cal.fits.count("copy") ? cal.fits.at("copy").per_unit : mem;  // ZeroStepCosts::copy_seconds's rate
    const double exchange = 2 * copy * 2 * 4 * N;  // per float of a row's width: two copies, each read and written
    elem_fwd += exchange * (d.QKV + d.A);
    elem_bwd += exchange * (2 * d.A + d.QKV);
  }
  const double block_fwd = in_fwd * (gemms + attention + elem_fwd);
  const double block_bwd = in_bwd * (gemms_bwd + attention_bwd + elem_bwd) + (s.recompute ? block_fwd : 0.0);

  // The embeddings: a row gather (and GPT-2's positions added); the backward scatters them back.
  const double emb = mem * 12 * N * C;
  // The tail: the final norm, the head's GEMM and the loss over the logits (written and read back
  // tile by tile).
  // Widened f16: nn::lm_head_cross_entropy widens the weight once and each tile's rows once, runs
  // its three GEMMs in f32, and rounds the f32 dlogits to f16 in place (4 bytes read and written an
  // element: 8/6 of a widened one). Widened bf16 goes through kernels::gemm, which widens each
  // call's operands (the weight once for a head of one tile).
  const bool head_wide = cd == DType::kF16 && widened(cal, cd);
  const double head = head_wide ? gemm(cal, DType::kF32, N, C, V) + widen_seconds(cal, V * C + N * C) : gemm(cal, cd, N, C, V);
  const double head_bwd = head_wide ? gemm_backward(cal, DType::kF32, N, C, V) + widen_seconds(cal, N * V * 8.0 / 6.0)
                                    : gemm_backward(cal, cd, N, C, V);
  const double loss = mem * 12 * N * V;

  ZeroStepCosts c;
  const size_t U = static_cast<size_t>(s.model.n_layer) + 2;
  c.forward.assign(U, block_fwd);
  c.backward.assign(U, block_bwd);
  const double emb_drop = s.model.embd_pdrop > 0 ? dropout(Nl * C) : 0.0;  // the embeddings' sum, and its gradient
  c.forward.front() = emb + emb_drop;
  c.backward.front() = emb + emb_drop;
  c.forward.back() = mem * (4 + e) * Nl * C + head + loss;  // the final norm's rows cast (then gathered)
  c.backward.back() = mem * 2 * (4 + e) * N * C;
  c.head_backward = head_bwd + loss;
  if (s.tp > 1) {  // the tp group's blocking collectives (cost.h)
    const int tp = s.tp;  // the tp group: adjacent ranks
    auto ar = [&cal, tp](double b) { return cal.collective_seconds("all_reduce", b, tp, 1); };
    auto ag = [&cal, tp](double b) { return cal.collective_seconds("all_gather", b, tp, 1); };
    auto rs = [&cal, tp](double b) { return cal.collective_seconds("reduce_scatter", b, tp, 1); };
    const double full = 4 * N * C, part = 4 * Nl * C;
    const double norm_rows = e * Nl * C;  // a norm's output rows, gathered in the compute dtype
    const bool sp = d.sp;
    const std::vector<double> block = sp ? std::vector<double>{ag(norm_rows), rs(part), ag(norm_rows), rs(part)}
                                         : std::vector<double>{ar(full), ar(full)};
    // With recompute a block's backward first runs its forward again, the forward's collectives
    // included (TransformerLM::backward calls Block::forward), then its own.
    std::vector<double> block_bwd;
    if (s.recompute) block_bwd = block;
    // The backward's own: under sequence parallelism, each half gathers the output gradient's rows,
    // then its saved norm output's rows (the weight gradient's input), and reduce-scatters the
    // input gradient.
    const std::vector<double> own_bwd = sp ? std::vector<double>{ag(part), ag(norm_rows), rs(part), ag(part), ag(norm_rows), rs(part)}
                                           : block;
    block_bwd.insert(block_bwd.end(), own_bwd.begin(), own_bwd.end());
    if (sp) block_bwd.push_back(ar(4.0 * (llama ? 2 : 4) * C));  // the norms' weight gradients
    c.tp_forward.assign(U, block);
    c.tp_backward.assign(U, block_bwd);
    c.tp_forward.front() = {sp ? rs(part) : ar(full)};                     // the vocabulary-parallel embedding
    c.tp_backward.front() = sp ? std::vector<double>{ag(part)} : std::vector<double>{};
    c.tp_forward.back() = sp ? std::vector<double>{ag(norm_rows), ar(4 * N), ar(4 * N)}  // the head's rows, the loss's max and sum
                             : std::vector<double>{ar(4 * N), ar(4 * N)};
    c.tp_backward.back() = {};
    c.tp_head_backward = {sp ? rs(part) : ar(full)};
    if (s.model.num_labels > 0) {  // a classifier's replicated score head: its rows gathered, nothing summed
      c.tp_forward.back() = sp ? std::vector<double>{ag(norm_rows)} : std::vector<double>{};
      c.tp_head_backward = {};
    }
  }
  if (s.usp > 1) {  // Ulysses' sp group (dp coordinates adjacent, tp ranks apart): its blocking all-to-alls (cost.h)
    const int usp = s.usp, stride = s.tp;
    auto a2a = [&cal, usp, stride](double b) { return cal.collective_seconds("all_to_all", b, usp, stride); };
    auto ar = [&cal, usp, stride](double b) { return cal.collective_seconds("all_reduce", b, usp, stride); };
    const double qkv = 4 * N * d.QKV, att = 4 * N * d.A;  // this rank's tokens of its tp rank's heads
    const std::vector<double> block{a2a(qkv), a2a(att)};
    std::vector<double> block_bwd;
    if (s.recompute) block_bwd = block;
    for (double b : {a2a(att), a2a(att), a2a(qkv)}) block_bwd.push_back(b);
    c.sp_forward.assign(U, block);
    c.sp_backward.assign(U, block_bwd);
    c.sp_forward.front() = {};
    c.sp_backward.front() = {};
    c.sp_forward.back() = {ar(4), ar(4)};  // the loss's target count and sum over the group
    c.sp_backward.back() = {};
  }
  c.memory_per_byte = mem;
  auto rate = [&cal](const char* family) { return cal.fits.count(family) ? cal.fits.at(family).per_unit : 0.0; };
  c.copy_per_byte = rate("copy");
  c.zero_per_byte = rate("zero");
  c.convert_per_byte = rate("convert");
  c.sum_per_element = rate("add");
  // One rank's slab passes in the cache (ZeroStepCosts::cache_bytes): this process's share of the
  // last-level cache, which its tp group shares.
  if (s.world == 1 && cal.cache_bytes > 0 && cal.fits.count("copy hot") && cal.fits.count("zero hot") && cal.fits.count("add hot")) {
    c.cache_bytes = static_cast<double>(cal.cache_bytes) / s.tp;
    c.hot_copy_per_byte = rate("copy hot");
    c.hot_zero_per_byte = rate("zero hot");
    c.hot_sum_per_element = rate("add hot");
    // The blocks' weight gradients (this rank's matrices) accumulated in a hot slab.
    const double weights = C * d.QKV + d.A * C + C * d.H + d.G * C;
    c.hot_backward_saving.assign(U, 0.0);
    for (size_t u = 1; u + 1 < U; ++u) c.hot_backward_saving[u] = std::max(0.0, 8 * weights * (mem - c.hot_copy_per_byte));
  }
  // The update (writing the compute-dtype copy where calibrated so), and the step's other passes
  // over the shard: the gradient norm reads it and zero_grad writes it.
  // The run's optimizer at its own line; a calibration without it (older, or a described cluster)
  // at AdamW's.
  // at AdamW's (a 1-bit optimizer's compressed update without its line: its warm-up's).
  const bool copy16 = e < 4 && s.zero_stage == 0;
  auto line_of = [&cal, copy16](UpdateKind u) -> const char* {
    if (cal.fits.count(update_line(u, copy16))) return update_line(u, copy16);
    return cal.fits.count(update_line(u, false)) ? update_line(u, false) : nullptr;
  };
  const UpdateKind warm = s.update == UpdateKind::kOneBitLambCompressed   ? UpdateKind::kLamb
                          : s.update == UpdateKind::kOneBitAdamCompressed ? UpdateKind::kAdamW
                                                                          : s.update;
  const char* update = line_of(s.update);
  if (update == nullptr) update = line_of(warm);
  if (update == nullptr) update = line_of(UpdateKind::kAdamW);
  // None at all: refused as a missing GEMM line is (the update was priced at 0 s, without a word).
  MT_CHECK(update != nullptr, ErrorKind::kNotFound,
           (cal.source.empty() ? std::string("calibration") : cal.source) + ": '" + update_line(UpdateKind::kAdamW, false) +
               "' (the optimizer's update) was not measured; run meshtrain calibrate again");
  c.optimizer_per_element = cal.fits.at(update).per_unit + (own ? mem * 8 : 0.0);
  if (s.optimizer_nvme && !s.param_nvme) {  // with param_nvme the step program times the swap
    MT_CHECK(cal.disk_read_gbs > 0 && cal.disk_write_gbs > 0 && cal.disk_mixed_gbs > 0, ErrorKind::kInvalidArgument,
             "cost model: offload_optimizer nvme needs the disk's rates in the calibration (meshtrain calibrate --io DIR)");
    const double u = c.optimizer_per_element, read = cal.disk_read_gbs * 1e9, write = cal.disk_write_gbs * 1e9,
                 mixed = cal.disk_mixed_gbs * 1e9, group = static_cast<double>(std::max<int64_t>(1, s.sub_group_size)),
                 slow = cal.disk_interference_s_per_byte;
    // The update beside the disk's 16·g bytes at the mixed rate: compute moves at 1 / (1 + k·mixed)
    // of its speed while the disk streams (the simulator's rule, SimProgram::disk_interference), so
    // an update longer than the transfer ends k·16·g / (1 + k·mixed) later than alone.
    c.optimizer = [u, read, write, mixed, group, slow](double n) {
      if (n <= 0) return 0.0;
      const double k = std::ceil(n / group), g = n / k, disk = 16 * g / mixed;
      const double beside = std::max(disk, u * g + slow * 16 * g / (1 + slow * mixed));
      return 8 * g / read + u * g + 8 * g / write + (k - 1) * beside;
    };
  }
  if (s.param_nvme) {
    MT_CHECK(cal.disk_read_gbs > 0 && cal.disk_write_gbs > 0 && cal.disk_mixed_gbs > 0, ErrorKind::kInvalidArgument,
             "cost model: offload_param nvme needs the disk's rates in the calibration (meshtrain calibrate --io DIR)");
    c.disk_read_per_byte = 1.0 / (cal.disk_read_gbs * 1e9);
    c.disk_write_per_byte = 1.0 / (cal.disk_write_gbs * 1e9);
    c.disk_mixed_per_byte = 1.0 / (cal.disk_mixed_gbs * 1e9);
    c.update_per_element = cal.fits.count("adamw") ? cal.fits.at("adamw").per_unit : 0.0;  // f32 master, no 16-bit copy
    c.disk_interference = cal.disk_interference_s_per_byte;
  }
  // The dp group: world ranks, tp apart; pipeline neighbours tp x dp apart (Megatron's order).
  const int dp = s.world, stride = s.tp, pp_stride = s.tp * s.world;
  if (s.world > 1) {
    c.all_gather = [&cal, dp, stride](double b) { return cal.collective_seconds("all_gather", b, dp, stride); };
    c.reduce_scatter = [&cal, dp, stride](double b) { return cal.collective_seconds("reduce_scatter", b, dp, stride); };
    c.all_reduce = [&cal, dp, stride](double b) { return cal.collective_seconds("all_reduce", b, dp, stride); };
    // A 1-bit optimizer past its warm-up (and 0/1 Adam's steps but its variance steps): the
    // gradients kept local, and a model-sized buffer's compressed exchange (not in 0/1 Adam's local
    // steps), where calibrated (a calibration before it: the all-reduce's line, as the warm-up's
    // gradients).
    if (update_keeps_gradients_local(s.update)) {
      c.local_gradients = true;
      if (update_exchanges(s.update)) {
        const char* line = cal.has_network || cal.fits.count("onebit_all_reduce") ? "onebit_all_reduce" : "all_reduce";
        c.onebit_exchange = [&cal, dp, stride, line](double b) { return cal.collective_seconds(line, b, dp, stride); };
      }
      // The local gradients scaled back by the rank count (OneBitSync::end_backward): a pass of
      // 8 bytes an element.
      c.optimizer_per_element += 8 * mem;
    }
  } else {  // one rank: the collectives are local copies
    const double copy = c.copy_per_byte > 0 ? c.copy_per_byte : mem;  // ZeroStepCosts::copy_seconds
    c.all_gather = c.reduce_scatter = c.all_reduce = [copy](double b) { return copy * 2 * b; };
  }
  c.send_recv = [&cal, pp_stride](double b) { return cal.collective_seconds("send_recv", b, 2, pp_stride); };
  return c;
}

}  // namespace mt::planner
