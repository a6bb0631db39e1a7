// The run configuration: DeepSpeed's batch rule, "auto" resolution, refusals by full path,
// warnings with did-you-mean, --set overrides.
#include "engine/ds_config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "base/error.h"
#include "base/scratch_dir.h"
#include "engine/hf_config.h"
#include "engine/json_file.h"

namespace mt::engine {
namespace {

nlohmann::json base() {
  return nlohmann::json::parse(R"({
    "model": {"model_type": "gpt2", "vocab_size": 97, "n_positions": 32, "n_embd": 48, "n_layer": 2, "n_head": 4},
    "seq_length": 16, "train_iters": 100, "train_micro_batch_size_per_gpu": 2
  })");
}

// base() with one more top-level key.
nlohmann::json with(const char* key, const nlohmann::json& v) {
  nlohmann::json j = base();
  j[key] = v;
  return j;
}

std::string error_of(nlohmann::json j, int world = 1) {
  try {
    ds_config_parse(std::move(j), "cfg.json", world);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Values that crashed a run or trained something else (a review, stop 56): refused by key, or read
// as DeepSpeed and Hugging Face read them.
TEST(DsConfig, ValuesThatCrashedOrTrainedAnotherModel) {
  const auto npos = std::string::npos;
  EXPECT_NE(error_of(with("steps_per_print", 0)).find("steps_per_print: must be at least 1 (got 0)"), npos);  // SIGFPE
  // Past 1e9 s the deadline in milliseconds overflowed: every collective timed out at once.
  EXPECT_NE(error_of(with("comm_timeout", 1e300)).find("comm_timeout must be positive and at most 1e9 seconds (got 1e+300)"), npos);
  EXPECT_NE(error_of(with("optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e300}}}})).find("must be a non-negative number a float holds"),
            npos);  // inf in the optimizer: a NaN loss at step 2
  // DeepSpeed's older name for bf16, read where bf16 is absent (it trained in f32 with a warning).
  EXPECT_EQ(ds_config_parse(with("bfloat16", {{"enabled", true}}), "cfg.json").compute_dtype, DType::kBF16);
  nlohmann::json both = with("bfloat16", {{"enabled", true}});
  both["bf16"] = {{"enabled", false}};
  EXPECT_NE(error_of(both).find("bf16 and bfloat16 (its older name"), npos);
  // GPT-2's sizes by the names GPT2Config's attribute_map gives them (the defaults were built: 124M).
  nlohmann::json alias = base();
  alias["model"] = {{"model_type", "gpt2"}, {"vocab_size", 97}, {"max_position_embeddings", 32}, {"hidden_size", 48},
                    {"num_hidden_layers", 3}, {"num_attention_heads", 4}};
  const RunConfig c = ds_config_parse(alias, "cfg.json");
  EXPECT_EQ(c.model.hidden, 48);
  EXPECT_EQ(c.model.n_layer, 3);
  EXPECT_EQ(c.model.n_head, 4);
  EXPECT_EQ(c.model.max_positions, 32);
  alias["model"]["n_embd"] = 64;
  EXPECT_NE(error_of(alias).find("fields 'n_embd' and 'hidden_size' (Hugging Face's other name for it) differ"), npos);
  // One label is Hugging Face's regression (it trained a one-class softmax: loss 0, exit 0, before
  // regression was built); a one-class softmax asked for by name is refused.
  nlohmann::json one = base();
  one["task"] = "classification";
  one["model"]["num_labels"] = 1;
  EXPECT_EQ(ds_config_parse(one, "cfg.json").model.problem_type, models::ProblemType::kRegression);
  one["model"]["problem_type"] = "single_label_classification";
  EXPECT_NE(error_of(one).find("num_labels: 1 with problem_type \"single_label_classification\" is a softmax over one class"), npos);
  one["model"].erase("num_labels");
  one["model"]["problem_type"] = "regression";  // run_classification.py's one value
  EXPECT_EQ(ds_config_parse(one, "cfg.json").model.num_labels, 1);
  // WarmupCosineLR with no cosine window after the warm-up: DeepSpeed clamps its progress (the floor
  // from the warm-up's end; it divided by zero, and this was refused).
  nlohmann::json cosine = with("scheduler", {{"type", "WarmupCosineLR"}, {"params", {{"warmup_num_steps", 3}, {"total_num_steps", 3}}}});
  EXPECT_EQ(error_of(cosine), "");
  // DeepSpeed's WarmupDecayLR and WarmupCosineLR require total_num_steps (a TypeError without it; it
  // was taken from train_iters without a word), and every warm-up schedule a positive warmup_num_steps.
  for (const char* type : {"WarmupDecayLR", "WarmupCosineLR"}) {
    EXPECT_NE(error_of(with("scheduler", {{"type", type}, {"params", {{"warmup_num_steps", 3}}}}))
                  .find("scheduler.params.total_num_steps: required by " + std::string(type)),
              npos) << type;
    EXPECT_NE(error_of(with("scheduler", {{"type", type}})).find("scheduler.params.total_num_steps: required by"), npos) << type;
    EXPECT_EQ(error_of(with("scheduler", {{"type", type}, {"params", {{"total_num_steps", "auto"}}}})), "") << type;
  }
  for (const char* type : {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}) {
    nlohmann::json params = {{"warmup_num_steps", 0}};
    if (std::string(type) != "WarmupLR") params["total_num_steps"] = 10;
    EXPECT_NE(error_of(with("scheduler", {{"type", type}, {"params", params}}))
                  .find("scheduler.params.warmup_num_steps must be a positive integer (DeepSpeed's " + std::string(type) + " raises on 0)"),
              npos) << type;
    params["warmup_num_steps"] = "auto";  // Hugging Face's warmup_steps: 0 by default
    EXPECT_EQ(error_of(with("scheduler", {{"type", type}, {"params", params}})), "") << type;
  }
  // DeepSpeed's FusedAdam takes weight_decay 0 by default (0.01 was applied to every AdamW);
  // torch_adam builds torch.optim.AdamW, whose default is 0.01.
  EXPECT_EQ(ds_config_parse(with("optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}), "cfg.json").optimizer.weight_decay, 0.0);
  EXPECT_EQ(ds_config_parse(with("optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}, {"torch_adam", true}}}}), "cfg.json")
                .optimizer.weight_decay,
            0.01);
  // Keys that change what is trained, warned or passed over before: refused by key.
  const std::pair<nlohmann::json, std::string> refused[] = {
      {with("gradient_allreduce_op", "sum"), "gradient_allreduce_op: \"sum\" is not supported"},
      {with("sequence_parallel_size", 2), "sequence_parallel_size (2) x parallel.tp (1) x parallel.pp (1) does not divide the 1 process(es)"},
      {with("bf16", {{"enabled", true}, {"bf16_optimizer_states", true}}), "bf16.bf16_optimizer_states: true"},
      {with("zero_optimization", {{"stage", 1}, {"zenflow", {{"topk_ratio", 0.1}}}}), "zero_optimization.zenflow: ZenFlow"},
      {with("zero_optimization", {{"stage", 1}, {"load_from_fp32_weights", false}}), "zero_optimization.load_from_fp32_weights: false"},
      {with("scheduler", {{"type", "WarmupLR"}, {"params", {{"last_batch_iteration", 500}}}}), "scheduler.params.last_batch_iteration: a schedule started part way"},
      {with("scheduler", {{"type", "WarmupCosineLR"}, {"params", {{"warmup_max_lr", 0.5}, {"total_num_steps", 50}}}}),
       "scheduler.params.warmup_max_lr: WarmupCosineLR takes no warmup_max_lr"},
      {with("scheduler", {{"type", "WarmupLR"}, {"params", {{"total_num_steps", 50}}}}), "WarmupLR takes no total_num_steps"},
  };
  for (const auto& [j, want] : refused) EXPECT_NE(error_of(j).find(want), npos) << want << ": " << error_of(j);
  // Data keys (every one selects data: an unknown one was warned about and the whole corpus
  // trained) and Megatron's arguments.
  EXPECT_NE(error_of(with("data", {{"train", "x"}, {"data_path", "y"}})).find("data.data_path: unknown key"), npos);
  EXPECT_NE(error_of(with("split", "949,50,1")).find("split: Megatron's --split is data.split here"), npos);
  EXPECT_NE(error_of(with("train_samples", 100)).find("train_samples: Megatron's argument"), npos);
  // A curriculum is checked to its last step and one past it, not to train_iters (1e13 took hours).
  nlohmann::json cl = with("curriculum_learning", {{"enabled", true}, {"curriculum_type", "seqlen"}, {"min_difficulty", 8},
                                                   {"max_difficulty", 16}, {"schedule_type", "fixed_linear"},
                                                   {"schedule_config", {{"total_curriculum_step", 4}, {"difficulty_step", 8}}}});
  cl["train_iters"] = 10000000000000LL;
  EXPECT_EQ(error_of(cl), "");
  // Counts narrowed to int: bounded first (2^32 + 1 trained as tp 1; tp x pp of 2^16 each wrapped
  // to 0, SIGFPE; a pipeline's 2^32 + 2 micro-batches trained 2).
  EXPECT_NE(error_of(with("parallel", {{"tp", 4294967297LL}})).find("parallel.tp: must be from 1 to 65536"), npos);
  EXPECT_NE(error_of(with("parallel", {{"tp", 65536}, {"pp", 65536}})).find("does not divide the 1 process(es)"), npos);
  EXPECT_NE(error_of(with("pipeline", {{"stages", 0}})).find("pipeline.stages: must be from 1 to 65536"), npos);
  EXPECT_NE(error_of(with("parallel", {{"tp", 2}, {"make_vocab_size_divisible_by", 1073741824}}), 2).find("make_vocab_size_divisible_by"), npos);
  EXPECT_NE(error_of(with("parallel", {{"virtual_stages", 3}})).find("parallel.virtual_stages: must be 1, or from 2"), npos);
  EXPECT_NE(error_of(with("gradient_accumulation_steps", 4294967298LL)).find("gradient_accumulation_steps (4294967298) is past 2^31 - 1"), npos);
  // LLaMA's seq_length past max_position_embeddings (generate and serve refuse it after).
  nlohmann::json long_llama = base();
  long_llama["model"] = {{"model_type", "llama"}, {"vocab_size", 97}, {"hidden_size", 48}, {"intermediate_size", 96},
                         {"num_hidden_layers", 1}, {"num_attention_heads", 4}, {"max_position_embeddings", 8}};
  EXPECT_NE(error_of(long_llama).find("seq_length 16 exceeds model max_position_embeddings 8"), npos);
  // LLaMA's RoPE as transformers 5 writes it (rope_parameters, passed over: 10000 built another model).
  nlohmann::json llama = base();
  llama["model"] = {{"model_type", "llama"}, {"vocab_size", 97}, {"hidden_size", 48}, {"intermediate_size", 96},
                    {"num_hidden_layers", 1}, {"num_attention_heads", 4}, {"max_position_embeddings", 32},
                    {"rope_theta", nullptr}, {"head_dim", nullptr}, {"rope_parameters", {{"rope_theta", 500000.0}, {"rope_type", "default"}}}};
  EXPECT_EQ(ds_config_parse(llama, "cfg.json").model.rope_theta, 500000.0f);  // and head_dim null is hidden / heads
  // RoPE scaling (stop 75): transformers 5's rope_parameters and transformers 4's rope_scaling (its
  // "type" spelling too) read alike; the keys a type needs are required (transformers' KeyError);
  // unknown keys are a line each; yarn and longrope are refused by name. It was all refused.
  llama["model"]["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "llama3"}, {"factor", 32.0},
                                       {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                                       {"original_max_position_embeddings", 8}};
  {
    const models::ModelConfig m = ds_config_parse(llama, "cfg.json").model;
    EXPECT_EQ(m.rope_scaling, (models::RopeScaling{"llama3", 32.0, 1.0, 4.0, 8}));
    EXPECT_EQ(m.rope_theta, 500000.0f);
  }
  llama["model"]["rope_parameters"].erase("high_freq_factor");
  EXPECT_NE(error_of(llama).find("rope_parameters: rope_type 'llama3' needs 'high_freq_factor'"), npos) << error_of(llama);
  llama["model"]["rope_parameters"]["high_freq_factor"] = 1.0;  // the blended band would be empty
  EXPECT_NE(error_of(llama).find("0 < low_freq_factor < high_freq_factor"), npos) << error_of(llama);
  // yarn (stop 78): its optional keys, transformers' defaults where absent (beta's 0 too, as its
  // `or`); a factor transformers 4 and 5 would take differently is refused naming both; longrope
  // stays refused by name.
  llama["model"]["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "yarn"}, {"factor", 4.0}, {"beta_slow", 0},
                                       {"mscale", 0.707}, {"mscale_all_dim", 1.0}, {"truncate", false}};
  {
    models::RopeScaling want{"yarn", 4.0, 1.0, 4.0, 0};
    want.mscale = 0.707;
    want.mscale_all_dim = 1.0;
    want.truncate = false;
    const models::ModelConfig m = ds_config_parse(llama, "cfg.json").model;
    EXPECT_EQ(m.rope_scaling, want);
    EXPECT_EQ(hf_config_parse(hf_config_to_json(m), "exported").rope_scaling, want);  // export writes it back
  }
  llama["model"]["rope_parameters"]["original_max_position_embeddings"] = 32;  // max_position_embeddings 32: ratio 1
  EXPECT_NE(error_of(llama).find("yarn's factor is 4 (transformers 5's) and max_position_embeddings / "
                                 "original_max_position_embeddings = 1 (transformers 4's) disagree: set "
                                 "max_position_embeddings to factor x original_max_position_embeddings (128)"),
            npos) << error_of(llama);
  llama["model"]["rope_parameters"]["original_max_position_embeddings"] = 8;  // 32 / 8 = 4: both read factor 4
  EXPECT_EQ(ds_config_parse(llama, "cfg.json").model.rope_scaling.original_max_positions, 8);
  llama["model"]["rope_parameters"]["truncate"] = 1;
  EXPECT_NE(error_of(llama).find("'truncate' must be true or false"), npos) << error_of(llama);
  llama["model"]["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "longrope"}, {"factor", 4.0}};
  EXPECT_NE(error_of(llama).find("rope_type 'longrope' is not supported (default, linear, dynamic, llama3, yarn)"), npos)
      << error_of(llama);
  llama["model"].erase("rope_parameters");
  llama["model"]["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}, {"mscale", 1.0}};
  {
    const RunConfig rc = ds_config_parse(llama, "cfg.json");
    EXPECT_EQ(rc.model.rope_scaling, (models::RopeScaling{"linear", 2.0, 1.0, 4.0, 0}));
    EXPECT_TRUE(std::any_of(rc.warnings.begin(), rc.warnings.end(), [](const std::string& w) {
      return w.find("rope_scaling: 'mscale' is not read by rope_type 'linear'") != std::string::npos;
    }));
  }
  llama["model"]["rope_scaling"] = {{"type", "linear"}, {"rope_type", "dynamic"}, {"factor", 2.0}};
  EXPECT_NE(error_of(llama).find("'rope_type' and 'type' differ"), npos);
  llama["model"]["rope_scaling"] = {{"rope_type", "linear"}, {"factor", -2.0}};
  EXPECT_NE(error_of(llama).find("rope_scaling: factor must be positive and finite"), npos) << error_of(llama);
  llama["model"].erase("rope_scaling");
  // Qwen2 (stop 75): LLaMA with q/k/v biases and Qwen2Config's defaults; its sliding window is
  // refused when on (use_sliding_window, or transformers 5's layer_types); LLaMA's attention_bias
  // puts a bias on all four projections. Both were refused (qwen2 as an unknown model_type).
  {
    nlohmann::json q = llama;
    q["model"]["model_type"] = "qwen2";
    q["model"]["num_key_value_heads"] = nullptr;
    q["model"]["sliding_window"] = 4096;
    q["model"]["max_window_layers"] = 21;
    q["model"]["use_sliding_window"] = false;
    q["model"]["layer_types"] = {"full_attention"};
    q["model"].erase("max_position_embeddings");  // Qwen2Config's 32768
    const models::ModelConfig m = ds_config_parse(q, "cfg.json").model;
    EXPECT_TRUE(m.qkv_bias);
    EXPECT_FALSE(m.o_bias);
    EXPECT_EQ(m.model_type, "qwen2");
    EXPECT_EQ(m.max_positions, 32768);
    EXPECT_EQ(m.n_kv_head, 4);  // null: the head count
    q["model"].erase("num_key_value_heads");
    q["model"]["num_attention_heads"] = 32;
    q["model"]["hidden_size"] = 64;
    EXPECT_EQ(ds_config_parse(q, "cfg.json").model.n_kv_head, 32);  // absent: Qwen2Config's 32
    q["model"]["num_key_value_heads"] = nullptr;
    models::ModelConfig no_bias = m;
    no_bias.qkv_bias = false;
    EXPECT_EQ(m.num_params() - no_bias.num_params(), 3 * 48);  // one layer's q, k, v biases (4 heads of 12, 4 kv heads)
    EXPECT_EQ(hf_config_to_json(m)["architectures"][0], "Qwen2ForCausalLM");
    q["model"]["layer_types"] = {"sliding_attention"};
    EXPECT_NE(error_of(q).find("field 'layer_types': \"sliding_attention\" is not supported"), npos) << error_of(q);
    q["model"].erase("layer_types");
    q["model"]["use_sliding_window"] = true;
    EXPECT_NE(error_of(q).find("field 'use_sliding_window': true is not supported"), npos) << error_of(q);
    nlohmann::json b = llama;
    b["model"]["attention_bias"] = true;
    const models::ModelConfig mb = ds_config_parse(b, "cfg.json").model;
    EXPECT_TRUE(mb.qkv_bias && mb.o_bias);
    EXPECT_EQ(hf_config_to_json(mb)["attention_bias"], true);
    b["device"] = "cuda";
    std::string cuda_error;
    try {
      ds_config_check_trainable(ds_config_parse(b, "cfg.json"));
    } catch (const Error& e) {
      cuda_error = e.what();
    }
    EXPECT_NE(cuda_error.find("model.attention_bias true: attention biases are not supported on the CUDA backend"), npos)
        << cuda_error;
  }
  // LLaMA's pad_token_id is nn.Embedding's padding_idx (it was passed over, and its row trained); a
  // negative one counts from the end, as torch's; GPT-2's embedding has none.
  EXPECT_EQ(ds_config_parse(llama, "cfg.json").model.padding_idx, -1);
  llama["model"]["pad_token_id"] = 5;
  EXPECT_EQ(ds_config_parse(llama, "cfg.json").model.padding_idx, 5);
  EXPECT_EQ(hf_config_to_json(ds_config_parse(llama, "cfg.json").model)["pad_token_id"], 5);  // export --hf
  llama["model"]["pad_token_id"] = -1;
  EXPECT_EQ(ds_config_parse(llama, "cfg.json").model.padding_idx, 96);
  llama["model"]["pad_token_id"] = nullptr;
  EXPECT_EQ(ds_config_parse(llama, "cfg.json").model.padding_idx, -1);
  EXPECT_TRUE(hf_config_to_json(ds_config_parse(llama, "cfg.json").model)["pad_token_id"].is_null());  // said: none
  for (int bad : {97, -98}) {
    llama["model"]["pad_token_id"] = bad;
    EXPECT_NE(error_of(llama).find("field 'pad_token_id': " + std::to_string(bad) + " is not an id of the vocabulary (97"), npos)
        << error_of(llama);
  }
  llama["model"].erase("pad_token_id");
  nlohmann::json gpt2_pad = base();
  gpt2_pad["model"]["pad_token_id"] = 5;  // a GPT-2 classifier's pooling id, not a padding row
  EXPECT_EQ(ds_config_parse(gpt2_pad, "cfg.json").model.padding_idx, -1);
  // No model_type at all: said so (it read "model_type '' is not supported").
  nlohmann::json untyped = base();
  untyped["model"].erase("model_type");
  EXPECT_NE(error_of(untyped).find("no field 'model_type' (gpt2, llama, qwen2)"), npos) << error_of(untyped);
  one["model"]["num_labels"] = 3;
  one["model"]["problem_type"] = "multi_label_classification";
  EXPECT_EQ(ds_config_parse(one, "cfg.json").model.problem_type, models::ProblemType::kMultiLabel);
  one["model"]["problem_type"] = "multi_label";
  EXPECT_NE(error_of(one).find("field 'problem_type': \"multi_label\" is not one of Hugging Face's"), npos);
  one["model"]["problem_type"] = 3;
  EXPECT_NE(error_of(one).find("field 'problem_type': must be a string"), npos);
  // Without num_labels, the labels data.labels names count (run_classification.py's count).
  one["model"].erase("num_labels");
  one["model"]["problem_type"] = "multi_label_classification";
  one["data"]["labels"] = {"a", "b", "c", "d"};
  EXPECT_EQ(ds_config_parse(one, "cfg.json").model.num_labels, 4);
  one["data"].erase("labels");
  // A causal LM's config.json with a problem_type left from a fine-tuning stays a causal LM.
  nlohmann::json lm = base();
  lm["model"]["architectures"] = {"GPT2LMHeadModel"};
  lm["model"]["problem_type"] = "single_label_classification";
  EXPECT_EQ(ds_config_parse(lm, "cfg.json").model.num_labels, 0);
  {  // A Hugging Face directory's causal LM with num_labels in its config.json (init_from): a causal-LM
     // run trains that causal LM, as AutoModelForCausalLM loads it (it was refused as "a sequence
     // classifier" needing task classification); a classification run counts the file's labels; a
     // run's own model block with num_labels beside GPT2LMHeadModel stays how a classifier is asked for.
    const ScratchDir dir;
    nlohmann::json hub = base()["model"];
    hub["architectures"] = {"GPT2LMHeadModel"};
    hub["num_labels"] = 3;
    std::ofstream(dir.file("config.json")) << hub.dump();
    nlohmann::json run = base();
    run["model"] = {{"init_from", dir.path()}};
    EXPECT_EQ(ds_config_parse(run, "cfg.json").model.num_labels, 0);
    run["task"] = "classification";
    EXPECT_EQ(ds_config_parse(run, "cfg.json").model.num_labels, 3);
    run.erase("task");
    run["model"]["num_labels"] = 3;  // the user's own key beside init_from asks for a classifier
    EXPECT_NE(error_of(run).find("needs \"task\": \"classification\""), npos);
    nlohmann::json block = base();
    block["model"] = hub;
    block["task"] = "classification";
    EXPECT_EQ(ds_config_parse(block, "cfg.json").model.num_labels, 3);
  }
}

// Megatron-LM's arguments written into a config were warned about as unknown keys, and
// meshtrain's defaults trained (clip_grad 1.0 unclipped, global_batch_size 8 at batch 2); a LLaMA
// config.json's partial_rotary_factor was passed over (the whole head rotated); a data key's
// refusal gave the optimizer's reason.
TEST(DsConfig, MegatronsArgumentsAndPartialRotaryAreRefusedByName) {
  const auto npos = std::string::npos;
  const std::pair<const char*, std::string> args[] = {
      {"clip_grad", "clip_grad: Megatron-LM's argument is not read here (meshtrain's is gradient_clipping)"},
      {"global_batch_size", "global_batch_size: Megatron-LM's argument is not read here (meshtrain's is train_batch_size)"},
      {"lr_decay_style", "(meshtrain's is scheduler.type)"},
      {"hidden_dropout", "hidden_dropout: Megatron-LM's argument"},
      {"make_vocab_size_divisible_by", "(meshtrain's is parallel.make_vocab_size_divisible_by)"},
      {"eod_mask_loss", "eod_mask_loss: Megatron-LM's argument is not read here (meshtrain's is data.eod_mask_loss)"},
      {"reset_position_ids", "(meshtrain's is data.reset_position_ids)"},
      {"reset_attention_mask", "(meshtrain's is data.reset_attention_mask)"},
      {"rampup_batch_size", "(not implemented)"},
      {"tensor_model_parallel_size", "(meshtrain's is parallel.tp)"},
  };
  for (const auto& [k, want] : args) EXPECT_NE(error_of(with(k, 1)).find(want), npos) << k << ": " << error_of(with(k, 1));
  // meshtrain's own top-level keys of the same spelling are still read.
  for (const char* ours : {"seed", "train_iters", "seq_length", "eval_iters", "eval_interval", "save_interval"})
    EXPECT_EQ(error_of(with(ours, 4)).find("Megatron-LM"), npos) << ours;
  nlohmann::json llama = base();
  llama["model"] = {{"model_type", "llama"}, {"vocab_size", 97}, {"hidden_size", 48}, {"intermediate_size", 96},
                    {"num_hidden_layers", 1}, {"num_attention_heads", 4}, {"max_position_embeddings", 32}};
  EXPECT_NO_THROW(ds_config_parse(llama, "cfg.json"));
  llama["model"]["partial_rotary_factor"] = 1.0;
  EXPECT_NO_THROW(ds_config_parse(llama, "cfg.json"));
  llama["model"]["partial_rotary_factor"] = 0.5;
  EXPECT_NE(error_of(llama).find("field 'partial_rotary_factor': a value other than 1 is not supported"), npos) << error_of(llama);
  llama["model"].erase("partial_rotary_factor");
  llama["model"]["rope_parameters"] = {{"rope_type", "default"}, {"partial_rotary_factor", 0.25}};
  EXPECT_NE(error_of(llama).find("a partial_rotary_factor other than 1 is not supported"), npos) << error_of(llama);
  const std::string data = error_of(with("data", {{"train", "x"}, {"reset_positions", true}}));
  EXPECT_NE(data.find("data.reset_positions: unknown key"), npos) << data;
  EXPECT_NE(data.find("every key of data selects what is trained"), npos) << data;
  EXPECT_EQ(data.find("optimizer"), npos) << data;
}

// A curriculum's lengths under sequence parallelism: micro-batch x 17 tokens does not split over
// tp 2, and the run ended at that step (exit 2, the message naming seq_length) instead of at start.
TEST(DsConfig, ACurriculumsLengthsMustSplitOverTheSequenceParallelGroup) {
  nlohmann::json j = base();
  j["seq_length"] = 32;
  j["train_micro_batch_size_per_gpu"] = 1;
  j["parallel"] = {{"tp", 2}, {"sequence_parallel", true}};
  j["curriculum_learning"] = {{"enabled", true}, {"curriculum_type", "seqlen"}, {"min_difficulty", 8}, {"max_difficulty", 32},
                              {"schedule_type", "fixed_linear"},
                              {"schedule_config", {{"total_curriculum_step", 5}, {"difficulty_step", 8}}}};
  EXPECT_EQ(error_of(j, 2), "");  // 12 -> 8, 16, ...: even lengths
  j["curriculum_learning"]["schedule_config"]["difficulty_step"] = 1;
  const std::string e = error_of(j, 2);
  EXPECT_NE(e.find("curriculum_learning with parallel.sequence_parallel: step 2 trains 17 tokens a sample"), std::string::npos) << e;
  j["train_micro_batch_size_per_gpu"] = 2;  // 2 x 17 splits
  EXPECT_EQ(error_of(j, 2), "");
}

// The fp16 scaler of the wrapper DeepSpeed's engine builds, and WarmupLR's default peak (a review
// against DeepSpeed's source, stop 57): at ZeRO 0 the minimum scale is held and skipped on (it
// ended the run), the unfused wrapper (Lamb, torch's Adam) has no hysteresis and, without any
// dynamic key, a minimum of 0.25; WarmupLR without warmup_max_lr peaks at the optimizer's lr (it
// took 0.001).
TEST(DsConfig, TheFp16ScalerAndWarmupLrFollowTheWrapperDeepSpeedBuilds) {
  auto scaler = [](const nlohmann::json& optimizer, int stage, const nlohmann::json& fp16) {
    nlohmann::json j = with("fp16", fp16);
    j["optimizer"] = optimizer;
    j["zero_optimization"] = {{"stage", stage}};
    return ds_config_parse(j, "cfg.json").loss_scaler;
  };
  const nlohmann::json adamw = {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}};
  const nlohmann::json torch_adamw = {{"type", "AdamW"}, {"params", {{"lr", 1e-4}, {"torch_adam", true}}}};
  const nlohmann::json lamb = {{"type", "Lamb"}, {"params", {{"lr", 1e-4}}}};
  const nlohmann::json on = {{"enabled", true}}, keyed = {{"enabled", true}, {"hysteresis", 2}};
  optim::LossScalerConfig z1 = scaler(adamw, 1, on), fused = scaler(adamw, 0, on);
  EXPECT_TRUE(z1.raise_error_at_min_scale);
  EXPECT_TRUE(z1.honour_hysteresis);
  EXPECT_FALSE(fused.raise_error_at_min_scale);
  EXPECT_TRUE(fused.honour_hysteresis);
  EXPECT_EQ(fused.min_scale, 1.0);
  for (const nlohmann::json& o : {torch_adamw, lamb}) {
    optim::LossScalerConfig u = scaler(o, 0, on);
    EXPECT_FALSE(u.raise_error_at_min_scale) << o;
    EXPECT_FALSE(u.honour_hysteresis) << o;
    EXPECT_EQ(u.min_scale, 0.25) << o;
    EXPECT_EQ(scaler(o, 0, keyed).min_scale, 1.0) << o;  // a dynamic key given: DeepSpeed's args, min 1
  }
  nlohmann::json warm = with("scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 3}}}});
  warm["optimizer"] = adamw;
  EXPECT_DOUBLE_EQ(ds_config_parse(warm, "cfg.json").scheduler.warmup_max_lr, 1e-4);
  warm["scheduler"]["type"] = "WarmupDecayLR";
  warm["scheduler"]["params"]["total_num_steps"] = 30;
  EXPECT_DOUBLE_EQ(ds_config_parse(warm, "cfg.json").scheduler.warmup_max_lr, 1e-3);
}

TEST(DsConfig, BatchRuleAnyTwoGiveTheThird) {
  auto j = base();
  RunConfig c = ds_config_parse(j, "cfg.json");
  EXPECT_EQ(c.batch.train_batch_size, 2);
  EXPECT_EQ(c.batch.gradient_accumulation_steps, 1);
  j["train_batch_size"] = 16;
  c = ds_config_parse(j, "cfg.json", 2);
  EXPECT_EQ(c.batch.gradient_accumulation_steps, 4);
  j.erase("train_micro_batch_size_per_gpu");
  j["gradient_accumulation_steps"] = 2;
  c = ds_config_parse(j, "cfg.json", 2);
  EXPECT_EQ(c.batch.micro_batch_per_gpu, 4);
  j["train_micro_batch_size_per_gpu"] = 3;
  EXPECT_NE(error_of(j, 2).find("must equal"), std::string::npos);
}

TEST(DsConfig, GpuRanksNeedStageZero) {
  auto j = base();
  j["comm_backend"] = "gloo";
  EXPECT_NE(error_of(j).find("comm_backend: \"gloo\" is not a backend"), std::string::npos) << error_of(j);
  j["comm_backend"] = "nccl";  // on the CPU
  EXPECT_NE(error_of(j).find("needs \"device\": \"cuda\""), std::string::npos) << error_of(j);
  j = base();
  j["device"] = "cuda";
  EXPECT_EQ(error_of(j, 2), "");  // MPI through the host (several ranks may share a GPU)
  j["zero_optimization"] = {{"stage", 1}};
  EXPECT_NE(error_of(j, 2).find("zero_optimization.stage 1 over 2 GPUs"), std::string::npos) << error_of(j, 2);
  j["comm_backend"] = "nccl";
  j["zero_optimization"] = {{"stage", 2}};
  std::string e = error_of(j, 2);
  // A build with NCCL names the stage; one without says so first.
  EXPECT_TRUE(e.find("zero_optimization.stage 2 over 2 GPUs") != std::string::npos ||
              e.find("built without NCCL") != std::string::npos)
      << e;
}

TEST(DsConfig, AnIndivisibleBatchBlamesWhatTheUserGave) {
  // `launch -n 3` with train_batch_size 8 alone: was "train_batch_size (8) must equal
  // train_micro_batch_size_per_gpu (2) * ...", a micro batch the user never set.
  auto j = base();
  j.erase("train_micro_batch_size_per_gpu");
  j["train_batch_size"] = 8;
  EXPECT_EQ(error_of(j, 3), "train_batch_size (8) is not a multiple of 3 data-parallel rank(s) (3)");
  j["gradient_accumulation_steps"] = 2;
  EXPECT_NE(error_of(j, 3).find("not a multiple of gradient_accumulation_steps x 3 data-parallel rank(s) (6)"),
            std::string::npos);
  j.erase("gradient_accumulation_steps");
  j["train_micro_batch_size_per_gpu"] = 3;
  EXPECT_NE(error_of(j, 1).find("not a multiple of train_micro_batch_size_per_gpu x 1 data-parallel rank(s) (3)"),
            std::string::npos);
}

TEST(DsConfig, AutoValuesResolveLikeHuggingFace) {
  auto j = base();
  j["train_batch_size"] = "auto";
  j["gradient_accumulation_steps"] = "auto";
  j["gradient_clipping"] = "auto";
  j["bf16"] = {{"enabled", "auto"}};
  j["optimizer"] = nlohmann::json::parse(R"({"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}})");
  j["scheduler"] = nlohmann::json::parse(R"({"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto"}})");
  RunConfig c = ds_config_parse(j, "cfg.json");
  EXPECT_EQ(c.batch.train_batch_size, 2);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.compute_dtype, DType::kF32);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 5e-5);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr, 5e-5);
  EXPECT_EQ(c.scheduler.total_num_steps, 100);
  j["fp16"] = {{"enabled", true}, {"loss_scale", "auto"}};
  EXPECT_NE(error_of(j).find("fp16.loss_scale"), std::string::npos);
}

// What torch.optim's Adam refuses: a beta outside [0, 1) (1 divides by zero in the bias
// correction; past 1 the moments grow without bound), a negative eps or weight decay. Each was
// taken before and made the weights non-finite, which a checkpoint then saved.
TEST(DsConfig, AdamsHyperparametersOutsideTheirRangesAreRefusedByKey) {
  for (const char* betas : {"[1.0, 0.999]", "[0.9, 2.0]", "[-0.5, 0.999]", "[0.9, 1]"}) {
    auto j = base();
    j["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"betas", nlohmann::json::parse(betas)}}}};
    const std::string e = error_of(j);
    EXPECT_NE(e.find("optimizer.params.betas"), std::string::npos) << betas << ": " << e;
    EXPECT_NE(e.find("outside [0, 1)"), std::string::npos) << e;
  }
  auto j = base();
  j["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"betas", {0.0, 0.95}}}}};
  EXPECT_EQ(ds_config_parse(j, "cfg.json").optimizer.beta1, 0.0);  // the edges of the range stand
  j["optimizer"]["params"]["eps"] = -1e-8;
  EXPECT_NE(error_of(j).find("optimizer.params.eps"), std::string::npos);
  j["optimizer"]["params"]["eps"] = 1e-8;
  j["optimizer"]["params"]["weight_decay"] = -0.1;
  EXPECT_NE(error_of(j).find("optimizer.params.weight_decay"), std::string::npos);
  // And two sizes that were taken: a negative gradient_clipping (clipping silently off), and a
  // micro-batch whose tokens overflow int (it said "batch and sequence length must be positive").
  j = base();
  j["gradient_clipping"] = -1.0;
  EXPECT_NE(error_of(j).find("gradient_clipping must be a non-negative number"), std::string::npos);
  j = base();
  j["train_micro_batch_size_per_gpu"] = int64_t{1000000000000};
  j.erase("train_batch_size");
  j.erase("gradient_accumulation_steps");
  EXPECT_NE(error_of(j).find("train_micro_batch_size_per_gpu (1000000000000) x seq_length"), std::string::npos) << error_of(j);
}

// A negative learning rate through the scheduler (which replaces optimizer.params.lr) trained by
// gradient ascent and exited 0: WarmupLR's warmup_max_lr -1 printed "lr -1.000e+00".
TEST(DsConfig, SchedulerRatesBelowZeroAreRefusedByKey) {
  const std::vector<std::pair<nlohmann::json, std::string>> cases = {
      {{{"type", "WarmupLR"}, {"params", {{"warmup_max_lr", -1}, {"warmup_num_steps", 2}}}}, "scheduler.params.warmup_max_lr"},
      {{{"type", "WarmupDecayLR"}, {"params", {{"warmup_max_lr", -0.5}, {"total_num_steps", 10}}}}, "scheduler.params.warmup_max_lr"},
      {{{"type", "WarmupLR"}, {"params", {{"warmup_min_lr", -1e-3}}}}, "scheduler.params.warmup_min_lr"},
      {{{"type", "WarmupCosineLR"}, {"params", {{"cos_min_ratio", -1}, {"total_num_steps", 10}}}}, "scheduler.params.cos_min_ratio"},
      {{{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", -5}}}}, "scheduler.params.warmup_num_steps"},
      {{{"type", "OneCycle"}, {"params", {{"cycle_min_lr", -1}, {"cycle_max_lr", -2}}}}, "scheduler.params.cycle_min_lr"},
      {{{"type", "OneCycle"}, {"params", {{"cycle_min_lr", 0}, {"cycle_max_lr", -2}}}}, "scheduler.params.cycle_max_lr"},
      {{{"type", "LRRangeTest"}, {"params", {{"lr_range_test_min_lr", -1e-3}}}}, "scheduler.params.lr_range_test_min_lr"},
      // train_iters 100: iteration 98 gives 1e-3 (1 - 0.02 x 99) < 0
      {{{"type", "LRRangeTest"}, {"params", {{"lr_range_test_step_rate", -0.02}, {"lr_range_test_step_size", 1}}}},
       "scheduler.params.lr_range_test_step_rate takes the learning rate to -0.00098 by step 100"},
      {{{"type", "LRRangeTest"}, {"params", {{"lr_range_test_step_size", 0}}}}, "scheduler.params.lr_range_test_step_size"},
      {{{"type", "LRRangeTest"}, {"params", {{"warmup_max_lr", 0.1}}}}, "scheduler.params.warmup_max_lr"}};
  for (const auto& [scheduler, key] : cases) {
    auto j = base();
    j["scheduler"] = scheduler;
    const std::string e = error_of(j);
    EXPECT_NE(e.find(key), std::string::npos) << scheduler.dump() << ": " << e;
  }
  auto j = base();
  j["scheduler"] = {{"type", "WarmupLR"}, {"params", {{"warmup_min_lr", 0}, {"warmup_max_lr", 1e-3}}}};
  EXPECT_DOUBLE_EQ(ds_config_parse(j, "cfg.json").scheduler.warmup_max_lr, 1e-3);
  // A falling range test that stays at or above 0 for the run's 100 steps is DeepSpeed's to run.
  j["scheduler"] = {{"type", "LRRangeTest"}, {"params", {{"lr_range_test_step_rate", -0.01}, {"lr_range_test_step_size", 1}}}};
  EXPECT_EQ(error_of(j), "");
}

// LRRangeTest's keys are read with DeepSpeed's defaults (absent params take them all, as for every
// type here, where DeepSpeed's engine needs a params block).
TEST(DsConfig, LrRangeTestIsReadKeyByKey) {
  auto j = base();
  j["scheduler"] = {{"type", "LRRangeTest"}};
  optim::LrScheduleConfig sc = ds_config_parse(j, "cfg.json").scheduler;
  EXPECT_EQ(sc.type, optim::LrScheduleType::kLRRangeTest);
  EXPECT_DOUBLE_EQ(sc.lr_range_test_min_lr, 1e-3);
  EXPECT_EQ(sc.lr_range_test_step_size, 2000);
  EXPECT_DOUBLE_EQ(sc.lr_range_test_step_rate, 1.0);
  EXPECT_FALSE(sc.lr_range_test_staircase);
  j["scheduler"]["params"] = {{"lr_range_test_min_lr", 0.01}, {"lr_range_test_step_size", 50},
                              {"lr_range_test_step_rate", 5}, {"lr_range_test_staircase", true}};
  sc = ds_config_parse(j, "cfg.json").scheduler;
  EXPECT_DOUBLE_EQ(sc.lr_range_test_min_lr, 0.01);
  EXPECT_EQ(sc.lr_range_test_step_size, 50);
  EXPECT_DOUBLE_EQ(sc.lr_range_test_step_rate, 5.0);
  EXPECT_TRUE(sc.lr_range_test_staircase);
  EXPECT_DOUBLE_EQ(optim::lr_for_step(sc, 52), 0.01 * 6);  // iteration 50: floor(51 / 50) = 1
  j["scheduler"]["params"]["lr_range_test_min_lr"] = {0.01};
  EXPECT_NE(error_of(j).find("scheduler.params.lr_range_test_min_lr: a list"), std::string::npos) << error_of(j);
  j["scheduler"]["params"]["lr_range_test_min_lr"] = 0.01;
  j["scheduler"]["params"]["lr_range_test_stepsize"] = 5;
  EXPECT_NE(error_of(j).find("scheduler.params.lr_range_test_stepsize"), std::string::npos) << error_of(j);
}

TEST(DsConfig, TrainingChangingKeysAreRefusedByFullPath) {
  auto j = base();
  j["zero_optimization"] = {{"stage", 3}, {"offload_param", {{"device", "nvme"}, {"nvme_path", "/x"}}}};
  EXPECT_NE(error_of(j).find("zero_optimization.offload_param.device 'nvme' needs"), std::string::npos);
  j = base();
  j["zero_optimization"] = {{"stage", 2}};
  j["optimizer"] = {{"type", "Lamb"}, {"params", {{"lr", 1e-3}}}};
  EXPECT_NE(error_of(j).find("Lamb"), std::string::npos);
  j = base();
  j["zero_optimization"] = {{"stage", 1}, {"offload_param", {{"device", "cpu"}}}};
  {  // DeepSpeed reads offload_param at stage 3 only: one warning, nothing offloaded
    RunConfig c = ds_config_parse(j, "cfg.json");
    EXPECT_EQ(c.zero.offload_param, "none");
    EXPECT_TRUE(std::any_of(c.warnings.begin(), c.warnings.end(),
                            [](const std::string& w) { return w.find("zero_optimization.offload_param: applies to stage 3 only") == 0; }));
  }
  j = base();
  j["optimizer"] = {{"type", "AdamW"}, {"params", {{"amsgrad", true}}}};
  EXPECT_NE(error_of(j).find("optimizer.params.amsgrad"), std::string::npos);
  j = base();
  j["curriculum_learning"] = {{"enabled", true}};
  EXPECT_NE(error_of(j).find("curriculum_learning"), std::string::npos);
  j = base();
  j["parallel"] = {{"tp", 2}};
  EXPECT_NE(error_of(j).find("parallel.tp"), std::string::npos);
  j = base();
  j["fp16"] = {{"enabled", true}};
  j["bf16"] = {{"enabled", true}};
  EXPECT_NE(error_of(j).find("cannot both"), std::string::npos);
  j = base();
  j["scheduler"] = {{"type", "ReduceLROnPlateau"}};  // not one of DeepSpeed's own
  EXPECT_NE(error_of(j).find("scheduler.type"), std::string::npos);
  j = base();
  j["optimizer"] = {{"type", "Lamb"}, {"params", {{"lr", 1e-3}, {"max_grad_norm", 1.0}}}};
  EXPECT_NE(error_of(j).find("optimizer.params.max_grad_norm"), std::string::npos);
  j = base();
  j["optimizer"] = {{"type", "SGD"}, {"params", {{"lr", 0.1}, {"maximize", true}}}};
  EXPECT_NE(error_of(j).find("optimizer.params.maximize"), std::string::npos);
  j = base();
  j["optimizer"] = {{"type", "SGD"}, {"params", {{"lr", 0.1}, {"nesterov", true}}}};  // torch: needs momentum
  EXPECT_NE(error_of(j).find("nesterov"), std::string::npos);
  j = base();
  j["optimizer"] = {{"type", "Adagrad"}};
  EXPECT_NE(error_of(j).find("optimizer.type"), std::string::npos);
  j = base();
  j["scheduler"] = {{"type", "OneCycle"}, {"params", {{"cycle_max_lr", 0.1}}}};
  EXPECT_NE(error_of(j).find("cycle_min_lr"), std::string::npos);
  // Taken with a warning before: AdamW's maximize and any other unknown optimizer or scheduler
  // argument (DeepSpeed passes them to the constructor, where an unknown one is an error),
  // data_types.grad_accum_dtype other than fp32, torch_autocast on.
  j = base();
  j["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"maximize", true}}}};
  EXPECT_NE(error_of(j).find("optimizer.params.maximize: maximize is not supported"), std::string::npos) << error_of(j);
  j = base();
  j["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"weight_dacay", 0.1}}}};
  EXPECT_NE(error_of(j).find("optimizer.params.weight_dacay: unknown key (did you mean 'weight_decay'?)"), std::string::npos)
      << error_of(j);
  j = base();
  j["scheduler"] = {{"type", "WarmupLR"}, {"params", {{"warmup_max_lr", 1e-3}, {"warmup_step", 10}}}};
  EXPECT_NE(error_of(j).find("scheduler.params.warmup_step: unknown key"), std::string::npos) << error_of(j);
  j = base();
  j["data_types"] = {{"grad_accum_dtype", "bf16"}};
  EXPECT_NE(error_of(j).find("data_types.grad_accum_dtype: \"bf16\" is not supported"), std::string::npos) << error_of(j);
  j["data_types"]["grad_accum_dtype"] = "fp32";
  EXPECT_EQ(error_of(j), "");
  // Real DeepSpeed and torch arguments that change nothing here are taken (the unknown-key refusal
  // above first refused them): DeepSpeedCPUAdam's fp32_optimizer_states true, the fused kernels'
  // switch of AdamW and SGD, and grad_accum_dtype spelled "float" or "float32".
  for (const char* t : {"float", "float32"}) {
    j["data_types"]["grad_accum_dtype"] = t;
    EXPECT_EQ(error_of(j), "") << t;
  }
  j = base();
  j["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"fp32_optimizer_states", true}, {"fused", true}}}};
  EXPECT_EQ(error_of(j), "");
  j["optimizer"]["params"]["fp32_optimizer_states"] = false;
  EXPECT_NE(error_of(j).find("fp32_optimizer_states"), std::string::npos) << error_of(j);
  j["optimizer"] = {{"type", "SGD"}, {"params", {{"lr", 0.1}, {"momentum", 0.9}, {"fused", false}, {"foreach", true}}}};
  EXPECT_EQ(error_of(j), "");
  // Dropout trains on the CPU runtime (GoldenDropout, DropoutLayouts); the CUDA backend and the
  // sparse attention kernels have none, so there a non-zero probability is refused by key. GPT-2's
  // attention-scaling switches, which were ignored, are refused too.
  auto trainable_error = [](const nlohmann::json& cfg) {
    try {
      ds_config_check_trainable(ds_config_parse(cfg, "cfg.json"));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  for (const char* k : {"embd_pdrop", "resid_pdrop", "attn_pdrop"}) {
    j = base();
    j["model"][k] = 0.1;
    EXPECT_EQ(error_of(j), "") << k;
    EXPECT_EQ(trainable_error(j), "") << k;
    j["device"] = "cuda";
    EXPECT_NE(trainable_error(j).find(std::string("model.") + k + ": 0.1: dropout is not supported on the CUDA backend"),
              std::string::npos) << trainable_error(j);
    j["model"][k] = 0;
    EXPECT_EQ(trainable_error(j), "") << k;
  }
  j = base();
  j["model"]["attn_pdrop"] = 0.1;
  j["model"]["resid_pdrop"] = 0.1;
  j["sparse_attention"] = {{"mode", "fixed"}, {"block", 4}};
  EXPECT_NE(trainable_error(j).find("model.attn_pdrop: 0.1: attention dropout is not supported with sparse_attention"),
            std::string::npos) << trainable_error(j);
  j["model"]["attn_pdrop"] = 0;
  EXPECT_EQ(trainable_error(j), "");  // residual dropout is outside the attention kernel
  j = base();
  j["model"] = {{"model_type", "llama"}, {"vocab_size", 97}, {"hidden_size", 32}, {"intermediate_size", 64},
                {"num_hidden_layers", 1}, {"num_attention_heads", 4}, {"max_position_embeddings", 32},
                {"attention_dropout", 0.1}};
  EXPECT_EQ(trainable_error(j), "");
  j["device"] = "cuda";
  EXPECT_NE(trainable_error(j).find("model.attention_dropout: 0.1: dropout is not supported on the CUDA backend"),
            std::string::npos) << trainable_error(j);
  j["model"]["attention_dropout"] = 0;
  j["model"]["pad_token_id"] = 3;  // the padding row is the CPU lookup's
  EXPECT_NE(trainable_error(j).find("model.pad_token_id: 3: LLaMA's padding row"), std::string::npos) << trainable_error(j);
  j["device"] = "cpu";
  EXPECT_EQ(trainable_error(j), "");
  {  // a hub GPT-2's config.json as a path, its dropout set beside it (the path form ignored the keys)
    const ScratchDir dir;
    const std::string path = dir.file("config.json");
    nlohmann::json hub = base()["model"];
    for (const char* k : {"embd_pdrop", "resid_pdrop", "attn_pdrop"}) hub[k] = 0.1;
    std::ofstream(path) << hub.dump();
    j = base();
    j["model"] = path;
    EXPECT_FLOAT_EQ(ds_config_parse(j, "cfg.json").model.resid_pdrop, 0.1f);
    for (const char* k : {"embd_pdrop", "resid_pdrop", "attn_pdrop"}) ds_config_set(j, std::string("model.") + k + "=0");
    EXPECT_EQ(j["model"]["config"], path);
    EXPECT_EQ(ds_config_parse(j, "cfg.json").model.resid_pdrop, 0.0f);
    EXPECT_EQ(ds_config_parse(j, "cfg.json").model.n_head, 4);  // the file's keys beside the sets
  }
  j = base();
  j["model"]["scale_attn_weights"] = false;
  EXPECT_NE(error_of(j).find("scale_attn_weights"), std::string::npos) << error_of(j);
  j = base();
  j["model"]["reorder_and_upcast_attn"] = true;
  EXPECT_NE(error_of(j).find("reorder_and_upcast_attn"), std::string::npos) << error_of(j);
  j = base();
  j["torch_autocast"] = {{"enabled", true}, {"dtype", "bfloat16"}};
  EXPECT_NE(error_of(j).find("torch_autocast is not supported yet"), std::string::npos) << error_of(j);
  for (const char* k : {"zero_quantized_gradients", "zero_quantized_weights", "zero_quantized_nontrainable_weights"}) {
    j = base();  // ZeRO++ changes the values exchanged: refused when on, accepted when off
    j["zero_optimization"] = {{"stage", 3}, {k, true}};
    EXPECT_NE(error_of(j).find(std::string("zero_optimization.") + k + ": ZeRO++"), std::string::npos) << k;
    j["zero_optimization"][k] = false;
    EXPECT_EQ(error_of(j), "") << k;
  }
}

TEST(DsConfig, LoggingKeysAndTyposWarnWithDidYouMean) {
  auto j = base();
  j["tensorboard"] = {{"enabled", true}};
  j["steps_per_prnt"] = 5;
  j["zero_optimization"] = {{"stage", 0}, {"contiguous_gradients", true}, {"allgather_bucket_size", 2e8}};
  RunConfig c = ds_config_parse(j, "cfg.json");
  std::string all;
  for (auto& w : c.warnings) all += w + "\n";
  EXPECT_NE(all.find("tensorboard"), std::string::npos);
  EXPECT_NE(all.find("did you mean 'steps_per_print'"), std::string::npos) << all;
  EXPECT_NE(all.find("zero_optimization.contiguous_gradients"), std::string::npos);
  EXPECT_NE(all.find("zero_optimization.allgather_bucket_size: no effect"), std::string::npos) << all;
  // DeepSpeed's aio tuning key that changes nothing here: said, once (it was taken in silence).
  j["aio"] = {{"overlap_events", false}};
  all.clear();
  for (auto& w : ds_config_parse(j, "cfg.json").warnings) all += w + "\n";
  EXPECT_NE(all.find("aio.overlap_events: false has no effect"), std::string::npos) << all;
}

TEST(DsConfig, ZeroKeysAsDeepSpeedReadsThem) {
  auto j = base();
  j["zero_optimization"] = {{"stage", 3}, {"reduce_bucket_size", 5e8}, {"stage3_prefetch_bucket_size", "auto"},
                            {"stage3_param_persistence_threshold", "auto"}, {"cpu_offload", true},
                            {"offload_param", {{"device", "cpu"}, {"pin_memory", true}}}};
  RunConfig c = ds_config_parse(j, "cfg.json");
  EXPECT_EQ(c.zero_stage, 3);
  EXPECT_TRUE(c.zero.overlap_comm);  // DeepSpeed's stage-3 default
  EXPECT_EQ(c.zero.reduce_bucket_size, 500000000);
  const int64_t H = c.model.hidden;
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 9 * H * H / 10);  // Hugging Face's "auto"
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 10 * H);
  EXPECT_EQ(c.zero.offload_optimizer, "cpu");  // the legacy key
  EXPECT_EQ(c.zero.offload_param, "cpu");
  j["zero_optimization"] = {{"stage", 1}};
  EXPECT_FALSE(ds_config_parse(j, "cfg.json").zero.overlap_comm);
}

TEST(DsConfig, MalformedModelFileIsNamed) {
  const ScratchDir dir;
  std::string path = dir.file("bad-model.json");
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs("{\"model_type\": \"gpt2\",", f);
  std::fclose(f);
  auto j = base();
  j["model"] = path;
  try {
    ds_config_parse(j, "cfg.json");
    FAIL() << "accepted a truncated model file";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("bad-model.json"), std::string::npos) << e.what();
  }
}

// data.seed replaced `seed`, and so the initial weights: data.seed 7 trained exactly as seed 7.
// It seeds the sample order only; without it the order takes `seed`.
TEST(DsConfig, DataSeedSeedsTheOrderOnly) {
  auto j = base();
  j["seed"] = 1234;
  j["data"] = {{"train", "corpus"}, {"seed", 7}};
  RunConfig c = ds_config_parse(j, "cfg.json");
  EXPECT_EQ(c.seed, 1234u);
  EXPECT_EQ(c.data_seed, 7u);
  EXPECT_EQ(ds_config_resolved(c)["data"]["seed"], 7);
  EXPECT_EQ(ds_config_resolved(c)["seed"], 1234);
  j["data"].erase("seed");
  j["seed"] = 99;
  c = ds_config_parse(j, "cfg.json");
  EXPECT_EQ(c.data_seed, 99u);
}

// data.sample_order: Megatron's GPTDataset order, kept in the resolved config; what it cannot be
// (unshuffled, a seed numpy refuses, a classifier's records) refused by key. The top-level seed is
// checked too when data.seed is absent. data.split: Megatron's --split, read and refused beside
// data.valid or with a fourth weight.
TEST(DsConfig, MegatronSampleOrderIsReadAndWhatItCannotBeIsRefused) {
  auto j = base();
  j["data"] = {{"train", "corpus"}, {"sample_order", "megatron"}};
  RunConfig c = ds_config_parse(j, "cfg.json");
  EXPECT_EQ(c.sample_order, "megatron");
  EXPECT_EQ(ds_config_resolved(c)["data"]["sample_order"], "megatron");
  EXPECT_EQ(ds_config_parse(base(), "cfg.json").sample_order, "meshtrain");
  const auto npos = std::string::npos;
  auto k = j;
  k["data"]["shuffle"] = false;
  EXPECT_NE(error_of(k).find("data.shuffle: false with sample_order \"megatron\""), npos) << error_of(k);
  k = j;
  k["seed"] = 4294967296LL;
  EXPECT_NE(error_of(k).find("data.seed: 4294967296 with sample_order \"megatron\""), npos) << error_of(k);
  k["data"]["seed"] = 4294967295LL;
  EXPECT_EQ(error_of(k), "");
  k = j;
  k["task"] = "classification";
  EXPECT_NE(error_of(k).find("task \"classification\": data.sample_order \"megatron\""), npos) << error_of(k);
  k = j;
  k["data"]["split"] = "969, 30, 1";
  c = ds_config_parse(k, "cfg.json");
  EXPECT_EQ(c.split_weights, (std::vector<double>{969, 30, 1}));
  EXPECT_EQ(ds_config_resolved(c)["data"]["split"], "969, 30, 1");
  k["data"]["valid"] = "other";
  EXPECT_NE(error_of(k).find("data.split cuts data.train into training and validation sequences; data.valid"), npos)
      << error_of(k);
  k["data"].erase("valid");
  k["data"]["split"] = "90,5,4,1";
  EXPECT_NE(error_of(k).find("data.split: \"90,5,4,1\": Megatron's split is up to three weights"), npos) << error_of(k);
  // Blends: Megatron's --data-path list, weighted (strings or numbers) or by size; the resolved
  // config keeps the list.
  k = j;
  k["data"]["train"] = {"0.3", "a", 0.7, " b "};
  c = ds_config_parse(k, "cfg.json");
  EXPECT_TRUE(c.train_spec.blend);
  EXPECT_TRUE(c.train_spec.weighted);
  EXPECT_EQ(c.train_spec.paths, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c.train_spec.weights, (std::vector<double>{0.3, 0.7}));
  EXPECT_EQ(ds_config_resolved(c)["data"]["train"], nlohmann::json({0.3, "a", 0.7, "b"}));
  EXPECT_EQ(ds_config_parse(ds_config_resolved(c), "cfg.json").train_spec.paths, c.train_spec.paths);
  k["data"]["train"] = {"a", "b", "c"};
  c = ds_config_parse(k, "cfg.json");
  EXPECT_TRUE(c.train_spec.blend);
  EXPECT_FALSE(c.train_spec.weighted);
  k["data"]["train"] = {"a"};
  EXPECT_FALSE(ds_config_parse(k, "cfg.json").train_spec.blend);  // built alone, as Megatron builds it
  // A weighted list of one: built alone as Megatron's --train-data-path builds it, blended (its
  // 0.5 % surplus) as its --data-path does, which data.split stands for; data.valid alone always.
  k["data"]["train"] = {"1", "a"};
  EXPECT_FALSE(ds_config_parse(k, "cfg.json").train_spec.blend);
  k["data"]["split"] = "9,1";
  EXPECT_TRUE(ds_config_parse(k, "cfg.json").train_spec.blend);
  k["data"].erase("split");
  k["data"]["valid"] = {"1", "a"};
  EXPECT_FALSE(ds_config_parse(k, "cfg.json").valid_spec.blend);
  k["data"].erase("valid");
  k["data"]["train"] = {"1e308", "a", "1e308", "b"};  // parsed; the sum's overflow is refused when the blend is built
  k["data"]["train"] = {"0.3", "a", "b", "c"};
  EXPECT_NE(error_of(k).find("data.train[2]: \"b\" is not a number, but the blend's other weights are numbers; a blend is"), npos)
      << error_of(k);
  k["data"]["train"] = {"1e400", "a", "1", "b"};  // the entry named, and why (two messages ran together)
  EXPECT_NE(error_of(k).find("data.train[0]: \"1e400\" is a number past a double's range"), npos) << error_of(k);
  k["data"]["train"] = {"-1", "a", "2", "b"};
  EXPECT_NE(error_of(k).find("data.train: the weight -1 of a must be a finite number > 0"), npos) << error_of(k);
  k["data"]["train"] = {"0", "a", "2", "b"};  // Megatron asserts it; the blend drew from it on ties
  EXPECT_NE(error_of(k).find("data.train: the weight 0 of a must be a finite number > 0"), npos) << error_of(k);
  k["data"]["train"] = nlohmann::json::array();
  EXPECT_NE(error_of(k).find("data.train must be a dataset"), npos) << error_of(k);
  k = j;
  k["data"]["sample_order"] = "Megatron";
  EXPECT_NE(error_of(k).find("data.sample_order: \"Megatron\" is not an order"), npos) << error_of(k);
}

// model_checkpoint.monitor takes GLUE's metrics: val_mcc (CoLA's), val_f1 (MRPC's and QQP's: label
// 1 of two; refused for three labels) beside val_acc and val_loss ("not a metric" before).
TEST(DsConfig, ModelCheckpointMonitorsGluesMetrics) {
  auto j = base();
  j["task"] = "classification";
  j["model_checkpoint"] = {{"monitor", "val_mcc"}, {"mode", "max"}};
  EXPECT_EQ(error_of(j), "");
  j["model_checkpoint"]["monitor"] = "val_f1";
  EXPECT_EQ(error_of(j), "");
  j["model"]["num_labels"] = 3;
  EXPECT_NE(error_of(j).find("val_f1 is not logged for a single_label_classification model of 3 label(s) (val_loss, "
                             "val_acc, val_mcc); val_f1 is the F1 of label 1 of two (MRPC's, QQP's)"),
            std::string::npos)
      << error_of(j);
  j["model_checkpoint"]["monitor"] = "val_auc";
  EXPECT_NE(error_of(j).find("\"val_auc\" is not a metric meshtrain logs"), std::string::npos) << error_of(j);
  // STS-B's correlations for a regression of one value; multi-label's micro F1.
  j["model"]["num_labels"] = 1;
  j["model_checkpoint"]["monitor"] = "val_spearmanr";
  EXPECT_EQ(error_of(j), "");
  j["model_checkpoint"]["monitor"] = "val_acc";
  EXPECT_NE(error_of(j).find("val_acc is not logged for a regression model of 1 label(s) (val_loss, val_pearson, val_spearmanr)"),
            std::string::npos)
      << error_of(j);
  j["model"]["num_labels"] = 3;
  j["model"]["problem_type"] = "multi_label_classification";
  j["model_checkpoint"]["monitor"] = "val_f1";
  EXPECT_EQ(error_of(j), "");
  j["model_checkpoint"]["monitor"] = "val_pearson";
  EXPECT_NE(error_of(j).find("(val_loss, val_f1)"), std::string::npos) << error_of(j);
}

// loss_normalization: "tokens" read (and kept in the resolved config); what it does not do yet
// refused by key; Megatron's calculate_per_token_loss names it.
TEST(DsConfig, LossNormalisationIsReadAndRefusedWhereNotBuilt) {
  auto j = base();
  j["loss_normalization"] = "tokens";
  RunConfig c = ds_config_parse(j, "cfg.json");
  EXPECT_EQ(c.loss_normalization, "tokens");
  EXPECT_EQ(ds_config_resolved(c)["loss_normalization"], "tokens");
  EXPECT_EQ(ds_config_parse(base(), "cfg.json").loss_normalization, "micro_batch");
  const auto npos = std::string::npos;
  auto k = j;
  k["loss_normalization"] = "sequence";
  EXPECT_NE(error_of(k).find("loss_normalization: \"sequence\" is not a normalization"), npos) << error_of(k);
  k = j;
  k["task"] = "classification";
  EXPECT_NE(error_of(k).find("task \"classification\": loss_normalization \"tokens\""), npos) << error_of(k);
  k = j;
  k["curriculum_learning"] = {{"enabled", true}, {"curriculum_type", "seqlen"}, {"min_difficulty", 8}, {"max_difficulty", 16},
                              {"schedule_type", "fixed_linear"},
                              {"schedule_config", {{"total_curriculum_step", 10}, {"difficulty_step", 8}}}};
  EXPECT_NE(error_of(k).find("loss_normalization \"tokens\": not with curriculum_learning yet"), npos) << error_of(k);
  EXPECT_NE(error_of(with("calculate_per_token_loss", true)).find("(meshtrain's is loss_normalization \"tokens\")"), npos);
}

// data.reset_position_ids / data.reset_attention_mask read (and kept in the resolved config);
// refused where the documents are not built: on cuda, the mask with sparse_attention, and for
// classification.
TEST(DsConfig, DocumentResetsAreReadAndRefusedWhereNotBuilt) {
  auto j = base();
  j["data"]["reset_position_ids"] = true;
  RunConfig c = ds_config_parse(j, "cfg.json");
  EXPECT_TRUE(c.reset_position_ids);
  EXPECT_FALSE(c.reset_attention_mask);
  EXPECT_EQ(ds_config_resolved(c)["data"]["reset_position_ids"], true);
  EXPECT_FALSE(ds_config_resolved(c)["data"].contains("reset_attention_mask"));
  j["data"]["reset_attention_mask"] = true;
  c = ds_config_parse(j, "cfg.json");
  EXPECT_TRUE(c.reset_attention_mask);
  EXPECT_TRUE(ds_config_parse(ds_config_resolved(c), "resolved").reset_attention_mask);
  const auto npos = std::string::npos;
  auto k = j;
  k["device"] = "cuda";
  EXPECT_NE(error_of(k).find("data.reset_position_ids: not on device \"cuda\" yet"), npos) << error_of(k);
  k = j;
  k["sparse_attention"] = {{"mode", "fixed"}, {"block", 4}};
  EXPECT_NE(error_of(k).find("data.reset_attention_mask: not with sparse_attention"), npos) << error_of(k);
  k["data"]["reset_attention_mask"] = false;  // positions alone do not touch the attention's layout
  EXPECT_NO_THROW(ds_config_parse(k, "cfg.json"));
  k = j;
  k["task"] = "classification";
  EXPECT_NE(error_of(k).find("task \"classification\": data.reset_position_ids and data.reset_attention_mask"), npos)
      << error_of(k);
}

// A key twice in one object was read as its last value without a word (DeepSpeed refuses it);
// the same key in two objects is fine.
TEST(DsConfig, ADuplicateKeyIsRefusedNamingIt) {
  const ScratchDir dir;
  const std::string path = dir.file("dup.json");
  std::ofstream(path) << R"({"train_iters": 6, "optimizer": {"params": {"lr": 1e-3}}, "scheduler": {"params": {"lr": 2}},
                             "train_iters": 3})";
  try {
    json_load_file(path);
    FAIL() << "a duplicate key was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("dup.json: key \"train_iters\" appears twice in one object"), std::string::npos)
        << e.what();
  }
  std::ofstream(path) << R"({"a": {"lr": 1}, "b": {"lr": 2}, "c": [{"x": 1}, {"x": 2}]})";
  EXPECT_EQ(json_load_file(path)["b"]["lr"], 2);
}

TEST(DsConfig, FieldErrorsNameTheKeyAndSetOverrides) {
  auto j = base();
  j["seq_length"] = "long";
  EXPECT_NE(error_of(j).find("seq_length"), std::string::npos);
  j = base();
  j["model"]["n_head"] = 5;
  EXPECT_NE(error_of(j).find("n_head"), std::string::npos);
  j = base();
  ds_config_set(j, "fp16.enabled=true");
  ds_config_set(j, "optimizer.params.lr=0.5");
  ds_config_set(j, "data.train=corpus");
  RunConfig c = ds_config_parse(j, "cfg.json");
  EXPECT_EQ(c.compute_dtype, DType::kF16);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.5);
  EXPECT_EQ(c.data_train, "corpus");
  EXPECT_THROW(ds_config_set(j, "novalue"), Error);
}

// Inputs found by fuzz/ds_config_fuzz.cpp (and its review) that used to crash, hit undefined
// behaviour or escape as a non-mt::Error exception; each is now an Error naming the key.
TEST(DsConfig, HostileValuesAreErrorsNamingTheKey) {
  auto expect = [](nlohmann::json j, const std::string& needle) {
    std::string e = error_of(std::move(j));
    EXPECT_NE(e.find(needle), std::string::npos) << "error '" << e << "' lacks '" << needle << "'";
  };
  auto j = base();
  j["model"] = ::testing::TempDir();  // a directory: its ext4 size 2^63 - 1 threw std::bad_alloc
  expect(j, "is a directory");
  j = base();
  j["train_iters"] = 1e30;  // double -> int64 out of range: undefined
  expect(j, "train_iters is out of range");
  j = base();
  j["seed"] = 18446744073709551615u;  // wrapped to -1
  expect(j, "seed is out of range");
  j = base();
  j["zero_optimization"] = {{"stage", 4294967296}};  // wrapped to stage 0
  expect(j, "zero_optimization.stage is out of range");
  j = base();
  j["train_batch_size"] = INT64_MIN;  // INT64_MIN / -1: SIGFPE
  j["train_micro_batch_size_per_gpu"] = -1;
  expect(j, "must be positive");
  j = base();
  j["train_micro_batch_size_per_gpu"] = int64_t{1} << 62;  // (2^62 * 4) overflowed int64
  j["gradient_accumulation_steps"] = 4;
  expect(j, "overflows");
  j = base();
  j["model"]["vocab_size"] = 4294967393;  // 2^32 + 97, read as 97
  expect(j, "'vocab_size' is out of range");
  j = base();
  j["model"].erase("n_head");
  j["model"]["n_embd"] = 1073741824;  // the default n_inner 4 * n_embd overflowed int
  expect(j, "n_embd");
  j = base();
  j["model"]["initializer_range"] = -0.02;  // was taken: std of a normal draw
  expect(j, "model.initializer_range: must be >= 0");
  j = base();
  j["model"]["layer_norm_epsilon"] = 1e300;  // infinite as a float: every norm's output 0
  expect(j, "model.layer_norm_epsilon: must be positive and finite");
  const ScratchDir dir;
  std::string deep = dir.file("deep-model.json");  // overflowed the stack when copied
  FILE* f = std::fopen(deep.c_str(), "w");
  std::fputs(("{\"x\": " + std::string(200000, '[') + std::string(200000, ']') + "}").c_str(), f);
  std::fclose(f);
  j = base();
  j["model"] = deep;
  expect(j, "nested deeper than 1000 levels");
}

TEST(DsConfig, SetRefusesWhatLaterBreaksTheConfig) {
  nlohmann::json number = 1;  // a config file holding `1`: operator[] threw json::type_error
  EXPECT_THROW(ds_config_set(number, "seq_length=8"), Error);
  auto j = base();  // a plain-string value that is not UTF-8: the printed config threw
  try {
    ds_config_set(j, "data.train=\xff");
    FAIL() << "accepted a value that is not UTF-8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not valid UTF-8"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(ds_config_resolved(ds_config_parse(j, "cfg.json")).dump());
}

// What `config check` prints is itself a valid configuration that resolves to the same thing,
// for every optimizer and schedule kind.
TEST(DsConfig, ResolvedFormParsesBackToItself) {
  std::vector<nlohmann::json> extras = {
      nlohmann::json::object(),
      {{"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}, {"momentum", 0.9}, {"nesterov", true}}}}},
       {"scheduler", {{"type", "OneCycle"}, {"params", {{"cycle_min_lr", 0.01}, {"cycle_max_lr", 0.1}, {"cycle_first_stair_count", 3}}}}}},
      {{"scheduler", {{"type", "LRRangeTest"}, {"params", {{"lr_range_test_step_size", 10}, {"lr_range_test_staircase", true}}}}}},
      {{"optimizer", {{"type", "Lamb"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.01}}}}},
       {"scheduler", {{"type", "WarmupCosineLR"}, {"params", {{"warmup_num_steps", 5}, {"total_num_steps", 40}}}}},
       {"no_weight_decay", "hf"}, {"activation_checkpointing", nlohmann::json::object()}, {"bf16", {{"enabled", true}}}},
      {{"fp16", {{"enabled", true}, {"loss_scale", 0}, {"hysteresis", 4}}},
       {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 10}, {"warmup_type", "linear"}}}}}},
      {{"optimizer", {{"type", "ZeroOneAdam"}, {"params", {{"lr", 0.01}, {"var_freeze_step", 7}, {"var_update_scaler", 2},
                                                           {"local_step_scaler", 3}, {"local_step_clipper", 4}}}}}},
      {{"optimizer", {{"type", "OneBitLamb"}, {"params", {{"lr", 0.01}, {"freeze_step", 9}, {"coeff_beta", 0.8},
                                                          {"factor_max", 3.0}, {"factor_min", 0.25}, {"factor_threshold", 0.2},
                                                          {"max_coeff", 0.3}}}}}},
  };
  for (const auto& extra : extras) {
    nlohmann::json j = base();
    j.update(extra);
    nlohmann::json once = ds_config_resolved(ds_config_parse(j, "a.json"));
    RunConfig again = ds_config_parse(once, "resolved.json");
    EXPECT_TRUE(again.warnings.empty()) << again.warnings.front();
    EXPECT_EQ(ds_config_resolved(again), once) << extra.dump();
  }
}

}  // namespace
}  // namespace mt::engine

namespace mt::engine {
namespace {

bool has_line(const std::vector<std::string>& lines, const std::string& start) {
  return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return l.rfind(start, 0) == 0; });
}

// Issue 12: a bare Hugging Face-style ds_config (no model, batch keys "auto") is checked alone and
// every "auto" it resolves is said once.
TEST(DsCompat, ABareAutoConfigIsValidAndSaysWhatAutoBecame) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
    "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"},
    "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}}
  })");
  EXPECT_NE(error_of(j).find("model: missing"), std::string::npos);  // a run needs a model
  RunConfig c = ds_config_parse(j, "ds.json", 2, /*allow_bare=*/true);  // was: "train_batch_size or ... must be given"
  EXPECT_TRUE(c.bare);
  EXPECT_EQ(c.batch.micro_batch_per_gpu, 8);
  EXPECT_EQ(c.batch.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.batch.train_batch_size, 16);
  EXPECT_TRUE(has_line(c.notes, "train_micro_batch_size_per_gpu: \"auto\" -> 8"));
  EXPECT_TRUE(has_line(c.notes, "train_batch_size: \"auto\" -> 16"));
  EXPECT_TRUE(has_line(c.notes, "zero_optimization.reduce_bucket_size: \"auto\""));
  // Derived from the numbers given where they determine it (DeepSpeed's rule), and said so.
  j["train_batch_size"] = 32;
  j["gradient_accumulation_steps"] = 4;
  c = ds_config_parse(j, "ds.json", 2, true);
  EXPECT_EQ(c.batch.micro_batch_per_gpu, 4);
  EXPECT_TRUE(has_line(c.notes, "train_micro_batch_size_per_gpu: \"auto\" -> 4 (train_batch_size /"));
  // No batch key at all: as "auto" (Hugging Face's Trainer supplies them).
  j = base();
  j.erase("train_micro_batch_size_per_gpu");
  c = ds_config_parse(j, "cfg.json");
  EXPECT_EQ(c.batch.micro_batch_per_gpu, 8);
  j["train_batch_size"] = 0;  // 0 is not "absent"
  EXPECT_NE(error_of(j).find("train_batch_size: must be positive"), std::string::npos);
}

