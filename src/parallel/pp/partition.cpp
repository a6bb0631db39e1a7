#include "parallel/pp/partition.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "base/error.h"

namespace mt::parallel::pp {

PartitionMethod parse_partition(const std::string& name, const std::string& key) {
  if (name == "uniform") return PartitionMethod::kUniform;
  if (name == "parameters") return PartitionMethod::kParameters;
  if (name == "time") return PartitionMethod::kTime;
  throw Error(ErrorKind::kInvalidArgument, key + ": unknown partition \"" + name + "\" (uniform, parameters or time)");
}

std::vector<int> partition_layers(PartitionMethod method, const PartitionInput& in) {
  const int S = in.stages, L = static_cast<int>(in.layer_cost.size());
  MT_CHECK(S >= 1, ErrorKind::kInvalidArgument, "pipeline stages must be >= 1");
  MT_CHECK(L >= S, ErrorKind::kInvalidArgument,
           "the model has " + std::to_string(L) + " layer(s) for " + std::to_string(S) +
               " pipeline stage(s) (parallel.pp x parallel.virtual_stages): every stage needs a layer");
  std::vector<int> b(S + 1, 0);
  if (method == PartitionMethod::kUniform) {
    const int q = L / S, extra = L % S;
    for (int s = 0; s < S; ++s) b[s + 1] = b[s] + q + (s < extra ? 1 : 0);
    return b;
  }
  // Min-max contiguous split: best[s][i] = smallest largest-stage cost of layers [0, i) on s stages.
  std::vector<double> prefix(L + 1, 0.0);
  for (int i = 0; i < L; ++i) prefix[i + 1] = prefix[i] + in.layer_cost[i];
  auto cost = [&](int s, int lo, int hi) {
    return prefix[hi] - prefix[lo] + (s == 0 ? in.first_cost : 0.0) + (s == S - 1 ? in.last_cost : 0.0);
  };
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(S + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int>> cut(S + 1, std::vector<int>(L + 1, 0));
  best[0][0] = 0.0;
  for (int s = 1; s <= S; ++s)
    for (int i = s; i <= L - (S - s); ++i)
      for (int j = s - 1; j < i; ++j) {
        if (best[s - 1][j] == inf) continue;
        double v = std::max(best[s - 1][j], cost(s - 1, j, i));
        if (v < best[s][i] * (1 - 1e-12)) {  // strictly better: earlier cuts win ties
          best[s][i] = v;
          cut[s][i] = j;
        }
      }
  b[S] = L;
  for (int s = S; s >= 1; --s) b[s - 1] = cut[s][b[s]];
  return b;
}

std::string describe_partition(const std::vector<int>& b, const PartitionInput& in) {
  const int S = static_cast<int>(b.size()) - 1;
  std::string out;
  for (int s = 0; s < S; ++s) {
    double c = (s == 0 ? in.first_cost : 0.0) + (s == S - 1 ? in.last_cost : 0.0);
    for (int l = b[s]; l < b[s + 1]; ++l) c += in.layer_cost[l];
    char cost[32];
    if (c >= 1e6) std::snprintf(cost, sizeof cost, "%.2fM", c / 1e6);
    else if (c >= 100) std::snprintf(cost, sizeof cost, "%.0f", c);
    else std::snprintf(cost, sizeof cost, "%.3g", c);  // seconds
    if (!out.empty()) out += ", ";
    out += "stage " + std::to_string(s) + ": " + (s == 0 ? "embedding + " : "") + "layers " + std::to_string(b[s]) + "-" +
           std::to_string(b[s + 1] - 1) + (s == S - 1 ? " + head" : "") + " (" + cost + ")";
  }
  return out;
}

}  // namespace mt::parallel::pp
