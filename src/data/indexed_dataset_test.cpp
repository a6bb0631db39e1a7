// Tests of the Megatron indexed dataset: writer/reader round trips for uint16 and int32, the bytes
// checked against a hand-built file and against an independent numpy reader
// (tools/check_megatron_idx.py, run when /usr/bin/python3 exists), other stored dtypes converted,
// and every malformed file refused with a kCorruption/kNotFound Error naming the file and field.
#include "data/indexed_dataset.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/file_io.h"
#include "base/scratch_dir.h"

#ifndef MT_SOURCE_DIR
#define MT_SOURCE_DIR "."
#endif

namespace mt::data {
namespace {

using Doc = std::vector<std::vector<int32_t>>;  // a document: its sequences

void write_dataset(const std::string& prefix, int64_t vocab, const std::vector<Doc>& docs) {
  IndexedDatasetWriter w(prefix, vocab);
  for (const Doc& doc : docs) {
    for (const auto& seq : doc) w.add_sequence(seq);
    w.end_document();
  }
  w.finalize();
}

std::vector<char> read_bytes(const std::string& path) {
  return file_read_all(path);
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
void put(std::vector<char>* bytes, size_t offset, T v) {
  std::memcpy(bytes->data() + offset, &v, sizeof v);
}

template <typename T>
void append(std::vector<char>* bytes, T v) {
  const char* p = reinterpret_cast<const char*>(&v);
  bytes->insert(bytes->end(), p, p + sizeof v);
}

// An .idx built field by field from the format description, independent of the writer.
std::vector<char> build_idx(uint8_t code, const std::vector<int32_t>& lengths,
                            const std::vector<int64_t>& pointers,
                            const std::vector<int64_t>& docs) {
  std::vector<char> b = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
  append<uint64_t>(&b, 1);
  append<uint8_t>(&b, code);
  append<uint64_t>(&b, lengths.size());
  append<uint64_t>(&b, docs.size());
  for (int32_t n : lengths) append(&b, n);
  for (int64_t p : pointers) append(&b, p);
  for (int64_t d : docs) append(&b, d);
  return b;
}

const std::vector<Doc> kDocs = {
    {{1, 2, 3}, {4, 5}},
    {{6}},
    {{}, {7, 8, 9, 10}},  // an empty sequence
    {{11, 12}},
};
const std::vector<int32_t> kStream = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
const std::vector<int32_t> kLengths = {3, 2, 1, 0, 4, 2};
const std::vector<int64_t> kDocIndices = {0, 2, 3, 5, 6};

std::vector<Doc> scaled_docs(int32_t offset) {
  std::vector<Doc> docs = kDocs;
  for (Doc& d : docs)
    for (auto& s : d)
      for (int32_t& t : s) t += offset;
  return docs;
}

void check_round_trip(int64_t vocab, int32_t offset, TokenDType dtype) {
  ScratchDir dir;
  std::string prefix = dir.path() + "/ds";
  write_dataset(prefix, vocab, scaled_docs(offset));
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.dtype(), dtype);
  ASSERT_EQ(ds.num_sequences(), kLengths.size());
  EXPECT_EQ(ds.num_documents(), 4u);
  EXPECT_EQ(ds.total_tokens(), kStream.size());
  uint64_t start = 0;
  for (size_t i = 0; i < kLengths.size(); ++i) {
    EXPECT_EQ(ds.sequence_length(i), kLengths[i]);
    EXPECT_EQ(ds.sequence_start(i), start);
    std::vector<int32_t> got(kLengths[i]);
    ds.read(i, 0, kLengths[i], got.data());
    for (int32_t j = 0; j < kLengths[i]; ++j) EXPECT_EQ(got[j], kStream[start + j] + offset);
    start += kLengths[i];
  }
  for (size_t d = 0; d < kDocIndices.size(); ++d)
    EXPECT_EQ(ds.document_first_sequence(d), static_cast<uint64_t>(kDocIndices[d]));
  std::vector<int32_t> part(2);
  ds.read(4, 1, 2, part.data());
  EXPECT_EQ(part, (std::vector<int32_t>{8 + offset, 9 + offset}));
  // Across document boundaries: stream tokens 4..9 span documents 0, 1 and 2.
  std::vector<int32_t> span(6);
  ds.read_stream(4, 6, span.data());
  for (int j = 0; j < 6; ++j) EXPECT_EQ(span[j], kStream[4 + j] + offset);

  // The bytes are exactly Megatron's layout.
  size_t size = token_dtype_size(dtype);
  std::vector<int64_t> pointers;
  int64_t p = 0;
  for (int32_t n : kLengths) {
    pointers.push_back(p);
    p += n * static_cast<int64_t>(size);
  }
  EXPECT_EQ(read_bytes(prefix + ".idx"),
            build_idx(static_cast<uint8_t>(dtype), kLengths, pointers, kDocIndices));
  EXPECT_EQ(read_bytes(prefix + ".bin").size(), kStream.size() * size);
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))  // no temporary left
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

TEST(IndexedDataset, RoundTripUInt16) {
  check_round_trip(50257, 50240, TokenDType::kUInt16);
}

TEST(IndexedDataset, RoundTripInt32) {
  check_round_trip(128256, 128240, TokenDType::kInt32);
}

TEST(IndexedDataset, DtypeFollowsMegatronOptimalDtype) {
  EXPECT_EQ(token_dtype_for_vocab(65499), TokenDType::kUInt16);
  EXPECT_EQ(token_dtype_for_vocab(65500), TokenDType::kInt32);
}

TEST(IndexedDataset, WriterRefusesTokenOutsideVocab) {
  ScratchDir dir;
  IndexedDatasetWriter w(dir.path() + "/ds", 100);
  std::vector<int32_t> bad = {1, 100};
  try {
    w.add_sequence(bad);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("outside vocab"), std::string::npos) << e.what();
  }
}