TEST(DsCompat, ABlockWithoutEnabledIsARequestOrSaysItIsOff) {
  auto j = base();
  // sparse_attention has no switch: the block is the request, and it is implemented.
  j["sparse_attention"] = {{"mode", "fixed"}, {"block", 8}};
  RunConfig c = ds_config_parse(j, "cfg.json");
  ASSERT_TRUE(c.sparse_attention.has_value());
  EXPECT_EQ(c.sparse_attention->block, 8);
  EXPECT_STREQ(kernels::sparsity_mode_name(c.sparse_attention->pattern), "fixed");
  j["sparse_attention"] = {{"mode", "fixed"}, {"block", 32}};  // 16 tokens are not whole blocks
  EXPECT_NE(error_of(j).find("sparse_attention.block"), std::string::npos);
  j["sparse_attention"] = {{"mode", "strided"}};
  EXPECT_NE(error_of(j).find("sparse_attention.mode: 'strided'"), std::string::npos);
  j["sparse_attention"] = {{"mode", "fixed"}, {"block", 8}, {"num_local_blocks", 3}, {"num_global_blocks", 2}};
  EXPECT_NE(error_of(j).find("sparse_attention."), std::string::npos);  // DeepSpeed: local % global
  // A switched block given without its switch is off in DeepSpeed: said in one line.
  j = base();
  j["curriculum_learning"] = {{"curriculum_type", "seqlen"}, {"min_difficulty", 8}};
  c = ds_config_parse(j, "cfg.json");
  EXPECT_TRUE(has_line(c.warnings, "curriculum_learning: has no \"enabled\" key, so it is off"));
  // ...and a nested switch turned on is a request (compression_training's techniques).
  j = base();
  j["compression_training"] = {{"weight_quantization", {{"shared_parameters", {{"enabled", true}}}}}};
  EXPECT_NE(error_of(j).find("compression_training is not supported"), std::string::npos);
  // Switches by Python's truth, as DeepSpeed tests them: 1, "true" (and "false") turn a feature on.
  // Only true counted: these trained without the feature and without a word.
  for (const nlohmann::json& on : {nlohmann::json{{"amp", {{"enabled", 1}}}}, nlohmann::json{{"amp", {{"enabled", "true"}}}},
                                   nlohmann::json{{"elasticity", {{"enabled", 1}, {"max_train_batch_size", 64}}}},
                                   nlohmann::json{{"progressive_layer_drop", {{"enabled", 1}}}},
                                   // DeepSpeed reads data_efficiency's nested switches by themselves.
                                   nlohmann::json{{"data_efficiency",
                                                   {{"enabled", false}, {"data_routing", {{"random_ltd", {{"enabled", true}}}}}}}}}) {
    j = base();
    j.update(on);
    EXPECT_NE(error_of(j).find("is not supported yet (it would change what is trained)"), std::string::npos) << on.dump();
  }
  // hybrid_engine is a pydantic model in DeepSpeed: its bool reads "false", "off" and 0 as off
  // (refused as on before), "yes" and 1 as on, and refuses what is not a bool.
  for (const nlohmann::json& on : {nlohmann::json{{"hybrid_engine", {{"enabled", "Yes"}}}},
                                   nlohmann::json{{"hybrid_engine", {{"enabled", 1}}}}}) {
    j = base();
    j.update(on);
    EXPECT_NE(error_of(j).find("hybrid_engine is not supported yet"), std::string::npos) << on.dump();
  }
  j = base();
  j["hybrid_engine"] = {{"enabled", false}, {"max_out_token", 256}};  // DeepSpeed's model forbids unknown keys
  EXPECT_NE(error_of(j).find("hybrid_engine.max_out_token: not a key of DeepSpeed's hybrid_engine"), std::string::npos)
      << error_of(j);
  for (const nlohmann::json& bad : {nlohmann::json{{"hybrid_engine", {{"enabled", "maybe"}}}},
                                    nlohmann::json{{"hybrid_engine", {{"enabled", 2}}}},
                                    nlohmann::json{{"hybrid_engine", {{"enabled", nullptr}}}}}) {
    j = base();
    j.update(bad);
    EXPECT_NE(error_of(j).find("hybrid_engine.enabled: " + bad["hybrid_engine"]["enabled"].dump() + " is not a boolean"),
              std::string::npos)
        << bad.dump() << ": " << error_of(j);
  }
  for (const nlohmann::json& off : {nlohmann::json{{"amp", {{"enabled", 0}}}}, nlohmann::json{{"sparse_gradients", nullptr}},
                                    nlohmann::json{{"sparse_gradients", false}}, nlohmann::json{{"hybrid_engine", {{"enabled", "false"}}}},
                                    nlohmann::json{{"hybrid_engine", {{"enabled", "OFF"}}}},
                                    nlohmann::json{{"hybrid_engine", {{"enabled", 0}, {"max_out_tokens", 256}}}}}) {
    j = base();
    j.update(off);
    EXPECT_NO_THROW(ds_config_parse(j, "cfg.json")) << off.dump();
  }
  // sparse_gradients is how DeepSpeed's stage 0 exchanges the embeddings' gradients (their non-zero
  // rows), not what they sum to: one warning line when on, by Python's truth; nothing when off.
  for (const nlohmann::json& on : {nlohmann::json(true), nlohmann::json(1), nlohmann::json("true")}) {
    j = base();
    j["sparse_gradients"] = on;
    c = ds_config_parse(j, "cfg.json");
    EXPECT_TRUE(has_line(c.warnings, "sparse_gradients: the embeddings' gradients are all-reduced dense")) << on.dump();
  }
  j = base();
  j["sparse_gradients"] = false;
  c = ds_config_parse(j, "cfg.json");
  for (const std::string& w : c.warnings) EXPECT_EQ(w.find("sparse_gradients"), std::string::npos) << w;
  // A classifier's data keys given to a causal LM (whose windows are seq_length long already):
  // one line names them all, false and a field name alike (a false one was accepted without a word).
  j = base();
  j["data"]["pad_to_max_length"] = false;
  j["data"]["label_name"] = "label";
  c = ds_config_parse(j, "cfg.json");
  EXPECT_TRUE(has_line(c.warnings, "data.label_name, data.pad_to_max_length: apply to \"task\": \"classification\"")) << j.dump();
  int lines = 0;
  for (const std::string& w : c.warnings) lines += w.find("apply to \"task\"") != std::string::npos;
  EXPECT_EQ(lines, 1);
  j = base();
  c = ds_config_parse(j, "cfg.json");
  for (const std::string& w : c.warnings) EXPECT_EQ(w.find("apply to \"task\""), std::string::npos) << w;
}

