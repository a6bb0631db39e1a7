// meshtrain inspect FILE: lists a safetensors file's tensors (name, dtype, shape) and metadata.
#include <cstdio>
#include <string>

#include "checkpoint/safetensors.h"
#include "cli/commands.h"

namespace mt::cli {

void register_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "List the tensors of a safetensors file");
  auto path = std::make_shared<std::string>();
  cmd->add_option("FILE", *path, "safetensors file")->required();
  cmd->callback([path] {
    checkpoint::SafetensorsFile f(*path);
    size_t total = 0;
    for (const auto& t : f.tensors()) {
      std::string shape = "[";
      for (size_t i = 0; i < t.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(t.shape[i]);
      shape += "]";
      std::printf("%-60s %-5s %s\n", t.name.c_str(), checkpoint::st_dtype_name(t.dtype), shape.c_str());
      total += t.end - t.begin;
    }
    for (const auto& [k, v] : f.metadata()) std::printf("metadata %s = %.80s\n", k.c_str(), v.c_str());
    std::printf("%zu tensors, %zu bytes of data\n", f.tensors().size(), total);
  });
}

}  // namespace mt::cli
