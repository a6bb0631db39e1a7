// Megatron indexed dataset: the writer (streams tokens to a temporary .bin, then .bin and .idx
// renamed into place, .idx last) and the memory-mapped reader with its up-front validation. The
// layout is in indexed_dataset.h.
#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <atomic>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/file_io.h"

namespace mt::data {

static_assert(std::endian::native == std::endian::little, "the .idx/.bin format is little-endian");

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderBytes = 34;  // magic 9 + version 8 + dtype 1 + counts 8 + 8
constexpr size_t kWriteBufferBytes = size_t{1} << 20;

template <typename T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
void append(std::vector<char>* out, T v) {
  const char* p = reinterpret_cast<const char*>(&v);
  out->insert(out->end(), p, p + sizeof v);
}

Error corruption(const std::string& path, const std::string& what) {
  return Error(ErrorKind::kCorruption, path + ": " + what);
}

// Converts n stored values of type T, from stream position `first`, to int32; a value that is not
// an int32 integer is corruption, named by its stream position and value (it said "token 6 of a
// read", the offset in one sample's window, or the value alone: stop 73).
template <typename T>
void convert(const char* src, uint64_t n, int32_t* out, const std::string& path, uint64_t first) {
  for (uint64_t k = 0; k < n; ++k) {
    T v = load<T>(src + k * sizeof(T));
    bool fits = true;
    if constexpr (std::is_floating_point_v<T>) {
      // NaN fails every comparison; 2^31 is exact in float and double.
      fits = v >= -2147483648.0 && v < 2147483648.0 && std::floor(v) == v;
    } else if constexpr (sizeof(T) > 4) {
      fits = v >= INT32_MIN && v <= INT32_MAX;
    }
    if (!fits) {
      char value[48];
      if constexpr (std::is_floating_point_v<T>) std::snprintf(value, sizeof value, "%.9g", static_cast<double>(v));
      else std::snprintf(value, sizeof value, "%lld", static_cast<long long>(v));
      throw corruption(path, "the token at stream position " + std::to_string(first + k) + " is " + value +
                                 ", not an int32 token id");
    }
    out[k] = static_cast<int32_t>(v);
  }
}

}  // namespace

bool token_dtype_is_known(uint8_t code) {
  return code >= 1 && code <= 8;
}

size_t token_dtype_size(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::kUInt8:
    case TokenDType::kInt8:
      return 1;
    case TokenDType::kInt16:
    case TokenDType::kUInt16:
      return 2;
    case TokenDType::kInt32:
    case TokenDType::kFloat32:
      return 4;
    case TokenDType::kInt64:
    case TokenDType::kFloat64:
      return 8;
  }
  throw Error(ErrorKind::kInternal, "token_dtype_size: unknown dtype");
}

const char* token_dtype_name(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::kUInt8:
      return "uint8";
    case TokenDType::kInt8:
      return "int8";
    case TokenDType::kInt16:
      return "int16";
    case TokenDType::kInt32:
      return "int32";
    case TokenDType::kInt64:
      return "int64";
    case TokenDType::kFloat64:
      return "float64";
    case TokenDType::kFloat32:
      return "float32";
    case TokenDType::kUInt16:
      return "uint16";
  }
  return "unknown";
}

TokenDType token_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size < 65500 ? TokenDType::kUInt16 : TokenDType::kInt32;
}

std::string indexed_dataset_idx_path(const std::string& prefix) {
  return prefix + ".idx";
}
std::string indexed_dataset_bin_path(const std::string& prefix) {
  return prefix + ".bin";
}

// ---- IndexedDatasetWriter ----

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, int64_t vocab_size)
    : prefix_(prefix),
      vocab_size_(vocab_size),
      dtype_(token_dtype_for_vocab(vocab_size)) {
  MT_CHECK(vocab_size > 0 && vocab_size <= int64_t{INT32_MAX} + 1, ErrorKind::kInvalidArgument,
           prefix + ": indexed dataset vocab_size " + std::to_string(vocab_size) + " out of range");
  // The temporaries of this prefix's runs that died before their rename (random names, not one
  // fixed name the next run overwrote) go first.
  remove_dead_temporaries(indexed_dataset_bin_path(prefix));
  remove_dead_temporaries(indexed_dataset_idx_path(prefix));
  bin_ = std::make_unique<AtomicFile>(indexed_dataset_bin_path(prefix));
  buffer_.reserve(kWriteBufferBytes);
}

IndexedDatasetWriter::~IndexedDatasetWriter() = default;  // an uncommitted temporary is removed

