// Cross-backend tests in the spirit of ggml's test-backend-ops: every CUDA kernel, forward and
// backward, on random shapes (odd sizes, T = 1, large logits) against the CPU kernel of the same
// contract, with a tolerance per op and dtype. Inputs are rounded to bf16 first where the GPU
// reads bf16, so both backends compute the same function; outputs are poisoned (NaN) before each
// run so an unwritten element fails. Skipped where no CUDA device is visible (CI); run on a GPU by
// scripts/gpu-check.sh.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"

namespace mt::cuda {
namespace {

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!available()) GTEST_SKIP() << "no CUDA device";
  }
};

std::vector<float> randv(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(g);
  return v;
}

std::vector<float> round_to(DType dt, std::vector<float> v) {
  if (dt == DType::kBF16)
    for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

// A device copy of host f32 values, stored as dt.
struct Dev {
  DeviceBuffer buf;
  DType dt = DType::kF32;
  size_t n = 0;
  Dev() = default;
  Dev(const std::vector<float>& v, DType t) : buf(std::max<size_t>(1, v.size()) * dtype_size(t), MemCategory::kWorkspace), dt(t), n(v.size()) {
    std::vector<char> host(v.size() * dtype_size(t));
    mt::convert(host.data(), t, v.data(), DType::kF32, v.size());
    copy_to_device(buf.data(), host.data(), host.size());
  }
  static Dev poisoned(size_t n, DType t) {  // NaN in f32 and bf16
    Dev d;
    d.buf = DeviceBuffer(std::max<size_t>(1, n) * dtype_size(t), MemCategory::kWorkspace);
    d.dt = t;
    d.n = n;
    std::vector<unsigned char> host(n * dtype_size(t), 0xff);
    copy_to_device(d.buf.data(), host.data(), host.size());
    return d;
  }
  void* p() const { return buf.data(); }
  float* f() const { return buf.as<float>(); }
  std::vector<float> get() const {
    std::vector<char> host(n * dtype_size(dt));
    copy_to_host(host.data(), buf.data(), host.size());
    std::vector<float> v(n);
    mt::convert(v.data(), DType::kF32, host.data(), dt, n);
    return v;
  }
};

Dev ints(const std::vector<int32_t>& v) {
  Dev d;
  d.buf = DeviceBuffer(v.size() * 4, MemCategory::kWorkspace);
  d.n = v.size();
  copy_to_device(d.buf.data(), v.data(), v.size() * 4);
  return d;
}

// ||a - b|| / ||b|| (and every a finite).
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

const DType kDtypes[] = {DType::kF32, DType::kBF16};

TEST_F(CudaOps, Embedding) {
  for (DType dt : kDtypes) {
    for (auto [B, T, C, V] : {std::tuple{3, 7, 37, 50}, std::tuple{1, 1, 64, 5}, std::tuple{2, 64, 768, 1000}}) {
      int N = B * T;
      auto wte = round_to(dt, randv(static_cast<size_t>(V) * C, 1));
      auto wpe = randv(static_cast<size_t>(T) * C, 2);
      std::vector<int32_t> tok(N);
      std::mt19937 g(3);
      for (auto& t : tok) t = static_cast<int32_t>(g() % V);
      std::vector<char> wte_host(wte.size() * dtype_size(dt));
      mt::convert(wte_host.data(), dt, wte.data(), DType::kF32, wte.size());
      std::vector<float> ref(static_cast<size_t>(N) * C);
      kernels::embedding_forward(ref.data(), tok.data(), wte_host.data(), dt, wpe.data(), N, T, C);
      Dev dwte(wte, dt), dwpe(wpe, DType::kF32), dtok = ints(tok), out = Dev::poisoned(ref.size(), DType::kF32);
      embedding_forward(out.f(), static_cast<int32_t*>(dtok.p()), dwte.p(), dt, dwpe.f(), N, T, C);
      EXPECT_LT(rel_err(out.get(), ref), 1e-6) << dtype_name(dt);
      // backward: += onto existing gradients
      auto dout = randv(ref.size(), 4);
      auto gw = randv(wte.size(), 5), gp = randv(wpe.size(), 6);
      Dev dgw(gw, DType::kF32), dgp(gp, DType::kF32), ddout(dout, DType::kF32);
      kernels::embedding_backward(gw.data(), gp.data(), dout.data(), tok.data(), N, T, C);
      std::vector<int32_t> buckets;
      int unique = embedding_buckets(tok.data(), N, V, buckets);
      Dev dbuckets = ints(buckets);
      embedding_backward(dgw.f(), dgp.f(), ddout.f(), static_cast<int32_t*>(dbuckets.p()), unique, N, T, C);
      EXPECT_LT(rel_err(dgw.get(), gw), 1e-6);
      EXPECT_LT(rel_err(dgp.get(), gp), 1e-6);
    }
  }
}

TEST_F(CudaOps, LayerNormAndRMSNorm) {
  for (DType dt : kDtypes) {
    for (auto [N, C] : {std::pair{19, 67}, std::pair{1, 32}, std::pair{300, 768}, std::pair{9, 1100}}) {
      auto x = randv(static_cast<size_t>(N) * C, 10, 3.0f);
      for (int i = 0; i < N; ++i) x[static_cast<size_t>(i) * C] += 5.0f;  // a non-zero mean
      auto w = randv(C, 11), b = randv(C, 12);
      std::vector<float> out(x.size()), mean(N), rstd(N);
      kernels::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
      Dev dx(x, DType::kF32), dw(w, DType::kF32), db(b, DType::kF32);
      Dev o = Dev::poisoned(out.size(), dt), m = Dev::poisoned(N, DType::kF32), r = Dev::poisoned(N, DType::kF32);
      layernorm_forward(o.p(), dt, m.f(), r.f(), dx.f(), dw.f(), db.f(), N, C, 1e-5f);
      EXPECT_LT(rel_err(o.get(), out), dt == DType::kF32 ? 1e-5 : 5e-3) << "LN " << N << "x" << C;
      EXPECT_LT(rel_err(m.get(), mean), 1e-5);
      EXPECT_LT(rel_err(r.get(), rstd), 1e-5);
      auto dout = randv(x.size(), 13);
      auto dinp = randv(x.size(), 14), gw = randv(C, 15), gb = randv(C, 16);
      Dev ddout(dout, DType::kF32), ddinp(dinp, DType::kF32), dgw(gw, DType::kF32), dgb(gb, DType::kF32);
      Dev ddinp2(dinp, DType::kF32), dgw2(gw, DType::kF32), dgb2(gb, DType::kF32);
      auto cs0 = randv(C, 19);
      Dev dcs(cs0, DType::kF32), dcopy = Dev::poisoned(x.size(), dt);
      kernels::layernorm_backward(dinp.data(), gw.data(), gb.data(), dout.data(), x.data(), w.data(), mean.data(),
                                  rstd.data(), N, C);
      layernorm_backward(ddinp.f(), dgw.f(), dgb.f(), ddout.f(), dx.f(), dw.f(), m.f(), r.f(), N, C);
      EXPECT_LT(rel_err(ddinp.get(), dinp), 1e-5);
      EXPECT_LT(rel_err(dgw.get(), gw), 1e-5);
      EXPECT_LT(rel_err(dgb.get(), gb), 1e-5);
      // The fused extras: dinp's copy in dt, and its column sums added onto cs0.
      layernorm_backward(ddinp2.f(), dgw2.f(), dgb2.f(), ddout.f(), dx.f(), dw.f(), m.f(), r.f(), N, C, dcopy.p(), dt,
                         dcs.f());
      EXPECT_LT(rel_err(ddinp2.get(), dinp), 1e-5) << C;
      EXPECT_LT(rel_err(dgw2.get(), gw), 1e-5) << C;
      EXPECT_LT(rel_err(dcopy.get(), round_to(dt, dinp)), dt == DType::kF32 ? 1e-5 : 1e-3) << C;
      std::vector<float> cs = cs0;
      for (int n = 0; n < N; ++n)
        for (int c = 0; c < C; ++c) cs[c] += dinp[static_cast<size_t>(n) * C + c];
      EXPECT_LT(rel_err(dcs.get(), cs), 1e-5) << C;

      std::vector<float> rout(x.size()), rr(N);
      kernels::rmsnorm_forward(rout.data(), rr.data(), x.data(), w.data(), N, C, 1e-6f);
      Dev ro = Dev::poisoned(rout.size(), dt), rs = Dev::poisoned(N, DType::kF32);
      rmsnorm_forward(ro.p(), dt, rs.f(), dx.f(), dw.f(), N, C, 1e-6f);
      EXPECT_LT(rel_err(ro.get(), rout), dt == DType::kF32 ? 1e-5 : 5e-3) << "RMS";
      EXPECT_LT(rel_err(rs.get(), rr), 1e-5);
      auto rdinp = randv(x.size(), 17), rgw = randv(C, 18);
      Dev drdinp(rdinp, DType::kF32), drgw(rgw, DType::kF32);
      kernels::rmsnorm_backward(rdinp.data(), rgw.data(), dout.data(), x.data(), w.data(), rr.data(), N, C);
      rmsnorm_backward(drdinp.f(), drgw.f(), ddout.f(), dx.f(), dw.f(), rs.f(), N, C);
      EXPECT_LT(rel_err(drdinp.get(), rdinp), 1e-5);
      EXPECT_LT(rel_err(drgw.get(), rgw), 1e-5);
    }
  }
}

TEST_F(CudaOps, GeluAndSwiGLU) {
  for (DType dt : kDtypes) {
    size_t n = 1001;
    auto x = round_to(dt, randv(n, 20, 4.0f)), dy = round_to(dt, randv(n, 21));
    std::vector<float> y(n), dx(n);
    kernels::gelu_forward(y.data(), x.data(), n);
    kernels::gelu_backward(dx.data(), x.data(), dy.data(), n);
    Dev gx(x, dt), gdy(dy, dt), gy = Dev::poisoned(n, dt), gdx = Dev::poisoned(n, dt);
    gelu_forward(gy.p(), gx.p(), dt, n);
    gelu_backward(gdx.p(), gx.p(), gdy.p(), dt, n);
    EXPECT_LT(rel_err(gy.get(), y), dt == DType::kF32 ? 1e-6 : 5e-3);
    EXPECT_LT(rel_err(gdx.get(), dx), dt == DType::kF32 ? 1e-6 : 5e-3);
    // Pointers off the 16-byte grid (one element in): the element-by-element path.
    Dev gy1 = Dev::poisoned(n, dt), gdx1 = Dev::poisoned(n, dt);
    size_t es = dtype_size(dt);
    gelu_forward(static_cast<char*>(gy1.p()) + es, static_cast<char*>(gx.p()) + es, dt, n - 1);
    gelu_backward(static_cast<char*>(gdx1.p()) + es, static_cast<char*>(gx.p()) + es, static_cast<char*>(gdy.p()) + es,
                  dt, n - 1);
    auto y1 = gy1.get(), dx1 = gdx1.get();
    EXPECT_LT(rel_err(std::vector<float>(y1.begin() + 1, y1.end()), std::vector<float>(y.begin() + 1, y.end())),
              dt == DType::kF32 ? 1e-6 : 5e-3);
    EXPECT_LT(rel_err(std::vector<float>(dx1.begin() + 1, dx1.end()), std::vector<float>(dx.begin() + 1, dx.end())),
              dt == DType::kF32 ? 1e-6 : 5e-3);

    // With the bias gradient fused (rows of 48: vectors; 45: the unfused fallback).
    for (int H : {48, 45}) {
      int R = 37;
      auto hx = round_to(dt, randv(static_cast<size_t>(R) * H, 24, 4.0f)), hd = round_to(dt, randv(static_cast<size_t>(R) * H, 25));
      std::vector<float> hdx(hx.size());
      kernels::gelu_backward(hdx.data(), hx.data(), hd.data(), hx.size());
      hdx = round_to(dt, hdx);
      auto bias0 = randv(H, 26);
      std::vector<float> bias = bias0;
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < H; ++c) bias[c] += hdx[static_cast<size_t>(r) * H + c];
      Dev ghx(hx, dt), ghd(hd, dt), ghdx = Dev::poisoned(hx.size(), dt), gbias(bias0, DType::kF32);
      gelu_backward_bias(ghdx.p(), gbias.f(), ghx.p(), ghd.p(), dt, R, H);
      EXPECT_LT(rel_err(ghdx.get(), hdx), dt == DType::kF32 ? 1e-6 : 5e-3) << H;
      EXPECT_LT(rel_err(gbias.get(), bias), dt == DType::kF32 ? 1e-5 : 5e-3) << H;
    }

    int N = 13, I = 45;
    auto h = round_to(dt, randv(static_cast<size_t>(N) * 2 * I, 22, 3.0f)), da = round_to(dt, randv(static_cast<size_t>(N) * I, 23));
    std::vector<float> act(static_cast<size_t>(N) * I), dh(h.size());
    kernels::swiglu_forward(act.data(), h.data(), N, I);
    kernels::swiglu_backward(dh.data(), da.data(), h.data(), N, I);
    Dev gh(h, dt), gda(da, dt), gact = Dev::poisoned(act.size(), dt), gdh = Dev::poisoned(dh.size(), dt);
    swiglu_forward(gact.p(), gh.p(), dt, N, I);
    swiglu_backward(gdh.p(), gda.p(), gh.p(), dt, N, I);
    EXPECT_LT(rel_err(gact.get(), act), dt == DType::kF32 ? 1e-6 : 5e-3);
    EXPECT_LT(rel_err(gdh.get(), dh), dt == DType::kF32 ? 1e-6 : 5e-3);
  }
}