// sparse_attention's keys as DeepSpeed's config reader (runtime/config.py) passes them: bigbird's
// num_random_blocks defaults to 0 there (1 was taken, its class's default: random blocks DeepSpeed
// does not train), and its `attention` is not passed to BigBird or BSLongformer (read here: a
// unidirectional bigbird drew its random blocks below the diagonal).
TEST(DsCompat, SparseAttentionKeysAreDeepSpeedsReaders) {
  auto j = base();
  j["sparse_attention"] = {{"mode", "bigbird"}, {"block", 8}};
  RunConfig c = ds_config_parse(j, "cfg.json");
  ASSERT_TRUE(c.sparse_attention.has_value());
  EXPECT_EQ(std::get<kernels::BigBirdSparsity>(c.sparse_attention->pattern).num_random_blocks, 0);
  for (const char* mode : {"bigbird", "bslongformer"}) {
    j["sparse_attention"] = {{"mode", mode}, {"block", 8}, {"attention", "unidirectional"}};
    c = ds_config_parse(j, "cfg.json");
    EXPECT_TRUE(has_line(c.warnings, "sparse_attention.attention: ignored: DeepSpeed's")) << mode;
    if (std::string(mode) == "bigbird") {
      EXPECT_EQ(std::get<kernels::BigBirdSparsity>(c.sparse_attention->pattern).attention,
                kernels::SparseDirection::kBidirectional);
    }
  }
}

