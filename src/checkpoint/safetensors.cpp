#include "checkpoint/safetensors.h"

#include <cerrno>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/fault.h"
#include "base/file_io.h"

namespace mt::checkpoint {
namespace {

struct DTypeName {
  const char* name;
  StDType dtype;
  size_t size;
};
const DTypeName kDTypes[] = {{"F32", StDType::kF32, 4},   {"F16", StDType::kF16, 2},
                             {"BF16", StDType::kBF16, 2}, {"I32", StDType::kI32, 4},
                             {"I64", StDType::kI64, 8},   {"U8", StDType::kU8, 1},
                             {"F64", StDType::kF64, 8},   {"I8", StDType::kI8, 1},
                             {"I16", StDType::kI16, 2},   {"BOOL", StDType::kBool, 1},
                             {"F8_E4M3", StDType::kF8E4M3, 1}, {"F8_E5M2", StDType::kF8E5M2, 1},
                             {"U16", StDType::kU16, 2},   {"U32", StDType::kU32, 4},
                             {"U64", StDType::kU64, 8}};

Error corrupt(const std::string& path, const std::string& what) {
  return Error(ErrorKind::kCorruption, path + ": " + what);
}

}  // namespace

const char* st_dtype_name(StDType d) {
  for (const auto& e : kDTypes)
    if (e.dtype == d) return e.name;
  return "?";
}

size_t st_dtype_size(StDType d) {
  for (const auto& e : kDTypes)
    if (e.dtype == d) return e.size;
  return 0;
}

namespace {
// A safetensors file is read by offset and size: a FIFO (whose open waits for a writer: `inspect`
// hung) or a device is refused before it is opened.
void require_regular(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;  // the open says why
  MT_CHECK(S_ISREG(st.st_mode) || S_ISDIR(st.st_mode), ErrorKind::kInvalidArgument,
           path + ": not a regular file (a pipe, socket or device): a safetensors file is read by offset");
}
// The 8-byte length that opens the file, checked before anything is allocated for it: the format's
// own limit is 100,000,000 bytes (safetensors' MAX_HEADER_SIZE), and a flipped bit in it had every
// rank reading the file allocate and read up to the whole shard before the JSON was found wanting.
void check_header_length(const std::string& path, uint64_t hlen, size_t file_size) {
  constexpr uint64_t kMaxHeader = 100'000'000;
  if (hlen > file_size - 8)
    throw corrupt(path, "header length " + std::to_string(hlen) + " runs past the end of the file");
  if (hlen > kMaxHeader)
    throw corrupt(path, "header length " + std::to_string(hlen) + " is over the format's limit of 100000000 bytes");
}
}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  require_regular(path);
  bytes_ = file_read_all(path);
  if (bytes_.size() < 8) throw corrupt(path, "shorter than the 8-byte safetensors header length");
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | static_cast<uint8_t>(bytes_[i]);
  check_header_length(path, hlen, bytes_.size());
  data_start_ = 8 + hlen;
  parse(bytes_.size() - data_start_);
}

namespace {
// n bytes at offset of an open file, or kCorruption / kIOError naming it.
void pread_all(int fd, const std::string& path, char* dst, size_t n, size_t offset) {
  while (n > 0) {
    ssize_t got = ::pread(fd, dst, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw Error(ErrorKind::kIOError, path + ": read failed: " + std::strerror(errno));
    if (got == 0) throw corrupt(path, "ends before the bytes its header promises");
    dst += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<size_t>(got);
  }
}
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};
}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path, bool header_only) : path_(path), header_only_(header_only) {
  if (!header_only) {
    *this = SafetensorsFile(path);
    return;
  }
  require_regular(path);
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  MT_CHECK(f.fd >= 0, errno == ENOENT ? ErrorKind::kNotFound : ErrorKind::kIOError,
           path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  MT_CHECK(::fstat(f.fd, &st) == 0, ErrorKind::kIOError, path + ": cannot stat: " + std::strerror(errno));
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) throw corrupt(path, "shorter than the 8-byte safetensors header length");
  bytes_.resize(8);
  pread_all(f.fd, path, bytes_.data(), 8, 0);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | static_cast<uint8_t>(bytes_[i]);
  check_header_length(path, hlen, size);
  data_start_ = 8 + hlen;
  bytes_.resize(data_start_);
  pread_all(f.fd, path, bytes_.data() + 8, hlen, 8);
  parse(size - data_start_);
}