TEST_F(CudaOps, Rope) {
  for (DType dt : kDtypes) {
    int B = 2, T = 9, NH = 4, NKV = 2, HS = 16;
    std::vector<float> cs(static_cast<size_t>(T) * HS / 2), sn(cs.size());
    kernels::rope_table(cs.data(), sn.data(), T, HS, 10000.0f);
    size_t n = static_cast<size_t>(B) * T * (NH + 2 * NKV) * HS;
    auto x = round_to(dt, randv(n, 30));
    auto ref = x, back = x;
    kernels::rope_forward(ref.data(), cs.data(), sn.data(), B, T, NH, NKV, HS);
    kernels::rope_backward(back.data(), cs.data(), sn.data(), B, T, NH, NKV, HS);
    Dev gc(cs, DType::kF32), gs(sn, DType::kF32), g1(x, dt), g2(x, dt);
    rope_forward(g1.p(), dt, gc.f(), gs.f(), B, T, NH, NKV, HS);
    rope_backward(g2.p(), dt, gc.f(), gs.f(), B, T, NH, NKV, HS);
    EXPECT_LT(rel_err(g1.get(), ref), dt == DType::kF32 ? 1e-6 : 5e-3);
    EXPECT_LT(rel_err(g2.get(), back), dt == DType::kF32 ? 1e-6 : 5e-3);
  }
}

