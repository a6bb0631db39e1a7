// What a causal-LM run samples from: one indexed dataset, or a blend of several as Megatron-LM
// blends them (BlendedMegatronDatasetBuilder and BlendedDataset), each part a TokenStream of its
// own in meshtrain's or Megatron's order, optionally over data.split's share of its sequences.
//
// A weighted blend of N samples (parts d with weights w_d normalised as numpy normalises them):
// part d is built for ceil(ceil(N·w_d) · 1.005) samples (Megatron's surplus), and global sample k
// is part blend.dataset(k)'s sample blend.sample(k), MegatronBlend over the weights normalised
// once more (BlendedDataset normalises what the builder already did). An unweighted blend takes
// one epoch of each part, weighted by the samples in it, min(N, their sum) samples in all.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/indexed_dataset.h"
#include "data/megatron_order.h"
#include "data/token_stream.h"

namespace mt::data {

struct TokenSourcePart {
  std::string prefix;       // an indexed dataset
  std::string mask_prefix;  // its loss mask (SFT), or empty
  double weight = 1.0;      // the blend's weight as given (unweighted blends ignore it)
};

struct TokenSourceOptions {
  std::string name;  // what messages call the source ("data.train")
  int seq_length = 0;
  bool shuffle = true;
  uint64_t seed = 0;
  bool megatron_order = false;
  uint64_t num_samples = 0;  // the samples the run draws (Megatron's orders and weighted blends)
  bool blend = false;        // parts blended as Megatron blends (a list in the config, even of one)
  bool weighted = true;      // a blend's weights were given
  std::vector<double> split_weights;  // data.split's weights, or empty
  int split = -1;                     // which share of each part's sequences (-1: all)
  int32_t eod_mask = -1;              // Megatron's --eod-mask-loss: the target after this input id is -100
};

class TokenSource {
 public:
  TokenSource(const std::vector<TokenSourcePart>& parts, const TokenSourceOptions& options);

  size_t num_parts() const { return parts_.size(); }
  const std::string& prefix(size_t part) const { return parts_[part].prefix; }
  int seq_length() const { return options_.seq_length; }
  // The samples there are: unbounded for one dataset, the blend's size for a blend.
  uint64_t size() const { return size_; }
  // The part global sample k comes from, and its sample number there.
  std::pair<size_t, uint64_t> locate(uint64_t k) const;
  TokenStream& stream(size_t part) { return *parts_[part].stream; }

  // inputs (T), targets (T) of global sample k; targets -100 where a mask says so, and with
  // eod_mask where the input is that id (Megatron masks loss_mask[tokens == eod]).
  void sample(uint64_t k, int32_t* inputs, int32_t* targets);
  // The position of token j (0..T) of global sample k in its part's dataset.
  uint64_t token_position(uint64_t k, uint64_t j);

 private:
  struct Part {
    std::string prefix;
    std::unique_ptr<IndexedDataset> tokens, mask;
    std::unique_ptr<TokenStream> stream;
  };
  TokenSourceOptions options_;
  std::vector<Part> parts_;
  std::unique_ptr<MegatronBlend> blend_;
  uint64_t size_ = UINT64_MAX;
};

}  // namespace mt::data
