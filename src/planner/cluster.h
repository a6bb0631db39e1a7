// Clusters we cannot run on (issue 14): a description of a GPU cluster from public specifications
// (devices per host, peak FLOP/s by dtype, memory and its bandwidth, intra- and inter-host links)
// and stated efficiency assumptions, turned into the Calibration the cost model reads, so that
// `meshtrain plan --cluster cluster.json` plans for it with the same search, step programs and
// simulator as for this machine. configs/clusters/ has DGX A100 80GB and DGX H100 descriptions.
//
// The JSON (every figure positive; "sources" free text):
//   {"name": "...", "sources": ["..."],
//    "devices_per_host": 8, "memory_gib": 80,
//    "peak_tflops": {"bf16": 312, "f32": 19.5},             dense, per device
//    "gemm": {"efficiency": 0.8, "half_efficiency_gflop": 0.5},  a GEMM of F flops runs at
//                                                             peak x efficiency x F / (F + half)
//    "attention_efficiency": 0.4,                            attention's core, forward, of peak
//    "memory_gbs": 2039, "memory_efficiency": 0.8,           HBM, the elementwise kernels' rate
//    "intra_host": {"gbs": 300, "latency_us": 3},            one direction, one device
//    "inter_host": {"gbs": 25, "latency_us": 6},             one device's share of the host's NICs
//    "link_efficiency": 0.8}                                 of those bandwidths a ring reaches
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/calibrate.h"

namespace mt::planner {

struct ClusterSpec {
  std::string name;
  std::vector<std::string> sources;
  int devices_per_host = 8;
  double memory_gib = 0.0;
  double peak_bf16_tflops = 0.0, peak_f32_tflops = 0.0;
  double gemm_efficiency = 0.0, gemm_half_gflop = 0.0;
  double attention_efficiency = 0.0;
  double memory_gbs = 0.0, memory_efficiency = 0.0;
  double intra_gbs = 0.0, intra_latency_us = 0.0, inter_gbs = 0.0, inter_latency_us = 0.0;
  double link_efficiency = 0.0;
};

// Throws kInvalidArgument naming `where` and the key that is missing or not positive.
ClusterSpec parse_cluster(const nlohmann::json& j, const std::string& where);

// The calibration the cost model reads: GEMM lines (time = (F + half) / (peak x efficiency)), the
// attention core's forward (and backward at twice its FLOPs), the memory rate, AdamW's bytes an
// element at that rate, and the network (Calibration::collective_seconds).
Calibration cluster_calibration(const ClusterSpec& c);

}  // namespace mt::planner
