// Tests of Megatron-LM's GPT sample order (megatron_order.h) through the loader training reads
// (TokenStream::set_megatron_order): the shuffles are numpy's own (RandomState.shuffle, run live),
// and every sample's tokens and stream positions are those tools/check_megatron_idx.py
// --gpt-dataset derives from numpy's draws another way (the shuffled documents' tokens laid end to
// end, cut every T tokens), over one epoch, several, and a last epoch shuffled apart. The epoch
// counts and the separate-final-epoch rule are checked by hand on a small dataset.
#include "data/megatron_order.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/file_io.h"
#include "base/scratch_dir.h"
#include "data/data_test_util.h"
#include "data/indexed_dataset.h"
#include "data/megatron_oracle_test_util.h"
#include "data/token_stream.h"

namespace mt::data {
namespace {

// One document (one sequence) per length, a length of 0 an empty one; returns the tokens end to end.
std::vector<int32_t> write_sequences(const std::string& prefix, const std::vector<int>& lengths, int64_t vocab = 1000) {
  return testing::write_lcg_documents(prefix, lengths, vocab, 777, false);
}

using testing::have_numpy;
using testing::oracle;

TEST(NumpyLegacyRandom, ShufflesAsNumpysRandomState) {
  // numpy.random.RandomState(1234).shuffle(numpy.arange(10)), and seed 2^32 - 1.
  std::vector<int> v(10);
  for (int i = 0; i < 10; ++i) v[static_cast<size_t>(i)] = i;
  std::vector<int> a = v, b = v;
  NumpyLegacyRandom(1234).shuffle(a);
  NumpyLegacyRandom(4294967295u).shuffle(b);
  EXPECT_EQ(a, (std::vector<int>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}));
  EXPECT_EQ(b, (std::vector<int>{6, 9, 5, 1, 8, 0, 7, 4, 2, 3}));
  if (!have_numpy()) GTEST_SKIP() << "no numpy for /usr/bin/python3";
  ScratchDir dir;
  for (const auto& [n, seed] : std::vector<std::pair<uint64_t, uint32_t>>{{1000, 0}, {1025, 1234}, {65536, 4294967295u}, {1, 5}}) {
    std::vector<uint64_t> mine(n);
    for (uint64_t i = 0; i < n; ++i) mine[i] = i;
    NumpyLegacyRandom(seed).shuffle(mine);
    EXPECT_EQ(mine, oracle("--numpy-shuffle " + std::to_string(n) + " " + std::to_string(seed), dir.path()).get<std::vector<uint64_t>>())
        << n << " elements, seed " << seed;
  }
}

// Sequences of 5, 3, 0, 7 and 4 tokens (S = 19), T = 4: one epoch holds (19 - 1) / 4 = 4 samples.
TEST(MegatronOrder, EpochsAndTheSeparateFinalEpochFollowGptDatasetsRule) {
  const std::vector<int32_t> lengths{5, 3, 0, 7, 4};
  // 3 samples need 3 * 4 + 1 = 13 tokens: one epoch, its 4 samples built.
  MegatronOrder one(lengths, 4, 3, 1234);
  EXPECT_EQ(one.num_epochs(), 1);
  EXPECT_FALSE(one.separate_final_epoch());
  EXPECT_EQ(one.size(), 4u);
  EXPECT_EQ(one.document_index().size(), 5u);
  // 5 samples need 21 tokens: two epochs; the second contributes 5 - 4 = 1 sample, below
  // int(0.8 * 4) = 3, so it is shuffled apart: (2 * 19 - 1) / 4 = 9 built, the first 4 a
  // permutation of 0..3 and the rest of 4..8.
  MegatronOrder apart(lengths, 4, 5, 1234);
  EXPECT_EQ(apart.num_epochs(), 2);
  EXPECT_TRUE(apart.separate_final_epoch());
  ASSERT_EQ(apart.size(), 9u);
  for (uint64_t k = 0; k < 9; ++k) EXPECT_EQ(apart.sample_of(k) < 4, k < 4) << k;
  // Each half of the document index holds every sequence once.
  for (size_t half = 0; half < 2; ++half) {
    std::vector<int32_t> part(apart.document_index().begin() + static_cast<long>(5 * half),
                              apart.document_index().begin() + static_cast<long>(5 * half + 5));
    std::sort(part.begin(), part.end());
    EXPECT_EQ(part, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  }
  // 8 samples: two epochs, the second giving 4 >= 3, shuffled together.
  MegatronOrder together(lengths, 4, 8, 1234);
  EXPECT_EQ(together.num_epochs(), 2);
  EXPECT_FALSE(together.separate_final_epoch());
  EXPECT_EQ(together.size(), 9u);
  // Every sample is T + 1 tokens, and sample s + 1 starts at sample s's last token.
  for (uint64_t k = 0; k < together.size(); ++k) {
    int64_t total = 0;
    for (const MegatronPiece& p : together.pieces(k)) total += p.length;
    EXPECT_EQ(total, 5) << k;
  }
  const std::vector<int32_t>& si = together.sample_index();
  ASSERT_EQ(si.size(), 2 * 10u);
  EXPECT_EQ(si[0], 0);
  EXPECT_EQ(si[1], 0);
  EXPECT_THROW(together.pieces(9), Error);
  EXPECT_THROW(MegatronOrder(std::vector<int32_t>{1}, 4, 1, 0), Error);  // one token
}

// The loader's samples, token for token and position for position, against the oracle.
void expect_stream_matches_oracle(const std::string& prefix, int T, uint64_t N, uint32_t seed, const std::string& scratch,
                                  int want_epochs, int want_apart, uint64_t first = 0, uint64_t end = UINT64_MAX) {
  IndexedDataset ds(prefix);
  TokenStream stream(ds, T, true, seed, first, end);
  stream.set_megatron_order(N);
  const std::string range = end == UINT64_MAX ? "" : " " + std::to_string(first) + " " + std::to_string(end);
  nlohmann::json want = oracle("--gpt-dataset " + prefix + " " + std::to_string(T) + " " + std::to_string(N) + " " +
                                   std::to_string(seed) + range,
                               scratch);
  const std::string what = "T " + std::to_string(T) + ", " + std::to_string(N) + " samples, seed " + std::to_string(seed);
  EXPECT_EQ(stream.megatron_order()->num_epochs(), want["num_epochs"].get<int>()) << what;
  EXPECT_EQ(stream.megatron_order()->separate_final_epoch(), want["separate_final_epoch"].get<bool>()) << what;
  EXPECT_EQ(stream.megatron_order()->size(), want["num_built"].get<uint64_t>()) << what;
  if (want_epochs > 0) {
    EXPECT_EQ(want["num_epochs"].get<int>(), want_epochs) << what;
  }
  if (want_apart >= 0) {
    EXPECT_EQ(want["separate_final_epoch"].get<bool>(), want_apart == 1) << what;
  }
  ASSERT_EQ(want["samples"].size(), N);
  std::vector<int32_t> in(static_cast<size_t>(T)), tg(static_cast<size_t>(T));
  for (uint64_t k = 0; k < N; ++k) {
    std::vector<int32_t> tokens = want["samples"][k].get<std::vector<int32_t>>();
    std::vector<uint64_t> positions = want["positions"][k].get<std::vector<uint64_t>>();
    stream.sample(k, in.data(), tg.data());
    ASSERT_EQ(in, std::vector<int32_t>(tokens.begin(), tokens.end() - 1)) << what << ", sample " << k;
    ASSERT_EQ(tg, std::vector<int32_t>(tokens.begin() + 1, tokens.end())) << what << ", sample " << k;
    for (uint64_t j = 0; j <= static_cast<uint64_t>(T); ++j)
      ASSERT_EQ(stream.token_position(k, j), positions[j]) << what << ", sample " << k << " token " << j;
  }
}

TEST(MegatronOrder, SamplesAreGptDatasetsOverOneAndSeveralEpochs) {
  if (!have_numpy()) GTEST_SKIP() << "no numpy for /usr/bin/python3";
  ScratchDir dir;
  // 120 documents of 0 to 60 tokens, some empty.
  std::vector<int> lengths;
  uint32_t x = 99;
  for (int d = 0; d < 120; ++d) {
    x = x * 1664525u + 1013904223u;
    lengths.push_back(static_cast<int>((x >> 16) % 61));
  }
  int S = 0;
  for (int n : lengths) S += n;
  const std::string prefix = dir.path() + "/docs";
  write_sequences(prefix, lengths);
  const int T = 16;
  const uint64_t per_epoch = static_cast<uint64_t>(S - 1) / T;
  // One epoch; just past one (the second shuffled apart); most of a second (shuffled together);
  // four and a bit; other seeds, a T longer than most documents.
  expect_stream_matches_oracle(prefix, T, per_epoch / 2, 1234, dir.path(), 1, 0);
  expect_stream_matches_oracle(prefix, T, per_epoch + 3, 1234, dir.path(), 2, 1);
  expect_stream_matches_oracle(prefix, T, 2 * per_epoch - 5, 1234, dir.path(), 2, 0);
  expect_stream_matches_oracle(prefix, T, 4 * per_epoch + 7, 0, dir.path(), 5, 1);
  expect_stream_matches_oracle(prefix, 100, 10, 4294967295u, dir.path(), -1, -1);
  // A split's sequences 30..99: their own epochs, sequence ids and stream positions.
  expect_stream_matches_oracle(prefix, T, per_epoch, 1234, dir.path(), 2, -1, 30, 100);
}

// Megatron's --split over n sequences, against the oracle's reading of the same text (numpy's
// normalisation, Python's round half to even), and by hand.
TEST(MegatronSplit, CutsTheSequencesAsMegatronsBuilder) {
  const std::vector<double> w = megatron_split_parse("969, 30, 1");
  EXPECT_EQ(w, (std::vector<double>{969, 30, 1}));
  EXPECT_EQ(megatron_split_parse("99,1"), (std::vector<double>{99, 1, 0}));
  // Megatron's pattern drops a minus ("2,-1" read as "2,1"): refused here (stop 73).
  for (const char* negative : {"2,-1", "-1,2,3", "2;-.5"}) {
    try {
      megatron_split_parse(negative);
      ADD_FAILURE() << negative << " was read";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("a weight is negative"), std::string::npos) << e.what();
    }
  }
  auto r = megatron_split_sequences(w, 1000, 1);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->first, 969u);
  EXPECT_EQ(r->end, 999u);
  EXPECT_FALSE(megatron_split_sequences(megatron_split_parse("100,0,0"), 7, 1));
  // 1/4 of 2 sequences is 0.5, which Python rounds to 0.
  r = megatron_split_sequences(megatron_split_parse("1,3"), 2, 1);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->first, 0u);
  EXPECT_EQ(r->end, 2u);
  for (const char* bad : {"", "1,2,3,4", "0,0", "1.2.3,1"}) EXPECT_THROW(megatron_split_parse(bad), Error) << bad;
  if (!have_numpy()) GTEST_SKIP() << "no numpy for /usr/bin/python3";
  ScratchDir dir;
  const std::vector<uint64_t> sizes{1, 2, 3, 10, 21, 1000, 123457};
  for (const std::string text : {"969,30,1", "99,1", "1,3", "0.5,0.25,0.25", "1,1,1", "949,50,1", "7,0,3"}) {
    const nlohmann::json all = oracle("--split '" + text + "' 1,2,3,10,21,1000,123457", dir.path());
    for (size_t s = 0; s < sizes.size(); ++s) {
      const uint64_t n = sizes[s];
      const nlohmann::json& want = all[s];
      for (int i = 0; i < 3; ++i) {
        auto got = megatron_split_sequences(megatron_split_parse(text), n, i);
        if (want[static_cast<size_t>(i)].is_null()) {
          EXPECT_FALSE(got) << text << " over " << n << ", split " << i;
        } else {
          ASSERT_TRUE(got) << text << " over " << n << ", split " << i;
          EXPECT_EQ(got->first, want[static_cast<size_t>(i)][0].get<uint64_t>()) << text << " over " << n << ", split " << i;
          EXPECT_EQ(got->end, want[static_cast<size_t>(i)][1].get<uint64_t>()) << text << " over " << n << ", split " << i;
        }
      }
    }
  }
}

