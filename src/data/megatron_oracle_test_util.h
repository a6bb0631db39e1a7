// The live oracle of the Megatron data tests: tools/check_megatron_idx.py under Debian's
// /usr/bin/python3 with numpy (the generator and sums Megatron-LM builds its indices with).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/file_io.h"

#ifndef MT_SOURCE_DIR
#define MT_SOURCE_DIR "."
#endif

namespace mt::data::testing {

inline bool have_numpy() {
  return file_exists("/usr/bin/python3") && std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") == 0;
}

// check_megatron_idx.py ARGS, its JSON output parsed (written under scratch).
inline nlohmann::json oracle(const std::string& args, const std::string& scratch) {
  const std::string out = scratch + "/oracle.json";
  const std::string cmd = std::string("/usr/bin/python3 ") + MT_SOURCE_DIR + "/tools/check_megatron_idx.py " + args + " > " + out;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<char> text = file_read_all(out);
  return nlohmann::json::parse(std::string(text.begin(), text.end()));
}

}  // namespace mt::data::testing
