// meshtrain config check [FILE] [--deepspeed DS] [--model M] [--data D] [--set k=v ...]: validates a
// run configuration (a bare DeepSpeed ds_config.json included: its keys are checked alone, and it
// says that model and data were not) and prints the resolved form; exit 0, or 2 with one line
// naming the key.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "base/error.h"
#include "engine/ds_config.h"

namespace mt::cli {

void register_config(CLI::App& app) {
  auto* cmd = app.add_subcommand("config", "Work with run configurations");
  auto* check = cmd->add_subcommand("check", "Validate a configuration and print its resolved form");
  cmd->require_subcommand(1);
  auto src = std::make_shared<engine::ConfigSources>();
  auto procs = std::make_shared<int>(0);
  check->add_option("FILE", src->config, "configuration JSON (a run file, or a bare DeepSpeed ds_config.json)");
  add_config_source_options(check, *src);
  // The processes the layout is checked for (a pipeline or tp layout was refused at the one process
  // the check assumed, under mpirun too: stop 73).
  check->add_option("--procs", *procs, "processes the run will have (default: mpirun's world size, else 1)")
      ->check(CLI::Range(1, 1 << 20));
  check->callback([src, procs] {
    MT_CHECK(!src->config.empty() || !src->deepspeed_file().empty(), ErrorKind::kInvalidArgument,
             "config check: give a configuration FILE or --deepspeed FILE");
    int world = *procs;
    if (world == 0)
      if (const char* env = std::getenv("OMPI_COMM_WORLD_SIZE"); env != nullptr && std::atoi(env) > 0) world = std::atoi(env);
    if (world == 0) world = 1;
    engine::RunConfig c;
    try {
      c = engine::ds_config_load(*src, world, /*allow_bare=*/true);
    } catch (const Error& e) {
      const std::string what = e.what();
      if (*procs == 0 && what.find("process(es)") != std::string::npos)
        throw Error(e.kind(), what + " (config check counted " + std::to_string(world) + ": give --procs N)");
      throw;
    }
    engine::ds_config_check_paths(c, /*create_save_dir=*/false);  // a check writes nothing
    engine::ds_config_check_trainable(c);
    for (const auto& w : c.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
    for (const auto& n : c.notes) std::fprintf(stderr, "auto: %s\n", n.c_str());
    if (c.bare)
      std::fprintf(stderr, "note: the DeepSpeed keys are valid; model and data were not checked (none given: add "
                           "--model/--data, or a run file with --deepspeed)\n");
    nlohmann::json r = engine::ds_config_resolved(c);
    if (c.bare) r.erase("model");
    std::printf("%s\n", r.dump(2).c_str());
  });
}

void add_config_source_options(CLI::App* cmd, engine::ConfigSources& src) {
  // Hugging Face's form is `--deepspeed FILE`; DeepSpeed's own is the switch `--deepspeed` with
  // `--deepspeed_config FILE` (and its deprecated `--deepscale`/`--deepscale_config`): both read.
  // The bare switch took the next word, `--deepspeed_config`, as its file.
  cmd->add_option("--deepspeed", src.deepspeed,
                  "a DeepSpeed ds_config.json, used as it is: merged with CONFIG (a key in both must agree); "
                  "bare, DeepSpeed's switch (give the file with --deepspeed_config)")
      ->expected(0, 1);
  cmd->add_option("--deepspeed_config,--deepscale_config", src.deepspeed_config, "DeepSpeed's name for --deepspeed FILE");
  cmd->add_flag("--deepscale")->description("DeepSpeed's deprecated switch: no effect");
  cmd->add_option("--local_rank", src.local_rank, "DeepSpeed's launcher passes it; the ranks are MPI's: no effect");
  cmd->add_option("--model", src.model, "the model: a Hugging Face directory (config.json, weights) or a config.json");
  cmd->add_option("--data", src.data, "training data (data.train): an indexed-dataset prefix or a .txt/.jsonl file");
  cmd->add_option("--tokenizer", src.tokenizer, "tokenizer.json for text data (data.tokenizer)");
  cmd->add_option("--set", src.sets, "override a key: a.b.c=value (JSON value or plain string); applied last");
}

}  // namespace mt::cli