// meshtrain's own order over a range of sequences: windows of that range's tokens only, at
// multiples of T from its first token, wrapping within it; positions are the dataset's.
TEST(TokenStream, ARangeOfSequencesIsAStreamOfItsOwn) {
  ScratchDir dir;
  const std::vector<int> lengths{9, 4, 13, 0, 6, 11, 7};
  const std::vector<int32_t> all = write_sequences(dir.path() + "/r", lengths);
  IndexedDataset ds(dir.path() + "/r");
  const uint64_t base = 9 + 4, S = 13 + 0 + 6 + 11;  // sequences 2..5
  const std::vector<int32_t> part(all.begin() + static_cast<long>(base), all.begin() + static_cast<long>(base + S));
  const int T = 7;
  for (bool shuffle : {false, true}) {
    TokenStream stream(ds, T, shuffle, 11, 2, 6);
    EXPECT_EQ(stream.num_tokens(), S);
    EXPECT_EQ(stream.num_samples_per_epoch(), (S - 1) / T);
    std::vector<int32_t> in(T), tg(T);
    for (uint64_t k = 0; k < 12; ++k) {
      const uint64_t start = stream.window_start(k);
      if (shuffle) {
        EXPECT_EQ(start % T, 0u);
      }
      stream.sample(k, in.data(), tg.data());
      for (uint64_t j = 0; j < static_cast<uint64_t>(T); ++j) {
        EXPECT_EQ(in[j], part[(start + j) % S]) << k << " " << j;
        EXPECT_EQ(tg[j], part[(start + j + 1) % S]) << k << " " << j;
      }
      EXPECT_EQ(stream.token_position(k, 3), base + (start + 3) % S);
    }
  }
  EXPECT_THROW(TokenStream(ds, T, false, 0, 3, 4), Error);  // sequence 3 is empty
  EXPECT_THROW(TokenStream(ds, T, false, 0, 5, 4), Error);
}