TEST(DsCompat, GradientAveragingKeysAndPermissionKeys) {
  auto j = base();
  j["gradient_predivide_factor"] = 8.0;
  RunConfig c = ds_config_parse(j, "cfg.json", 2);
  EXPECT_EQ(c.gradient_predivide_factor, 8.0);
  EXPECT_FALSE(c.prescale_gradients);
  j["prescale_gradients"] = true;
  c = ds_config_parse(j, "cfg.json", 2);
  EXPECT_TRUE(c.prescale_gradients);
  EXPECT_TRUE(has_line(c.warnings, "gradient_predivide_factor: ignored because prescale_gradients is true"));
  j["gradient_predivide_factor"] = 0.0;
  EXPECT_NE(error_of(j).find("gradient_predivide_factor: must be a positive number"), std::string::npos);
  j = base();
  j["optimizer"] = {{"type", "AdamW"}};  // (none given is said)
  j["zero_allow_untested_optimizer"] = true;
  j["zero_optimization"] = {{"stage", 1}, {"elastic_checkpoint", true}, {"reduce_bucket_size", 0}};
  c = ds_config_parse(j, "cfg.json", 2);
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();  // implemented: no "has no effect" line
  j["communication_data_type"] = "fp8";
  EXPECT_NE(error_of(j).find("communication_data_type: 'fp8' is not a DeepSpeed communication type"), std::string::npos);
  j["optimizer"] = {{"type", "Adam"}, {"params", {{"lr", 1e-3}, {"bias_correction", false}}}};
  j.erase("communication_data_type");
  c = ds_config_parse(j, "cfg.json", 2);
  EXPECT_FALSE(c.optimizer.bias_correction);  // was: refused
}

