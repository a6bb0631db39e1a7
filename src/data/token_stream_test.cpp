// Tests of the training sample loader: in-order windows checked against windows computed by hand
// from the documents (wrap-around and document boundaries included), the shuffled order a
// permutation within every epoch that is reproducible per seed and differs between epochs, and
// sample_permutation pinned to the values of its written definition as computed by
// tools/check_megatron_idx.py --permutation (and cross-checked live when /usr/bin/python3 exists).
#include "data/token_stream.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/file_io.h"
#include "base/scratch_dir.h"
#include "data/data_test_util.h"
#include "data/indexed_dataset.h"

#ifndef MT_SOURCE_DIR
#define MT_SOURCE_DIR "."
#endif

namespace mt::data {
namespace {

// Writes documents of the given lengths, each two sequences (its halves), with token values from a
// fixed pseudo-random rule; returns the concatenated stream.
std::vector<int32_t> write_docs(const std::string& prefix, const std::vector<int>& doc_lengths, int64_t vocab = 50000) {
  return testing::write_lcg_documents(prefix, doc_lengths, vocab, 12345, true);
}

// The window of T + 1 tokens from stream position start, wrapping around.
void expected_window(const std::vector<int32_t>& stream, uint64_t start, int T,
                     std::vector<int32_t>* inputs, std::vector<int32_t>* targets) {
  inputs->clear();
  targets->clear();
  for (int j = 0; j <= T; ++j) {
    int32_t t = stream[(start + static_cast<uint64_t>(j)) % stream.size()];
    if (j < T) inputs->push_back(t);
    if (j > 0) targets->push_back(t);
  }
}

TEST(TokenStream, InOrderWindowsWrapAroundAndCrossDocuments) {
  ScratchDir dir;
  std::vector<int32_t> stream = write_docs(dir.path() + "/ds", {7, 3, 1, 9, 3});  // S = 23
  IndexedDataset ds(dir.path() + "/ds");
  ASSERT_EQ(ds.total_tokens(), 23u);
  const int T = 5;
  TokenStream ts(ds, T, /*shuffle=*/false, 0);
  EXPECT_EQ(ts.num_samples_per_epoch(), 4u);  // (23 - 1) / 5
  std::vector<int32_t> in(T), tg(T), want_in, want_tg;
  for (uint64_t k = 0; k < 40; ++k) {
    uint64_t start = (k * T) % 23;
    EXPECT_EQ(ts.window_start(k), start);
    ts.sample(k, in.data(), tg.data());
    expected_window(stream, start, T, &want_in, &want_tg);
    EXPECT_EQ(in, want_in) << "sample " << k;
    EXPECT_EQ(tg, want_tg) << "sample " << k;
  }
  // Sample 4 is [20, 26): stream tokens 20, 21, 22, then 0, 1, 2 again.
  ts.sample(4, in.data(), tg.data());
  EXPECT_EQ(in, (std::vector<int32_t>{stream[20], stream[21], stream[22], stream[0], stream[1]}));
  EXPECT_EQ(tg.back(), stream[2]);
}

TEST(TokenStream, StreamShorterThanWindowWrapsRepeatedly) {
  ScratchDir dir;
  std::vector<int32_t> stream = write_docs(dir.path() + "/ds", {3});
  IndexedDataset ds(dir.path() + "/ds");
  const int T = 8;
  for (bool shuffle : {false, true}) {
    TokenStream ts(ds, T, shuffle, 1);
    EXPECT_EQ(ts.num_samples_per_epoch(), 1u);
    std::vector<int32_t> in(T), tg(T), want_in, want_tg;
    for (uint64_t k = 0; k < 4; ++k) {
      ts.sample(k, in.data(), tg.data());
      expected_window(stream, shuffle ? 0 : (k * T) % 3, T, &want_in, &want_tg);
      EXPECT_EQ(in, want_in);
      EXPECT_EQ(tg, want_tg);
    }
  }
}

TEST(TokenStream, BatchRowsAreConsecutiveSamples) {
  ScratchDir dir;
  write_docs(dir.path() + "/ds", {50, 17, 33});
  IndexedDataset ds(dir.path() + "/ds");
  const int B = 3, T = 16;
  for (bool shuffle : {false, true}) {
    TokenStream ts(ds, T, shuffle, 9);
    std::vector<int32_t> in(B * T), tg(B * T), row_in(T), row_tg(T);
    ts.batch(5, B, in.data(), tg.data());  // crosses the epoch boundary (n = 6) when shuffled
    for (int b = 0; b < B; ++b) {
      ts.sample(5 + b, row_in.data(), row_tg.data());
      EXPECT_TRUE(std::equal(row_in.begin(), row_in.end(), in.begin() + b * T));
      EXPECT_TRUE(std::equal(row_tg.begin(), row_tg.end(), tg.begin() + b * T));
    }
  }
}

TEST(TokenStream, ShuffleIsAPermutationPerEpochAndReproducible) {
  ScratchDir dir;
  std::vector<int32_t> stream = write_docs(dir.path() + "/ds", {400, 1, 250, 350});  // S = 1001
  IndexedDataset ds(dir.path() + "/ds");
  const int T = 10;
  TokenStream a(ds, T, /*shuffle=*/true, 42);
  TokenStream b(ds, T, /*shuffle=*/true, 42);
  TokenStream c(ds, T, /*shuffle=*/true, 43);
  const uint64_t n = a.num_samples_per_epoch();
  ASSERT_EQ(n, 100u);
  std::vector<std::vector<uint64_t>> orders;
  std::vector<int32_t> in(T), tg(T), want_in, want_tg;
  for (uint64_t e = 0; e < 3; ++e) {
    std::vector<uint64_t> order, order_c;
    for (uint64_t k = e * n; k < (e + 1) * n; ++k) {
      uint64_t start = a.window_start(k);
      ASSERT_EQ(start % T, 0u);
      order.push_back(start / T);
      order_c.push_back(c.window_start(k) / T);
      EXPECT_EQ(b.window_start(k), start);
      a.sample(k, in.data(), tg.data());
      expected_window(stream, start, T, &want_in, &want_tg);
      ASSERT_LE(start + T + 1, stream.size());  // a shuffled window never wraps
      EXPECT_EQ(in, want_in);
      EXPECT_EQ(tg, want_tg);
    }
    std::vector<uint64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(sorted[i], i) << "epoch " << e;
    EXPECT_NE(order, order_c) << "seeds 42 and 43 gave the same order in epoch " << e;
    orders.push_back(order);
  }
  EXPECT_NE(orders[0], orders[1]);
  EXPECT_NE(orders[1], orders[2]);
  // Random access: going back to epoch 0 reproduces it.
  for (uint64_t k = 0; k < n; ++k) EXPECT_EQ(a.window_start(k) / T, orders[0][k]);
}

TEST(SamplePermutation, SplitMix64MatchesReference) {
  // Vigna's splitmix64.c seeded with 1234567.
  uint64_t state = 1234567;
  EXPECT_EQ(splitmix64_next(&state), 6457827717110365317ull);
  EXPECT_EQ(splitmix64_next(&state), 3203168211198807973ull);
  EXPECT_EQ(splitmix64_next(&state), 9817491932198370423ull);
}

TEST(SamplePermutation, PinnedValues) {
  // tools/check_megatron_idx.py --permutation 10 42 0 (and ... 10 42 1, ... 10 7 0).
  EXPECT_EQ(sample_permutation(10, 42, 0), (std::vector<uint64_t>{2, 8, 9, 7, 1, 4, 6, 0, 5, 3}));
  EXPECT_EQ(sample_permutation(10, 42, 1), (std::vector<uint64_t>{3, 1, 6, 8, 4, 5, 9, 7, 2, 0}));
  EXPECT_EQ(sample_permutation(10, 7, 0), (std::vector<uint64_t>{0, 9, 5, 2, 7, 4, 8, 6, 1, 3}));
  EXPECT_TRUE(sample_permutation(0, 1, 0).empty());
  EXPECT_EQ(sample_permutation(1, 1, 5), (std::vector<uint64_t>{0}));
}

TEST(SamplePermutation, MatchesPythonDefinition) {
  if (!file_exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  ScratchDir dir;
  std::string out = dir.path() + "/perm.json";
  std::string cmd = std::string("/usr/bin/python3 ") + MT_SOURCE_DIR +
                    "/tools/check_megatron_idx.py --permutation 1000 123456789 17 > " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<char> text = file_read_all(out);
  auto want =
      nlohmann::json::parse(std::string(text.begin(), text.end())).get<std::vector<uint64_t>>();
  EXPECT_EQ(sample_permutation(1000, 123456789, 17), want);
}

TEST(TokenStream, RefusesBadArguments) {
  ScratchDir dir;
  write_docs(dir.path() + "/ds", {4});
  IndexedDataset ds(dir.path() + "/ds");
  try {
    TokenStream ts(ds, 0, false, 0);
    FAIL() << "T = 0 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  }
  IndexedDatasetWriter w(dir.path() + "/empty", 10);
  w.finalize();
  IndexedDataset empty(dir.path() + "/empty");
  EXPECT_EQ(empty.num_sequences(), 0u);
  EXPECT_EQ(empty.num_documents(), 0u);
  EXPECT_THROW(TokenStream(empty, 4, false, 0), Error);
}

}  // namespace
}  // namespace mt::data

namespace mt::data {
namespace {

// The loss mask: target i of a sample is -100 exactly where the mask value at its stream position
// (window start + 1 + i, wrapping) is 0, checked against positions computed by hand.
TEST(TokenStreamMask, MaskedTargetsAreIgnoredIncludingAcrossTheWrap) {
  ScratchDir dir;
  std::vector<int32_t> stream = write_docs(dir.path() + "/t", {7, 5});  // S = 12
  std::vector<int32_t> mask_values;
  {
    IndexedDatasetWriter w(dir.path() + "/t.mask", 2);
    for (int d : {7, 5}) {
      std::vector<int32_t> m;
      for (int k = 0; k < d; ++k) m.push_back(static_cast<int32_t>(mask_values.size() % 3 != 0));
      mask_values.insert(mask_values.end(), m.begin(), m.end());
      w.add_sequence(m);
      w.end_document();
    }
    w.finalize();
  }
  IndexedDataset ds(dir.path() + "/t"), mask(dir.path() + "/t.mask");
  const int T = 5;
  TokenStream ts(ds, T, false, 1);
  ts.set_loss_mask(&mask);
  std::vector<int32_t> in(T), tg(T);
  for (uint64_t k = 0; k < 6; ++k) {  // windows start at 0, 5, 10 (wraps), 3, 8 (wraps), 1
    ts.sample(k, in.data(), tg.data());
    uint64_t start = (k * T) % 12;
    for (int i = 0; i < T; ++i) {
      uint64_t p = (start + 1 + static_cast<uint64_t>(i)) % 12;
      EXPECT_EQ(tg[i], mask_values[p] ? stream[p] : -100) << "sample " << k << " target " << i;
      EXPECT_EQ(in[i], stream[(start + static_cast<uint64_t>(i)) % 12]);
    }
  }
  // A mask of another length is refused, naming it.
  write_docs(dir.path() + "/short", {4});
  IndexedDataset shorter(dir.path() + "/short");
  try {
    ts.set_loss_mask(&shorter);
    FAIL() << "a mask of another length was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("short"), std::string::npos) << e.what();
  }
}

// A mask that is 0 over every token the stream reads trains nothing: refused when set (it trained
// at loss 0 and exited 0). One trained token anywhere in the stream's share, the last one included,
// is enough; a split whose share is all 0 is refused though the whole mask is not.
TEST(TokenStreamMask, AMaskThatTrainsNothingIsRefused) {
  ScratchDir dir;
  write_docs(dir.path() + "/t", {7, 5});  // S = 12: documents [0, 7) and [7, 12), two sequences each
  auto write_mask = [&](const std::string& name, int one_at) {
    IndexedDatasetWriter w(dir.path() + "/" + name, 2);
    int at = 0;
    for (int d : {7, 5}) {
      std::vector<int32_t> m;
      for (int k = 0; k < d; ++k, ++at) m.push_back(at == one_at ? 1 : 0);
      w.add_sequence(m);
      w.end_document();
    }
    w.finalize();
  };
  write_mask("zeros", -1);
  write_mask("last", 11);
  IndexedDataset ds(dir.path() + "/t"), zeros(dir.path() + "/zeros"), last(dir.path() + "/last");
  TokenStream ts(ds, 4, false, 1);
  try {
    ts.set_loss_mask(&zeros);
    FAIL() << "an all-zero mask was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("zeros: the loss mask is 0 on all 12 tokens of"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nothing would be trained"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(ts.set_loss_mask(&last));
  TokenStream first_only(ds, 4, false, 1, 0, 2);  // document 0 alone: mask "last" is 0 there
  try {
    first_only.set_loss_mask(&last);
    FAIL() << "a split whose share of the mask is all 0 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("0 on all 7 tokens of the split's share of"), std::string::npos) << e.what();
  }
  TokenStream second_only(ds, 4, false, 1, 2, 4);
  EXPECT_NO_THROW(second_only.set_loss_mask(&last));
}

// A mask value other than 0 and 1 (2, -1) trained as 1 without a word (stop 73).
TEST(TokenStreamMask, AValueOtherThanZeroOrOneIsRefused) {
  ScratchDir dir;
  write_docs(dir.path() + "/t", {7, 5});
  {
    IndexedDatasetWriter w(dir.path() + "/two", 3);
    for (int d : {7, 5}) {
      w.add_sequence(std::vector<int32_t>(static_cast<size_t>(d), 2));
      w.end_document();
    }
    w.finalize();
  }
  IndexedDataset ds(dir.path() + "/t"), two(dir.path() + "/two");
  TokenStream ts(ds, 4, false, 1);
  ts.set_loss_mask(&two);
  std::vector<int32_t> in(4), tg(4);
  try {
    ts.sample(0, in.data(), tg.data());
    FAIL() << "a mask value of 2 was read as trained";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("two: loss mask value 2 in sample 0 is not 0 or 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mt::data
