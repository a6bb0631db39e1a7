#include "parallel/grad_sync.h"

#include <algorithm>

#include "parallel/dp/grad_buckets.h"

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
      : LocalSync(store), buckets_(store.grad(), store.numel(), o.bucket_elems, dp, o.overlap_comm, o.timeout) {
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

 private:
  ZeroRuntime rt_;
};

}  // namespace

std::unique_ptr<GradSync> make_grad_sync(nn::ParamStore& store, const std::vector<Unit>& units,
                                         const std::vector<std::vector<nn::Module*>>& modules, comm::Backend& dp,
                                         const GradSyncOptions& o) {
  if (o.stage >= 1) return std::make_unique<ZeroSync>(store, units, modules, dp, o);
  if (dp.size() > 1) return std::make_unique<BucketedSync>(store, units, modules, dp, o);
  return std::make_unique<LocalSync>(store);
}

}  // namespace mt::parallel