TEST_F(CudaOps, BiasBackwardConvertAdd) {
  // C = 71: the column reduction; C = 2304 (GPT-2's qkv) and 72: 16-byte loads, 1 to 3 rows a block.
  for (DType dt : kDtypes)
    for (auto [N, C] : {std::pair{333, 71}, std::pair{1000, 2304}, std::pair{5, 72}, std::pair{20000, 72}}) {
      auto dy = round_to(dt, randv(static_cast<size_t>(N) * C, 40));
      auto db = randv(C, 41);
      Dev gdy(dy, dt), gdb(db, DType::kF32);
      kernels::bias_backward(db.data(), dy.data(), N, C);
      bias_backward(gdb.f(), gdy.p(), dt, N, C);
      EXPECT_LT(rel_err(gdb.get(), db), 1e-5) << N << " x " << C << " " << dtype_name(dt);
    }
  auto x = randv(777, 42, 100.0f);
  Dev gx(x, DType::kF32), gb = Dev::poisoned(x.size(), DType::kBF16);
  cuda::convert(gb.p(), DType::kBF16, gx.p(), DType::kF32, x.size());
  auto bx = gb.get();
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(bx[i], bf16_to_f32(f32_to_bf16(x[i]))) << "RNE at " << i;
  auto y = randv(777, 43);
  Dev gy(y, DType::kF32);
  add_inplace(gx.f(), gy.f(), x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] += x[i];
  EXPECT_LT(rel_err(gx.get(), y), 1e-7);
}