TEST(IndexedDataset, FinalizeClosesOpenDocumentAndAbandonLeavesNothing) {
  ScratchDir dir;
  {
    IndexedDatasetWriter w(dir.path() + "/a", 10);
    std::vector<int32_t> s = {1, 2};
    w.add_sequence(s);
    w.finalize();
  }
  IndexedDataset a(dir.path() + "/a");
  EXPECT_EQ(a.num_documents(), 1u);
  EXPECT_EQ(a.document_first_sequence(1), 1u);
  {
    IndexedDatasetWriter w(dir.path() + "/b", 10);
    std::vector<int32_t> s = {1, 2};
    w.add_sequence(s);
  }
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().rfind("b.", 0), std::string::npos) << e.path();  // no b.bin, b.idx, b.bin.tmp*
}

// Two writers of one prefix at once (two tokenize runs to one output) each write a temporary of
// their own: the first publishes its dataset whole, the second then replaces it whole. With one
// fixed PREFIX.bin.tmp the second's open truncated the first's file, its writes went into the
// .bin the first had published (beside the first's .idx), and its rename failed.
TEST(IndexedDataset, TwoWritersOfOnePrefixEachPublishAWholeDataset) {
  ScratchDir dir;
  const std::string prefix = dir.path() + "/same";
  // A run of this prefix killed before its rename left its temporary: the next writer removes it.
  { std::ofstream(prefix + ".bin.tmp.Zz9Zz9") << "dead"; }
  std::filesystem::last_write_time(prefix + ".bin.tmp.Zz9Zz9",
                                   std::filesystem::file_time_type::clock::now() - std::chrono::minutes(5));
  IndexedDatasetWriter first(prefix, 10), second(prefix, 10);
  EXPECT_FALSE(file_exists(prefix + ".bin.tmp.Zz9Zz9"));
  std::vector<int32_t> a = {1, 2, 3}, b = {4, 5, 6, 7, 8};
  first.add_sequence(a);
  second.add_sequence(b);
  second.add_sequence(b);
  first.finalize();
  auto sequence = [](const IndexedDataset& d, uint64_t i) {
    std::vector<int32_t> out(static_cast<size_t>(d.sequence_length(i)));
    d.read(i, 0, static_cast<int64_t>(out.size()), out.data());
    return out;
  };
  {
    IndexedDataset d(prefix);
    ASSERT_EQ(d.num_sequences(), 1u);
    EXPECT_EQ(sequence(d, 0), a);
  }
  second.finalize();
  IndexedDataset d(prefix);
  ASSERT_EQ(d.num_sequences(), 2u);
  EXPECT_EQ(sequence(d, 0), b);
  EXPECT_EQ(sequence(d, 1), b);
}

