// Tensor-parallel split rules without communication: every rank's shard of every parameter equals
// the slice of the one-process parameter (initialised from the same seed), c_attn's q|k|v are split
// three ways and interleaved per rank, the vocabulary is padded with zero rows that never reach
// the one-process layout, and the shards put back together give the whole parameter.
#include <gtest/gtest.h>

#include <vector>

#include "base/error.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/param_store.h"

namespace mt::nn {
namespace {

constexpr int C = 8, I = 16, V = 13, Vp = 16;  // Vp: V padded to a multiple of 4 (2 x tp 2, or 4 x 1)

class Layer : public Module {
 public:
  explicit Layer(TpPlace place) : Module("") {
    int padded = place.size == 1 ? V : (V + 4 - 1) / 4 * 4;
    wte = add_module(std::make_unique<Embedding>("wte", V, C, true, 0.5f, place, padded));
    c_attn = add_module(std::make_unique<Linear>("c_attn", C, 3 * C, true, WeightLayout::kInOut, 0.5f, TpKind::kColumn, place, 3));
    c_proj = add_module(std::make_unique<Linear>("c_proj", C, C, true, WeightLayout::kInOut, 0.5f, TpKind::kRow, place));
    q = add_module(std::make_unique<Linear>("q_proj", C, I, false, WeightLayout::kOutIn, 0.5f, TpKind::kColumn, place));
    o = add_module(std::make_unique<Linear>("o_proj", I, C, false, WeightLayout::kOutIn, 0.5f, TpKind::kRow, place));
    finalize_names();
    store = std::make_unique<ParamStore>(*this, DType::kF32);
    store->init(11);
    // Non-zero biases, so the bias splits are seen too: the same function of the global index.
    for (Parameter* p : store->parameters())
      if (p->name.ends_with("bias"))
        tp_for_each_run(p->global_shape, p->split, p->place, [&](int64_t lo, int64_t go, int64_t len) {
          for (int64_t k = 0; k < len; ++k) p->master[lo + k] = 0.25f * static_cast<float>(go + k + 1);
        });
  }
  Embedding* wte;
  Linear *c_attn, *c_proj, *q, *o;
  std::unique_ptr<ParamStore> store;
};

TEST(TpSplit, EachShardIsTheSliceOfTheWholeParameter) {
  Layer whole({0, 1});
  for (int tp : {2, 4}) {
    std::vector<std::vector<float>> rebuilt;
    for (Parameter* p : whole.store->parameters()) rebuilt.emplace_back(static_cast<size_t>(p->numel()), -1.0f);
    for (int r = 0; r < tp; ++r) {
      Layer shard({r, tp});
      const auto& ps = shard.store->parameters();
      ASSERT_EQ(ps.size(), whole.store->parameters().size());
      for (size_t i = 0; i < ps.size(); ++i) {
        Parameter* full = whole.store->parameters()[i];
        ASSERT_EQ(ps[i]->name, full->name);
        EXPECT_EQ(ps[i]->unpadded_shape(), full->shape) << full->name;
        std::vector<float> want(static_cast<size_t>(ps[i]->numel()));
        tp_extract(want.data(), full->master, ps[i]->global_shape, ps[i]->split, ps[i]->place);
        for (size_t k = 0; k < want.size(); ++k) ASSERT_EQ(ps[i]->master[k], want[k]) << full->name << " tp " << tp << " rank " << r << " element " << k;
        tp_insert(rebuilt[i].data(), ps[i]->master, ps[i]->global_shape, ps[i]->split, ps[i]->place);
      }
      // Local widths: c_attn (C, 3C/tp), c_proj (C/tp, C) [Conv1D (in, out)], q (I/tp, C), o (C, I/tp).
      EXPECT_EQ(shard.c_attn->weight()->shape, (Shape{C, 3 * C / tp}));
      EXPECT_EQ(shard.c_proj->weight()->shape, (Shape{C / tp, C}));
      EXPECT_EQ(shard.c_proj->bias()->shape, (Shape{C}));  // replicated, added once after the reduce
      EXPECT_TRUE(shard.c_proj->bias_deferred());
      EXPECT_EQ(shard.q->weight()->shape, (Shape{I / tp, C}));
      EXPECT_EQ(shard.o->weight()->shape, (Shape{C, I / tp}));
      EXPECT_EQ(shard.o->in(), I / tp);
      EXPECT_EQ(shard.q->out(), I / tp);
    }
    for (size_t i = 0; i < rebuilt.size(); ++i) {
      Parameter* full = whole.store->parameters()[i];
      for (size_t k = 0; k < rebuilt[i].size(); ++k) ASSERT_EQ(rebuilt[i][k], full->master[k]) << full->name << " tp " << tp;
    }
  }
}

TEST(TpSplit, FusedQkvIsSplitThreeWaysAndInterleaved) {
  Layer whole({0, 1});
  const float* W = whole.c_attn->weight()->master;  // (C, 3C): columns q | k | v
  for (int r = 0; r < 2; ++r) {
    Layer shard({r, 2});
    const float* w = shard.c_attn->weight()->master;  // (C, 3C/2): q_r | k_r | v_r
    const int h = C / 2;
    for (int i = 0; i < C; ++i)
      for (int part = 0; part < 3; ++part)
        for (int j = 0; j < h; ++j)
          ASSERT_EQ(w[i * 3 * h + part * h + j], W[i * 3 * C + part * C + r * h + j]) << "row " << i << " part " << part;
    const float* b = shard.c_attn->bias()->master;
    for (int part = 0; part < 3; ++part)
      for (int j = 0; j < h; ++j) EXPECT_EQ(b[part * h + j], 0.25f * static_cast<float>(part * C + r * h + j + 1));
  }
}

TEST(TpSplit, VocabularyIsPaddedWithZeroRowsOutsideTheOneProcessLayout) {
  // tp 4, V 13 -> 16 rows (4 per rank); rank 3 holds rows 12..15 of which only 12 is a word.
  Layer last({3, 4});
  Parameter* w = last.wte->weight();
  EXPECT_EQ(w->global_shape, (Shape{Vp, C}));
  EXPECT_EQ(w->unpadded_shape(), (Shape{V, C}));
  EXPECT_EQ(w->shape, (Shape{4, C}));
  EXPECT_EQ(last.wte->first_row(), 12);
  for (int k = C; k < 4 * C; ++k) EXPECT_EQ(w->master[k], 0.0f) << "padding element " << k;
  EXPECT_NE(w->master[0], 0.0f);
  EXPECT_EQ(last.store->global_numel(), Layer({0, 1}).store->numel());  // checkpoints: no padding
  EXPECT_THROW(Linear("bad", C, 3 * 5, false, WeightLayout::kOutIn, 0.1f, TpKind::kColumn, {0, 2}, 3), Error);
}

}  // namespace
}  // namespace mt::nn