TEST_F(CudaOps, CrossEntropyTile) {
  // Logits in f32 or bf16 (the bf16 head GEMM's output); the CPU kernel reads the same (rounded)
  // values in f32.
  for (DType lt : kDtypes) {
    for (DType dt : kDtypes) {
      for (auto [R, V, scale] : {std::tuple{5, 1003, 1.0f}, std::tuple{3, 50257, 30.0f}, std::tuple{1, 7, 80.0f}}) {
        int ld = (V + 63) / 64 * 64;
        auto logits = round_to(lt, randv(static_cast<size_t>(R) * V, 50, scale));
        std::vector<int32_t> tg(R);
        for (int r = 0; r < R; ++r) tg[r] = (r * 7919) % V;
        if (R > 1) tg[1] = -100;
        std::vector<float> padded(static_cast<size_t>(R) * ld, 0.0f);
        for (int r = 0; r < R; ++r) std::memcpy(&padded[static_cast<size_t>(r) * ld], &logits[static_cast<size_t>(r) * V], V * 4);
        std::vector<float> loss(R), lse(R), dl = logits;
        float gs = 0.37f;
        kernels::cross_entropy_tile(loss.data(), lse.data(), dl.data(), tg.data(), R, V, gs);
        Dev gl(padded, lt), gt = ints(tg), gloss = Dev::poisoned(R, DType::kF32), glse = Dev::poisoned(R, DType::kF32);
        Dev gd = Dev::poisoned(static_cast<size_t>(R) * ld, dt);
        cross_entropy_tile(gloss.f(), glse.f(), gl.p(), lt, ld, static_cast<int32_t*>(gt.p()), R, V, gs, gd.p(), dt, ld);
        EXPECT_LT(rel_err(gloss.get(), loss), 1e-5) << V;
        EXPECT_LT(rel_err(glse.get(), lse), 1e-6);
        auto d = gd.get();
        std::vector<float> dv(static_cast<size_t>(R) * V);
        for (int r = 0; r < R; ++r) std::memcpy(&dv[static_cast<size_t>(r) * V], &d[static_cast<size_t>(r) * ld], V * 4);
        EXPECT_LT(rel_err(dv, dl), dt == DType::kF32 ? 1e-5 : 5e-3);
      }
    }
  }
}

