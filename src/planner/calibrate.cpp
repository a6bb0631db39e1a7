#include "planner/calibrate.h"

#include <algorithm>
#include <vector>

#include "base/error.h"
#include "base/threads.h"
#include "base/timer.h"
#include "io/aio.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ops.h"

namespace mt::planner {

LinearFit fit_line(const std::vector<std::pair<double, double>>& points, bool relative) {
  MT_CHECK(!points.empty(), ErrorKind::kInvalidArgument, "fit_line: no points");
  // Relative least squares (each point weighted by 1/seconds²): the points span orders of
  // magnitude, and a plain fit would let the largest decide the latency alone.
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [x, y] : points) {
    const double w = relative && y > 0 ? 1.0 / (y * y) : 1.0;
    sw += w;
    sx += w * x;
    sy += w * y;
    sxx += w * x * x;
    sxy += w * x * y;
  }
  LinearFit f;
  const double det = sw * sxx - sx * sx;
  const bool line = points.size() > 1 && det > 0;
  if (line) {
    f.per_unit = (sw * sxy - sx * sy) / det;
    f.latency = (sy - f.per_unit * sx) / sw;
  }
  if (!line || f.latency < 0 || f.per_unit < 0) {  // a rate through the origin
    f.latency = 0.0;
    f.per_unit = sxx > 0 ? sxy / sxx : 0.0;
  }
  return f;
}

double Calibration::seconds(const std::string& family, double units) const {
  auto it = fits.find(family);
  if (it == fits.end())
    throw Error(ErrorKind::kNotFound, "calibration: '" + family + "' was not measured" +
                                          (family.rfind("all_", 0) == 0 || family == "reduce_scatter" || family == "send_recv"
                                               ? " (collectives need a calibration run under mpirun with 2 or more ranks)"
                                               : ""));
  auto c = curves.find(family);
  if (c == curves.end() || c->second.size() < 2 || units < c->second.front().first) return it->second.seconds(units);
  const auto& pts = c->second;
  for (size_t i = 1; i < pts.size(); ++i)
    if (units <= pts[i].first) {
      const auto [x0, y0] = pts[i - 1];
      const auto [x1, y1] = pts[i];
      return y0 + (y1 - y0) * (units - x0) / (x1 - x0);
    }
  return pts.back().second * units / pts.back().first;  // past the largest: at its rate
}

double Calibration::gemm_seconds(long m, long n, long k, DType dtype) const {
  return seconds(std::string("gemm ") + dtype_name(dtype), 2.0 * static_cast<double>(m) * n * k);
}

namespace {

// Seconds per call of f, timed for at least `budget` seconds and `min_calls` calls after one
// untimed call. With a group, every rank runs the same calls and takes the slowest rank's time.
template <typename F>
double time_calls(F&& f, double budget, int min_calls, comm::Backend* group) {
  f();
  if (group) group->barrier(comm::BarrierOptions{})->wait();
  Timer t;
  int calls = 0;
  // Every rank must run the same number of calls: rank 0 decides after its budget, and the
  // group follows (a one-element max-reduce per round keeps them in step).
  for (;;) {
    f();
    ++calls;
    float more = calls < min_calls || t.seconds() < budget ? 1.0f : 0.0f;
    if (group) {
      comm::AllReduceOptions o;
      o.op = comm::ReduceOp::kMax;
      o.tag = "calibrate";
      group->all_reduce(&more, 1, DType::kF32, o)->wait();
    }
    if (more == 0.0f) break;
  }
  float s = static_cast<float>(t.seconds() / calls);
  if (group) {
    comm::AllReduceOptions o;
    o.op = comm::ReduceOp::kMax;
    o.tag = "calibrate time";
    group->all_reduce(&s, 1, DType::kF32, o)->wait();
  }
  return s;
}

void add_family(Calibration& cal, const std::string& family, const std::vector<CalPoint>& pts, bool relative = true,
                bool curve = false) {
  std::vector<std::pair<double, double>> xy;
  for (const CalPoint& p : pts) {
    cal.points.push_back(p);
    xy.emplace_back(p.units, p.seconds);
  }
  cal.fits[family] = fit_line(xy, relative);
  if (curve) {
    std::sort(xy.begin(), xy.end());
    cal.curves[family] = xy;
  }
}

}  // namespace