// The pair is renamed into place under the directory's lock, and opened under it: a writer waits
// while another holds it (two writers' renames interleaved: one's .bin with the other's .idx), and
// so does a reader (it opened a new .bin with the old .idx between a writer's two renames).
TEST(IndexedDataset, APairIsPublishedAndOpenedUnderTheDirectorysLock) {
  ScratchDir dir;
  const std::string prefix = dir.path() + "/pair";
  std::vector<int32_t> a = {1, 2, 3};
  IndexedDatasetWriter writer(prefix, 10);
  writer.add_sequence(a);
  std::atomic<bool> done{false};
  std::thread publish;
  {
    const DirectoryLock other_writer(prefix, /*exclusive=*/true);
    publish = std::thread([&] {
      writer.finalize();
      done = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_FALSE(done.load());
    EXPECT_FALSE(file_exists(prefix + ".bin"));  // nothing renamed while the other holds the lock
    EXPECT_FALSE(file_exists(prefix + ".idx"));
  }
  publish.join();
  ASSERT_TRUE(done.load());
  EXPECT_EQ(IndexedDataset(prefix).num_sequences(), 1u);
  done = false;
  uint64_t opened = 0;
  std::thread reader;
  {
    const DirectoryLock publishing(prefix, /*exclusive=*/true);  // a writer between its two renames
    reader = std::thread([&] {
      opened = IndexedDataset(prefix).num_sequences();
      done = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_FALSE(done.load());  // the reader waits for the pair
  }
  reader.join();
  EXPECT_TRUE(done.load());
  EXPECT_EQ(opened, 1u);
  // Readers share the lock: two at once do not wait on each other.
  const DirectoryLock first_reader(prefix, /*exclusive=*/false);
  EXPECT_EQ(IndexedDataset(prefix).num_sequences(), 1u);
}

// Files with a stored dtype the writer never picks are read and converted to int32.
// The .bin is read with pread, not mapped: reading a 32 MiB dataset through does not leave its
// pages in the process's resident set (a mapping's touched pages stayed: the whole 32 MiB).
TEST(IndexedDataset, ReadingTheBinDoesNotGrowTheResidentSet) {
  ScratchDir dir;
  const std::string prefix = dir.path() + "/big";
  {
    IndexedDatasetWriter w(prefix, 50000);
    std::vector<int32_t> seq(4096);
    for (int s = 0; s < 4096; ++s) {  // 16M uint16 tokens: 32 MiB
      for (size_t i = 0; i < seq.size(); ++i) seq[i] = static_cast<int32_t>((s * 7919 + i) % 50000);
      w.add_sequence(seq);
      if (s % 16 == 15) w.end_document();
    }
    w.finalize();
  }
  IndexedDataset ds(prefix);
  ASSERT_EQ(ds.total_tokens(), uint64_t{4096} * 4096);
  std::vector<int32_t> out(4096);
  const double before = static_cast<double>(process_rss_bytes());
  int64_t checksum = 0;
  for (uint64_t i = 0; i < ds.num_sequences(); ++i) {
    ds.read(i, 0, 4096, out.data());
    checksum += out[i % 4096];
    ASSERT_EQ(out[17], static_cast<int32_t>((i * 7919 + 17) % 50000)) << i;
  }
  const double grown = static_cast<double>(process_rss_bytes()) - before;
  EXPECT_GT(checksum, 0);
  EXPECT_LT(grown, 4.0 * 1048576) << "reading 32 MiB of tokens grew the resident set by " << grown / 1048576 << " MiB";
}

// A .bin truncated while a reader has it open (rather than replaced, as the writer does): a read
// past its new end is a kIOError naming the file and the byte, not SIGBUS (as with a mapping).
TEST(IndexedDataset, BinTruncatedWhileInUseIsAnErrorNotASignal) {
  ScratchDir dir;
  const std::string prefix = dir.path() + "/cut";
  write_dataset(prefix, 1000, {Doc{{1, 2, 3, 4}, {5, 6, 7, 8}}, Doc{{9, 10, 11, 12}}});
  IndexedDataset ds(prefix);
  std::filesystem::resize_file(prefix + ".bin", 4);  // two uint16 tokens left
  std::vector<int32_t> out(4);
  ds.read(0, 0, 2, out.data());
  EXPECT_EQ(out[1], 2);
  try {
    ds.read(2, 0, 4, out.data());
    FAIL() << "read past the truncated end";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIOError);
    EXPECT_NE(std::string(e.what()).find("cut.bin"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated while in use"), std::string::npos) << e.what();
  }
}

// The .idx stays mapped. Truncated (not replaced) while a reader has it, the pages past its new end
// are gone and reading them raised SIGBUS, ending the run without a word; now the read is a
// kIOError naming the file. A SIGBUS outside the guarded reads still ends the process.
TEST(IndexedDataset, IdxTruncatedWhileInUseIsAnErrorNotASignal) {
  ScratchDir dir;
  const std::string prefix = dir.path() + "/cut";
  write_dataset(prefix, 1000, {Doc{{1, 2, 3, 4}, {5, 6, 7, 8}}, Doc{{9, 10, 11, 12}}});
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.sequence_length(2), 4);
  std::filesystem::resize_file(prefix + ".idx", 0);
  for (int what = 0; what < 3; ++what) {
    try {
      if (what == 0) ds.sequence_length(1);
      if (what == 1) ds.sequence_start(1);
      if (what == 2) ds.document_first_sequence(1);
      FAIL() << "read the truncated index (" << what << ")";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kIOError);
      EXPECT_NE(std::string(e.what()).find("cut.idx"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("truncated while in use"), std::string::npos) << e.what();
    }
  }
  // The checks the constructor runs read the index the same way: truncated under them (between the
  // mapping and the checks of a reader being opened), they are a kIOError too.
  try {
    ds.validate();
    FAIL() << "validated the truncated index";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIOError) << e.what();
    EXPECT_NE(std::string(e.what()).find("cut.idx"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated while in use"), std::string::npos) << e.what();
  }
  EXPECT_EXIT(::raise(SIGBUS), ::testing::KilledBySignal(SIGBUS), "");
}

// The checks read the arrays a block of 65,536 values at a time: an index of more sequences than a
// block is checked across the blocks' edges (a gap after the first block is found, and named).
TEST(IndexedDataset, ChecksSpanTheValidationsBlocks) {
  ScratchDir dir;
  const std::string prefix = dir.path() + "/many";
  const int S = 65536 + 100;
  std::vector<int32_t> lengths(S, 1);
  std::vector<int64_t> pointers(S);
  for (int i = 0; i < S; ++i) pointers[i] = 4 * int64_t{i};
  std::vector<char> bin(4 * size_t{S}, 0);
  write_bytes(prefix + ".bin", bin);
  write_bytes(prefix + ".idx", build_idx(4, lengths, pointers, {0, S}));
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.total_tokens(), uint64_t{S});
  EXPECT_EQ(ds.sequence_start(S - 1), uint64_t{S - 1});
  pointers[65537] += 4;  // a gap in the second block
  write_bytes(prefix + ".idx", build_idx(4, lengths, pointers, {0, S}));
  try {
    IndexedDataset bad(prefix);
    FAIL() << "opened an index with a gap";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorruption) << e.what();
    EXPECT_NE(std::string(e.what()).find("sequence_pointers[65537]"), std::string::npos) << e.what();
  }
}

TEST(IndexedDataset, ReadsOtherDtypes) {
  ScratchDir dir;
  std::string prefix = dir.path() + "/ds";
  std::vector<char> bin;
  for (int64_t v : {7, 0, 2147483647}) append(&bin, v);
  write_bytes(prefix + ".bin", bin);
  write_bytes(prefix + ".idx", build_idx(5, {2, 1}, {0, 16}, {0, 2}));
  IndexedDataset ds(prefix);
  std::vector<int32_t> got(3);
  ds.read_stream(0, 3, got.data());
  EXPECT_EQ(got, (std::vector<int32_t>{7, 0, 2147483647}));

  bin.clear();
  for (float v : {3.0f, 4.5f}) append(&bin, v);
  write_bytes(prefix + ".bin", bin);
  write_bytes(prefix + ".idx", build_idx(7, {2}, {0}, {0, 1}));
  IndexedDataset fs(prefix);
  fs.read(0, 0, 1, got.data());
  EXPECT_EQ(got[0], 3);
  // 4.5 is not a token id: named by its stream position and value (it said "token 0 of a read",
  // and an int64 past int32 gave its value alone: stop 73).
  try {
    fs.read(0, 1, 1, got.data());
    ADD_FAILURE() << "4.5 was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ds.bin: the token at stream position 1 is 4.5, not an int32 token id"), std::string::npos)
        << e.what();
  }
  bin.clear();
  for (int64_t v : {int64_t{7}, int64_t{1} << 40}) append(&bin, v);
  write_bytes(prefix + ".bin", bin);
  write_bytes(prefix + ".idx", build_idx(5, {2}, {0}, {0, 1}));
  IndexedDataset big(prefix);
  try {
    big.read_stream(0, 2, got.data());
    ADD_FAILURE() << "2^40 was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the token at stream position 1 is 1099511627776, not an int32 token id"), std::string::npos)
        << e.what();
  }

  write_bytes(prefix + ".bin", {char(200), char(1)});
  write_bytes(prefix + ".idx", build_idx(1, {2}, {0}, {0, 1}));
  IndexedDataset u8(prefix);
  u8.read(0, 0, 2, got.data());
  EXPECT_EQ(got[0], 200);
  EXPECT_EQ(got[1], 1);
}