void IndexedDatasetWriter::add_sequence(std::span<const int32_t> tokens) {
  MT_CHECK(!finalized_, ErrorKind::kInvalidArgument, prefix_ + ": add_sequence after finalize");
  MT_CHECK(tokens.size() <= size_t{INT32_MAX}, ErrorKind::kInvalidArgument,
           prefix_ + ": sequence of " + std::to_string(tokens.size()) + " tokens exceeds int32");
  for (size_t k = 0; k < tokens.size(); ++k) {
    int32_t t = tokens[k];
    MT_CHECK(t >= 0 && t < vocab_size_, ErrorKind::kInvalidArgument,
             prefix_ + ": token " + std::to_string(t) + " at position " + std::to_string(k) +
                 " of sequence " + std::to_string(lengths_.size()) + " outside vocab [0, " +
                 std::to_string(vocab_size_) + ")");
    if (dtype_ == TokenDType::kUInt16) {
      append(&buffer_, static_cast<uint16_t>(t));
    } else {
      append(&buffer_, t);
    }
    if (buffer_.size() >= kWriteBufferBytes) flush_buffer();
  }
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
  bin_bytes_ += tokens.size() * token_dtype_size(dtype_);
}

void IndexedDatasetWriter::end_document() {
  MT_CHECK(!finalized_, ErrorKind::kInvalidArgument, prefix_ + ": end_document after finalize");
  document_indices_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetWriter::flush_buffer() {
  bin_->append(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void IndexedDatasetWriter::finalize() {
  MT_CHECK(!finalized_, ErrorKind::kInvalidArgument, prefix_ + ": finalize called twice");
  if (document_indices_.back() != static_cast<int64_t>(lengths_.size())) end_document();

  flush_buffer();
  finalized_ = true;

  uint64_t S = lengths_.size();
  uint64_t D = document_indices_.size();
  std::vector<char> idx;
  idx.reserve(kHeaderBytes + 12 * S + 8 * D);
  idx.insert(idx.end(), kMagic, kMagic + sizeof kMagic);
  append<uint64_t>(&idx, 1);
  append<uint8_t>(&idx, static_cast<uint8_t>(dtype_));
  append<uint64_t>(&idx, S);
  append<uint64_t>(&idx, D);
  for (int32_t n : lengths_) append<int32_t>(&idx, n);
  int64_t pointer = 0;
  for (int32_t n : lengths_) {
    append<int64_t>(&idx, pointer);
    pointer += int64_t{n} * static_cast<int64_t>(token_dtype_size(dtype_));
  }
  for (int64_t d : document_indices_) append<int64_t>(&idx, d);
  AtomicFile idx_file(indexed_dataset_idx_path(prefix_));
  idx_file.append(idx.data(), idx.size());
  // Both on disk before either is renamed (a failed .idx sync published the .bin beside the old
  // .idx), and outside the lock (a large .bin's fsync held every reader of the directory). Then
  // published together: another writer of this prefix renames its pair before or after ours, never
  // between (its .bin with our .idx), and a reader opens a pair (IndexedDataset).
  bin_->sync();
  idx_file.sync();
  const DirectoryLock publishing(prefix_, /*exclusive=*/true);
  bin_->commit();
  idx_file.commit();
  bin_.reset();
}

// ---- MappedFile ----

namespace {

// Opens a regular file for reading: its descriptor, and its size in *size. kNotFound when missing,
// kInvalidArgument when not a regular file, kIOError otherwise.
int open_regular(const std::string& path, uint64_t* size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    throw Error(e == ENOENT ? ErrorKind::kNotFound : ErrorKind::kIOError,
                path + ": cannot open: " + std::strerror(e));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw Error(ErrorKind::kIOError, path + ": fstat failed: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(ErrorKind::kInvalidArgument, path + ": not a regular file" + (S_ISDIR(st.st_mode) ? " (a directory)" : ""));
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

}  // namespace

namespace {

// The SIGBUS guard of MappedFile::read: the handler jumps back into the read that faulted (its
// thread's guard); a SIGBUS anywhere else gets the previous disposition, or the default one.
// volatile: the handler reads it, so the stores around the guarded copy are never dropped.
thread_local sigjmp_buf* volatile t_bus_guard = nullptr;
struct sigaction g_prev_bus {};

void on_sigbus(int sig, siginfo_t* info, void* context) {
  if (sigjmp_buf* guard = t_bus_guard) {
    t_bus_guard = nullptr;
    siglongjmp(*guard, 1);
  }
  if ((g_prev_bus.sa_flags & SA_SIGINFO) != 0 && g_prev_bus.sa_sigaction != nullptr) {
    g_prev_bus.sa_sigaction(sig, info, context);
    return;
  }
  if ((g_prev_bus.sa_flags & SA_SIGINFO) == 0 && g_prev_bus.sa_handler != SIG_DFL && g_prev_bus.sa_handler != SIG_IGN) {
    g_prev_bus.sa_handler(sig);
    return;
  }
  ::signal(SIGBUS, SIG_DFL);  // the default action: the process ends by SIGBUS, as without the guard
  ::raise(SIGBUS);
}

void install_sigbus_guard() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;  // not blocked after the jump out of the handler
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_prev_bus);
  });
}

}  // namespace

void MappedFile::read(size_t offset, void* out, size_t n) const {
  sigjmp_buf env;
  sigjmp_buf* const outer = t_bus_guard;  // a guard around this one, restored after it
  if (sigsetjmp(env, 0) != 0) {
    std::atomic_signal_fence(std::memory_order_seq_cst);
    t_bus_guard = outer;
    throw Error(ErrorKind::kIOError, path_ + ": bytes " + std::to_string(offset) + "-" + std::to_string(offset + n) +
                                         " are no longer in the file (truncated while in use?)");
  }
  t_bus_guard = &env;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(out, data_ + offset, n);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_bus_guard = outer;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  install_sigbus_guard();
  uint64_t bytes = 0;
  int fd = open_regular(path, &bytes);
  size_ = static_cast<size_t>(bytes);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      throw Error(ErrorKind::kIOError, path + ": mmap failed: " + std::strerror(e));
    }
    data_ = static_cast<const char*>(p);
  }
  ::close(fd);  // the mapping stays valid
}

