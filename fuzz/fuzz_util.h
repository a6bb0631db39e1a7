// Shared by the fuzz targets: a private temporary directory for parsers that read files, and the
// contract every parser of untrusted input is held to: it returns or throws mt::Error. Any other
// exception terminates the process, so libFuzzer records the input as a crash, as it does for
// ASan/UBSan reports, deadly signals, leaks and inputs slower than -timeout.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "base/error.h"

namespace mt::fuzz {

// A directory of this process's own under the system temporary directory, created on first use
// and removed at a normal exit (a crashing run leaves it for inspection).
inline const std::string& temp_dir() {
  struct Dir {
    std::string path;
    Dir() {
      std::string tmpl = (std::filesystem::temp_directory_path() / "mt_fuzz_XXXXXX").string();
      if (::mkdtemp(tmpl.data()) == nullptr) {
        std::perror("mt_fuzz: mkdtemp");
        std::abort();
      }
      path = tmpl;
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

inline std::string temp_path(const std::string& name) {
  return temp_dir() + "/" + name;
}

// Replaces path by a new file holding data.
// NOTE: removing the old file first, rather than truncating it, keeps ext4 from flushing the file
// on every close (its auto_da_alloc heuristic for truncate-then-rewrite), which costs 100x speed.
inline void write_file(const std::string& path, const void* data, size_t size) {
  ::unlink(path.c_str());
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out.good()) {
    std::fprintf(stderr, "mt_fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

// Runs fn(); an mt::Error is the parser refusing its input, which is fine. Any other exception is
// left uncaught on purpose: with no handler the C++ runtime terminates at the throw itself (it
// prints the type and what()), so the crash report's stack shows where it was thrown.
template <typename Fn>
void expect_ok_or_error(Fn&& fn) {
  try {
    fn();
  } catch (const Error&) {
  }
}

}  // namespace mt::fuzz
