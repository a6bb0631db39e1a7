// meshtrain: the single binary. Errors are caught here only: one line, a non-zero exit code
// (2 for bad input — arguments, configs, files — and 1 for everything else).
#include <cstdio>
#include <exception>

#include "base/error.h"
#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"meshtrain: train transformer language models on one or many processes"};
  app.require_subcommand(1);
  mt::cli::register_bench(app);
  mt::cli::register_inspect(app);
  mt::cli::register_config(app);
  mt::cli::register_train(app);
  mt::cli::register_tokenize(app);
  mt::cli::register_export(app);
  mt::cli::register_plot(app);
  mt::cli::register_generate(app);
  mt::cli::register_launch(app);
  mt::cli::register_estimate(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const mt::Error& e) {
    std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
    bool bad_input = e.kind() == mt::ErrorKind::kInvalidArgument || e.kind() == mt::ErrorKind::kNotFound ||
                     e.kind() == mt::ErrorKind::kCorruption || e.kind() == mt::ErrorKind::kNotSupported;
    return bad_input ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshtrain: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