// ---- Cross-check with an independent numpy reader ----

void check_with_numpy(int64_t vocab, int32_t offset, const char* dtype_name) {
  if (!file_exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  ScratchDir dir;
  std::string prefix = dir.path() + "/ds";
  write_dataset(prefix, vocab, scaled_docs(offset));
  std::string out = dir.path() + "/out.json";
  std::string cmd = std::string("/usr/bin/python3 ") + MT_SOURCE_DIR +
                    "/tools/check_megatron_idx.py " + prefix + " > " + out;
  int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc)) << cmd;
  if (WEXITSTATUS(rc) == 3) GTEST_SKIP() << "numpy missing";
  ASSERT_EQ(WEXITSTATUS(rc), 0) << cmd;
  std::vector<char> text = read_bytes(out);
  nlohmann::json j = nlohmann::json::parse(std::string(text.begin(), text.end()));

  IndexedDataset ds(prefix);
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["dtype"], dtype_name);
  EXPECT_EQ(j["dtype_code"], static_cast<int>(ds.dtype()));
  EXPECT_EQ(j["sequence_count"], ds.num_sequences());
  EXPECT_EQ(j["document_count"], ds.num_documents() + 1);
  for (uint64_t i = 0; i < ds.num_sequences(); ++i) {
    EXPECT_EQ(j["sequence_lengths"][i], ds.sequence_length(i));
    EXPECT_EQ(j["sequence_pointers"][i], ds.sequence_start(i) * token_dtype_size(ds.dtype()));
    std::vector<int32_t> got(ds.sequence_length(i));
    ds.read(i, 0, ds.sequence_length(i), got.data());
    EXPECT_EQ(j["sequences"][i].get<std::vector<int32_t>>(), got) << "sequence " << i;
  }
  for (uint64_t d = 0; d <= ds.num_documents(); ++d)
    EXPECT_EQ(j["document_indices"][d], ds.document_first_sequence(d));
  EXPECT_EQ(j["document_indices"].get<std::vector<int64_t>>(), kDocIndices);
}

