// safetensors: round trip, and every malformed file is a one-line Corruption error, never a crash.
#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "base/error.h"
#include "base/scratch_dir.h"

namespace mt::checkpoint {
namespace {

// The process's own directory, removed at exit.
std::string tmp_path(const std::string& name) {
  static const ScratchDir dir("mt_safetensors_test");
  return dir.file(name);
}

void write_raw(const std::string& path, const std::string& header, size_t data_bytes, bool fix_len = true,
               uint64_t len_override = 0) {
  std::ofstream f(path, std::ios::binary);
  uint64_t len = fix_len ? header.size() : len_override;
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>((len >> (8 * i)) & 0xff));
  f << header;
  f << std::string(data_bytes, '\0');
}

TEST(Safetensors, RoundTrip) {
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<bf16_t> b = {f32_to_bf16(1.5f), f32_to_bf16(-2.0f)};
  std::string path = tmp_path("rt.safetensors");
  safetensors_write(path, {{"x.weight", DType::kF32, {2, 3}, a.data()}, {"y", DType::kBF16, {2}, b.data()}},
                    {{"format", "pt"}});
  SafetensorsFile f(path);
  EXPECT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.read_f32("x.weight", {2, 3}), a);
  EXPECT_EQ(f.read_f32("y"), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_THROW(f.read_f32("x.weight", {3, 2}), Error);
  try {
    f.get("missing");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos);
  }
}

// Found by fuzz/safetensors_fuzz.cpp: reading an empty tensor passed a null pointer to memcpy
// (undefined behaviour, reported by UBSan in the debug and fuzz presets).
TEST(Safetensors, EmptyTensorsReadAsEmpty) {
  std::string p = tmp_path("empty.safetensors");
  write_raw(p, R"({"e":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},"i":{"dtype":"I32","shape":[0],"data_offsets":[0,0]},"x":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}})", 2);
  SafetensorsFile f(p);
  EXPECT_TRUE(f.read_f32("e", {0, 4}).empty());
  EXPECT_TRUE(f.read_i32("i").empty());
  EXPECT_EQ(f.read_f32("x").size(), 1u);
}

void expect_corrupt(const std::string& path, const std::string& needle) {
  try {
    SafetensorsFile f(path);
    FAIL() << "accepted " << path;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorruption) << e.what();
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(Safetensors, MalformedFilesAreRefusedByName) {
  std::string p = tmp_path("bad.safetensors");
  { std::ofstream f(p, std::ios::binary); f << "abc"; }
  expect_corrupt(p, "shorter than");
  write_raw(p, "{}", 0, false, 1u << 30);
  expect_corrupt(p, "past the end");
  // Headers (with their data sizes) that must be refused, and a word of the message naming why.
  // [the "overlap" with an empty tensor between: that tensor used to hide the overlap; the three
  // "bytes [..." cases: the upstream reader's "no holes, fully indexed buffer" rule (a gap between
  // tensors, bytes after the last one, a first tensor not at 0), accepted before]
  struct Bad {
    const char* header;
    size_t data;
    const char* why;
  };
  const Bad bad[] = {
      {"{not json", 0, "not valid JSON"},
      {R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}})", 4, "unknown dtype"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4, "do not match"},
      {R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8, "outside"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12, "overlap"},
      {R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},"c":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 16, "overlap"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 12, "bytes [4, 8) of the data section belong to no tensor"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8, "bytes [4, 8) at the end of the data section"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8, "bytes [0, 4)"},
      {R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, "negative"},
      {R"([1,2])", 0, "not a JSON object"},
  };
  for (const Bad& b : bad) {
    write_raw(p, b.header, b.data);
    expect_corrupt(p, b.why);
  }
  write_raw(p, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})", 4);
  EXPECT_NO_THROW(SafetensorsFile{p});  // an empty tensor at the end is indexed
  // A length past the format's 100,000,000-byte limit, in a (sparse) 200 MB file: refused before the
  // header-only reader (a sharded load's) allocates and reads it; it read 200 MB of zeros first.
  {
    const std::string big = tmp_path("big.safetensors");
    write_raw(big, "{", 0, false, 150'000'000);
    std::filesystem::resize_file(big, 200'000'000);
    try {
      SafetensorsFile f(big, /*header_only=*/true);
      ADD_FAILURE() << "accepted " << big;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorruption);
      EXPECT_NE(std::string(e.what()).find("header length 150000000 is over the format's limit"), std::string::npos) << e.what();
    }
  }
  // Every dtype of the format is indexed (inspect lists them: an FP8 checkpoint was "unknown dtype
  // 'F8_E4M3'"); the float readers still take F32, F16 and BF16 only.
  write_raw(p, R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"F8_E5M2","shape":[2],"data_offsets":[2,4]},)"
               R"("c":{"dtype":"U16","shape":[1],"data_offsets":[4,6]},"d":{"dtype":"U32","shape":[1],"data_offsets":[6,10]},)"
               R"("e":{"dtype":"U64","shape":[1],"data_offsets":[10,18]}})",
            18);
  {
    SafetensorsFile f(p);
    ASSERT_EQ(f.tensors().size(), 5u);
    EXPECT_STREQ(st_dtype_name(f.get("a").dtype), "F8_E4M3");
    EXPECT_STREQ(st_dtype_name(f.get("e").dtype), "U64");
    try {
      f.read_f32("a");
      ADD_FAILURE() << "an F8 tensor read as f32";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("has dtype F8_E4M3, expected a float type"), std::string::npos) << e.what();
    }
  }
  try {
    SafetensorsFile f(tmp_path("does-not-exist.safetensors"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
  }
}

}  // namespace
}  // namespace mt::checkpoint
