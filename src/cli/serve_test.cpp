// `meshtrain serve`'s tool-calling flags (stop 77), as vLLM's serve checks them at start-up: an
// unknown --tool-call-parser and --enable-auto-tool-choice without a parser are one line and a
// non-zero exit, before any checkpoint is read. What the flags do is tested over HTTP
// (src/serve/http_server_tools_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "cli/cli_test_util.h"

namespace {

std::string dir() {
  static std::string d = mt::cli::testing::make_test_dir("mt_serve_cli_test");
  return d;
}

int run(const std::string& args, std::string* err) { return mt::cli::testing::run_meshtrain(dir(), args, nullptr, err); }

TEST(ServeCli, ToolCallingFlagsAreCheckedBeforeTheModelLoads) {
  const std::string model = dir() + "/no-such-model";
  std::string err;
  EXPECT_EQ(run("serve " + model + " --tool-call-parser mistral", &err), 2);
  EXPECT_NE(err.find("--tool-call-parser: unknown parser 'mistral' (known: hermes, llama3_json)"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_EQ(run("serve " + model + " --enable-auto-tool-choice", &err), 2);
  EXPECT_NE(err.find("--enable-auto-tool-choice needs --tool-call-parser"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  // Both given: on to the model (which is not there).
  EXPECT_EQ(run("serve " + model + " --enable-auto-tool-choice --tool-call-parser llama3_json", &err), 2);
  EXPECT_NE(err.find("no-such-model"), std::string::npos) << err;
  EXPECT_EQ(err.find("tool"), std::string::npos) << err;
}

}  // namespace