// SFT's loss mask in Megatron's order: target i is ignored where the mask at the sample's token
// i + 1 (its stream position, from the oracle) is 0.
TEST(MegatronOrder, TheLossMaskFollowsEachTokenToItsPlace) {
  if (!have_numpy()) GTEST_SKIP() << "no numpy for /usr/bin/python3";
  ScratchDir dir;
  const std::vector<int> lengths{9, 4, 13, 0, 6, 11, 7};
  const std::string prefix = dir.path() + "/t";
  write_sequences(prefix, lengths);
  std::vector<int32_t> mask_of;  // by stream position
  {
    IndexedDatasetWriter w(prefix + ".mask", 2);
    for (int n : lengths) {
      std::vector<int32_t> m;
      for (int k = 0; k < n; ++k) m.push_back(static_cast<int32_t>((mask_of.size() + m.size()) % 3 != 1));
      mask_of.insert(mask_of.end(), m.begin(), m.end());
      w.add_sequence(m);
      w.end_document();
    }
    w.finalize();
  }
  IndexedDataset ds(prefix), mask(prefix + ".mask");
  const int T = 5;
  const uint64_t N = 20;  // two epochs of (50 - 1) / 5 = 9 samples, and a third
  TokenStream stream(ds, T, true, 7);
  stream.set_loss_mask(&mask);
  stream.set_megatron_order(N);
  nlohmann::json want = oracle("--gpt-dataset " + prefix + " 5 20 7", dir.path());
  std::vector<int32_t> in(T), tg(T);
  int ignored = 0;
  for (uint64_t k = 0; k < N; ++k) {
    std::vector<int32_t> tokens = want["samples"][k].get<std::vector<int32_t>>();
    std::vector<uint64_t> positions = want["positions"][k].get<std::vector<uint64_t>>();
    stream.sample(k, in.data(), tg.data());
    for (int i = 0; i < T; ++i) {
      const bool masked = mask_of[positions[static_cast<size_t>(i) + 1]] == 0;
      EXPECT_EQ(tg[static_cast<size_t>(i)], masked ? -100 : tokens[static_cast<size_t>(i) + 1]) << "sample " << k << " target " << i;
      ignored += masked;
    }
  }
  EXPECT_GT(ignored, 0);
}

