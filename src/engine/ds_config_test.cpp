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
  j["zero_optimization"] = {{"stage", 2}};
  EXPECT_NE(error_of(j).find("zero_optimization.stage"), std::string::npos);
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
  j["zero_optimization"] = {{"stage", 0}, {"overlap_comm", true}};
  RunConfig c = ds_config_parse(j, "cfg.json");
  std::string all;
  for (auto& w : c.warnings) all += w + "\n";
  EXPECT_NE(all.find("tensorboard"), std::string::npos);
  EXPECT_NE(all.find("did you mean 'steps_per_print'"), std::string::npos) << all;
  EXPECT_NE(all.find("zero_optimization.overlap_comm"), std::string::npos);
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

}  // namespace
}  // namespace mt::engine