TEST(IndexedDataset, MatchesNumpyReaderUInt16) {
  check_with_numpy(50257, 50240, "uint16");
}

TEST(IndexedDataset, MatchesNumpyReaderInt32) {
  check_with_numpy(128256, 128240, "int32");
}

// ---- Malformed files ----

class MalformedIndex : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = dir_.path() + "/ds";
    write_dataset(prefix_, 1000, kDocs);  // uint16, S = 6, D = 5
    idx_ = read_bytes(prefix_ + ".idx");
    bin_ = read_bytes(prefix_ + ".bin");
  }
  size_t pointer_offset(size_t i) const { return 34 + 4 * 6 + 8 * i; }
  size_t document_offset(size_t d) const { return 34 + 12 * 6 + 8 * d; }

  // Writes the (patched) files, opens them and expects an error of kind whose message names file
  // and contains what.
  void expect_refused(ErrorKind kind, const std::string& file, const std::string& what) {
    write_bytes(prefix_ + ".idx", idx_);
    write_bytes(prefix_ + ".bin", bin_);
    try {
      IndexedDataset ds(prefix_);
      FAIL() << "opened without error; expected: " << what;
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_EQ(e.kind(), kind) << msg;
      EXPECT_NE(msg.find(prefix_ + file), std::string::npos) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
    }
  }

  ScratchDir dir_;
  std::string prefix_;
  std::vector<char> idx_, bin_;
};