TEST_F(CudaOps, CrossEntropyInPlace) {
  // Training writes the gradient over the logits (CudaLM: f32 logits in f32, bf16 logits in bf16).
  // Every row's loss must still use the target's logit, not the gradient another thread wrote
  // there first (a race that made f32 losses vary run to run before the logit was read ahead of
  // the barriers).
  const int R = 4096, V = 1003;
  for (DType dt : kDtypes) {
    auto logits = round_to(dt, randv(static_cast<size_t>(R) * V, 51, 4.0f));
    std::vector<int32_t> tg(R);
    for (int r = 0; r < R; ++r) tg[r] = r % 3 == 0 ? V - 1 - (r % 97) : (r * 7919) % V;
    std::vector<float> loss(R), lse(R), dl = logits;
    kernels::cross_entropy_tile(loss.data(), lse.data(), dl.data(), tg.data(), R, V, 0.5f);
    Dev gt = ints(tg), gloss = Dev::poisoned(R, DType::kF32);
    for (int ld : {V, 1024}) {  // one by one, and four at a time (production pads rows to 64)
      std::vector<float> padded(static_cast<size_t>(R) * ld, 0.0f), want(padded.size(), 0.0f);
      for (int r = 0; r < R; ++r) {
        std::memcpy(&padded[static_cast<size_t>(r) * ld], &logits[static_cast<size_t>(r) * V], V * 4);
        std::memcpy(&want[static_cast<size_t>(r) * ld], &dl[static_cast<size_t>(r) * V], V * 4);
      }
      for (int rep = 0; rep < 3; ++rep) {
        Dev gi(padded, dt);
        cross_entropy_tile(gloss.f(), nullptr, gi.p(), dt, ld, static_cast<int32_t*>(gt.p()), R, V, 0.5f, gi.p(), dt, ld);
        auto got = gloss.get();
        int bad = 0;
        for (int r = 0; r < R; ++r) bad += std::fabs(got[r] - loss[r]) > 1e-5f * std::max(1.0f, std::fabs(loss[r]));
        EXPECT_EQ(bad, 0) << "rows whose loss read the gradient, ld " << ld << ", repetition " << rep << ", " << dtype_name(dt);
        EXPECT_LT(rel_err(gi.get(), want), dt == DType::kF32 ? 1e-5 : 5e-3) << ld;
      }
    }
  }
}

