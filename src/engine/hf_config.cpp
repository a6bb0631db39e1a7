#include "engine/hf_config.h"

#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <set>

#include "base/error.h"
#include "base/text.h"
#include "engine/json_file.h"

namespace mt::engine {
namespace {

class Reader {
 public:
  Reader(const nlohmann::json& j, const std::string& where) : j_(j), where_(where) {}

  int integer(const char* key, int fallback, bool required) const {
    asked_.insert(key);
    if (!j_.contains(key) || j_[key].is_null()) {
      MT_CHECK(!required, ErrorKind::kInvalidArgument, where_ + ": missing required field '" + key + "'");
      return fallback;
    }
    MT_CHECK(j_[key].is_number_integer(), ErrorKind::kInvalidArgument,
             where_ + ": field '" + key + "' must be an integer");
    // NOTE: get<int>() would wrap a larger value silently (2^32 + 97 read as 97).
    const nlohmann::json& v = j_[key];
    bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= INT_MAX
                                       : v.get<int64_t>() >= INT_MIN && v.get<int64_t>() <= INT_MAX;
    MT_CHECK(fits, ErrorKind::kInvalidArgument,
             where_ + ": field '" + key + "' is out of range (" + v.dump() + ")");
    return j_[key].get<int>();
  }
  // A GPT-2 size by its own name or by the name GPT2Config's attribute_map gives it (hidden_size
  // for n_embd, ...), which Hugging Face builds from too: read, not passed over for the default.
  int integer_or_alias(const char* key, const char* alias, int fallback) const {
    asked_.insert(key), asked_.insert(alias);
    const bool has_key = j_.contains(key) && !j_[key].is_null(), has_alias = j_.contains(alias) && !j_[alias].is_null();
    if (!has_alias) return integer(key, fallback, false);
    const int a = integer(alias, fallback, false);
    MT_CHECK(!has_key || integer(key, fallback, false) == a, ErrorKind::kInvalidArgument,
             where_ + ": fields '" + key + "' and '" + alias + "' (Hugging Face's other name for it) differ");
    return a;
  }
  float number(const char* key, float fallback) const {
    asked_.insert(key);
    if (!j_.contains(key) || j_[key].is_null()) return fallback;
    MT_CHECK(j_[key].is_number(), ErrorKind::kInvalidArgument, where_ + ": field '" + key + "' must be a number");
    return j_[key].get<float>();
  }
  bool boolean(const char* key, bool fallback) const {
    asked_.insert(key);
    if (!j_.contains(key) || j_[key].is_null()) return fallback;
    MT_CHECK(j_[key].is_boolean(), ErrorKind::kInvalidArgument, where_ + ": field '" + key + "' must be true or false");
    return j_[key].get<bool>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    asked_.insert(key);
    if (!j_.contains(key) || j_[key].is_null()) return fallback;
    MT_CHECK(j_[key].is_string(), ErrorKind::kInvalidArgument, where_ + ": field '" + key + "' must be a string");
    return j_[key].get<std::string>();
  }
  void refuse_if(bool cond, const char* key, const std::string& why) const {
    asked_.insert(key);
    MT_CHECK(!cond, ErrorKind::kNotSupported, where_ + ": field '" + key + "': " + why);
  }
  // A key of the object that no field read and that is one or two edits from a field that is read
  // and absent (model.n_layr beside no n_layer): the field kept its default, and another model
  // trained. Hugging Face's PretrainedConfig keeps any key it does not know, and a hub config.json
  // carries many (bos_token_id, use_cache, torch_dtype): only a near miss is said.
  void near_misses(std::vector<std::string>& warnings) const {
    for (const auto& [k, v] : j_.items()) {
      if (asked_.count(k) || k.size() < 4) continue;
      std::string best;
      int best_d = 3;
      for (const std::string& c : asked_)
        if (const int d = edit_distance(k, c); d < best_d && !j_.contains(c)) best_d = d, best = c;
      if (!best.empty())
        warnings.push_back(where_ + ": field '" + k + "' is not read, and '" + best +
                           "' keeps its default (did you mean '" + best + "'?)");
    }
  }