TEST_F(MalformedIndex, ValidFileOpens) {
  write_bytes(prefix_ + ".idx", idx_);
  IndexedDataset ds(prefix_);
  EXPECT_EQ(ds.total_tokens(), 12u);
}

TEST_F(MalformedIndex, TruncatedHeader) {
  idx_.resize(20);
  expect_refused(ErrorKind::kCorruption, ".idx", "truncated header");
}

TEST_F(MalformedIndex, TruncatedArrays) {
  idx_.resize(idx_.size() - 8);
  expect_refused(ErrorKind::kCorruption, ".idx", "truncated");
}

TEST_F(MalformedIndex, EmptyIndex) {
  idx_.clear();
  expect_refused(ErrorKind::kCorruption, ".idx", "truncated header");
}

TEST_F(MalformedIndex, HugeCountsDoNotOverflow) {
  put<uint64_t>(&idx_, 18, uint64_t{1} << 62);
  expect_refused(ErrorKind::kCorruption, ".idx", "sequence_count");
}

TEST_F(MalformedIndex, TrailingBytes) {
  idx_.insert(idx_.end(), 3, '\0');
  expect_refused(ErrorKind::kCorruption, ".idx", "trailing bytes");
}

TEST_F(MalformedIndex, WrongMagic) {
  idx_[0] = 'X';
  expect_refused(ErrorKind::kCorruption, ".idx", "bad magic");
}