MappedFile::~MappedFile() {
  release();
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::release() {
  if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

IndexedDataset::File::File(const std::string& path) : fd(open_regular(path, &size)) {}

IndexedDataset::File::~File() {
  if (fd >= 0) ::close(fd);
}

// ---- IndexedDataset ----

IndexedDataset::IndexedDataset(const std::string& prefix)
    : IndexedDataset(prefix, DirectoryLock(indexed_dataset_idx_path(prefix), /*exclusive=*/false)) {}

// The lock is the caller's temporary: held until this constructor returns, over both opens.
IndexedDataset::IndexedDataset(const std::string& prefix, const DirectoryLock& /*opening*/)
    : prefix_(prefix),
      idx_path_(indexed_dataset_idx_path(prefix)),
      bin_path_(indexed_dataset_bin_path(prefix)),
      idx_(idx_path_),
      bin_(bin_path_) {
  validate();
}

void IndexedDataset::validate() {
  validate_header();
  validate_document_indices();
  validate_sequences();
}

namespace {

// fn(i, v) for the `count` values v of type T at byte `offset` of f, in order, copied out a block
// at a time under the mapping's SIGBUS guard.
template <typename T, typename Fn>
void for_each_value(const MappedFile& f, uint64_t offset, uint64_t count, Fn&& fn) {
  constexpr uint64_t kBlock = uint64_t{1} << 16;
  std::vector<T> block(static_cast<size_t>(std::min(count, kBlock)));
  for (uint64_t i0 = 0; i0 < count; i0 += kBlock) {
    const uint64_t m = std::min(kBlock, count - i0);
    f.read(offset + i0 * sizeof(T), block.data(), m * sizeof(T));
    for (uint64_t j = 0; j < m; ++j) fn(i0 + j, block[j]);
  }
}

}  // namespace

void IndexedDataset::validate_header() {
  size_t size = idx_.size();
  if (size < kHeaderBytes)
    throw corruption(idx_path_, "truncated header: " + std::to_string(size) +
                                    " bytes, a Megatron index header needs 34");
  char header[kHeaderBytes];
  idx_.read(0, header, kHeaderBytes);
  const char* p = header;
  if (std::memcmp(p, kMagic, sizeof kMagic) != 0)
    throw corruption(idx_path_, "bad magic: not a Megatron MMIDIDX index");
  uint64_t version = load<uint64_t>(p + 9);
  if (version != 1)
    throw corruption(idx_path_, "unsupported version " + std::to_string(version) + ", expected 1");
  uint8_t code = load<uint8_t>(p + 17);
  if (!token_dtype_is_known(code))
    throw corruption(idx_path_,
                     "unknown dtype code " + std::to_string(code) + " (Megatron's codes are 1..8)");
  dtype_ = static_cast<TokenDType>(code);
  dtype_size_ = token_dtype_size(dtype_);
  sequence_count_ = load<uint64_t>(p + 18);
  document_count_ = load<uint64_t>(p + 26);

  // The arrays need 12·S + 8·D bytes (+ S for the modes of a multimodal file). Compare by division
  // first so that absurd counts cannot overflow.
  uint64_t body = size - kHeaderBytes;
  bool counts_fit = sequence_count_ <= body / 12 && document_count_ <= body / 8;
  uint64_t need = counts_fit ? 12 * sequence_count_ + 8 * document_count_ : 0;
  if (!counts_fit || body < need) {
    throw corruption(idx_path_,
                     "truncated: " + std::to_string(size) + " bytes cannot hold " +
                         std::to_string(sequence_count_) + " sequences (sequence_count) and " +
                         std::to_string(document_count_) + " document indices (document_count)");
  }
  if (body != need && body != need + sequence_count_) {
    throw corruption(idx_path_, std::to_string(body - need) +
                                    " trailing bytes after the arrays of " +
                                    std::to_string(sequence_count_) + " sequences and " +
                                    std::to_string(document_count_) + " document indices");
  }
  lengths_offset_ = kHeaderBytes;
  pointers_offset_ = lengths_offset_ + 4 * sequence_count_;
  documents_offset_ = pointers_offset_ + 8 * sequence_count_;
}

void IndexedDataset::validate_document_indices() {
  if (document_count_ == 0)
    throw corruption(idx_path_, "document_count is 0; document_indices must start with 0");
  int64_t prev = 0;
  for_each_value<int64_t>(idx_, documents_offset_, document_count_, [&](uint64_t d, int64_t v) {
    auto at = [&] { return "document_indices[" + std::to_string(d) + "] = " + std::to_string(v); };
    if (d == 0 && v != 0) throw corruption(idx_path_, at() + ", must be 0");
    if (v < prev)
      throw corruption(idx_path_, at() + " decreases (previous " + std::to_string(prev) + ")");
    if (static_cast<uint64_t>(v) > sequence_count_)
      throw corruption(idx_path_,
                       at() + " exceeds sequence_count " + std::to_string(sequence_count_));
    prev = v;
  });
  if (static_cast<uint64_t>(prev) != sequence_count_)
    throw corruption(idx_path_, "document_indices ends at " + std::to_string(prev) +
                                    ", not at sequence_count " + std::to_string(sequence_count_));
}

void IndexedDataset::validate_sequences() {
  // Lengths first, so a short .bin is reported as such rather than as a pointer past its end.
  uint64_t total = 0;
  for_each_value<int32_t>(idx_, lengths_offset_, sequence_count_, [&](uint64_t i, int32_t n) {
    if (n < 0)
      throw corruption(idx_path_, "sequence_lengths[" + std::to_string(i) +
                                      "] = " + std::to_string(n) + " is negative");
    total += static_cast<uint64_t>(n);  // S·2^31 cannot overflow: S is bounded by the file size
  });
  total_tokens_ = total;
  uint64_t bin_size = bin_.size;
  if (bin_size / dtype_size_ != total || bin_size % dtype_size_ != 0) {
    throw corruption(bin_path_, std::to_string(bin_size) + " bytes, but the sequence_lengths of " +
                                    idx_path_ + " claim " + std::to_string(total) + " " +
                                    token_dtype_name(dtype_) + " tokens (" +
                                    std::to_string(total * dtype_size_) + " bytes)");
  }
  uint64_t expected = 0;  // Megatron writes sequences back to back from byte 0
  // The pointers against the lengths, block by block (both copied out under the guard).
  std::vector<int32_t> lengths;
  uint64_t first = 0;  // the sequence at lengths[0]
  for_each_value<int64_t>(idx_, pointers_offset_, sequence_count_, [&](uint64_t i, int64_t p) {
    if (i - first >= lengths.size()) {
      first = i;
      lengths.resize(static_cast<size_t>(std::min<uint64_t>(uint64_t{1} << 16, sequence_count_ - i)));
      idx_.read(lengths_offset_ + 4 * i, lengths.data(), lengths.size() * 4);
    }
    const uint64_t bytes = static_cast<uint64_t>(lengths[i - first]) * dtype_size_;
    auto at = [&] { return "sequence_pointers[" + std::to_string(i) + "] = " + std::to_string(p); };
    if (p < 0 || static_cast<uint64_t>(p) > bin_size || bin_size - static_cast<uint64_t>(p) < bytes)
      throw corruption(idx_path_, at() + " with " + std::to_string(bytes) +
                                      " bytes runs past the end of " + bin_path_ + " (" +
                                      std::to_string(bin_size) + " bytes)");
    if (static_cast<uint64_t>(p) < expected)
      throw corruption(idx_path_, at() + " overlaps the previous sequence, which ends at byte " +
                                      std::to_string(expected));
    if (static_cast<uint64_t>(p) > expected)
      throw corruption(idx_path_, at() + " leaves a gap after byte " + std::to_string(expected) +
                                      " (sequences must be contiguous)");
    expected += bytes;
  });
}

int64_t IndexedDataset::pointer(uint64_t i) const {
  return idx_.load<int64_t>(pointers_offset_ + 8 * i);
}

int64_t IndexedDataset::sequence_length(uint64_t i) const {
  MT_CHECK(i < sequence_count_, ErrorKind::kInvalidArgument,
           idx_path_ + ": sequence " + std::to_string(i) + " out of range (" +
               std::to_string(sequence_count_) + " sequences)");
  return idx_.load<int32_t>(lengths_offset_ + 4 * i);
}

uint64_t IndexedDataset::sequence_start(uint64_t i) const {
  MT_CHECK(i < sequence_count_, ErrorKind::kInvalidArgument,
           idx_path_ + ": sequence " + std::to_string(i) + " out of range (" +
               std::to_string(sequence_count_) + " sequences)");
  return static_cast<uint64_t>(pointer(i)) / dtype_size_;
}

uint64_t IndexedDataset::document_first_sequence(uint64_t d) const {
  MT_CHECK(d < document_count_, ErrorKind::kInvalidArgument,
           idx_path_ + ": document index " + std::to_string(d) + " out of range (" +
               std::to_string(document_count_) + " entries)");
  return static_cast<uint64_t>(idx_.load<int64_t>(documents_offset_ + 8 * d));
}

void IndexedDataset::read(uint64_t i, int64_t offset, int64_t count, int32_t* out) const {
  int64_t n = sequence_length(i);
  MT_CHECK(offset >= 0 && count >= 0 && offset <= n && count <= n - offset,
           ErrorKind::kInvalidArgument,
           prefix_ + ": read of tokens [" + std::to_string(offset) + ", +" + std::to_string(count) +
               ") outside sequence " + std::to_string(i) + " of length " + std::to_string(n));
  read_stream(sequence_start(i) + static_cast<uint64_t>(offset), static_cast<uint64_t>(count), out);
}

void IndexedDataset::read_stream(uint64_t position, uint64_t count, int32_t* out) const {
  MT_CHECK(position <= total_tokens_ && count <= total_tokens_ - position,
           ErrorKind::kInvalidArgument,
           prefix_ + ": stream read [" + std::to_string(position) + ", +" + std::to_string(count) +
               ") past the " + std::to_string(total_tokens_) + " tokens");
  if (count == 0) return;
  // int32 tokens are read into `out` itself; the other types through a buffer, then converted.
  const size_t bytes = count * dtype_size_;
  std::vector<char> buffer;
  char* dst = reinterpret_cast<char*>(out);
  if (dtype_ != TokenDType::kInt32) {
    buffer.resize(bytes);
    dst = buffer.data();
  }
  const uint64_t at = position * dtype_size_;
  for (size_t done = 0; done < bytes;) {
    const ssize_t n = ::pread(bin_.fd, dst + done, bytes - done, static_cast<off_t>(at + done));
    if (n < 0 && errno == EINTR) continue;
    MT_CHECK(n > 0, ErrorKind::kIOError,
             bin_path_ + ": read of " + std::to_string(bytes) + " bytes at byte " + std::to_string(at) + " failed" +
                 (n == 0 ? " (the file ends at byte " + std::to_string(at + done) + ": truncated while in use?)"
                         : ": " + std::string(std::strerror(errno))));
    done += static_cast<size_t>(n);
  }
  const char* src = dst;
  switch (dtype_) {
    case TokenDType::kUInt8:
      convert<uint8_t>(src, count, out, bin_path_, position);
      break;
    case TokenDType::kInt8:
      convert<int8_t>(src, count, out, bin_path_, position);
      break;
    case TokenDType::kInt16:
      convert<int16_t>(src, count, out, bin_path_, position);
      break;
    case TokenDType::kUInt16:
      convert<uint16_t>(src, count, out, bin_path_, position);
      break;
    case TokenDType::kInt32:
      break;  // read in place
    case TokenDType::kInt64:
      convert<int64_t>(src, count, out, bin_path_, position);
      break;
    case TokenDType::kFloat32:
      convert<float>(src, count, out, bin_path_, position);
      break;
    case TokenDType::kFloat64:
      convert<double>(src, count, out, bin_path_, position);
      break;
  }
}

}  // namespace mt::data
