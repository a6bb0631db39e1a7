// Test helpers shared by the PyTorch golden tests (engine/golden_test.cpp on the CPU,
// engine/cuda/engine_cuda_test.cpp on the GPU): the golden file of tools/make_golden.py and the
// error measures both compare with.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "engine/hf_config.h"
#include "engine/hf_weights.h"
#include "models/transformer.h"
#include "models/config.h"

namespace mt::engine::testing {

struct Golden {
  std::unique_ptr<checkpoint::SafetensorsFile> file;
  models::ModelConfig cfg;
  int B = 0, T = 0, steps = 0;
  std::vector<int32_t> tokens, targets;
};

// MT_GOLDEN_DIR in the environment overrides the build tree's (a prebuilt bundle on a GPU machine).
inline std::string golden_dir() {
  const char* e = std::getenv("MT_GOLDEN_DIR");
  return e && *e ? e : MT_GOLDEN_DIR;
}

inline Golden load_golden(const std::string& name) {
  Golden g;
  g.file = std::make_unique<checkpoint::SafetensorsFile>(golden_dir() + "/" + name + ".safetensors");
  const auto& md = g.file->metadata();
  g.cfg = hf_config_parse(nlohmann::json::parse(md.at("config")), name);
  g.B = std::stoi(md.at("batch"));
  g.T = std::stoi(md.at("seq"));
  g.steps = std::stoi(md.at("steps"));
  g.tokens = g.file->read_i32("tokens");
  if (g.file->find("targets")) g.targets = g.file->read_i32("targets");  // none in cls-* files
  return g;
}

// The golden model's architecture and initial weights, prepared for its batch.
inline std::unique_ptr<models::TransformerLM> make_model(const Golden& g, DType dt, bool recompute,
                                                       models::ModelOptions::Documents documents = {}) {
  models::ModelOptions opts;
  opts.compute_dtype = dt;
  opts.recompute = recompute;
  opts.documents = documents;
  auto m = std::make_unique<models::TransformerLM>(g.cfg, opts);
  hf_weights_load(m->store(), *g.file, "param.");
  m->prepare(g.B, g.T);
  return m;
}

// max|a - b| / max|b|: relative error at the scale of the tensor (a non-finite a fails).
inline double rel_err(const float* a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return den > 0 ? num / den : num;
}

inline double cosine(const float* a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb + 1e-30);
}

}  // namespace mt::engine::testing