const void* SafetensorsFile::data(const StTensorInfo& t) const {
  MT_CHECK(!header_only_, ErrorKind::kInternal, path_ + ": opened header-only: tensor data is read by read_f32");
  return bytes_.data() + data_start_ + t.begin;
}

void SafetensorsFile::parse(size_t data_size) {
  const std::string& path = path_;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes_.begin() + 8, bytes_.begin() + static_cast<long>(data_start_));
  } catch (const nlohmann::json::exception& e) {
    throw corrupt(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) throw corrupt(path, "header is not a JSON object");
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw corrupt(path, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) throw corrupt(path, "__metadata__." + m.key() + " is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      throw corrupt(path, "tensor '" + name + "' lacks dtype, shape or data_offsets");
    StTensorInfo t;
    t.name = name;
    if (!v["dtype"].is_string()) throw corrupt(path, "tensor '" + name + "': dtype is not a string");
    std::string dn = v["dtype"].get<std::string>();
    const DTypeName* found = nullptr;
    for (const auto& e : kDTypes)
      if (dn == e.name) found = &e;
    if (!found) throw corrupt(path, "tensor '" + name + "': unknown dtype '" + dn + "'");
    t.dtype = found->dtype;
    if (!v["shape"].is_array()) throw corrupt(path, "tensor '" + name + "': shape is not an array");
    uint64_t numel = 1;
    for (const auto& s : v["shape"]) {
      if (!s.is_number_integer() || s.get<int64_t>() < 0)
        throw corrupt(path, "tensor '" + name + "': shape holds a non-integer or negative dimension");
      int64_t dim = s.get<int64_t>();
      if (dim > 0 && numel > (uint64_t{1} << 48) / static_cast<uint64_t>(dim))
        throw corrupt(path, "tensor '" + name + "': shape too large");
      numel *= static_cast<uint64_t>(dim);
      t.shape.push_back(dim);
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw corrupt(path, "tensor '" + name + "': data_offsets is not [begin, end]");
    t.begin = off[0].get<uint64_t>();
    t.end = off[1].get<uint64_t>();
    if (t.begin > t.end || t.end > data_size)
      throw corrupt(path, "tensor '" + name + "': data_offsets [" + std::to_string(t.begin) + ", " +
                              std::to_string(t.end) + "] outside the " + std::to_string(data_size) +
                              "-byte data section");
    if (t.end - t.begin != numel * found->size)
      throw corrupt(path, "tensor '" + name + "': " + std::to_string(t.end - t.begin) +
                              " bytes do not match its shape and dtype");
    tensors_.push_back(std::move(t));
  }
  // The upstream reader's rule ("no holes, fully indexed buffer"): sorted by offsets, every tensor
  // starts where the one before it ended (the first at 0), and the last ends at the end of the data
  // section. Overlaps, unindexed bytes between tensors and trailing bytes are all refused.
  std::vector<const StTensorInfo*> order;
  for (const auto& t : tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](auto* a, auto* b) { return a->begin != b->begin ? a->begin < b->begin : a->end < b->end; });
  uint64_t expect = 0;
  const StTensorInfo* prev = nullptr;
  for (const StTensorInfo* t : order) {
    if (t->begin < expect)
      throw corrupt(path, "tensors '" + prev->name + "' and '" + t->name + "' overlap");
    if (t->begin > expect)
      throw corrupt(path, "bytes [" + std::to_string(expect) + ", " + std::to_string(t->begin) +
                              ") of the data section belong to no tensor (before '" + t->name + "')");
    expect = t->end;
    prev = t;
  }
  if (expect != data_size)
    throw corrupt(path, "bytes [" + std::to_string(expect) + ", " + std::to_string(data_size) +
                            ") at the end of the data section belong to no tensor");
}

