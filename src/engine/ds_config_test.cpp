// The run configuration: DeepSpeed's batch rule, "auto" resolution, refusals by full path,
// warnings with did-you-mean, --set overrides.
#include "engine/ds_config.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "base/error.h"

namespace mt::engine {
namespace {

nlohmann::json base() {
  return nlohmann::json::parse(R"({
    "model": {"model_type": "gpt2", "vocab_size": 97, "n_positions": 32, "n_embd": 48, "n_layer": 2, "n_head": 4},
    "seq_length": 16, "train_iters": 100, "train_micro_batch_size_per_gpu": 2
  })");
}

std::string error_of(nlohmann::json j, int world = 1) {
  try {
    ds_config_parse(std::move(j), "cfg.json", world);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
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

TEST(DsConfig, TrainingChangingKeysAreRefusedByFullPath) {
  auto j = base();
  j["zero_optimization"] = {{"stage", 2}, {"offload_optimizer", {{"device", "nvme"}}}};
  EXPECT_NE(error_of(j).find("zero_optimization.offload_optimizer.device: 'nvme'"), std::string::npos);
  j = base();
  j["zero_optimization"] = {{"stage", 2}};
  j["optimizer"] = {{"type", "Lamb"}, {"params", {{"lr", 1e-3}}}};
  EXPECT_NE(error_of(j).find("Lamb"), std::string::npos);
  j = base();
  j["zero_optimization"] = {{"stage", 1}, {"offload_param", {{"device", "cpu"}}}};
  EXPECT_NE(error_of(j).find("offload_param needs stage 3"), std::string::npos);
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
  j["scheduler"] = {{"type", "LRRangeTest"}};
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
}

TEST(DsConfig, LoggingKeysAndTyposWarnWithDidYouMean) {
  auto j = base();
  j["tensorboard"] = {{"enabled", true}};
  j["steps_per_prnt"] = 5;
  j["zero_optimization"] = {{"stage", 0}, {"contiguous_gradients", true}};
  RunConfig c = ds_config_parse(j, "cfg.json");
  std::string all;
  for (auto& w : c.warnings) all += w + "\n";
  EXPECT_NE(all.find("tensorboard"), std::string::npos);
  EXPECT_NE(all.find("did you mean 'steps_per_print'"), std::string::npos) << all;
  EXPECT_NE(all.find("zero_optimization.contiguous_gradients"), std::string::npos);
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
  std::string path = ::testing::TempDir() + "/bad-model.json";
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
  std::string deep = ::testing::TempDir() + "/deep-model.json";  // overflowed the stack when copied
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
       {"scheduler", {{"type", "OneCycle"}, {"params", {{"cycle_min_lr", 0.01}, {"cycle_max_lr", 0.1}}}}}},
      {{"optimizer", {{"type", "Lamb"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.01}}}}},
       {"scheduler", {{"type", "WarmupCosineLR"}, {"params", {{"warmup_num_steps", 5}}}}},
       {"no_weight_decay", "hf"}, {"activation_checkpointing", nlohmann::json::object()}, {"bf16", {{"enabled", true}}}},
      {{"fp16", {{"enabled", true}, {"loss_scale", 0}, {"hysteresis", 4}}},
       {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 10}, {"warmup_type", "linear"}}}}}},
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
