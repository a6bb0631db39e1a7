// Helpers shared by the CLI's end-to-end tests (src/cli/*_test.cpp, one test_cli binary): a
// scratch directory per test process, running the meshtrain binary with its output captured,
// and a small learnable indexed dataset.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/indexed_dataset.h"

namespace mt::cli::testing {

// The directories make_test_dir made, removed when the test process ends (a swapped-model test
// leaves gigabytes; ctest runs hundreds of processes). MT_KEEP_TEST_DIRS=1 keeps them to look at.
struct TestDirs {
  std::vector<std::string> paths;
  ~TestDirs() {
    if (std::getenv("MT_KEEP_TEST_DIRS") != nullptr) return;
    for (const std::string& p : paths) {
      std::error_code ec;
      std::filesystem::remove_all(p, ec);
    }
  }
};
inline TestDirs& test_dirs() {
  static TestDirs dirs;
  return dirs;
}

// The launcher exports the KEY=VALUE lines of DeepSpeed's DS_ENV_FILE (.deepspeed_env in $HOME, then
// in the working directory) to every rank: the tests read none of the user's. An absolute name that
// does not exist is looked up nowhere else (launch.cpp); a test of the file sets its own and puts
// this one back.
inline constexpr const char* kNoDeepSpeedEnv = "/nonexistent/meshtrain-tests-read-no-.deepspeed_env";
inline const bool kNoUserDeepSpeedEnv = [] { return ::setenv("DS_ENV_FILE", kNoDeepSpeedEnv, 1) == 0; }();

// A fresh directory named `name`_<pid> under the test temp dir (ctest runs each test as its own
// process, possibly in parallel, so the pid keeps them apart), removed when the process ends.
inline std::string make_test_dir(const std::string& name) {
  std::string p = ::testing::TempDir() + "/" + name + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  test_dirs().paths.push_back(p);
  return p;
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs `meshtrain ARGS` with stdout/stderr in dir/stdout.txt and dir/stderr.txt; returns its exit
// code (-1 when it did not exit normally) and, where asked, what it printed.
inline int run_meshtrain(const std::string& dir, const std::string& args, std::string* out = nullptr,
                         std::string* err = nullptr) {
  std::string o = dir + "/stdout.txt", e = dir + "/stderr.txt";
  int rc = std::system((std::string(MT_MESHTRAIN_BIN) + " " + args + " > " + o + " 2> " + e).c_str());
  if (out) *out = slurp(o);
  if (err) *err = slurp(e);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// `docs` documents of 40 tokens following next = 5 cur + 3 (mod 97): learnable, deterministic.
inline void write_chain_dataset(const std::string& prefix, int docs, int vocab = 97) {
  data::IndexedDatasetWriter w(prefix, vocab);
  for (int d = 0; d < docs; ++d) {
    std::vector<int32_t> seq;
    int32_t tok = d % 97;
    for (int i = 0; i < 40; ++i) {
      seq.push_back(tok);
      tok = (tok * 5 + 3) % 97;
    }
    w.add_sequence(seq);
    w.end_document();
  }
  w.finalize();
}

// Every value of `key` in a --metrics file (one JSON object per line), in order.
inline std::vector<double> metric_values(const std::string& metrics, const std::string& key) {
  std::vector<double> v;
  std::ifstream f(metrics);
  std::string line;
  while (std::getline(f, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains(key) && j[key].is_number()) v.push_back(j[key].get<double>());
  }
  return v;
}

}  // namespace mt::cli::testing
