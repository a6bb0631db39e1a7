#include "parallel/grad_sync.h"

#include <algorithm>

#include "comm/onebit.h"
#include "parallel/dp/grad_buckets.h"
#include "tensor/allocator.h"

namespace mt::parallel {
namespace {

class LocalSync : public GradSync {
 public:
  explicit LocalSync(nn::ParamStore& store) : store_(store) {}
  const char* kind() const override { return "local"; }
  float* master() const override { return store_.master(); }
  float* grad() const override { return store_.grad(); }
  size_t numel() const override { return store_.numel(); }
  void* compute() const override { return store_.compute_dtype() != DType::kF32 ? store_.compute() : nullptr; }
  DType compute_dtype() const override { return store_.compute_dtype(); }
  void after_update() override {}
  void zero_grad() override { store_.zero_grad(); }
  void gather(float* dst, const float* span) override {
    if (dst) std::copy(span, span + store_.numel(), dst);
  }
  void scatter(float* span, const float* local) const override {
    std::copy(local, local + store_.numel(), span);
    if (span == store_.master()) store_.sync_compute();
  }

 protected:
  nn::ParamStore& store_;
};

// Stage 0 over more than one rank: a bucket is launched once backward has passed below it (after
// each block and the tail) during the last micro-batch; the others do not communicate.
class BucketedSync : public LocalSync {
 public:
  BucketedSync(nn::ParamStore& store, const std::vector<Unit>& units, const std::vector<std::vector<nn::Module*>>& modules,
               comm::Backend& dp, const GradSyncOptions& o)
      : LocalSync(store), buckets_(store.grad(), store.numel(), o.bucket_elems, dp, o.overlap_comm, o.timeout, o.comm_dtype) {
    for (size_t u = 1; u < units.size(); ++u) {
      size_t from = units[u].offset;
      for (nn::Module* m : modules[u])
        m->add_hook(nn::HookPoint::kPostBackward, [this, from](nn::Module&, nn::HookPoint) {
          if (buckets_.armed()) buckets_.ready_from(from);
        });
    }
  }
  const char* kind() const override { return "bucketed"; }
  void begin_backward(bool last) override {
    if (last) buckets_.begin();
  }
  void end_backward(bool last) override {
    if (last) buckets_.finish();
  }

 private:
  GradBuckets buckets_;
};

// Stage 0 with a 1-bit optimizer: BucketedSync while the optimizer wants averaged gradients; then
// nothing during backward, and the optimizer's momentum through compressed_all_reduce.
class OneBitSync : public GradSync, public optim::StateExchange {
 public:
  OneBitSync(nn::ParamStore& store, const std::vector<Unit>& units, const std::vector<std::vector<nn::Module*>>& modules,
             comm::Backend& dp, const GradSyncOptions& o)
      : full_(store, units, modules, dp, o), dp_(dp), timeout_(o.timeout), per_tensor_(o.onebit_per_tensor),
        plan_(spans(store, o.onebit_per_tensor), dp.size()),
        worker_error_(plan_.worker_error_len * 4, MemCategory::kOptimizer),
        server_error_(plan_.server_error_len * 4, MemCategory::kOptimizer) {
    std::fill_n(worker_error_.as<float>(), plan_.worker_error_len, 0.0f);
    std::fill_n(server_error_.as<float>(), plan_.server_error_len, 0.0f);
  }
  // DeepSpeed compresses each parameter tensor on its own where its optimizer sees them (1-bit and
  // 0/1 Adam in fp32), and the one flat buffer its fp16 optimizer hands over (and 1-bit LAMB's
  // flat momentum). The whole buffer was always one, with a scale per server chunk: a LayerNorm's
  // momentum shared its scale with its neighbour, a thousand times its size.
  static std::vector<std::pair<size_t, size_t>> spans(const nn::ParamStore& store, bool per_tensor) {
    if (!per_tensor) return {{0, store.numel()}};
    std::vector<std::pair<size_t, size_t>> out;
    for (const nn::Parameter* p : store.parameters()) out.emplace_back(p->offset, static_cast<size_t>(p->numel()));
    return out;
  }
  const char* kind() const override { return "onebit"; }
  float* master() const override { return full_.master(); }
  float* grad() const override { return full_.grad(); }
  size_t numel() const override { return full_.numel(); }
  void* compute() const override { return full_.compute(); }
  DType compute_dtype() const override { return full_.compute_dtype(); }
  void begin_backward(bool last) override {
    if (!grads_local()) full_.begin_backward(last);
  }
  // The engine scales each rank's loss by 1/dp for a summing reduction: a local gradient is
  // multiplied back by dp, so grad() is this rank's own mean gradient (what DeepSpeed's ranks hold
  // with their backward all-reduce off).
  void end_backward(bool last) override {
    if (!grads_local()) {
      full_.end_backward(last);
    } else if (last) {
      float* g = full_.grad();
      const float n = static_cast<float>(dp_.size());
      const size_t e = full_.numel();
#pragma omp parallel for simd schedule(static) if (parallel: e > (size_t{1} << 15))
      for (size_t i = 0; i < e; ++i) g[i] *= n;
    }
  }
  void zero_grad() override { full_.zero_grad(); }
  void gather(float* dst, const float* span) override { full_.gather(dst, span); }
  void scatter(float* span, const float* local) const override { full_.scatter(span, local); }

