// The file I/O seam: atomic write and whole-file read round trip, and every failure an mt::Error
// naming the path (a directory included).
#include "base/file_io.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

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

// A run's hold on a directory (HeldLock: the save_dir's .lock): a second holder (another open of
// the file, as another process's) is refused, naming the first; the lock goes with its holder; the
// file is writable by all, so that the next run, whoever's, names itself there.
TEST(HeldLock, ASecondHolderIsRefusedNamingTheFirstAndTheLockGoesWithIt) {
  const ScratchDir dir;
  const std::string path = dir.file(".lock");
  {
    const HeldLock first(path, "save_dir D", "give each run its own save_dir");
    std::string message;
    try {
      const HeldLock second(path, "save_dir D", "give each run its own save_dir");
      ADD_FAILURE() << "a second holder was let in";
    } catch (const Error& e) {
      message = e.what();
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    }
    EXPECT_NE(message.find("save_dir D is in use by another run (pid " + std::to_string(::getpid()) + " on host "),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("lock " + path + "): give each run its own save_dir"), std::string::npos) << message;
  }
  struct stat st{};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u);
  EXPECT_NO_THROW(HeldLock(path, "save_dir D", ""));  // the first gone, its lock with it
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

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Two writers of one path at once (two runs saving one file, two ranks writing one cache): each
// publishes a whole file and the last rename wins. With a fixed PATH.tmp the second open truncated
// the first's temporary, both wrote into it, the first rename published the mix (512 KiB of 'B'
// then 512 KiB of 'A') and the second threw "rename failed".
TEST(FileIo, TwoWritersOfOnePathEachPublishAWholeFile) {
  const ScratchDir dir;
  const std::string path = dir.file("shared.bin");
  const std::string a(1 << 20, 'A'), b(1 << 19, 'B');
  {
    AtomicFile first(path);
    AtomicFile second(path);
    first.append(a.data(), a.size());
    second.append(b.data(), b.size());
    first.commit();
    std::vector<char> back = file_read_all(path);
    EXPECT_TRUE(std::string(back.begin(), back.end()) == a) << "the first writer's file is not whole";
    second.commit();
  }
  std::vector<char> back = file_read_all(path);
  EXPECT_TRUE(std::string(back.begin(), back.end()) == b) << "the second writer's file is not whole";
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"shared.bin"});
}

// A file of the user's named as a temporary once was (PATH.tmp) is left alone, and a write given up
// before commit() (an error on the way) leaves nothing beside it.
TEST(FileIo, AWriteGivenUpLeavesNoTemporaryAndTouchesNoOtherFile) {
  const ScratchDir dir;
  const std::string path = dir.file("out.json");
  { std::ofstream(path + ".tmp") << "mine"; }
  {
    AtomicFile f(path);
    f.append("partial", 7);
  }
  EXPECT_FALSE(file_exists(path));
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"out.json.tmp"});
  file_write_atomic(path, "{}", 2);
  std::vector<char> mine = file_read_all(path + ".tmp");
  EXPECT_EQ(std::string(mine.begin(), mine.end()), "mine");
  EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{"out.json", "out.json.tmp"}));
}

// A directory the temporary cannot be created in fails naming the path, before anything is written.
TEST(FileIo, AnUnwritableDirectoryIsNamed) {
  const ScratchDir dir;
  const std::string path = dir.file("no-such-dir") + "/out.json";
  try {
    AtomicFile f(path);
    ADD_FAILURE() << "opened " << path;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIOError);
    EXPECT_NE(std::string(e.what()).find(path + ".tmp"), std::string::npos) << e.what();
  }
}

// A temporary whose writer died before its rename (a killed tokenize) is removed by the next
// writer of the path; a live writer's (it holds its lock), a young one's, another path's and a
// file of the user's are not. Random names would otherwise pile up where a fixed one was
// overwritten.
TEST(FileIo, DeadWritersTemporariesAreRemovedLiveOnesKept) {
  const ScratchDir dir;
  const std::string path = dir.file("data.bin");
  auto age = [](const std::string& p) {
    const auto old = std::filesystem::file_time_type::clock::now() - std::chrono::minutes(5);
    std::filesystem::last_write_time(p, old);
  };
  { std::ofstream(path + ".tmp.Ab3xZ9") << "dead"; }
  age(path + ".tmp.Ab3xZ9");
  { std::ofstream(path + ".tmp.Yq7Wk2") << "young"; }  // could be a writer between its create and lock
  { std::ofstream(dir.file("other.bin.tmp.Ab3xZ9")) << "x"; }
  age(dir.file("other.bin.tmp.Ab3xZ9"));
  { std::ofstream(path + ".tmp") << "mine"; }
  age(path + ".tmp");
  AtomicFile live(path);
  live.append("x", 1);
  std::vector<std::string> before = names_in(dir.path());
  std::string live_name;
  for (const std::string& n : before)
    if (n.rfind("data.bin.tmp.", 0) == 0 && n != "data.bin.tmp.Ab3xZ9" && n != "data.bin.tmp.Yq7Wk2") live_name = n;
  ASSERT_FALSE(live_name.empty());
  age(dir.file(live_name));
  EXPECT_EQ(remove_dead_temporaries(path), 1);
  std::vector<std::string> want = {"data.bin.tmp", "data.bin.tmp.Yq7Wk2", live_name, "other.bin.tmp.Ab3xZ9"};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(names_in(dir.path()), want);
  live.commit();
  EXPECT_EQ(std::string(file_read_all(path).data(), 1), "x");
}

}  // namespace
}  // namespace mt
