// The file I/O seam: atomic write and whole-file read round trip, and every failure an mt::Error
// naming the path (a directory included).
#include "base/file_io.h"

#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "base/scratch_dir.h"

namespace mt {
namespace {

ErrorKind error_kind_of_read(const std::string& path, std::string* message) {
  try {
    file_read_all(path);
  } catch (const Error& e) {
    *message = e.what();
    return e.kind();
  }
  ADD_FAILURE() << "read " << path << " without an error";
  return ErrorKind::kInternal;
}

TEST(FileIo, WriteAtomicThenReadAll) {
  const ScratchDir dir;
  std::string path = dir.file("file_io_round_trip");
  const std::string text("a\0b", 3);
  file_write_atomic(path, text.data(), text.size());
  std::vector<char> back = file_read_all(path);
  EXPECT_EQ(std::string(back.begin(), back.end()), text);
  EXPECT_TRUE(file_exists(path));
  file_write_atomic(path, nullptr, 0);
  EXPECT_TRUE(file_read_all(path).empty());
}

TEST(FileIo, MissingFileIsNotFound) {
  std::string message;
  std::string path = ::testing::TempDir() + "/file_io_does_not_exist";
  EXPECT_EQ(error_kind_of_read(path, &message), ErrorKind::kNotFound);
  EXPECT_NE(message.find(path), std::string::npos) << message;
}

// Found by fuzz/ds_config_fuzz.cpp ({"model": "/"}): a directory opened fine, its size read as
// 2^63 - 1 on ext4, and the allocation threw std::bad_alloc instead of an Error naming the path.
TEST(FileIo, DirectoryIsRefusedByName) {
  std::string message;
  std::string dir = ::testing::TempDir();
  EXPECT_EQ(error_kind_of_read(dir, &message), ErrorKind::kInvalidArgument);
  EXPECT_NE(message.find("is a directory"), std::string::npos) << message;
}

}  // namespace
}  // namespace mt