const StTensorInfo* SafetensorsFile::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const StTensorInfo& SafetensorsFile::get(const std::string& name) const {
  const StTensorInfo* t = find(name);
  MT_CHECK(t != nullptr, ErrorKind::kNotFound, path_ + ": no tensor named '" + name + "'");
  return *t;
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
  const StTensorInfo& t = get(name);
  size_t n = (t.end - t.begin) / std::max<size_t>(1, st_dtype_size(t.dtype));
  std::vector<float> out(n);
  if (n == 0) return out;  // NOTE: memcpy from/to an empty vector's null data() is undefined
  std::vector<char> read;
  if (header_only_) {
    read.resize(t.end - t.begin);
    Fd f{::open(path_.c_str(), O_RDONLY | O_CLOEXEC)};
    MT_CHECK(f.fd >= 0, ErrorKind::kIOError, path_ + ": cannot open: " + std::strerror(errno));
    pread_all(f.fd, path_, read.data(), read.size(), data_start_ + t.begin);
    bytes_read_ += read.size();
  }
  const void* src = header_only_ ? static_cast<const void*>(read.data()) : data(t);
  switch (t.dtype) {
    case StDType::kF32: std::memcpy(out.data(), src, n * 4); break;
    case StDType::kBF16: convert(out.data(), DType::kF32, src, DType::kBF16, n); break;
    case StDType::kF16: convert(out.data(), DType::kF32, src, DType::kF16, n); break;
    default:
      throw Error(ErrorKind::kInvalidArgument, path_ + ": tensor '" + name + "' has dtype " +
                                                    st_dtype_name(t.dtype) + ", expected a float type");
  }
  return out;
}

int SafetensorsFile::read_fd() const {
  if (!fd_) {
    int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    MT_CHECK(fd >= 0, ErrorKind::kIOError, path_ + ": cannot open: " + std::strerror(errno));
    fd_ = std::shared_ptr<int>(new int(fd), [](int* p) {
      ::close(*p);
      delete p;
    });
  }
  return *fd_;
}

void SafetensorsFile::read_f32_into(const std::string& name, size_t first, size_t count, float* dst) const {
  const StTensorInfo& t = get(name);
  const size_t es = std::max<size_t>(1, st_dtype_size(t.dtype)), n = (t.end - t.begin) / es;
  MT_CHECK(first <= n && count <= n - first, ErrorKind::kInvalidArgument,
           path_ + ": tensor '" + name + "' has " + std::to_string(n) + " elements, asked for [" + std::to_string(first) +
               ", " + std::to_string(first + count) + ")");
  DType from = t.dtype == StDType::kF32 ? DType::kF32 : t.dtype == StDType::kBF16 ? DType::kBF16 : DType::kF16;
  MT_CHECK(t.dtype == StDType::kF32 || t.dtype == StDType::kBF16 || t.dtype == StDType::kF16, ErrorKind::kInvalidArgument,
           path_ + ": tensor '" + name + "' has dtype " + st_dtype_name(t.dtype) + ", expected a float type");
  if (count == 0) return;
  const size_t at = t.begin + first * es;
  if (!header_only_) return convert(dst, DType::kF32, static_cast<const char*>(data(t)) + first * es, from, count);
  bytes_read_ += count * es;
  if (from == DType::kF32) {
    ++reads_;
    return pread_all(read_fd(), path_, reinterpret_cast<char*>(dst), count * 4, data_start_ + at);
  }
  // 16-bit elements staged a few MiB at a time.
  const size_t chunk = std::min<size_t>(count, size_t{8} << 20);
  std::vector<char> read(chunk * es);
  for (size_t done = 0; done < count; done += chunk) {
    const size_t m = std::min(chunk, count - done);
    ++reads_;
    pread_all(read_fd(), path_, read.data(), m * es, data_start_ + at + done * es);
    convert(dst + done, DType::kF32, read.data(), from, m);
  }
}

