// Which transformer layers each pipeline stage holds (pure). Stages are cut on block boundaries,
// the embedding on the first virtual stage and the final norm + LM head on the last; the
// partition counts them (DeepSpeed's "parameters" method counts only the layers, which users see
// put 21 layers on one stage and 14 on another once the embedding is added by hand).
#pragma once

#include <string>
#include <vector>

namespace mt::parallel::pp {

enum class PartitionMethod { kUniform, kParameters, kTime };
// "uniform", "parameters" (DeepSpeed's pipeline.partition / partition_method names), "time"
// (costs measured on this machine; the split is balanced as for parameters). Throws
// kInvalidArgument naming `key` otherwise.
PartitionMethod parse_partition(const std::string& name, const std::string& key);

struct PartitionInput {
  int stages = 1;                    // virtual stages S = pp * v
  std::vector<double> layer_cost;    // one per transformer layer
  double first_cost = 0.0;           // the embedding (stage 0)
  double last_cost = 0.0;            // final norm + LM head (stage S-1)
};

// Boundaries b (S + 1 entries): stage s holds layers [b[s], b[s+1]). Every stage holds at least
// one layer (kInvalidArgument naming the layer and stage counts otherwise). uniform: DeepSpeed's
// split (the first L mod S stages one layer more); parameters and time: the split whose largest
// stage cost (first_cost / last_cost included) is smallest, ties broken toward earlier cuts.
std::vector<int> partition_layers(PartitionMethod method, const PartitionInput& in);

// "stage 0: embedding + layers 0-5 (7.1M), stage 1: layers 6-11 + head (7.9M)" with each stage's
// cost (in `unit`: parameters are shown as counts).
std::string describe_partition(const std::vector<int>& bounds, const PartitionInput& in);

}  // namespace mt::parallel::pp