TEST_F(CudaOps, AdamWAndSumSquares) {
  size_t n = 100003;
  auto p = randv(n, 60), g = randv(n, 61), m = randv(n, 62, 0.1f), v = randv(n, 63, 0.1f);
  for (float& x : v) x = std::fabs(x);
  kernels::AdamWParams ap;
  ap.lr = 3e-3f;
  ap.weight_decay = 0.1f;
  ap.step = 7;
  ap.grad_scale = 0.5f;
  Dev gp(p, DType::kF32), gg(g, DType::kF32), gm(m, DType::kF32), gv(v, DType::kF32), gl = Dev::poisoned(n, DType::kBF16);
  std::vector<bf16_t> lowp(n);
  kernels::adamw_update(p.data(), g.data(), m.data(), v.data(), lowp.data(), DType::kBF16, n, ap);
  cuda::adamw_update(gp.f(), gg.f(), gm.f(), gv.f(), gl.p(), DType::kBF16, n, ap);
  EXPECT_LT(rel_err(gp.get(), p), 1e-6);
  EXPECT_LT(rel_err(gm.get(), m), 1e-6);
  EXPECT_LT(rel_err(gv.get(), v), 1e-6);
  std::vector<float> lw(n);
  mt::convert(lw.data(), DType::kF32, lowp.data(), DType::kBF16, n);
  EXPECT_LT(rel_err(gl.get(), lw), 1e-2);
  double ref = kernels::sum_squares(g.data(), n);
  EXPECT_NEAR(sum_squares(gg.f(), n), ref, 1e-9 * ref);
  g[12345] = INFINITY;
  Dev ginf(g, DType::kF32);
  EXPECT_FALSE(std::isfinite(sum_squares(ginf.f(), n)));
}

TEST_F(CudaOps, GemmEveryTransposeDtypeBiasAccumulate) {
  for (DType ab : kDtypes) {
    for (DType out : kDtypes) {
      if (ab == DType::kF32 && out == DType::kBF16) continue;  // not a combination the model uses
      for (auto [M, N, K] : {std::tuple{33, 17, 29}, std::tuple{1, 64, 768}, std::tuple{256, 768, 384}}) {
        for (int ta = 0; ta < 2; ++ta) {
          for (int tb = 0; tb < 2; ++tb) {
            int lda = ta ? M : K, ldb = tb ? K : N;
            auto a = round_to(ab, randv(static_cast<size_t>(M) * K, 70));
            auto b = round_to(ab, randv(static_cast<size_t>(K) * N, 71));
            auto bias = randv(N, 72);
            auto cin = round_to(out, randv(static_cast<size_t>(M) * N, 73));
            std::vector<char> ah(a.size() * dtype_size(ab)), bh(b.size() * dtype_size(ab));
            mt::convert(ah.data(), ab, a.data(), DType::kF32, a.size());
            mt::convert(bh.data(), ab, b.data(), DType::kF32, b.size());
            std::vector<float> ref(static_cast<size_t>(M) * N);
            kernels::gemm(M, N, K, ah.data(), lda, ta, bh.data(), ldb, tb, ref.data(), N, ab, false, bias.data());
            Dev ga(a, ab), gb(b, ab), gbias(bias, DType::kF32), gcin(cin, out);
            Dev d1 = Dev::poisoned(ref.size(), out);
            gemm(M, N, K, ga.p(), lda, ta, gb.p(), ldb, tb, d1.p(), N, ab, out, false, gbias.f());
            double t = out == DType::kF32 ? (ab == DType::kF32 ? 1e-5 : 1e-3) : 8e-3;
            EXPECT_LT(rel_err(d1.get(), ref), t) << M << "x" << N << "x" << K << " ta " << ta << " tb " << tb;
            // D = cin + A B + bias (the residual add)
            std::vector<float> ref2 = ref;
            for (size_t i = 0; i < ref2.size(); ++i) ref2[i] += cin[i];
            Dev d2 = Dev::poisoned(ref.size(), out);
            gemm(M, N, K, ga.p(), lda, ta, gb.p(), ldb, tb, d2.p(), N, ab, out, false, gbias.f(), gcin.p());
            EXPECT_LT(rel_err(d2.get(), ref2), t);
            // D += A B (gradient accumulation), f32 only
            if (out == DType::kF32) {
              std::vector<float> ref3 = cin;
              kernels::gemm(M, N, K, ah.data(), lda, ta, bh.data(), ldb, tb, ref3.data(), N, ab, true);
              Dev d3(cin, DType::kF32);
              gemm(M, N, K, ga.p(), lda, ta, gb.p(), ldb, tb, d3.p(), N, ab, out, true);
              EXPECT_LT(rel_err(d3.get(), ref3), t);
            }
          }
        }
      }
    }
  }
}

