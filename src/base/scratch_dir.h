// Tests' scratch space: a fresh directory under the system's temporary one, unique to the process
// and the object (mkdtemp), removed with everything in it when the object goes. Fixed names under
// /tmp were left behind after every run and shared between runs at once.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

#include "base/error.h"

namespace mt {

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix = "mt_test") {
    std::string tmpl = std::filesystem::temp_directory_path().string() + "/" + prefix + "_XXXXXX";
    MT_CHECK(::mkdtemp(tmpl.data()) != nullptr, ErrorKind::kIOError, "scratch directory: mkdtemp " + tmpl + " failed");
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace mt