// --deepspeed: the user's file untouched beside our run file; keys in both must agree, "auto"
// yields, flags and --set come last.
TEST(DsCompat, DeepSpeedFileMergesWithTheRunFile) {
  const ScratchDir scratch("ds_compat");
  const std::string d = scratch.path();
  nlohmann::json run = base();
  run["gradient_clipping"] = 0.5;
  run["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}};
  std::ofstream(d + "/run.json") << run.dump();
  std::ofstream(d + "/ds.json") << R"({"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto",
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": 0.1}}, "zero_optimization": {"stage": 1}})";
  ConfigSources s;
  s.config = d + "/run.json";
  s.deepspeed = d + "/ds.json";
  RunConfig c = ds_config_load(s, 2);
  EXPECT_EQ(c.batch.micro_batch_per_gpu, 2);  // the run file's number fills the DeepSpeed "auto"
  EXPECT_EQ(c.gradient_clipping, 0.5);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.1);  // only in the DeepSpeed file
  EXPECT_EQ(c.zero.stage, 1);
  std::ofstream(d + "/ds2.json") << R"({"gradient_clipping": 1.0})";
  s.deepspeed = d + "/ds2.json";
  try {
    ds_config_load(s, 2);
    ADD_FAILURE() << "a disagreement was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gradient_clipping: " + d + "/run.json says 0.5 and " + d + "/ds2.json says 1.0"),
              std::string::npos) << e.what();
  }
  // --set decides, as the message says (the merge refused before the --set was applied); a --set
  // of a parent key decides the keys under it.
  s.sets = {"gradient_clipping=0.25"};
  EXPECT_EQ(ds_config_load(s, 2).gradient_clipping, 0.25);
  std::ofstream(d + "/ds3.json") << R"({"optimizer": {"type": "AdamW", "params": {"lr": 2e-3}}})";
  s.deepspeed = d + "/ds3.json";
  s.sets = {};
  EXPECT_THROW(ds_config_load(s, 2), Error);
  s.sets = {"optimizer.params.lr=5e-4"};
  EXPECT_DOUBLE_EQ(ds_config_load(s, 2).optimizer.lr, 5e-4);
  s.sets = {"optimizer.params={\"lr\": 4e-4}"};
  EXPECT_DOUBLE_EQ(ds_config_load(s, 2).optimizer.lr, 4e-4);
  s.sets = {"optimizer.params.weight_decay=0"};  // another key: the lr still disagrees
  EXPECT_THROW(ds_config_load(s, 2), Error);
  s.deepspeed = d + "/ds2.json";
  // --deepspeed with --model / --data and no run file.
  nlohmann::json model = base()["model"];
  std::ofstream(d + "/config.json") << model.dump();
  ConfigSources f;
  f.deepspeed = d + "/ds.json";
  f.model = d + "/config.json";
  f.data = d + "/corpus";
  f.sets = {"train_iters=5", "seq_length=16"};
  c = ds_config_load(f, 1);
  EXPECT_EQ(c.model.hidden, 48);
  EXPECT_EQ(c.data_train, d + "/corpus");
  EXPECT_EQ(c.batch.micro_batch_per_gpu, 8);
  EXPECT_EQ(c.train_iters, 5);
  f.model = d + "/nothing.json";
  EXPECT_THROW(ds_config_load(f, 1), Error);
}

