// For the tokenizer tests: where the ctest fixture tokenizer_golden (scripts/make-tokenizer-golden.sh,
// tools/make_tokenizer_golden.js) writes its data, $MT_TOKENIZER_GOLDEN or beside MT_GOLDEN_DIR.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace mt::data {

inline std::string tokenizer_golden_dir() {
  const char* env = std::getenv("MT_TOKENIZER_GOLDEN");
  if (env != nullptr) return env;
  return (std::filesystem::path(MT_GOLDEN_DIR).parent_path() / "tokenizer_golden").string();
}

}  // namespace mt::data