 private:
  const nlohmann::json& j_;
  const std::string& where_;
  mutable std::set<std::string> asked_{"model_type",  "architectures",   "id2label", "label2id", "init_from",
                                       "config",      "rope_parameters", "rope_scaling", "pad_token_id", "num_labels",
                                       "bos_token_id", "eos_token_id"};
};

// A rope_scaling (or transformers 5's rope_parameters) object: its type by "rope_type" or the older
// "type", and the keys transformers' _validate_*_parameters require of that type (a missing one is
// its KeyError). Keys it does not know are one warning line each, as transformers logs them; types
// not built here are refused by name.
models::RopeScaling parse_rope_scaling(const nlohmann::json& o, const std::string& where,
                                       const std::set<std::string>& also_known, std::vector<std::string>* warnings) {
  models::RopeScaling rs;
  auto text = [&](const char* k) -> std::string {
    if (!o.contains(k) || o[k].is_null()) return "";
    MT_CHECK(o[k].is_string(), ErrorKind::kInvalidArgument, where + ": '" + k + "' must be a string");
    return o[k].get<std::string>();
  };
  const std::string rope_type = text("rope_type"), old_type = text("type");
  MT_CHECK(rope_type.empty() || old_type.empty() || rope_type == old_type, ErrorKind::kInvalidArgument,
           where + ": 'rope_type' and 'type' differ");
  rs.type = !rope_type.empty() ? rope_type : !old_type.empty() ? old_type : "default";
  MT_CHECK(rs.type == "default" || rs.type == "linear" || rs.type == "dynamic" || rs.type == "llama3" || rs.type == "yarn",
           ErrorKind::kNotSupported,
           where + ": rope_type '" + rs.type + "' is not supported (default, linear, dynamic, llama3, yarn)");
  auto num = [&](const char* k) {
    MT_CHECK(o.contains(k) && !o[k].is_null(), ErrorKind::kInvalidArgument,
             where + ": rope_type '" + rs.type + "' needs '" + k + "'");
    MT_CHECK(o[k].is_number(), ErrorKind::kInvalidArgument, where + ": '" + k + "' must be a number");
    return o[k].get<double>();
  };
  std::set<std::string> known = {"rope_type", "type"};
  known.insert(also_known.begin(), also_known.end());
  if (rs.type != "default") rs.factor = num("factor"), known.insert("factor");
  if (rs.type == "dynamic") known.insert("original_max_position_embeddings");  // optional, unused (transformers)
  if (rs.type == "llama3") {
    rs.low_freq_factor = num("low_freq_factor");
    rs.high_freq_factor = num("high_freq_factor");
    const double omp = num("original_max_position_embeddings");
    MT_CHECK(omp == std::floor(omp) && omp > 0 && omp < 1e15, ErrorKind::kInvalidArgument,
             where + ": 'original_max_position_embeddings' must be a positive integer");
    rs.original_max_positions = static_cast<int64_t>(omp);
    known.insert({"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  }
  if (rs.type == "yarn") {  // the optional keys; absent or null (and beta's 0, as transformers' `or`) take the defaults
    auto optional = [&](const char* k, double fallback) {
      known.insert(k);
      return o.contains(k) && !o[k].is_null() ? num(k) : fallback;
    };
    const double omp = optional("original_max_position_embeddings", 0.0);
    MT_CHECK(omp == std::floor(omp) && omp >= 0 && omp < 1e15 && (omp > 0 || !o.contains("original_max_position_embeddings") ||
                                                                  o["original_max_position_embeddings"].is_null()),
             ErrorKind::kInvalidArgument, where + ": 'original_max_position_embeddings' must be a positive integer");
    rs.original_max_positions = static_cast<int64_t>(omp);
    rs.attention_factor = optional("attention_factor", 0.0);
    MT_CHECK(!o.contains("attention_factor") || o["attention_factor"].is_null() || rs.attention_factor > 0,
             ErrorKind::kInvalidArgument, where + ": 'attention_factor' must be positive");
    rs.beta_fast = optional("beta_fast", 32.0);
    rs.beta_slow = optional("beta_slow", 1.0);
    if (rs.beta_fast == 0) rs.beta_fast = 32.0;
    if (rs.beta_slow == 0) rs.beta_slow = 1.0;
    rs.mscale = optional("mscale", 0.0);
    rs.mscale_all_dim = optional("mscale_all_dim", 0.0);
    known.insert("truncate");
    if (o.contains("truncate") && !o["truncate"].is_null()) {
      MT_CHECK(o["truncate"].is_boolean(), ErrorKind::kInvalidArgument, where + ": 'truncate' must be true or false");
      rs.truncate = o["truncate"].get<bool>();
    }
  }
  for (const auto& [k, v] : o.items())
    if (!known.count(k) && warnings != nullptr)
      warnings->push_back(where + ": '" + k + "' is not read by rope_type '" + rs.type + "'");
  return rs;
}

}  // namespace

models::ModelConfig hf_config_parse(const nlohmann::json& j, const std::string& where, std::vector<std::string>* warnings) {
  MT_CHECK(j.is_object(), ErrorKind::kInvalidArgument, where + ": model config must be a JSON object");
  Reader r(j, where);
  std::string type = r.string("model_type", "");
  models::ModelConfig c;
  if (type == "gpt2") {
    c.arch = models::Arch::kGpt2;
    c.vocab_size = r.integer("vocab_size", 50257, false);
    c.max_positions = r.integer_or_alias("n_positions", "max_position_embeddings", 1024);
    c.hidden = r.integer_or_alias("n_embd", "hidden_size", 768);
    c.n_layer = r.integer_or_alias("n_layer", "num_hidden_layers", 12);
    c.n_head = r.integer_or_alias("n_head", "num_attention_heads", 12);
    c.n_kv_head = c.n_head;
    bool has_inner = j.contains("n_inner") && !j["n_inner"].is_null();
    MT_CHECK(has_inner || c.hidden <= INT_MAX / 4, ErrorKind::kInvalidArgument,
             where + ": field 'n_embd' is too large for the default n_inner (4 * n_embd overflows int)");
    c.intermediate = r.integer("n_inner", has_inner ? 0 : 4 * c.hidden, false);
    c.norm_eps = r.number("layer_norm_epsilon", 1e-5f);
    std::string act = r.string("activation_function", "gelu_new");
    r.refuse_if(act != "gelu_new" && act != "gelu_pytorch_tanh", "activation_function",
                "'" + act + "' is not supported (gelu_new, gelu_pytorch_tanh)");
    c.tie_embeddings = r.boolean("tie_word_embeddings", true);
    r.refuse_if(r.boolean("scale_attn_by_inverse_layer_idx", false), "scale_attn_by_inverse_layer_idx",
                "true is not supported");
    r.refuse_if(!r.boolean("scale_attn_weights", true), "scale_attn_weights", "false is not supported");
    r.refuse_if(r.boolean("reorder_and_upcast_attn", false), "reorder_and_upcast_attn", "true is not supported");
    c.embd_pdrop = r.number("embd_pdrop", 0.0f);  // Hugging Face's GPT2Config defaults them to 0.1; ours are 0
    c.resid_pdrop = r.number("resid_pdrop", 0.0f);
    c.attn_pdrop = r.number("attn_pdrop", 0.0f);
  } else if (type == "llama" || type == "qwen2") {
    // Qwen2 (Qwen2/2.5) is LLaMA with biases on q, k and v (none on o_proj) and its own defaults
    // (Qwen2Config: vocab 151936, 32768 positions); its sliding window is off unless
    // use_sliding_window, which is refused.
    const bool qwen2 = type == "qwen2";
    c.arch = models::Arch::kLlama;
    c.model_type = type;
    c.vocab_size = r.integer("vocab_size", qwen2 ? 151936 : 32000, false);
    c.hidden = r.integer("hidden_size", 0, true);
    c.intermediate = r.integer("intermediate_size", 0, true);
    c.n_layer = r.integer("num_hidden_layers", 0, true);
    c.n_head = r.integer("num_attention_heads", 0, true);
    // Absent: LlamaConfig takes the head count; Qwen2Config's default is 32 (null: the head count).
    c.n_kv_head = r.integer("num_key_value_heads", qwen2 && !j.contains("num_key_value_heads") ? 32 : c.n_head, false);
    c.max_positions = r.integer("max_position_embeddings", qwen2 ? 32768 : 2048, false);
    c.norm_eps = r.number("rms_norm_eps", 1e-6f);
    c.rope_theta = r.number("rope_theta", 10000.0f);
    // transformers 5 writes RoPE's settings as rope_parameters {rope_theta, rope_type, factor, ...}
    // (and may leave a top-level "rope_theta": null): it was passed over, and 10000 built another
    // model. transformers 4 writes the scaling as rope_scaling {rope_type (or type), factor, ...}.
    if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
      const nlohmann::json& rp = j["rope_parameters"];
      r.refuse_if(!rp.is_object(), "rope_parameters", "must be an object");
      const std::string rp_where = where + ": rope_parameters";
      const Reader rr(rp, rp_where);
      r.refuse_if(rp.contains("partial_rotary_factor") && !rp["partial_rotary_factor"].is_null() &&
                      rr.number("partial_rotary_factor", 1.0f) != 1.0f,
                  "rope_parameters", "a partial_rotary_factor other than 1 is not supported");
      if (rp.contains("rope_theta") && !rp["rope_theta"].is_null()) {
        const float theta = rr.number("rope_theta", c.rope_theta);
        r.refuse_if(j.contains("rope_theta") && !j["rope_theta"].is_null() && theta != c.rope_theta, "rope_theta",
                    "differs from rope_parameters.rope_theta");
        c.rope_theta = theta;
      }
      c.rope_scaling = parse_rope_scaling(rp, rp_where, {"rope_theta", "partial_rotary_factor"}, warnings);
    }
    if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
      r.refuse_if(!j["rope_scaling"].is_object(), "rope_scaling", "must be an object or null");
      const models::RopeScaling rs = parse_rope_scaling(j["rope_scaling"], where + ": rope_scaling", {}, warnings);
      r.refuse_if(c.rope_scaling.type != "default" && !(rs == c.rope_scaling), "rope_scaling",
                  "differs from rope_parameters (give one)");
      c.rope_scaling = rs;
    }
    c.tie_embeddings = r.boolean("tie_word_embeddings", false);
    std::string act = r.string("hidden_act", "silu");
    r.refuse_if(act != "silu", "hidden_act", "'" + act + "' is not supported (silu)");
    if (qwen2) {
      c.qkv_bias = true;
      r.refuse_if(r.boolean("use_sliding_window", false), "use_sliding_window",
                  "true is not supported (sliding-window attention)");
      (void)r.integer("sliding_window", 0, false);  // read by transformers only with use_sliding_window
      (void)r.integer("max_window_layers", 0, false);
      if (j.contains("layer_types") && !j["layer_types"].is_null()) {  // transformers 5
        r.refuse_if(!j["layer_types"].is_array(), "layer_types", "must be a list");
        for (const auto& t : j["layer_types"])
          r.refuse_if(t != "full_attention", "layer_types", t.dump() + " is not supported (full_attention)");
      }
    } else {
      // LlamaConfig's attention_bias: biases on q, k, v and o_proj.
      c.qkv_bias = c.o_bias = r.boolean("attention_bias", false);
    }
    r.refuse_if(r.boolean("mlp_bias", false), "mlp_bias", "true is not supported");
    // transformers' RoPE reads it from any config (rotary on that share of each head's dims only);
    // it was passed over, and the whole head rotated.
    r.refuse_if(j.contains("partial_rotary_factor") && !j["partial_rotary_factor"].is_null() &&
                    r.number("partial_rotary_factor", 1.0f) != 1.0f,
                "partial_rotary_factor", "a value other than 1 is not supported");
    c.attn_pdrop = r.number("attention_dropout", 0.0f);
    // LlamaModel builds nn.Embedding(vocab_size, hidden_size, pad_token_id): that row learns
    // nothing from the lookup. It was passed over, and the row trained.
    if (j.contains("pad_token_id") && !j["pad_token_id"].is_null()) {
      const int pad = r.integer("pad_token_id", -1, false);
      r.refuse_if(pad < -c.vocab_size || pad >= c.vocab_size, "pad_token_id",
                  std::to_string(pad) + " is not an id of the vocabulary (" + std::to_string(c.vocab_size) +
                      "; nn.Embedding's padding_idx counts a negative one from the end)");
      c.padding_idx = pad < 0 ? c.vocab_size + pad : pad;
    }
    r.refuse_if(j.contains("head_dim") && !j["head_dim"].is_null() && r.integer("head_dim", 0, false) != c.hidden / std::max(1, c.n_head),
                "head_dim", "a head_dim other than hidden_size / num_attention_heads is not supported");
  } else {
    MT_CHECK(j.contains("model_type") && !j["model_type"].is_null(), ErrorKind::kInvalidArgument,
             where + ": no field 'model_type' (gpt2, llama, qwen2): it names the architecture");
    throw Error(ErrorKind::kNotSupported,
                where + ": model_type '" + type + "' is not supported (gpt2, llama, qwen2)");
  }
  c.init_std = r.number("initializer_range", 0.02f);
  // The special ids, carried for export (an integer, or for eos a list of them, as transformers'
  // configs hold them).
  auto id_of = [&](const nlohmann::json& v, const char* key) {
    r.refuse_if(!v.is_number_integer() || v.get<int64_t>() < 0, key, "must be a non-negative integer id (or a list of them)");
    return v.get<int64_t>();
  };
  if (j.contains("bos_token_id") && !j["bos_token_id"].is_null()) c.bos_token_id = id_of(j["bos_token_id"], "bos_token_id");
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
    const nlohmann::json& e = j["eos_token_id"];
    c.eos_is_list = e.is_array();
    if (e.is_array())
      for (const auto& x : e) c.eos_token_ids.push_back(id_of(x, "eos_token_id"));
    else
      c.eos_token_ids.push_back(id_of(e, "eos_token_id"));
  }
  // Sequence classification: our "num_labels", or a *ForSequenceClassification architecture with
  // Hugging Face's id2label (2 labels when it has none).
  r.refuse_if(j.contains("problem_type") && !j["problem_type"].is_null() && !j["problem_type"].is_string(), "problem_type",
              "must be a string (single_label_classification, regression, multi_label_classification)");
  const bool has_problem = j.contains("problem_type") && j["problem_type"].is_string();
  // A classifier: num_labels, a *ForSequenceClassification architecture, or a problem_type in a
  // config that names no other architecture (a causal LM's config.json may carry one from its
  // fine-tuning; it stays a causal LM).
  bool classifier = j.contains("num_labels"), other_arch = false;
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const auto& a : j["architectures"]) {
      const bool cls = a.is_string() && a.get<std::string>().ends_with("ForSequenceClassification");
      classifier |= cls;
      other_arch |= !cls;
    }
  classifier |= has_problem && !other_arch;
  if (classifier) {
    const std::string problem = has_problem ? r.string("problem_type", "") : "";
    r.refuse_if(!problem.empty() && problem != "single_label_classification" && problem != "regression" &&
                    problem != "multi_label_classification",
                "problem_type",
                "\"" + problem + "\" is not one of Hugging Face's (single_label_classification, regression, multi_label_classification)");
    // id2label's size (2 without it), as PretrainedConfig counts; regression's one value where
    // nothing says otherwise, as run_classification.py sets it.
    const int from_map = j.contains("id2label") && j["id2label"].is_object() ? static_cast<int>(j["id2label"].size())
                         : problem == "regression"                          ? 1
                                                                            : 2;
    c.num_labels = r.integer("num_labels", from_map, false);
    r.refuse_if(c.num_labels < 1, "num_labels", "must be at least 1");
    // Without problem_type, Hugging Face's loss takes one label as regression and more as classes
    // (its integer labels; a float multi-hot is multi-label there, named here).
    c.problem_type = problem == "regression" || (problem.empty() && c.num_labels == 1) ? models::ProblemType::kRegression
                     : problem == "multi_label_classification"                       ? models::ProblemType::kMultiLabel
                                                                                     : models::ProblemType::kSingleLabel;
  }
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(e.kind(), where + ": " + e.what());
  }
  if (warnings) r.near_misses(*warnings);
  return c;
}

