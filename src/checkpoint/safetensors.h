// safetensors (Hugging Face): an 8-byte little-endian header length, a JSON header
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the
// data. The reader validates everything before handing out a pointer: header within the file,
// valid JSON, known dtype, shape × dtype size == extent, extents within the data and not
// overlapping. Every failure is a kCorruption (or kNotFound) Error naming the file and the tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace mt::checkpoint {

// Every dtype of the safetensors format (listed by inspect; the readers take the float ones).
enum class StDType { kF32, kF16, kBF16, kI32, kI64, kU8, kF64, kI8, kI16, kBool, kF8E4M3, kF8E5M2, kU16, kU32, kU64 };

struct StTensorInfo {
  std::string name;
  StDType dtype;
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;  // byte offsets in the data section
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // reads and validates the whole file
  // header_only: reads and validates the header alone (against the file's size); read_f32 then
  // reads each tensor's bytes from the file when asked (sharded checkpoints read a few tensors of
  // a file), and data() is unavailable.
  SafetensorsFile(const std::string& path, bool header_only);

  const std::string& path() const { return path_; }
  const std::vector<StTensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const StTensorInfo* find(const std::string& name) const;
  const StTensorInfo& get(const std::string& name) const;  // throws kNotFound naming file + tensor
  const void* data(const StTensorInfo& t) const;
  // Copies a floating tensor into f32, checking its shape (throws naming the tensor on mismatch).
  std::vector<float> read_f32(const std::string& name, const std::vector<int64_t>& shape) const;
  std::vector<float> read_f32(const std::string& name) const;
  // Elements [first, first + count) of a floating tensor (flat, row-major) into dst as f32: in
  // header-only mode only their bytes are read (init_from under ZeRO reads each rank's pieces).
  void read_f32_into(const std::string& name, size_t first, size_t count, float* dst) const;
  // Several ranges of one tensor, each into its own dst, in ascending order without overlap (a
  // rank's tensor-parallel slice: a column split is a short run a row). In header-only mode runs
  // apart by at most 64 KiB are read together, up to 16 MiB a read, and the bytes between them
  // skipped: a handful of reads a tensor rather than one a row.
  struct Run {
    size_t first = 0, count = 0;
    float* dst = nullptr;
  };
  void read_f32_runs(const std::string& name, const std::vector<Run>& runs) const;
  size_t bytes_read() const { return bytes_read_; }  // header-only mode: tensor bytes read so far
  size_t reads() const { return reads_; }            // header-only mode: the reads those took
  std::vector<int32_t> read_i32(const std::string& name) const;

 private:
  void parse(size_t data_size);  // the header in bytes_[8, data_start_)
  int read_fd() const;           // header-only mode: the file, opened at the first read
  std::string path_;
  mutable std::shared_ptr<int> fd_;  // closed with the last copy
  mutable size_t bytes_read_ = 0, reads_ = 0;
  bool header_only_ = false;
  std::vector<char> bytes_;
  size_t data_start_ = 0;
  std::vector<StTensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct StTensorOut {
  std::string name;
  DType dtype;  // f32, bf16 or f16
  std::vector<int64_t> shape;
  const void* data;
  // Null data: the tensor's elements [begin, begin + n) are asked for in parts, in order, into dst
  // (a tensor that is not in memory, e.g. ZeRO-Infinity's swapped state).
  std::function<void(size_t begin, size_t n, void* dst)> fill = nullptr;
};
// Writes a safetensors file atomically (temp, fsync, rename), streaming: the file is never staged
// in memory (a tensor with fill, a few MiB at a time).
void safetensors_write(const std::string& path, const std::vector<StTensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata);

const char* st_dtype_name(StDType d);
size_t st_dtype_size(StDType d);

}  // namespace mt::checkpoint
