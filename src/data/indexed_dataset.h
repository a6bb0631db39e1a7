// Megatron-LM's memory-mapped indexed dataset (megatron/core/datasets/indexed_dataset.py): a token
// file PREFIX.bin (raw tokens, one dtype) and an index PREFIX.idx, little-endian:
//
//   offset 0   magic "MMIDIDX\0\0"                         9 bytes
//   offset 9   version u64 = 1
//   offset 17  dtype code u8 (TokenDType)
//   offset 18  sequence_count S u64
//   offset 26  document_count D u64
//   offset 34  sequence_lengths   int32[S]   (tokens)
//              sequence_pointers  int64[S]   (byte offsets into .bin)
//              document_indices   int64[D]   (optional int8[S] sequence modes of multimodal files)
//
// document_indices is Megatron's IndexedDatasetBuilder list: it starts at [0] and end_document()
// appends the number of sequences written so far, so D = documents + 1, document d holds sequences
// [document_indices[d], document_indices[d + 1]) and the last entry is S.
//
// The reader maps both files (the .bin is never read whole) and validates the index up front;
// every inconsistency is a kCorruption Error naming the file and the field.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/file_io.h"

namespace mt::data {

// Megatron's DType codes; serialised, so append-only.
enum class TokenDType : uint8_t {
  kUInt8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUInt16 = 8,
};

bool token_dtype_is_known(uint8_t code);
size_t token_dtype_size(TokenDType dtype);
const char* token_dtype_name(TokenDType dtype);
// Megatron's DType.optimal_dtype: uint16 when vocab_size < 65500, else int32.
TokenDType token_dtype_for_vocab(int64_t vocab_size);

std::string indexed_dataset_idx_path(const std::string& prefix);
std::string indexed_dataset_bin_path(const std::string& prefix);

// Writes PREFIX.bin and PREFIX.idx. Tokens stream into a temporary of the writer's own
// (PREFIX.bin.tmp.XXXXXX, AtomicFile) as they are added; finalize() fsyncs and renames it, then
// writes the .idx atomically, so a reader sees either no dataset, an old one, or the whole new one
// (a new .bin beside an old .idx is refused by the reader's checks). Two writers of one prefix at
// once each write files of their own (the second no longer writes into the first's); their two
// renames may interleave, which the reader's checks refuse where the sizes differ. A temporary
// whose writer died goes with the next writer of the prefix (remove_dead_temporaries).
class IndexedDatasetWriter {
 public:
  // REQUIRES: vocab_size > 0. Every token added must lie in [0, vocab_size).
  IndexedDatasetWriter(const std::string& prefix, int64_t vocab_size);
  ~IndexedDatasetWriter();  // removes the temporary .bin when finalize() was not reached
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  void add_sequence(std::span<const int32_t> tokens);
  // Closes the current document; a document with no sequence is allowed (Megatron allows it too).
  void end_document();
  // Closes a document left open, then writes the files. REQUIRES: called once.
  void finalize();

  TokenDType dtype() const { return dtype_; }
  uint64_t num_sequences() const { return lengths_.size(); }

 private:
  void flush_buffer();

  std::string prefix_;
  int64_t vocab_size_;
  TokenDType dtype_;
  std::unique_ptr<AtomicFile> bin_;  // the .bin's temporary until finalize()
  std::vector<char> buffer_;  // encoded tokens not yet written to bin_
  uint64_t bin_bytes_ = 0;    // bytes added so far, buffered or written
  std::vector<int32_t> lengths_;
  std::vector<int64_t> document_indices_{0};
  bool finalized_ = false;
};

// A read-only mapping of a whole file; empty files map to nothing. read() copies bytes out under a
// SIGBUS guard: a file truncated (not replaced) while mapped makes the access past its new end a
// kIOError naming the file, as the .bin's pread does, instead of killing the process.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // kNotFound when missing, kIOError otherwise
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const char* data() const { return data_; }
  size_t size() const { return size_; }
  // n bytes at offset into out (offset + n <= size()); kIOError when the file no longer holds them.
  void read(size_t offset, void* out, size_t n) const;
  template <typename T>
  T load(size_t offset) const {
    T v;
    read(offset, &v, sizeof v);
    return v;
  }

 private:
  void release();

  std::string path_;
  const char* data_ = nullptr;
  size_t size_ = 0;
};

// Reader of a Megatron indexed dataset. Invariant (checked at open): sequences lie in .bin in order
// and back to back from byte 0, so token p of the concatenation of all sequences (the "stream") is
// at byte p · dtype size. Values are converted to int32 when read; a stored value that does not fit
// (int64 or float files) is a kCorruption Error then.
// The .idx stays mapped for the reader's lifetime (its reads, the checks at open included, SIGBUS-guarded). The .bin is read with pread, not mapped: reads
// copy the tokens out anyway, a mapping's touched pages would count in the process's resident set
// for good (a long run over a large dataset: gigabytes, DESIGN-NOTES 60), and a .bin truncated
// while in use (rather than replaced, as the writer does) gives a kIOError naming it, not SIGBUS.
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);

  const std::string& prefix() const { return prefix_; }
  TokenDType dtype() const { return dtype_; }
  uint64_t num_sequences() const { return sequence_count_; }
  uint64_t num_documents() const { return document_count_ - 1; }
  uint64_t total_tokens() const { return total_tokens_; }
  int64_t sequence_length(uint64_t i) const;
  // Stream position of the first token of sequence i.
  uint64_t sequence_start(uint64_t i) const;
  // document_indices[d] for d in [0, num_documents()]: the first sequence of document d.
  uint64_t document_first_sequence(uint64_t d) const;

  // out[0, count) = tokens [offset, offset + count) of sequence i.
  // REQUIRES: i < num_sequences(), 0 <= offset, offset + count <= sequence_length(i).
  void read(uint64_t i, int64_t offset, int64_t count, int32_t* out) const;
  // out[0, count) = stream tokens [position, position + count); may span sequences and documents.
  // REQUIRES: position + count <= total_tokens().
  void read_stream(uint64_t position, uint64_t count, int32_t* out) const;

  // The index's checks against itself and the .bin's size, which the constructor runs. Every read
  // of the mapping goes through MappedFile::read, a block at a time, so an index truncated under a
  // check is a kIOError naming it, not SIGBUS.
  void validate();

 private:
  IndexedDataset(const std::string& prefix, const DirectoryLock& opening);
  void validate_header();
  void validate_document_indices();
  void validate_sequences();
  int64_t pointer(uint64_t i) const;

  std::string prefix_;
  std::string idx_path_;
  std::string bin_path_;
  MappedFile idx_;
  // The .bin: an open descriptor and its size at open.
  struct File {
    uint64_t size = 0;  // before fd: fd's initialiser sets it
    int fd = -1;
    explicit File(const std::string& path);
    ~File();
    File(const File&) = delete;
    File& operator=(const File&) = delete;
  } bin_;
  TokenDType dtype_ = TokenDType::kUInt16;
  size_t dtype_size_ = 2;
  uint64_t sequence_count_ = 0;
  uint64_t document_count_ = 0;
  uint64_t total_tokens_ = 0;
  size_t lengths_offset_ = 0;  // byte offsets of the three arrays in .idx
  size_t pointers_offset_ = 0;
  size_t documents_offset_ = 0;
};

}  // namespace mt::data
