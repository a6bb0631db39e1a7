// Loading Hugging Face-layout safetensors weights into a model's flat buffers, by parameter name
// and shape (GPT-2's Conv1D weights are (in, out) in both, so no transposes are needed), and
// writing them back out in the same layout (`meshtrain export --hf`).
//
// Names: our parameters carry the names of HF's *ForCausalLM state dicts ("transformer.h.0.attn.
// c_attn.weight", "model.layers.0.self_attn.q_proj.weight", "lm_head.weight"). A file saved from
// the bare trunk (the gpt2 hub checkpoint: "h.0.attn.c_attn.weight", "wte.weight") is accepted too:
// a name missing from the file is looked up again without its first component. Extra tensors in
// the file are not loaded: transformers' buffers (GPT-2's "attn.bias" causal masks) and a tied
// "lm_head.weight" quietly, any other in one warning (hf_warn_unused_tensors).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include <vector>

#include "checkpoint/safetensors.h"
#include "models/config.h"
#include "nn/param_store.h"
#include "tensor/dtype.h"

namespace mt::engine {

// Copies "<prefix><name>" for every parameter from the file into master weights (and refreshes the
// compute copy). Missing tensors or wrong shapes throw naming the tensor and the file.
// With flat (numel f32) given, the values go there (at each parameter's offset) instead of into
// the store (whose buffers ZeRO may have released).
void hf_weights_load(nn::ParamStore& store, const checkpoint::SafetensorsFile& file,
                     const std::string& prefix = "", float* flat = nullptr);
// path: a .safetensors file, a directory holding model.safetensors, or a directory / index file
// of a sharded checkpoint (model.safetensors.index.json with its "weight_map").
void hf_weights_load_path(nn::ParamStore& store, const std::string& path);

// Where a model's starting weights come from (model.init_from): one parameter at a time, in the
// store's layout. Hugging Face files (HfWeights) and meshtrain checkpoints (checkpoint_io.h:
// init_from_weights) are both read this way, so neither is ever held whole.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // p's values in the store's layout (p.numel() floats: this rank's tensor-parallel shard, padding
  // rows zero) into dst. false, dst untouched, for a classifier's score.weight that a causal LM's
  // weights lack: it keeps its initial values, as Hugging Face's from_pretrained does.
  virtual bool read(const nn::Parameter& p, float* dst) = 0;
  // Elements [lo, hi) of p's values in the store's layout into dst (hi - lo floats), or false as
  // read(). Sources that can read a part (HfWeights) read only its bytes; the default returns
  // false, and weight_initial_values then reads the whole parameter once and keeps it for the
  // pieces that follow.
  virtual bool reads_ranges() const { return false; }
  virtual bool read_range(const nn::Parameter& p, size_t lo, size_t hi, float* dst) {
    (void)p, (void)lo, (void)hi, (void)dst;
    return false;
  }
};

// A Hugging Face path (as hf_weights_load_path takes) opened by its files' headers alone, with
// every parameter of `store` resolved to its tensor (file, name, shape) when it is constructed: a
// missing tensor or a wrong shape throws then, naming both, before anything is loaded. Each read()
// reads one tensor from its file.
class HfWeights : public WeightSource {
 public:
  // speak: say that the files lack a classifier's score.weight (checkpoint_io.h: checkpoint_weights).
  HfWeights(const std::string& path, const nn::ParamStore& store, bool speak = true);
  bool read(const nn::Parameter& p, float* dst) override;
  // Only the file bytes of [lo, hi): one read per run of the rank's tensor-parallel slice that
  // meets the range (the whole tensor is never in memory: DESIGN-NOTES 71).
  bool reads_ranges() const override { return true; }
  bool read_range(const nn::Parameter& p, size_t lo, size_t hi, float* dst) override;
  size_t bytes_read() const;  // tensor bytes read from the files so far
  size_t reads() const;       // and the reads that took

 private:
  struct Source {
    const checkpoint::SafetensorsFile* file = nullptr;  // null: keeps its initial values
    std::string name;
  };
  std::string path_;
  std::map<std::string, std::unique_ptr<checkpoint::SafetensorsFile>> files_;
  std::map<const nn::Parameter*, Source> sources_;
};

// Every parameter of the store from the source (one at a time), then the compute copy refreshed.
void weights_load(WeightSource& source, nn::ParamStore& store);

// The values of the store's flat elements [begin, end) (its layout, padding zero) from the source:
// a parameter it lacks takes `initial` (the seed's values). TransformerLM::set_initial_values hands
// it to ZeRO's runtime, which makes each rank's shards unit by unit and never holds the whole model
// (model.init_from under ZeRO: DESIGN-NOTES 67).
std::function<void(size_t, size_t, float*)> weight_initial_values(std::shared_ptr<WeightSource> source,
                                                                  const nn::ParamStore& store,
                                                                  std::function<void(size_t, size_t, float*)> initial);
// The parameter names of the whole model cfg builds, every layer and the head (not one pipeline
// stage's): a one-layer model of the same kind's names, its layer's repeated for each layer.
std::vector<std::string> hf_model_tensor_names(const models::ModelConfig& cfg);
// The tensors of a Hugging Face path (as hf_weights_load_path takes) that none of `names` reads, by
// its name or the bare trunk's (HfWeights' lookup), less the buffers transformers leaves in a state
// dict (GPT-2's attn.bias and attn.masked_bias, rotary_emb.inv_freq) and, for a tied model,
// lm_head.weight.
std::vector<std::string> hf_unused_tensors(const std::string& path, const std::vector<std::string>& names, bool tied);
// One warning line naming hf_unused_tensors' (their count and the first five), as from_pretrained's
// "Some weights of the model checkpoint ... were not used": a file of more layers than the config
// says, or a bias the config does not have, loads what the model reads and drops the rest.
void hf_warn_unused_tensors(const std::string& path, const std::vector<std::string>& names, bool tied);
// The directory's config.json when path is a directory that holds one, else "".
std::string hf_weights_config_path(const std::string& path);
// Writes every parameter's master weights to one safetensors file in dtype (f32, bf16 or f16).
void hf_weights_save(const nn::ParamStore& store, const std::string& path, DType dtype);

}  // namespace mt::engine