Calibration calibrate(const CalibrateOptions& options) {
  Calibration cal;
  cal.threads = threads_get();
  comm::Backend* group = options.group != nullptr && options.group->size() > 1 ? options.group : nullptr;
  cal.world = group ? group->size() : 1;
  const double budget = options.quick ? 0.02 : 0.2;

  // GEMMs: the shapes a transformer step runs (tokens × out × in), from a small MLP to a wide one.
  // gemm_ceiling_tflops times C = A·Bᵀ on this process's threads (one GEMM per rank at a time).
  struct Shape {
    int m, n, k;
  };
  const std::vector<Shape> shapes = options.quick ? std::vector<Shape>{{64, 256, 256}, {256, 512, 512}, {256, 1024, 512}}
                                                  : std::vector<Shape>{{64, 256, 256},    {256, 1024, 256},
                                                                       {512, 1024, 1024}, {1024, 2048, 1024},
                                                                       {2048, 4096, 1024}, {2048, 2048, 4096}};
  for (DType dt : {DType::kF32, DType::kBF16}) {
    std::vector<CalPoint> pts;
    for (const Shape& s : shapes) {
      const double tflops = kernels::gemm_ceiling_tflops(s.m, s.n, s.k, dt, budget);
      const double flops = 2.0 * s.m * s.n * s.k;
      pts.push_back({std::string("gemm ") + dtype_name(dt) + " " + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
                         std::to_string(s.k),
                     flops, flops / (tflops * 1e12)});
    }
    add_family(cal, std::string("gemm ") + dtype_name(dt), pts);
  }
  // The backward's two GEMMs of each shape: the input gradient dX (M, K) = dY (M, N) · W (N, K)
  // and the weight gradient dW (N, K) += dY^T · X, accumulated (what Linear's backward runs).
  for (DType dt : {DType::kF32, DType::kBF16}) {
    std::vector<CalPoint> pts;
    for (const Shape& s : shapes) {
      const size_t es = dtype_size(dt);
      std::vector<char> dy(static_cast<size_t>(s.m) * s.n * es), w(static_cast<size_t>(s.n) * s.k * es),
          x(static_cast<size_t>(s.m) * s.k * es);
      std::vector<float> dx(static_cast<size_t>(s.m) * s.k), dw(static_cast<size_t>(s.n) * s.k);
      const double sec = time_calls(
          [&] {
            kernels::gemm(s.m, s.k, s.n, dy.data(), s.n, false, w.data(), s.k, false, dx.data(), s.k, dt, false);
            kernels::gemm(s.n, s.k, s.m, dy.data(), s.n, true, x.data(), s.k, false, dw.data(), s.k, dt, true);
          },
          budget, 3, nullptr);
      pts.push_back({std::string("gemm backward ") + dtype_name(dt) + " " + std::to_string(s.m) + "x" +
                         std::to_string(s.n) + "x" + std::to_string(s.k),
                     4.0 * s.m * s.n * s.k, sec});
    }
    add_family(cal, std::string("gemm backward ") + dtype_name(dt), pts);
  }
  // Causal attention's core (the tiled kernel, f32), forward and backward, by the FLOPs of QK^T
  // and PV over the causal pairs (models::attention_core_flops): 64-wide heads, T 64 to 512.
  {
    std::vector<CalPoint> fwd, bwd;
    const std::vector<int> Ts = options.quick ? std::vector<int>{64, 128} : std::vector<int>{64, 128, 256, 512};
    for (int T : Ts) {
      const int B = 2, NH = 8, HS = 64;
      const size_t rows = static_cast<size_t>(B) * T;
      std::vector<float> qkv(rows * 3 * NH * HS, 0.01f), out(rows * NH * HS), lse(rows * NH), dqkv(qkv.size()),
          dout(out.size(), 1e-3f);
      for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>(i % 97) / 97.0f - 0.5f;
      const double flops = 2.0 * 2.0 * B * HS * NH * (static_cast<double>(T) * (T + 1) / 2);
      fwd.push_back({"attention forward T=" + std::to_string(T), flops,
                     time_calls([&] { kernels::attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, NH, HS); },
                                budget, 3, nullptr)});
      bwd.push_back({"attention backward T=" + std::to_string(T), flops,
                     time_calls(
                         [&] {
                           kernels::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B,
                                                       T, NH, NH, HS);
                         },
                         budget, 3, nullptr)});
    }
    add_family(cal, "attention forward", fwd);
    add_family(cal, "attention backward", bwd);  // by the forward's FLOPs
  }

  // A memory-bound kernel (GELU: 4 bytes read and 4 written per element), and the AdamW update
  // (the optimizer's cost per element: master, gradient and both moments).
  const std::vector<size_t> sizes = options.quick ? std::vector<size_t>{1 << 14, 1 << 17, 1 << 19}
                                                  : std::vector<size_t>{1 << 14, 1 << 17, 1 << 20, 1 << 22, 1 << 24};
  {
    std::vector<CalPoint> mem, adam;
    for (size_t n : sizes) {
      std::vector<float> a(n, 0.5f), b(n), g(n, 1e-3f), m(n), v(n);
      const double s = time_calls([&] { kernels::gelu_forward(b.data(), a.data(), n); }, budget, 3, nullptr);
      mem.push_back({"gelu_forward f32 " + std::to_string(n), 8.0 * static_cast<double>(n), s});
      kernels::AdamWParams p;
      const double sa = time_calls(
          [&] { kernels::adamw_update(a.data(), g.data(), m.data(), v.data(), nullptr, DType::kF32, n, p); }, budget, 3,
          nullptr);
      adam.push_back({"adamw_update " + std::to_string(n), static_cast<double>(n), sa});
    }
    // Plain least squares: the largest points, past the caches, set the rate. A training step's
    // elementwise passes and its optimizer stream buffers far larger than the caches, and the
    // small points' rate (AdamW 5.3 G elements/s at 1M here, 1.8 at 16M) would be 2-3x too fast.
    add_family(cal, "memory", mem, false);
    add_family(cal, "adamw", adam, false);
  }

  // Collectives over the group, by bytes per rank (f32), and a p2p round trip between ranks 0
  // and 1 (half of it is one message). Dense between 4 and 16 MiB, where OpenMPI's algorithms
  // change here, and up to 128 MiB (a stage-0 bucket of a small model).
  if (group) {
    const std::vector<size_t> bytes = options.quick ? std::vector<size_t>{4096, 1 << 16, 1 << 20}
                                                    : std::vector<size_t>{4096,    1 << 14, 1 << 16, 1 << 18, 1 << 20,
                                                                          1 << 22, 3 << 21, 1 << 23, 3 << 22, 1 << 24,
                                                                          1 << 26, 1 << 27};
    const int P = group->size(), me = group->rank();
    std::vector<CalPoint> ar, ag, rs, sr;
    for (size_t b : bytes) {
      const size_t n = b / 4;
      std::vector<float> x(n * P, 1.0f), y(n * P);
      ar.push_back({"all_reduce f32", static_cast<double>(b), time_calls([&] {
                      comm::AllReduceOptions o;
                      o.tag = "calibrate all_reduce";
                      group->all_reduce(x.data(), n, DType::kF32, o)->wait();
                    }, budget, 3, group)});
      ag.push_back({"all_gather f32", static_cast<double>(b), time_calls([&] {
                      comm::AllGatherOptions o;
                      o.tag = "calibrate all_gather";
                      group->all_gather(y.data(), x.data(), n, DType::kF32, o)->wait();
                    }, budget, 3, group)});
      rs.push_back({"reduce_scatter f32", static_cast<double>(b), time_calls([&] {
                      comm::ReduceScatterOptions o;
                      o.tag = "calibrate reduce_scatter";
                      group->reduce_scatter(y.data(), x.data(), n, DType::kF32, o)->wait();
                    }, budget, 3, group)});
      const double rt = time_calls([&] {
        if (me == 0) {
          comm::SendOptions so;
          group->send(x.data(), n, DType::kF32, 1, so)->wait();
          comm::RecvOptions ro;
          group->recv(y.data(), n, DType::kF32, 1, ro)->wait();
        } else if (me == 1) {
          comm::RecvOptions ro;
          group->recv(y.data(), n, DType::kF32, 0, ro)->wait();
          comm::SendOptions so;
          group->send(y.data(), n, DType::kF32, 0, so)->wait();
        }
      }, budget, 3, group);
      sr.push_back({"send_recv f32", static_cast<double>(b), rt / 2});
    }
    add_family(cal, "all_reduce", ar, true, true);
    add_family(cal, "all_gather", ag, true, true);
    add_family(cal, "reduce_scatter", rs, true, true);
    add_family(cal, "send_recv", sr, true, true);
  }

  if (!options.io_dir.empty()) {
    io::AioOptions o;
    const io::Bandwidth bw = io::bandwidth_probe(options.io_dir, options.io_bytes, o);
    cal.disk_read_gbs = bw.read_gbs;
    cal.disk_write_gbs = bw.write_gbs;
    cal.disk_mixed_gbs = bw.mixed_gbs;
  }
  return cal;
}

}  // namespace mt::planner