TEST_F(CudaOps, GemmGeluEpiloguesAreTanhGeluAndItsGradient) {
  // The fused epilogues against the product and the CPU's tanh GELU applied to the GPU's own
  // pre-activation: in f32 output, tanh against erf GELU would differ by ~1e-3 (caught here).
  const int M = 40, N = 48, K = 32;
  auto a = round_to(DType::kBF16, randv(static_cast<size_t>(M) * K, 60)), b = round_to(DType::kBF16, randv(static_cast<size_t>(K) * N, 61));
  auto bias = randv(N, 62), g = randv(static_cast<size_t>(M) * N, 63, 2.0f);
  Dev ga(a, DType::kBF16), gb(b, DType::kBF16), gbias(bias, DType::kF32);
  for (bool fused : {true, false}) {
    set_gemm_fused_epilogues(fused);
    for (DType out : kDtypes) {
      std::string what = std::string(fused ? "fused " : "unfused ") + dtype_name(out);
      Dev pre = Dev::poisoned(static_cast<size_t>(M) * N, out);  // the plain product + bias
      gemm(M, N, K, ga.p(), K, false, gb.p(), N, false, pre.p(), N, DType::kBF16, out, false, gbias.f());
      GemmOp op;
      op.M = M; op.N = N; op.K = K;
      op.a = ga.p(); op.lda = K; op.b = gb.p(); op.ldb = N;
      op.ab_type = DType::kBF16; op.d_type = out;
      op.bias = gbias.f();
      op.epilogue = Epilogue::kGelu;
      Dev d = Dev::poisoned(static_cast<size_t>(M) * N, out), aux = Dev::poisoned(static_cast<size_t>(M) * N, out);
      op.d = d.p(); op.ldd = N; op.aux = aux.p(); op.ldaux = N;
      gemm(op);
      auto auxv = aux.get();
      EXPECT_LT(rel_err(auxv, pre.get()), out == DType::kF32 ? 1e-6 : 1e-2) << what;
      std::vector<float> want(auxv.size());
      kernels::gelu_forward(want.data(), auxv.data(), want.size());
      EXPECT_LT(rel_err(d.get(), round_to(out, want)), out == DType::kF32 ? 1e-5 : 1e-2) << what;
      // dGELU with the bias gradient: D = (A B) * gelu'(aux), bgrad = column sums of D.
      Dev prod = Dev::poisoned(static_cast<size_t>(M) * N, out);
      gemm(M, N, K, ga.p(), K, false, gb.p(), N, false, prod.p(), N, DType::kBF16, out, false);
      Dev gaux(g, out), dd = Dev::poisoned(static_cast<size_t>(M) * N, out), bg = Dev::poisoned(N, DType::kF32);
      GemmOp bo = op;
      bo.bias = nullptr;
      bo.epilogue = Epilogue::kDGelu;
      bo.d = dd.p(); bo.aux = gaux.p(); bo.bgrad = bg.f();
      gemm(bo);
      auto pv = prod.get(), gv = gaux.get();
      std::vector<float> wd(pv.size()), wb(N, 0.0f);
      kernels::gelu_backward(wd.data(), gv.data(), pv.data(), wd.size());
      auto ddv = dd.get();
      EXPECT_LT(rel_err(ddv, round_to(out, wd)), out == DType::kF32 ? 1e-5 : 1e-2) << what;
      for (int r = 0; r < M; ++r)
        for (int c = 0; c < N; ++c) wb[c] += ddv[static_cast<size_t>(r) * N + c];
      EXPECT_LT(rel_err(bg.get(), wb), out == DType::kF32 ? 1e-5 : 1e-2) << what;
    }
  }
  set_gemm_fused_epilogues(true);
}

struct AttnShape {
  int B, T, NH, NKV, HS;
};

