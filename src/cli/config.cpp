// meshtrain config check FILE [--set k=v ...]: validates a run configuration (a bare DeepSpeed
// ds_config.json included, which needs a model block to train but is checked for everything else)
// and prints the resolved form; exit 0, or 2 with one line naming the key.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "engine/ds_config.h"

namespace mt::cli {

void register_config(CLI::App& app) {
  auto* cmd = app.add_subcommand("config", "Work with run configurations");
  auto* check = cmd->add_subcommand("check", "Validate a configuration and print its resolved form");
  cmd->require_subcommand(1);
  auto path = std::make_shared<std::string>();
  auto sets = std::make_shared<std::vector<std::string>>();
  check->add_option("FILE", *path, "configuration JSON")->required();
  check->add_option("--set", *sets, "override a key: a.b.c=value (JSON value or plain string)");
  check->callback([path, sets] {
    engine::RunConfig c = engine::ds_config_load(*path, *sets);
    engine::ds_config_check_paths(c);
    for (const auto& w : c.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
    std::printf("%s\n", engine::ds_config_resolved(c).dump(2).c_str());
  });
}

}  // namespace mt::cli