TEST_F(MalformedIndex, WrongVersion) {
  put<uint64_t>(&idx_, 9, 2);
  expect_refused(ErrorKind::kCorruption, ".idx", "version 2");
}

TEST_F(MalformedIndex, UnknownDtypeCode) {
  idx_[17] = 9;
  expect_refused(ErrorKind::kCorruption, ".idx", "unknown dtype code 9");
}

TEST_F(MalformedIndex, PointerPastEndOfBin) {
  put<int64_t>(&idx_, pointer_offset(5), 24);  // sequence 5 has 2 tokens; the .bin has 24 bytes
  expect_refused(ErrorKind::kCorruption, ".idx",
                 "sequence_pointers[5] = 24 with 4 bytes runs past the end");
}

TEST_F(MalformedIndex, NegativePointer) {
  put<int64_t>(&idx_, pointer_offset(0), -2);
  expect_refused(ErrorKind::kCorruption, ".idx", "sequence_pointers[0] = -2");
}

TEST_F(MalformedIndex, OverlappingPointers) {
  put<int64_t>(&idx_, pointer_offset(1), 4);  // sequence 0 is bytes [0, 6)
  expect_refused(ErrorKind::kCorruption, ".idx", "sequence_pointers[1] = 4 overlaps");
}

TEST_F(MalformedIndex, GapBetweenSequences) {
  put<int64_t>(&idx_, pointer_offset(1), 8);
  expect_refused(ErrorKind::kCorruption, ".idx", "sequence_pointers[1] = 8 leaves a gap");
}

TEST_F(MalformedIndex, NegativeLength) {
  put<int32_t>(&idx_, 34 + 4 * 2, -1);
  expect_refused(ErrorKind::kCorruption, ".idx", "sequence_lengths[2] = -1");
}

TEST_F(MalformedIndex, DocumentIndicesNotEndingAtSequenceCount) {
  put<int64_t>(&idx_, document_offset(4), 5);
  expect_refused(ErrorKind::kCorruption, ".idx",
                 "document_indices ends at 5, not at sequence_count 6");
}

TEST_F(MalformedIndex, DocumentIndicesNotStartingAtZero) {
  put<int64_t>(&idx_, document_offset(0), 1);
  expect_refused(ErrorKind::kCorruption, ".idx", "document_indices[0] = 1");
}

TEST_F(MalformedIndex, DocumentIndicesDecreasing) {
  put<int64_t>(&idx_, document_offset(2), 1);
  expect_refused(ErrorKind::kCorruption, ".idx", "document_indices[2] = 1 decreases");
}

TEST_F(MalformedIndex, DocumentIndexPastSequenceCount) {
  put<int64_t>(&idx_, document_offset(3), 7);
  expect_refused(ErrorKind::kCorruption, ".idx", "document_indices[3] = 7 exceeds sequence_count");
}

TEST_F(MalformedIndex, BinShorterThanClaimed) {
  bin_.resize(bin_.size() - 2);
  expect_refused(ErrorKind::kCorruption, ".bin", "22 bytes, but the sequence_lengths");
}

TEST_F(MalformedIndex, BinLongerThanClaimed) {
  bin_.resize(bin_.size() + 2);
  expect_refused(ErrorKind::kCorruption, ".bin", "26 bytes, but the sequence_lengths");
}

TEST_F(MalformedIndex, MissingBin) {
  write_bytes(prefix_ + ".idx", idx_);
  std::filesystem::remove(prefix_ + ".bin");
  try {
    IndexedDataset ds(prefix_);
    FAIL() << "opened without a .bin";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
    EXPECT_NE(std::string(e.what()).find(prefix_ + ".bin: cannot open"), std::string::npos)
        << e.what();
  }
}

TEST_F(MalformedIndex, MissingIdx) {
  std::filesystem::remove(prefix_ + ".idx");
  EXPECT_THROW(IndexedDataset ds(prefix_), Error);
}

}  // namespace
}  // namespace mt::data