// From a probe of the configuration surface: each message names where its value came from, and
// what two files say alike is not a disagreement.
TEST(DsCompat, MessagesNameWhereTheValueCameFrom) {
  const ScratchDir scratch("ds_where");
  const std::string d = scratch.path();
  auto error_of_load = [](const ConfigSources& s) -> std::string {
    try {
      ds_config_load(s, 1);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  nlohmann::json run = base();
  run["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}};
  std::ofstream(d + "/run.json") << run.dump();
  // A bad --set value is the --set's (it was "run.json: train_iters must be an integer").
  ConfigSources s;
  s.config = d + "/run.json";
  s.sets = {"train_iters="};
  EXPECT_EQ(error_of_load(s).rfind("--set train_iters=: train_iters", 0), 0u) << error_of_load(s);
  s.sets = {"seq_length=8", "seed=-1"};
  EXPECT_EQ(error_of_load(s), "--set seed=-1: seed: -1 is negative (numpy's and Hugging Face's set_seed refuse one too)");
  // A disagreement no --set settles is still the files', whatever else --set says.
  std::ofstream(d + "/clip.json") << R"({"gradient_clipping": 1.0})";
  run["gradient_clipping"] = 0.5;
  std::ofstream(d + "/run-clip.json") << run.dump();
  ConfigSources clip;
  clip.config = d + "/run-clip.json";
  clip.deepspeed = d + "/clip.json";
  clip.sets = {"seed=3"};
  EXPECT_EQ(error_of_load(clip).rfind(d + "/run-clip.json: gradient_clipping: " + d + "/run-clip.json says 0.5", 0), 0u)
      << error_of_load(clip);
  // DeepSpeed reads optimizer.type case-blind: "AdamW" beside "adamw" is one optimizer.
  std::ofstream(d + "/lower.json") << R"({"optimizer": {"type": "adamw", "params": {"lr": "auto"}}})";
  ConfigSources lower;
  lower.config = d + "/run.json";
  lower.deepspeed = d + "/lower.json";
  EXPECT_EQ(error_of_load(lower), "");
  EXPECT_EQ(ds_config_load(lower, 1).optimizer.type, "AdamW");
  // total_num_steps "auto" without train_iters: the message is train_iters' (it said the scheduler's
  // total must be positive).
  std::ofstream(d + "/decay.json") << R"({"train_micro_batch_size_per_gpu": 2, "scheduler": {"type": "WarmupDecayLR",
    "params": {"warmup_num_steps": 1, "total_num_steps": "auto"}}})";
  std::ofstream(d + "/config.json") << base()["model"].dump();
  ConfigSources decay;
  decay.deepspeed = d + "/decay.json";
  decay.model = d + "/config.json";
  EXPECT_NE(error_of_load(decay).find("scheduler.params.total_num_steps: \"auto\" is train_iters, which is not given (a DeepSpeed "
                                      "config has none: --set train_iters=N)"),
            std::string::npos)
      << error_of_load(decay);
  decay.sets = {"train_iters=10"};
  EXPECT_EQ(ds_config_load(decay, 1).scheduler.total_num_steps, 10);
  // Negative seeds were read as 2^64 - 1 and 2^64 - 2.
  EXPECT_EQ(error_of(with("seed", -1)), "seed: -1 is negative (numpy's and Hugging Face's set_seed refuse one too)");
  EXPECT_NE(error_of(with("data", {{"seed", -2}})).find("data.seed: -2 is negative"), std::string::npos)
      << error_of(with("data", {{"seed", -2}}));
  // eval_interval without a validation set: one warning (it was ignored without a word).
  auto warned = [](const RunConfig& c, const std::string& what) {
    return std::any_of(c.warnings.begin(), c.warnings.end(), [&](const std::string& w) { return w.find(what) != std::string::npos; });
  };
  EXPECT_TRUE(warned(ds_config_parse(with("eval_interval", 5), "cfg.json"),
                     "eval_interval: 5, but neither data.valid nor data.split gives a validation set: no validation runs"));
  nlohmann::json v = with("eval_interval", 5);
  v["data"] = {{"valid", "some/prefix"}};
  EXPECT_FALSE(warned(ds_config_parse(v, "cfg.json"), "no validation runs"));
  // A NUL in a key ended the printed warning there.
  nlohmann::json nul = base();
  nul[std::string("seq_lengt\0h", 11)] = 1;
  EXPECT_TRUE(warned(ds_config_parse(nul, "cfg.json"), "seq_lengt\\u0000h: unknown key"));
  // The message of --set parallel.pp=8 begins with parallel.tp: it blamed the file (stop 73).
  s.sets = {"parallel.pp=8"};
  const std::string pp = error_of_load(s);
  EXPECT_EQ(pp.rfind("--set parallel.pp=8: parallel.tp (1) x parallel.pp (8)", 0), 0u) << pp;
  // A misspelt model field kept its default without a word (a 12-layer model for n_layr 2); a
  // hub config.json's other keys (bos_token_id, use_cache) say nothing (stop 73).
  nlohmann::json typo = base();
  typo["model"].erase("n_layer");
  typo["model"]["n_layr"] = 2;
  typo["model"]["bos_token_id"] = 96;
  typo["model"]["use_cache"] = true;
  const RunConfig tc = ds_config_parse(typo, "cfg.json");
  EXPECT_TRUE(warned(tc, "cfg.json: model: field 'n_layr' is not read, and 'n_layer' keeps its default (did you mean 'n_layer'?)"));
  EXPECT_EQ(std::count_if(tc.warnings.begin(), tc.warnings.end(),
                          [](const std::string& w) { return w.find("is not read") != std::string::npos; }),
            1);
  EXPECT_FALSE(warned(ds_config_parse(base(), "cfg.json"), "is not read"));
  // Hugging Face's TrainingArguments pasted in: save_total_limit was "unknown key, ignored" with no
  // hint (3 checkpoints kept); learning_rate trained at the default lr with that warning (stop 73).
  const RunConfig hf = ds_config_parse(with("save_total_limit", 2), "cfg.json");
  EXPECT_TRUE(warned(hf, "save_total_limit: Hugging Face's TrainingArguments field is not read here; meshtrain's is keep_last"));
  EXPECT_FALSE(warned(hf, "unknown key"));
  // data.eod_id given: checked whether read or not, and said when nothing reads it (500 beside a
  // vocabulary of 97 passed in silence without eod_mask_loss, stop 73).
  EXPECT_EQ(error_of(with("data", {{"eod_id", 500}})), "data.eod_id: 500 is outside the model's vocabulary [0, 97)");
  EXPECT_EQ(error_of(with("data", {{"eod_id", -1}})), "data.eod_id: -1 is not a token id (>= 0)");
  EXPECT_TRUE(warned(ds_config_parse(with("data", {{"eod_id", 5}}), "cfg.json"),
                     "data.eod_id: read by data.eod_mask_loss, reset_position_ids and reset_attention_mask, none of which is on"));
  EXPECT_FALSE(warned(ds_config_parse(with("data", {{"eod_id", 5}, {"eod_mask_loss", true}}), "cfg.json"), "data.eod_id"));
  constexpr size_t npos = std::string::npos;
  // The layout's blocks: an unread key was warned and the run trained another layout, dp 2 at twice
  // the batch (parallel.ppp, pipeline.num_stages); two settings that differ won in silence (stop 73).
  EXPECT_NE(error_of(with("parallel", {{"ppp", 2}}), 2).find("parallel.ppp: unknown key (did you mean 'pp'?)"), npos)
      << error_of(with("parallel", {{"ppp", 2}}), 2);
  EXPECT_NE(error_of(with("pipeline", {{"num_stages", 2}}), 2).find("pipeline.num_stages: unknown key"), npos);
  EXPECT_EQ(error_of(with("parallel", {{"pp", 2}, {"dp", 1}}), 2), "");
  EXPECT_NE(error_of(with("pipeline", {{"partition", "uniform"}, {"partition_method", "parameters"}})).find("differ"), npos);
  nlohmann::json both = with("pipeline", {{"partition", "uniform"}});
  both["parallel"] = {{"partition", "parameters"}};
  EXPECT_NE(error_of(both).find("parallel.partition (\"parameters\") and pipeline.partition (\"uniform\") differ"), npos)
      << error_of(both);
  nlohmann::json interval = with("pipeline", {{"activation_checkpoint_interval", 1}});
  interval["activation_checkpointing"] = {{"enabled", false}};
  EXPECT_NE(error_of(interval).find("activation_checkpointing.enabled: false, and pipeline.activation_checkpoint_interval 1"),
            npos) << error_of(interval);
  EXPECT_NE(error_of(with("checkpoint_activations", true)).find("Megatron-LM's argument is not read here"), npos);
  EXPECT_NE(error_of(with("pipeline", {{"partition_method", "type:transformer"}})).find("pipeline.partition_method: \"type:transformer\""),
            npos);
  EXPECT_EQ(error_of(with("learning_rate", 1e-3)),
            "learning_rate: Hugging Face's TrainingArguments field is not read here (meshtrain's is optimizer.params.lr)");
}

