// One subcommand per file; each registers its flags on the app and runs when chosen.
#pragma once

#include <CLI/CLI.hpp>

namespace mt::cli {

void register_bench(CLI::App& app);
void register_inspect(CLI::App& app);
void register_config(CLI::App& app);
void register_train(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_export(CLI::App& app);
void register_generate(CLI::App& app);

}  // namespace mt::cli