void check_attention(DType dt, const AttnShape& s, bool plain) {
  set_attention_plain(plain);
  size_t QKV = static_cast<size_t>(s.NH + 2 * s.NKV) * s.HS, rows = static_cast<size_t>(s.B) * s.T;
  auto qkv = round_to(dt, randv(rows * QKV, 80, 2.0f));
  auto dout = round_to(dt, randv(rows * s.NH * s.HS, 81));
  std::vector<float> out(rows * s.NH * s.HS), lse(static_cast<size_t>(s.B) * s.NH * s.T), dqkv(qkv.size());
  kernels::attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.NH, s.NKV, s.HS);
  Dev gq(qkv, dt), gdo(dout, dt), go = Dev::poisoned(out.size(), dt), gl = Dev::poisoned(lse.size(), DType::kF32);
  attention_forward(go.p(), gl.f(), gq.p(), dt, s.B, s.T, s.NH, s.NKV, s.HS);
  std::string what = std::string(dtype_name(dt)) + (plain ? " plain" : " tc") + " B" + std::to_string(s.B) + " T" +
                     std::to_string(s.T) + " NH" + std::to_string(s.NH) + " NKV" + std::to_string(s.NKV) + " HS" +
                     std::to_string(s.HS);
  EXPECT_LT(rel_err(go.get(), out), dt == DType::kF32 ? 1e-5 : 1e-2) << what;
  EXPECT_LT(rel_err(gl.get(), lse), 1e-5) << what;
  // backward against the CPU with the GPU's own (rounded) output, as training does
  auto gout = go.get();
  kernels::attention_backward(dqkv.data(), dout.data(), qkv.data(), gout.data(), lse.data(), s.B, s.T, s.NH, s.NKV,
                              s.HS);
  Dev gdq = Dev::poisoned(dqkv.size(), dt);
  attention_backward(gdq.p(), gdo.p(), gq.p(), go.p(), gl.f(), dt, s.B, s.T, s.NH, s.NKV, s.HS);
  auto g = gdq.get();
  // q, k and v parts separately (a wrong part hides in the total)
  for (int part = 0; part < 3; ++part) {
    size_t off = part == 0 ? 0 : (part == 1 ? s.NH : s.NH + s.NKV) * static_cast<size_t>(s.HS);
    size_t w = (part == 0 ? s.NH : s.NKV) * static_cast<size_t>(s.HS);
    std::vector<float> a, b;
    for (size_t r = 0; r < rows; ++r)
      for (size_t i = 0; i < w; ++i) {
        a.push_back(g[r * QKV + off + i]);
        b.push_back(dqkv[r * QKV + off + i]);
      }
    // Relative to the part's norm, floored at 1% of the whole gradient's: with one key (T = 1) the
    // q and k gradients are zero in exact arithmetic (a softmax over one score), so both sides hold
    // only rounding noise there.
    double num = 0, den = 0, whole = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(std::isfinite(a[i])) << what;
      num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
      den += static_cast<double>(b[i]) * b[i];
    }
    for (float x : dqkv) whole += static_cast<double>(x) * x;
    double err = std::sqrt(num / std::max(den, 1e-4 * whole));
    EXPECT_LT(err, dt == DType::kF32 ? 1e-4 : 2.5e-2) << what << " part " << "qkv"[part];
  }
  set_attention_plain(false);
}

TEST_F(CudaOps, AttentionForwardBackward) {
  const AttnShape shapes[] = {{2, 1, 4, 2, 64}, {1, 77, 4, 1, 64}, {2, 130, 2, 2, 128}, {1, 64, 12, 12, 64},
                              {1, 33, 3, 3, 24}, {2, 200, 8, 2, 64}};
  for (const AttnShape& s : shapes) {
    check_attention(DType::kF32, s, true);
    check_attention(DType::kBF16, s, true);
    check_attention(DType::kBF16, s, false);  // tensor cores where HS is 64/128
  }
}

TEST_F(CudaOps, AllocatorReusesBlocksAndAccounts) {
  DeviceAllocator& a = DeviceAllocator::global();
  {
    DeviceBuffer warm(3 << 20, MemCategory::kActivations);
  }
  int64_t mallocs = a.device_mallocs();
  size_t before = a.stats().current[static_cast<int>(MemCategory::kActivations)];
  for (int i = 0; i < 10; ++i) {
    DeviceBuffer b(3 << 20, MemCategory::kActivations);
    EXPECT_EQ(a.stats().current[static_cast<int>(MemCategory::kActivations)], before + (3 << 20));
  }
  EXPECT_EQ(a.device_mallocs(), mallocs) << "a steady loop must not call cudaMalloc";
  EXPECT_EQ(a.stats().current[static_cast<int>(MemCategory::kActivations)], before);
  EXPECT_GE(a.stats().peak[static_cast<int>(MemCategory::kActivations)], before + (3 << 20));
}

}  // namespace
}  // namespace mt::cuda