// Items stop 73's note left (stop 74): DeepSpeed's documented defaults are accepted quietly, a
// wrong type is refused, and a message names the key the user gave.
TEST(DsCompat, DeepSpeedDefaultsPassQuietlyAndMessagesNameTheKeyGiven) {
  constexpr size_t npos = std::string::npos;
  auto count = [](const RunConfig& c, const std::string& what) {
    return std::count_if(c.warnings.begin(), c.warnings.end(), [&](const std::string& w) { return w.find(what) != npos; });
  };
  // DeepSpeed's documented activation_checkpointing block, at its defaults: four "no effect" lines before.
  const RunConfig ac = ds_config_parse(with("activation_checkpointing", {{"partition_activations", false},
                                                                         {"cpu_checkpointing", false},
                                                                         {"contiguous_memory_optimization", false},
                                                                         {"number_checkpoints", nullptr},
                                                                         {"synchronize_checkpoint_boundary", false},
                                                                         {"profile", false}}),
                                       "cfg.json");
  EXPECT_EQ(count(ac, "activation_checkpointing"), 0);
  EXPECT_TRUE(ac.activation_checkpointing);
  EXPECT_EQ(count(ds_config_parse(with("activation_checkpointing", {{"profile", true}}), "cfg.json"),
                  "activation_checkpointing.profile: true has no effect"),
            1);
  EXPECT_EQ(count(ds_config_parse(with("activation_checkpointing", {{"number_checkpoints", 4}}), "cfg.json"),
                  "activation_checkpointing.number_checkpoints: has no effect"),
            1);
  EXPECT_EQ(error_of(with("activation_checkpointing", {{"profile", "yes"}})), "activation_checkpointing.profile must be true or false");
  EXPECT_NE(error_of(with("activation_checkpointing", {{"number_checkpoints", 0}})).find("must be null or a count >= 1"), npos);
  // adam_w_mode, which DeepSpeed's engine pops for Adam and AdamW: beside AdamW it was refused as an
  // unknown key; Adam's L2 mode without decay (AdamW's update exactly) was refused as not implemented.
  auto adam = [](const char* type, nlohmann::json params) {
    return with("optimizer", {{"type", type}, {"params", std::move(params)}});
  };
  EXPECT_EQ(error_of(adam("AdamW", {{"lr", 1e-3}, {"adam_w_mode", true}})), "");
  const RunConfig aw = ds_config_parse(adam("AdamW", {{"lr", 1e-3}, {"adam_w_mode", false}, {"weight_decay", 0.1}}), "cfg.json");
  EXPECT_TRUE(aw.optimizer.adam_w_mode);
  EXPECT_EQ(count(aw, "optimizer.params.adam_w_mode: false is not read for type AdamW"), 1);
  const RunConfig l2 = ds_config_parse(adam("Adam", {{"lr", 1e-3}, {"adam_w_mode", false}}), "cfg.json");
  EXPECT_TRUE(l2.optimizer.adam_w_mode);
  EXPECT_EQ(l2.optimizer.weight_decay, 0.0);
  EXPECT_EQ(error_of(adam("Adam", {{"lr", 1e-3}, {"adam_w_mode", false}, {"torch_adam", true}})), "");  // torch.optim.Adam, wd 0
  // With a decay: Adam's L2 mode (refused until stop 77; trained against torch.optim.Adam in
  // Train.OptimizerVariantsMatchPyTorch's adam_l2 variants).
  const RunConfig l2_decay = ds_config_parse(adam("Adam", {{"lr", 1e-3}, {"adam_w_mode", false}, {"weight_decay", 0.1}}), "cfg.json");
  EXPECT_FALSE(l2_decay.optimizer.adam_w_mode);
  EXPECT_EQ(l2_decay.optimizer.weight_decay, 0.1);
  // DeepSpeed's own default pipeline.partition "best" (which its PipelineModule does not read):
  // PipelineModule's default "parameters" trains; it was refused.
  nlohmann::json best = with("pipeline", {{"stages", 2}, {"partition", "best"}});
  EXPECT_EQ(error_of(best, 2), "");
  EXPECT_EQ(ds_config_parse(best, "cfg.json", 2).partition, "parameters");
  // pipeline.stages that does not divide the processes was named as parallel.tp x parallel.pp.
  const std::string stages = error_of(with("pipeline", {{"stages", 2}}), 3);
  EXPECT_EQ(stages.rfind("pipeline.stages (2) does not divide the 3 process(es)", 0), 0u) << stages;
  // partition_activations' sequence parallelism was named as parallel.sequence_parallel.
  nlohmann::json pa = with("activation_checkpointing", {{"partition_activations", true}});
  pa["parallel"] = {{"tp", 2}};
  pa["train_micro_batch_size_per_gpu"] = 1;
  pa["seq_length"] = 15;
  const std::string sp = error_of(pa, 2);
  EXPECT_EQ(sp.rfind("activation_checkpointing.partition_activations (sequence parallelism with tp > 1) splits", 0), 0u) << sp;
  // fixed_discrete's max_step out of order: DeepSpeed takes the last difficulty past the last entry
  // (64 at step 4 of [6, 3]), the first match gave 16 here; refused.
  nlohmann::json disc = with("curriculum_learning", {{"enabled", true}, {"curriculum_type", "seqlen"}, {"min_difficulty", 4},
                                                     {"max_difficulty", 16}, {"schedule_type", "fixed_discrete"},
                                                     {"schedule_config", {{"difficulty", {4, 8, 16}}, {"max_step", {6, 3}}}}});
  EXPECT_NE(error_of(disc).find("curriculum_learning.schedule_config.max_step: must increase (entry 1 is 3 after 6)"), npos)
      << error_of(disc);
  disc["curriculum_learning"]["schedule_config"]["max_step"] = {3, 6};
  EXPECT_EQ(error_of(disc), "");
}

// The real ds_config files of tests/fixtures/ds_configs (README: sources, licences), given to the
// parser exactly as they are: each passes bare, or is refused naming the key it cannot honour.
TEST(DsCompat, RealConfigsPassBareOrAreRefusedByKey) {
  namespace fs = std::filesystem;
  const std::map<std::string, std::string> refused = {
      {"13-dsexamples-compression-gpt2-w8a8.json", "compression_training is not supported"},
      {"14-dsexamples-data-efficiency-random-ltd.json", "data_efficiency is not supported"},
      {"18-deepspeed-tests-bingbertsquad-eigenvalue-quantize.json", "eigenvalue is not supported"},
      // Its misspelling is refused by DeepSpeed's DeepSpeedZeroConfig (extra="forbid") too.
      {"08-dsexamples-megatron-zero-infinity-nvme.json",
       "zero_optimization.stage3_param_persitance_threshold: unknown key (did you mean 'stage3_param_persistence_threshold'?)"},
      {"29-llamafactory-z3-quantized-grads.json", "zero_optimization.zero_quantized_gradients: ZeRO++"},
  };
  int passed = 0, seen = 0;
  for (const auto& e : fs::directory_iterator(std::string(MT_SOURCE_DIR) + "/tests/fixtures/ds_configs")) {
    if (e.path().extension() != ".json") continue;
    ++seen;
    const std::string name = e.path().filename().string();
    ConfigSources s;
    s.config = e.path().string();
    std::string err;
    try {
      ds_config_load(s, 1, /*allow_bare=*/true);
    } catch (const Error& x) {
      err = x.what();
    }
    auto it = refused.find(name);
    if (it == refused.end()) {
      EXPECT_EQ(err, "") << name;
      ++passed;
    } else {
      EXPECT_NE(err.find(it->second), std::string::npos) << name << ": " << err;
    }
  }
  EXPECT_GE(seen, 15);
  EXPECT_GE(passed, 15);
}

// DeepSpeed's CurriculumScheduler, worked by hand from its formulas (curriculum.h).
TEST(Curriculum, DifficultiesFollowDeepSpeedsSchedules) {
  CurriculumConfig c;
  c.min_difficulty = 8;
  c.max_difficulty = 64;
  c.schedule_type = "fixed_linear";
  c.total_curriculum_step = 10;
  c.difficulty_step = 8;
  EXPECT_EQ(curriculum_difficulty(c, 1), 8);    // floor(0.1 * 56 + 8) = 13, down to a multiple of 8
  EXPECT_EQ(curriculum_difficulty(c, 5), 32);   // floor(0.5 * 56 + 8) = 36 -> 32
  EXPECT_EQ(curriculum_difficulty(c, 10), 64);
  EXPECT_EQ(curriculum_difficulty(c, 11), 64);  // 69 -> 64, at most max
  c.schedule_type = "fixed_root";
  c.root_degree = 2.0;
  c.total_curriculum_step = 100;
  EXPECT_EQ(curriculum_difficulty(c, 25), 32);  // sqrt(0.25) = 0.5 -> 36 -> 32
  EXPECT_EQ(curriculum_difficulty(c, 1), 8);    // sqrt(0.01) = 0.1 -> 13 -> 8
  EXPECT_EQ(curriculum_difficulty(c, 64), 48);  // 0.8 -> floor(52.8) = 52 -> 48
  // Below min_difficulty after the rounding: raised to its first multiple of difficulty_step, as
  // deepspeedai/DeepSpeed does since its PR #8334 (it trained 8 tokens for min 12, stop 74).
  c.min_difficulty = 12;
  EXPECT_EQ(curriculum_difficulty(c, 1), 16);   // floor(0.1 * 52 + 12) = 17 -> 16
  c.schedule_type = "fixed_linear";
  EXPECT_EQ(curriculum_difficulty(c, 1), 16);   // floor(0.01 * 52 + 12) = 12 -> 8 -> 16
  c.min_difficulty = 8;
  c.schedule_type = "fixed_root";
  c.schedule_type = "fixed_discrete";
  c.difficulty = {8, 16, 32};
  c.max_step = {2, 4};
  EXPECT_EQ(curriculum_difficulty(c, 2), 8);
  EXPECT_EQ(curriculum_difficulty(c, 3), 16);
  EXPECT_EQ(curriculum_difficulty(c, 5), 32);
  // update_difficulty: once at max_difficulty it stays, whatever the schedule says later.
  c.max_difficulty = 16;
  c.difficulty = {16, 8, 8};
  CurriculumSchedule s(c);
  EXPECT_EQ(s.at(1), 16);
  EXPECT_EQ(s.at(3), 16);
  EXPECT_EQ(s.at(9), 16);
}