void SafetensorsFile::read_f32_runs(const std::string& name, const std::vector<Run>& runs) const {
  if (!header_only_) {
    for (const Run& r : runs) read_f32_into(name, r.first, r.count, r.dst);
    return;
  }
  const StTensorInfo& t = get(name);
  const size_t es = std::max<size_t>(1, st_dtype_size(t.dtype));
  constexpr size_t kGap = size_t{64} << 10, kSpan = size_t{16} << 20;  // bytes
  std::vector<char> span;
  for (size_t i = 0; i < runs.size();) {
    // The runs after i that lie close enough, within one span.
    size_t j = i + 1, end = runs[i].first + runs[i].count;
    while (j < runs.size() && runs[j].first >= end && (runs[j].first - end) * es <= kGap &&
           (runs[j].first + runs[j].count - runs[i].first) * es <= kSpan) {
      end = runs[j].first + runs[j].count;
      ++j;
    }
    if (j == i + 1) {
      read_f32_into(name, runs[i].first, runs[i].count, runs[i].dst);
      ++i;
      continue;
    }
    // One read of [first of i, end): read_f32_into's checks (bounds, a float dtype) on the span,
    // into a staging buffer, then each run converted out of it.
    const size_t first = runs[i].first, count = end - first;
    const size_t n = (t.end - t.begin) / es;
    MT_CHECK(first <= n && count <= n - first, ErrorKind::kInvalidArgument,
             path_ + ": tensor '" + name + "' has " + std::to_string(n) + " elements, asked for [" +
                 std::to_string(first) + ", " + std::to_string(end) + ")");
    MT_CHECK(t.dtype == StDType::kF32 || t.dtype == StDType::kBF16 || t.dtype == StDType::kF16, ErrorKind::kInvalidArgument,
             path_ + ": tensor '" + name + "' has dtype " + st_dtype_name(t.dtype) + ", expected a float type");
    const DType from = t.dtype == StDType::kF32 ? DType::kF32 : t.dtype == StDType::kBF16 ? DType::kBF16 : DType::kF16;
    span.resize(count * es);
    ++reads_;
    bytes_read_ += count * es;
    pread_all(read_fd(), path_, span.data(), count * es, data_start_ + t.begin + first * es);
    for (size_t k = i; k < j; ++k)
      convert(runs[k].dst, DType::kF32, span.data() + (runs[k].first - first) * es, from, runs[k].count);
    i = j;
  }
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name,
                                             const std::vector<int64_t>& shape) const {
  const StTensorInfo& t = get(name);
  if (t.shape != shape) {
    auto str = [](const std::vector<int64_t>& s) {
      std::string r = "[";
      for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
      return r + "]";
    };
    throw Error(ErrorKind::kInvalidArgument, path_ + ": tensor '" + name + "' has shape " +
                                                 str(t.shape) + ", expected " + str(shape));
  }
  return read_f32(name);
}

std::vector<int32_t> SafetensorsFile::read_i32(const std::string& name) const {
  const StTensorInfo& t = get(name);
  MT_CHECK(t.dtype == StDType::kI32, ErrorKind::kInvalidArgument,
           path_ + ": tensor '" + name + "' is not I32");
  std::vector<int32_t> out((t.end - t.begin) / 4);
  if (!out.empty()) std::memcpy(out.data(), data(t), out.size() * 4);
  return out;
}

void safetensors_write(const std::string& path, const std::vector<StTensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto& t : tensors) {
    size_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<size_t>(d);
    size_t bytes = numel * dtype_size(t.dtype);
    const char* dn = t.dtype == DType::kF32 ? "F32" : t.dtype == DType::kBF16 ? "BF16" : "F16";
    header[t.name] = {{"dtype", dn}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  while (h.size() % 8) h.push_back(' ');
  char len[8];
  uint64_t hl = h.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((hl >> (8 * i)) & 0xff);
  AtomicFile out(path);
  out.append(len, 8);
  out.append(h.data(), h.size());
  std::vector<char> part;
  for (const auto& t : tensors) {
    size_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<size_t>(d);
    const size_t esz = dtype_size(t.dtype);
    if (t.data != nullptr) {
      out.append(t.data, numel * esz);
      continue;
    }
    MT_CHECK(t.fill != nullptr, ErrorKind::kInternal, path + ": tensor " + t.name + " has neither data nor fill");
    const size_t chunk = (size_t{8} << 20) / esz;
    part.resize(std::min(numel, chunk) * esz);
    for (size_t b = 0; b < numel; b += chunk) {
      const size_t n = std::min(chunk, numel - b);
      t.fill(b, n, part.data());
      out.append(part.data(), n * esz);
    }
  }
  fault_point("safetensors.before_commit");  // test seam: a writer stopped with its temporary whole
  out.commit();
}

}  // namespace mt::checkpoint
