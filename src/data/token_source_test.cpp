// Tests of the run's data source (token_source.h): Megatron's blends, token for token through
// TokenSource::sample against tools/check_megatron_idx.py --blend (numpy's normalisation and
// shuffles, the blend told in the script's own words), weighted and by size, over data.split's
// shares too; the blending index by hand; numpy's float64 sum against numpy itself.
#include "data/token_source.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/file_io.h"
#include "base/scratch_dir.h"
#include "data/indexed_dataset.h"
#include "data/megatron_oracle_test_util.h"

namespace mt::data {
namespace {

using testing::have_numpy;
using testing::oracle;

// `docs` documents of 5 to 44 tokens, tokens from a rule seeded by `salt`.
void write_docs(const std::string& prefix, int docs, uint32_t salt) {
  IndexedDatasetWriter w(prefix, 5000);
  uint32_t x = salt;
  for (int d = 0; d < docs; ++d) {
    x = x * 1664525u + 1013904223u;
    std::vector<int32_t> seq(5 + (x >> 16) % 40);
    for (int32_t& t : seq) {
      x = x * 1103515245u + 12345u;
      t = static_cast<int32_t>((x >> 8) % 5000);
    }
    w.add_sequence(seq);
    w.end_document();
  }
  w.finalize();
}

TEST(MegatronBlend, TakesFromTheDatasetFurthestBehindItsWeight) {
  // Equal weights alternate: at k = 0 both are 0.5 behind (the first wins), at k = 1 the second
  // is 0.5 behind and the first 0.5 ahead, and so on.
  MegatronBlend even({0.5, 0.5}, 6);
  for (uint64_t k = 0; k < 6; ++k) {
    EXPECT_EQ(even.dataset(k), static_cast<int>(k % 2)) << k;
    EXPECT_EQ(even.sample(k), k / 2) << k;
  }
  // 1 : 3 over 8 samples: (k = 0) 0.25 vs 0.75 -> 1; (1) 0.25 vs -0.25 -> 0; (2) -0.5 vs 0.5 -> 1;
  // (3) -0.25 vs 0.25 -> 1; (4) 0 vs 0 -> 0; (5) 1.25 - 2 vs 3.75 - 3 -> 1; ...
  MegatronBlend quarter({0.25, 0.75}, 8);
  const std::vector<int> want{1, 0, 1, 1, 0, 1, 1, 1};
  int zeros = 0;
  for (uint64_t k = 0; k < 8; ++k) {
    EXPECT_EQ(quarter.dataset(k), want[k]) << k;
    zeros += quarter.dataset(k) == 0;
  }
  EXPECT_EQ(zeros, 2);
  EXPECT_EQ(megatron_blend_share(0.3, 10), 3u);
  EXPECT_EQ(megatron_blend_build(0.3, 1000), 302u);  // ceil(300 * 1.005) = ceil(301.5)
}

TEST(NumpySum, AddsAsNumpyAdds) {
  // Sequential below 8 elements: (0.1 + 0.2) + 0.3, not 0.1 + (0.2 + 0.3).
  EXPECT_EQ(numpy_sum({0.1, 0.2, 0.3}), 0.6000000000000001);
  if (!have_numpy()) GTEST_SKIP() << "no numpy for /usr/bin/python3";
  ScratchDir dir;
  nlohmann::json arrays = nlohmann::json::array();
  std::vector<std::vector<double>> mine;
  uint64_t x = 42;
  for (size_t n : {1, 2, 7, 8, 9, 15, 16, 17, 100, 127, 128, 129, 200, 256, 300, 1000, 5001}) {
    std::vector<double> a(n);
    for (double& v : a) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      v = static_cast<double>(x >> 11) / 9007199254740992.0 * (x % 3 == 0 ? 1e-3 : x % 3 == 1 ? 1.0 : 1e3);
    }
    arrays.push_back(a);
    mine.push_back(a);
  }
  std::ofstream(dir.path() + "/arrays.json") << arrays.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  const std::vector<double> want = oracle("--numpy-sums " + dir.path() + "/arrays.json", dir.path()).get<std::vector<double>>();
  ASSERT_EQ(want.size(), mine.size());
  for (size_t i = 0; i < mine.size(); ++i) EXPECT_EQ(numpy_sum(mine[i]), want[i]) << mine[i].size() << " values";
}

// The source's samples against the oracle's blend, token for token and position for position.
void expect_blend_matches(const std::vector<std::string>& items, const std::vector<TokenSourcePart>& parts, bool weighted,
                          int T, uint64_t N, uint32_t seed, const std::string& scratch) {
  TokenSourceOptions o;
  o.name = "data.train";
  o.seq_length = T;
  o.seed = seed;
  o.megatron_order = true;
  o.num_samples = N;
  o.blend = true;
  o.weighted = weighted;
  TokenSource source(parts, o);
  std::string args = "--blend " + std::to_string(T) + " " + std::to_string(N) + " " + std::to_string(seed);
  for (const std::string& item : items) args += " " + item;
  nlohmann::json want = oracle(args, scratch);
  EXPECT_EQ(source.size(), want["size"].get<uint64_t>()) << args;
  std::vector<int32_t> in(static_cast<size_t>(T)), tg(static_cast<size_t>(T));
  for (uint64_t k = 0; k < N; ++k) {
    const auto [part, local] = source.locate(k);
    ASSERT_EQ(part, want["dataset"][k].get<size_t>()) << args << ": sample " << k;
    ASSERT_EQ(local, want["dataset_sample"][k].get<uint64_t>()) << args << ": sample " << k;
    const std::vector<int32_t> tokens = want["samples"][k].get<std::vector<int32_t>>();
    source.sample(k, in.data(), tg.data());
    ASSERT_EQ(in, std::vector<int32_t>(tokens.begin(), tokens.end() - 1)) << args << ": sample " << k;
    ASSERT_EQ(tg, std::vector<int32_t>(tokens.begin() + 1, tokens.end())) << args << ": sample " << k;
    ASSERT_EQ(source.token_position(k, 5), want["positions"][k][5].get<uint64_t>()) << args << ": sample " << k;
  }
}

TEST(TokenSource, MegatronBlendsAreItsBlendedDatasets) {
  if (!have_numpy()) GTEST_SKIP() << "no numpy for /usr/bin/python3";
  ScratchDir dir;
  const std::string a = dir.path() + "/a", b = dir.path() + "/b", c = dir.path() + "/c";
  write_docs(a, 40, 1);
  write_docs(b, 15, 2);
  write_docs(c, 90, 3);
  // Weights 0.2 : 0.5 : 0.3 (written 2, 5, 3) over 300 samples of 16: the small dataset b runs
  // to several epochs, the others to one or two.
  expect_blend_matches({"2", a, "5", b, "3", c}, {{a, "", 2}, {b, "", 5}, {c, "", 3}}, true, 16, 300, 1234, dir.path());
  // Weights whose sum rounds (0.1 + 0.2 + 0.3 ...), and one dataset given a weight of its own.
  expect_blend_matches({"0.1", a, "0.2", b, "0.3", c}, {{a, "", 0.1}, {b, "", 0.2}, {c, "", 0.3}}, true, 8, 257, 7, dir.path());
  expect_blend_matches({"1", c}, {{c, "", 1}}, true, 16, 100, 99, dir.path());
  // Without weights: one epoch of each, by its samples; 100 of them asked for.
  expect_blend_matches({a, b, c}, {{a, "", 1}, {b, "", 1}, {c, "", 1}}, false, 16, 100, 1234, dir.path());
}

TEST(TokenSource, AnUnweightedBlendShorterThanTheRunIsRefused) {
  ScratchDir dir;
  write_docs(dir.path() + "/a", 10, 1);
  write_docs(dir.path() + "/b", 10, 2);
  TokenSourceOptions o;
  o.name = "data.train";
  o.seq_length = 16;
  o.num_samples = 100000;
  o.blend = true;
  o.weighted = false;
  try {
    TokenSource s({{dir.path() + "/a", "", 1}, {dir.path() + "/b", "", 1}}, o);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.train: a blend without weights is one epoch of each dataset"), std::string::npos)
        << e.what();
  }
  o.weighted = true;
  try {  // weights whose sum overflows (it said "sample 0 is past the blend's 0")
    TokenSource s({{dir.path() + "/a", "", 1e308}, {dir.path() + "/b", "", 1e308}}, o);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("they must add up to a finite number"), std::string::npos) << e.what();
  }
  TokenSource weighted({{dir.path() + "/a", "", 1}, {dir.path() + "/b", "", 3}}, o);  // meshtrain's order: any length
  EXPECT_EQ(weighted.size(), 100000u);
  std::vector<int32_t> in(16), tg(16);
  weighted.sample(99999, in.data(), tg.data());
  EXPECT_THROW(weighted.sample(100000, in.data(), tg.data()), Error);
}

}  // namespace
}  // namespace mt::data