bool hf_directory_drop_num_labels(nlohmann::json& j) {
  if (!j.is_object() || !j.contains("num_labels") || !j.contains("architectures") || !j["architectures"].is_array() ||
      j["architectures"].empty())
    return false;
  for (const auto& a : j["architectures"]) {
    const std::string name = a.is_string() ? a.get<std::string>() : std::string();
    if (!name.ends_with("ForCausalLM") && !name.ends_with("LMHeadModel")) return false;
  }
  j.erase("num_labels");
  return true;
}

models::ModelConfig hf_config_load(const std::string& path) {
  return hf_config_parse(json_load_file(path), path);
}

namespace {

// The shortest decimal that reads back as the same float (1e-05, not 9.999999747378752e-06).
double shortest(float f) {
  char buf[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(f));
    if (std::strtof(buf, nullptr) == f) break;
  }
  return std::strtod(buf, nullptr);
}

}  // namespace

nlohmann::json hf_config_to_json(const models::ModelConfig& c) {
  nlohmann::json j;
  j["vocab_size"] = c.vocab_size;
  j["initializer_range"] = shortest(c.init_std);
  j["tie_word_embeddings"] = c.tie_embeddings;
  if (c.arch == models::Arch::kGpt2) {
    j["model_type"] = "gpt2";
    j["architectures"] = {"GPT2LMHeadModel"};
    j["n_positions"] = c.max_positions;
    j["n_embd"] = c.hidden;
    j["n_layer"] = c.n_layer;
    j["n_head"] = c.n_head;
    j["n_inner"] = c.intermediate;
    j["layer_norm_epsilon"] = shortest(c.norm_eps);
    j["activation_function"] = "gelu_new";
    // Written out: Hugging Face's defaults are 0.1, which would train the exported model with
    // dropout it was not trained with here.
    j["embd_pdrop"] = shortest(c.embd_pdrop);
    j["resid_pdrop"] = shortest(c.resid_pdrop);
    j["attn_pdrop"] = shortest(c.attn_pdrop);
  } else {
    const bool qwen2 = c.model_type == "qwen2";
    j["model_type"] = qwen2 ? "qwen2" : "llama";
    j["architectures"] = {qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
    if (qwen2) j["use_sliding_window"] = false;
    else if (c.o_bias) j["attention_bias"] = true;
    j["hidden_size"] = c.hidden;
    j["intermediate_size"] = c.intermediate;
    j["num_hidden_layers"] = c.n_layer;
    j["num_attention_heads"] = c.n_head;
    j["num_key_value_heads"] = c.n_kv_head;
    j["max_position_embeddings"] = c.max_positions;
    j["rms_norm_eps"] = shortest(c.norm_eps);
    j["rope_theta"] = shortest(c.rope_theta);
    if (c.rope_scaling.type != "default") {  // transformers 4's spelling; transformers 5 reads it too
      nlohmann::json rs = {{"rope_type", c.rope_scaling.type}, {"factor", c.rope_scaling.factor}};
      if (c.rope_scaling.type == "llama3") {
        rs["low_freq_factor"] = c.rope_scaling.low_freq_factor;
        rs["high_freq_factor"] = c.rope_scaling.high_freq_factor;
        rs["original_max_position_embeddings"] = c.rope_scaling.original_max_positions;
      }
      if (c.rope_scaling.type == "yarn") {  // what was read; the defaults left out
        const models::RopeScaling& y = c.rope_scaling;
        if (y.original_max_positions > 0) rs["original_max_position_embeddings"] = y.original_max_positions;
        if (y.attention_factor > 0) rs["attention_factor"] = y.attention_factor;
        rs["beta_fast"] = y.beta_fast;
        rs["beta_slow"] = y.beta_slow;
        if (y.mscale > 0) rs["mscale"] = y.mscale;
        if (y.mscale_all_dim > 0) rs["mscale_all_dim"] = y.mscale_all_dim;
        if (!y.truncate) rs["truncate"] = false;
      }
      j["rope_scaling"] = rs;
    }
    j["hidden_act"] = "silu";
    j["attention_dropout"] = shortest(c.attn_pdrop);
    // Always: a checkpoint's model says whether it trained a padding row (check_same_model).
    j["pad_token_id"] = c.padding_idx >= 0 ? nlohmann::json(c.padding_idx) : nlohmann::json(nullptr);
  }
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_is_list) j["eos_token_id"] = c.eos_token_ids;
  else if (!c.eos_token_ids.empty()) j["eos_token_id"] = c.eos_token_ids[0];
  if (c.num_labels > 0) {  // Hugging Face's sequence-classification config
    j["architectures"] = {c.arch == models::Arch::kGpt2       ? "GPT2ForSequenceClassification"
                          : c.model_type == "qwen2" ? "Qwen2ForSequenceClassification"
                                                    : "LlamaForSequenceClassification"};
    nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
    for (int i = 0; i < c.num_labels; ++i) {
      id2label[std::to_string(i)] = "LABEL_" + std::to_string(i);
      label2id["LABEL_" + std::to_string(i)] = i;
    }
    j["id2label"] = id2label;
    j["label2id"] = label2id;
    j["problem_type"] = models::problem_type_name(c.problem_type);
  }
  return j;
}

}  // namespace mt::engine