  void bind(optim::Optimizer& optimizer) override {
    optimizer_ = &optimizer;
    optimizer.set_exchange(this);
  }
  bool grads_local() const override { return optimizer_ && optimizer_->wants_local_gradients(); }
  std::vector<optim::StateBuffer> rank_state() const override {
    // Named by layout: a checkpoint's buffers of another layout (flat under fp16, per tensor in
    // fp32, or before the plans) are another compression's errors even where the sizes agree, and
    // start at zero (checkpoint_io's load_rank_state).
    const std::string layout = per_tensor_ ? "_per_tensor" : "_flat";
    return {{"worker_error" + layout, worker_error_.as<float>(), plan_.worker_error_len},
            {"server_error" + layout, server_error_.as<float>(), plan_.server_error_len}};
  }
  void average(float* buf, size_t n) override {
    MT_CHECK(n == full_.numel(), ErrorKind::kInternal, "onebit sync: the exchange covers the whole flat buffer");
    comm::CommOptions o;
    o.timeout = timeout_;
    comm::compressed_all_reduce(dp_, buf, plan_, worker_error_.as<float>(), server_error_.as<float>(), o);
  }
  void reset_errors() override {
    std::fill_n(worker_error_.as<float>(), plan_.worker_error_len, 0.0f);
    std::fill_n(server_error_.as<float>(), plan_.server_error_len, 0.0f);
  }

 private:
  BucketedSync full_;
  comm::Backend& dp_;
  std::chrono::milliseconds timeout_;
  bool per_tensor_;
  comm::OneBitPlan plan_;
  Buffer worker_error_, server_error_;
  optim::Optimizer* optimizer_ = nullptr;
};

class ZeroSync : public GradSync {
 public:
  ZeroSync(nn::ParamStore& store, const std::vector<Unit>& units, const std::vector<std::vector<nn::Module*>>& modules,
           comm::Backend& dp, const GradSyncOptions& o)
      : rt_(store, units, modules, dp, o.zero) {}
  const char* kind() const override { return "zero"; }
  float* master() const override { return rt_.master(); }
  float* grad() const override { return rt_.grad(); }
  size_t numel() const override { return rt_.partition().shard_numel(); }
  bool sharded() const override { return true; }
  std::vector<optim::ParamSegment> span_segments(const std::vector<optim::ParamSegment>& all) const override {
    return rt_.partition().shard_segments(all);
  }
  void begin_backward(bool last) override { rt_.set_last_micro_batch(last); }
  void end_backward(bool) override { rt_.finish_backward(); }
  void after_update() override { rt_.refresh_params(); }
  void zero_grad() override { rt_.zero_grad(); }
  void gather(float* dst, const float* span) override { rt_.gather_flat(dst, span, 0); }
  void scatter(float* span, const float* local) const override { rt_.scatter_flat(span, local); }
  const ZeroRuntime* zero() const override { return &rt_; }
  ZeroRuntime* zero() override { return &rt_; }

 private:
  ZeroRuntime rt_;
};

}  // namespace

std::unique_ptr<GradSync> make_grad_sync(nn::ParamStore& store, const std::vector<Unit>& units,
                                         const std::vector<std::vector<nn::Module*>>& modules, comm::Backend& dp,
                                         const GradSyncOptions& o) {
  if (o.stage >= 1) {
    MT_CHECK(!o.onebit, ErrorKind::kNotSupported, "1-bit optimizers run with ZeRO stage 0 only");
    return std::make_unique<ZeroSync>(store, units, modules, dp, o);
  }
  if (o.onebit && dp.size() > 1) return std::make_unique<OneBitSync>(store, units, modules, dp, o);
  if (dp.size() > 1) return std::make_unique<BucketedSync>(store, units, modules, dp, o);
  return std::make_unique<LocalSync>(store);
}

}  // namespace mt::parallel