TEST(MegatronOrder, RefusesSeedsNumpyRefusesAndSamplesNotBuilt) {
  ScratchDir dir;
  write_sequences(dir.path() + "/d", {30, 30});
  IndexedDataset ds(dir.path() + "/d");
  TokenStream big_seed(ds, 8, true, 1ull << 32);
  EXPECT_THROW(big_seed.set_megatron_order(4), Error);
  TokenStream stream(ds, 8, true, 3);
  stream.set_megatron_order(4);  // one epoch: (60 - 1) / 8 = 7 built
  std::vector<int32_t> in(8), tg(8);
  stream.sample(6, in.data(), tg.data());
  EXPECT_THROW(stream.sample(7, in.data(), tg.data()), Error);
  EXPECT_THROW(stream.window_start(0), Error);  // a sample is pieces, not one window
  // A run of 1e15 samples is refused at once: its indices would not fit this machine (the epochs
  // were counted one by one before, for hours, ignoring signals), and the order itself refuses
  // more epochs than Megatron's int32 document index holds.
  TokenStream huge(ds, 8, true, 3);
  try {
    huge.set_megatron_order(1'000'000'000'000'000ull);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("GiB of indices, more than half of this machine's"), std::string::npos) << e.what();
  }
  EXPECT_THROW(MegatronOrder(std::vector<int32_t>{30, 30}, 8, 1'000'000'000'000'000ull, 0), Error);
}

}  // namespace
}  // namespace mt::data