// A review against DeepSpeed's config (this session): keys that trained another run without a
// word, or read by names DeepSpeed does not have.
// zero_optimization (and its offload blocks), fp16 and bf16 are read by DeepSpeed's pydantic config
// models, which forbid keys they do not have: a misspelt one ("enable", "stag", "offload_optimzer",
// "loss_scale_windw") was warned about and the default trained (fp32, ZeRO 0, no offload, window
// 1000), exit 0. Every field those models have is still accepted, and an unknown key set to "auto"
// is warned, as DeepSpeed drops "auto" values before it validates.
TEST(DsConfig, BlocksDeepSpeedValidatesRefuseUnknownKeys) {
  auto refused = [](const char* key, const nlohmann::json& block, const std::string& what) {
    const std::string e = error_of(with(key, block));
    EXPECT_NE(e.find(what), std::string::npos) << e;
    EXPECT_NE(e.find("refuses keys it does not have"), std::string::npos) << e;
  };
  refused("bf16", {{"enable", true}}, "bf16.enable: unknown key (did you mean 'enabled'?)");
  refused("fp16", {{"enabled", true}, {"loss_scale_windw", 10}}, "fp16.loss_scale_windw: unknown key (did you mean 'loss_scale_window'?)");
  refused("zero_optimization", {{"stag", 2}}, "zero_optimization.stag: unknown key");
  refused("zero_optimization", {{"stage", 2}, {"offload_optimzer", {{"device", "cpu"}}}}, "zero_optimization.offload_optimzer: unknown key");
  // A field of the other offload block is not one of this block's.
  refused("zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}, {"max_in_cpu", 1}}}},
          "zero_optimization.offload_optimizer.max_in_cpu: unknown key");
  refused("zero_optimization", {{"stage", 3}, {"offload_param", {{"device", "cpu"}, {"fast_init", true}}}},
          "zero_optimization.offload_param.fast_init: unknown key");
  // "auto" on an unknown key: DeepSpeed drops it; one warning line.
  const RunConfig a = ds_config_parse(with("zero_optimization", {{"stage", 2}, {"reduce_bucket", "auto"}}), "cfg.json");
  EXPECT_TRUE(std::any_of(a.warnings.begin(), a.warnings.end(),
                          [](const std::string& w) { return w.find("zero_optimization.reduce_bucket: unknown key, ignored") != std::string::npos; }));
  // Every field of DeepSpeed's models (deepspeed/runtime/zero/config.py, offload_config.py,
  // precision_config.py), by field name and by alias.
  const nlohmann::json zero = nlohmann::json::parse(R"({"stage": 3, "contiguous_gradients": true, "reduce_scatter": true,
    "reduce_bucket_size": 500000000, "use_multi_rank_bucket_allreduce": true, "allgather_partitions": true,
    "allgather_bucket_size": 500000000, "overlap_comm": false, "load_from_fp32_weights": true, "elastic_checkpoint": false,
    "sub_group_size": 1000000000, "prefetch_bucket_size": 50000000, "param_persistence_threshold": 100000,
    "model_persistence_threshold": 1000000000000, "max_live_parameters": 1000000000, "max_reuse_distance": 1000000000,
    "gather_16bit_weights_on_model_save": false, "module_granularity_threshold": 0, "use_all_reduce_for_fetch_params": false,
    "allgather_sequential": false, "partition_stream_chunk_size": 0, "ignore_unused_parameters": true, "legacy_stage1": false,
    "round_robin_gradients": false, "zero_hpz_partition_size": 1, "zero_quantized_weights": false,
    "zero_quantized_nontrainable_weights": false, "zero_quantized_gradients": false, "zeropp_loco_param": null,
    "mics_shard_size": -1, "mics_hierarchical_params_gather": false, "memory_efficient_linear": true,
    "pipeline_loading_checkpoint": false, "override_module_apply": true, "log_trace_cache_warnings": false,
    "enable_sanity_checks": false, "save_muon_momentum_buffer_in_memory": false, "leaf_module": {}, "zenflow": null,
    "cpu_offload": false, "cpu_offload_param": false, "cpu_offload_use_pin_memory": false,
    "stage3_gather_fp16_weights_on_model_save": false,
    "offload_param": {"device": "none", "nvme_path": null, "buffer_count": 5, "buffer_size": 100000000,
                      "max_in_cpu": 1000000000, "pin_memory": false},
    "offload_optimizer": {"device": "none", "nvme_path": null, "buffer_count": 4, "pin_memory": false, "pipeline_read": false,
                          "pipeline_write": false, "fast_init": false, "ratio": 1.0, "super_offload": false,
                          "convert_grad_on_cpu": true, "cpuadam_cores_perc": 0.8}})");
  EXPECT_EQ(error_of(with("zero_optimization", zero)), "");
  nlohmann::json aliases = {{"stage", 3}};
  for (const char* k : {"prefetch_bucket_size", "param_persistence_threshold", "model_persistence_threshold", "max_live_parameters",
                        "max_reuse_distance", "gather_16bit_weights_on_model_save", "module_granularity_threshold",
                        "use_all_reduce_for_fetch_params", "allgather_sequential", "partition_stream_chunk_size"})
    aliases[std::string("stage3_") + k] = zero[k];
  EXPECT_EQ(error_of(with("zero_optimization", aliases)), "");
  EXPECT_EQ(error_of(with("fp16", nlohmann::json::parse(R"({"enabled": true, "auto_cast": false, "loss_scale": 0,
    "initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2, "consecutive_hysteresis": false, "min_loss_scale": 1,
    "fp16_master_weights_and_grads": false})"))), "");
  EXPECT_EQ(error_of(with("bf16", nlohmann::json::parse(R"({"enabled": true, "immediate_grad_update": false,
    "check_grad_overflow": false, "bf16_master_weights_and_grads": false, "bf16_optimizer_states": false})"))), "");
  // fp16's loss-scaling keys copied into bf16 (real configs do it; they change nothing there): one
  // warning each, not refused.
  const RunConfig b = ds_config_parse(with("bf16", nlohmann::json::parse(R"({"enabled": true, "loss_scale": 0,
    "hysteresis": 2, "auto_cast": false})")), "cfg.json");
  EXPECT_EQ(std::count_if(b.warnings.begin(), b.warnings.end(),
                          [](const std::string& w) { return w.find("an fp16 key; bf16 has no loss scaling") != std::string::npos; }),
            3);
  EXPECT_EQ(b.compute_dtype, DType::kBF16);
}

TEST(DsConfig, KeysAReviewFoundReadOtherwiseThanDeepSpeed) {
  const auto npos = std::string::npos;
  // AutoTP training: data parallelism takes world / autotp_size (the batch was autotp_size times
  // DeepSpeed's, every process a data-parallel rank).
  nlohmann::json tp = with("tensor_parallel", {{"autotp_size", 2}});
  tp["gradient_accumulation_steps"] = 1;
  const RunConfig t = ds_config_parse(tp, "cfg.json", 4);
  EXPECT_EQ(t.tp, 2);
  EXPECT_EQ(t.world_size, 2);
  EXPECT_EQ(t.batch.train_batch_size, 4);
  EXPECT_EQ(ds_config_parse(with("tensor_parallel", {{"autotp_size", 0}}), "cfg.json", 4).tp, 1);
  nlohmann::json clash = tp;
  clash["parallel"] = {{"tp", 1}};
  EXPECT_NE(error_of(clash, 4).find("tensor_parallel.autotp_size (2) and parallel.tp (1) disagree"), npos);
  EXPECT_NE(error_of(tp, 3).find("tensor_parallel.autotp_size (2) does not divide the 3 process(es)"), npos);
  // WarmupLR without params peaks at the optimizer's lr, as with "params": {} (it was 0.001).
  nlohmann::json warm = with("optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.01}}}});
  warm["scheduler"] = {{"type", "WarmupLR"}};
  EXPECT_DOUBLE_EQ(ds_config_parse(warm, "cfg.json").scheduler.warmup_max_lr, 0.01);
  warm["scheduler"]["params"] = nlohmann::json::object();
  EXPECT_DOUBLE_EQ(ds_config_parse(warm, "cfg.json").scheduler.warmup_max_lr, 0.01);
  // An optimizer block without a type (AdamW was trained, its name never given).
  EXPECT_NE(error_of(with("optimizer", {{"params", {{"lr", 0.1}}}})).find("optimizer.type: missing"), npos);
  // No optimizer block: the default is said, and --set tunes it.
  EXPECT_TRUE(has_line(ds_config_parse(base(), "cfg.json").warnings, "optimizer: none given; training with AdamW (lr 0.001"));
  nlohmann::json set = base();
  ds_config_set(set, "optimizer.params.lr=0.25");
  EXPECT_EQ(ds_config_parse(set, "cfg.json").optimizer.type, "AdamW");
  // ZeRO's field names beside their stage3_ aliases; DeepSpeed's deprecated cpu_offload_param.
  const RunConfig z = ds_config_parse(
      with("zero_optimization", {{"stage", 3}, {"prefetch_bucket_size", 1000}, {"param_persistence_threshold", 0},
                                 {"max_live_parameters", 5000}, {"cpu_offload_param", true}}),
      "cfg.json");
  EXPECT_EQ(z.zero.stage3_prefetch_bucket_size, 1000);
  EXPECT_EQ(z.zero.stage3_param_persistence_threshold, 0);
  EXPECT_EQ(z.zero.stage3_max_live_parameters, 5000);
  EXPECT_EQ(z.zero.offload_param, "cpu");
  // Beside the block that replaces it, a legacy key set overrode an nvme block without a word (stop 73).
  const nlohmann::json nvme = {{"device", "nvme"}, {"nvme_path", "/tmp/swap"}};
  EXPECT_EQ(error_of(with("zero_optimization", {{"stage", 3}, {"cpu_offload_param", true}, {"offload_param", nvme},
                                                {"offload_optimizer", nvme}})),
            "zero_optimization.cpu_offload_param is DeepSpeed's deprecated form of zero_optimization.offload_param, which is "
            "given too; give one (DeepSpeed refuses the pair)");
  EXPECT_NE(error_of(with("zero_optimization", {{"stage", 2}, {"cpu_offload", true}, {"offload_optimizer", nvme}}))
                .find("zero_optimization.cpu_offload is DeepSpeed's deprecated form of zero_optimization.offload_optimizer"),
            npos);
  EXPECT_FALSE(has_line(z.warnings, "zero_optimization.prefetch_bucket_size"));
  EXPECT_NE(error_of(with("zero_optimization", {{"stage", 3}, {"prefetch_bucket_size", 1}, {"stage3_prefetch_bucket_size", 2}}))
                .find("are one setting"),
            npos);
  // seq_parallel_communication_data_type is DeepSpeed's gradient reduction dtype with Ulysses (it
  // replaces communication_data_type there, fp32 unless given); it was warned as the all-to-all's.
  EXPECT_TRUE(has_line(ds_config_parse(with("seq_parallel_comm_data_type", "fp16"), "cfg.json").warnings,
                       "seq_parallel_comm_data_type: accepted; it sets the gradients' reduction dtype with parallel.sp > 1"));
  nlohmann::json ulysses = with("seq_parallel_communication_data_type", "BF16");
  ulysses["sequence_parallel_size"] = 2;
  ulysses["communication_data_type"] = "fp16";
  const RunConfig u = ds_config_parse(ulysses, "cfg.json", 2);
  EXPECT_EQ(u.seq_comm_dtype, DType::kBF16);
  EXPECT_EQ(grad_comm_dtype(u, u.sp), DType::kBF16);
  EXPECT_EQ(grad_comm_dtype(u, 1), DType::kF16);
  EXPECT_TRUE(has_line(u.warnings, "communication_data_type: 'fp16' is not used: with parallel.sp 2 the gradients are reduced in "
                                   "seq_parallel_communication_data_type ('bf16'), as DeepSpeed does"));
  EXPECT_FALSE(has_line(u.warnings, "seq_parallel_communication_data_type: accepted"));
  EXPECT_EQ(ds_config_parse(ds_config_resolved(u), "resolved", 2).seq_comm_dtype, DType::kBF16);
  ulysses.erase("seq_parallel_communication_data_type");  // DeepSpeed's default: fp32
  const RunConfig d = ds_config_parse(ulysses, "cfg.json", 2);
  EXPECT_EQ(grad_comm_dtype(d, d.sp), DType::kF32);
  EXPECT_TRUE(has_line(d.warnings, "communication_data_type: 'fp16' is not used: with parallel.sp 2 the gradients are reduced in "
                                   "seq_parallel_communication_data_type (fp32 unless given)"));
  ulysses["seq_parallel_communication_data_type"] = "fp16";
  ulysses["seq_parallel_comm_data_type"] = "bf16";
  EXPECT_EQ(error_of(ulysses, 2), "seq_parallel_comm_data_type ('bf16') and seq_parallel_communication_data_type ('fp16') disagree: give one");
  ulysses.erase("seq_parallel_comm_data_type");
  ulysses["seq_parallel_communication_data_type"] = "int8";
  EXPECT_EQ(error_of(ulysses, 2), "seq_parallel_communication_data_type: 'int8' is not a DeepSpeed communication type (fp16, bf16, fp32)");
  // An empty data path is none (--set data.valid= turns validation off; train failed opening ".idx",
  // naming no key).
  const RunConfig nv = ds_config_parse(with("data", {{"train", "a"}, {"valid", ""}}), "cfg.json");
  EXPECT_TRUE(nv.data_valid.empty());
  EXPECT_TRUE(nv.valid_spec.paths.empty());
}

}  // namespace
}  // namespace mt::engine

namespace mt::engine {
namespace {

// DeepSpeed-Ulysses: parallel.sp and DeepSpeed's sequence_parallel_size, the data-parallel size
// they leave (processes / (tp pp sp)), and every combination not built yet refused by name.
TEST(DsConfig, UlyssesSequenceParallelSize) {
  const auto npos = std::string::npos;
  const RunConfig ds = ds_config_parse(with("sequence_parallel_size", 2), "cfg.json", 4);
  EXPECT_EQ(ds.sp, 2);
  EXPECT_EQ(ds.world_size, 2);
  EXPECT_EQ(ds.batch.train_batch_size, 4);  // micro 2 x accumulation 1 x dp 2: sp adds no samples
  const RunConfig own = ds_config_parse(with("parallel", {{"sp", 2}}), "cfg.json", 2);
  EXPECT_EQ(own.sp, 2);
  EXPECT_EQ(own.world_size, 1);
  nlohmann::json both = with("parallel", {{"sp", 2}, {"dp", 2}});
  both["sequence_parallel_size"] = 2;
  EXPECT_EQ(error_of(both, 4), "");
  both["parallel"]["dp"] = 4;
  EXPECT_NE(error_of(both, 4).find("parallel.dp: 4 does not match the 4 process(es) / (tp 1 x pp 1 x sp 2) = 2"), npos) << error_of(both, 4);
  both["parallel"] = {{"sp", 4}};
  EXPECT_NE(error_of(both, 4).find("sequence_parallel_size (2) and parallel.sp (4) disagree"), npos) << error_of(both, 4);
  EXPECT_NE(error_of(with("parallel", {{"sp", 3}}), 4).find("parallel.sp (3) x parallel.tp (1) x parallel.pp (1) does not divide the 4 process(es)"),
            npos);
  EXPECT_NE(error_of(with("sequence_parallel_size", 0), 4).find("sequence_parallel_size: must be from 1 to 65536 (got 0)"), npos);

  // sp 2 on 2 processes with one more key (or model key) set.
  auto sp2 = [](const char* key, const nlohmann::json& v) {
    nlohmann::json j = with("parallel", {{"sp", 2}});
    if (key != nullptr) j[key] = v;
    return j;
  };
  const std::string name = "parallel.sp 2 (Ulysses sequence parallelism) with ";
  nlohmann::json tp = sp2(nullptr, nullptr);
  tp["parallel"]["tp"] = 2;
  // With tp (stop 80): each tp rank's heads split over the sp group; tp x sp must divide them.
  EXPECT_EQ(error_of(tp, 4), "");
  EXPECT_EQ(ds_config_parse(tp, "cfg.json", 4).world_size, 1);
  tp["parallel"]["tp"] = 4;
  EXPECT_NE(error_of(tp, 8).find("model.n_head (4) must be divisible by parallel.tp x parallel.sp (8)"), npos) << error_of(tp, 8);
  nlohmann::json pp = sp2(nullptr, nullptr);
  pp["parallel"]["pp"] = 2;
  EXPECT_EQ(error_of(pp, 4), "");  // with pp too (stop 80): each stage's ranks an sp group
  const std::pair<nlohmann::json, std::string> refused[] = {
      {sp2("optimizer", {{"type", "OneBitAdam"}, {"params", {{"lr", 1e-3}}}}), "optimizer.type OneBitAdam (1-bit)"},
  };
  for (const auto& [j, want] : refused) EXPECT_NE(error_of(j, 2).find(name + want + " is not implemented yet"), npos) << want << ": " << error_of(j, 2);
  // A curriculum (stop 80): each step's length split over the sp ranks, refused naming the step
  // where it does not split.
  auto curriculum = [&](int min, int step) {
    return sp2("curriculum_learning", {{"enabled", true}, {"curriculum_type", "seqlen"}, {"min_difficulty", min}, {"max_difficulty", 16},
                                       {"schedule_type", "fixed_linear"},
                                       {"schedule_config", {{"total_curriculum_step", 4}, {"difficulty_step", step}}}});
  };
  EXPECT_EQ(error_of(curriculum(8, 4), 2), "");
  EXPECT_EQ(error_of(curriculum(9, 3), 2),
            "curriculum_learning with parallel.sp 2 (Ulysses): step 1 trains 9 tokens a sample, which do not split over the 2 "
            "ranks: give difficulties (min_difficulty, difficulty_step) that they divide");
  // What runs with sp since stop 78: ZeRO 3, documents, "tokens" normalisation, dropout.
  nlohmann::json drop = sp2("zero_optimization", {{"stage", 3}});
  drop["model"]["resid_pdrop"] = 0.1;
  drop["loss_normalization"] = "tokens";
  drop["data"] = {{"train", "a"}, {"reset_attention_mask", true}, {"reset_position_ids", true}};
  EXPECT_EQ(error_of(drop, 2), "") << error_of(drop, 2);
  nlohmann::json cls = sp2("task", "classification");
  cls["model"]["num_labels"] = 2;
  EXPECT_EQ(error_of(cls, 2), "");  // a classifier too (stop 80; classify_test trains it)
  nlohmann::json odd = sp2("seq_length", 15);
  EXPECT_NE(error_of(odd, 2).find("parallel.sp 2 (Ulysses sequence parallelism) splits each sample's seq_length (15) tokens over 2 ranks"),
            npos) << error_of(odd, 2);
  // Heads: GPT-2's n_head (4) over sp 8; LLaMA's num_attention_heads and num_key_value_heads both named.
  EXPECT_NE(error_of(with("parallel", {{"sp", 8}}), 8).find("model.n_head (4) must be divisible by 8"), npos)
      << error_of(with("parallel", {{"sp", 8}}), 8);
  nlohmann::json llama = with("parallel", {{"sp", 4}});
  llama["model"] = {{"model_type", "llama"}, {"vocab_size", 97}, {"hidden_size", 64}, {"intermediate_size", 96},
                    {"num_hidden_layers", 2}, {"num_attention_heads", 8}, {"num_key_value_heads", 2}, {"max_position_embeddings", 32}};
  EXPECT_NE(error_of(llama, 4).find("model.num_attention_heads (8) and model.num_key_value_heads (2) must be divisible by 4"), npos)
      << error_of(llama, 4);
}

}  // namespace
}  // namespace mt::engine
