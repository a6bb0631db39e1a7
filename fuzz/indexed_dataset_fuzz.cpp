// Fuzzes the Megatron indexed dataset reader (data/indexed_dataset.h), which maps PREFIX.idx and
// PREFIX.bin. Input: one flags byte, then the whole .idx. The .bin is derived, so that most inputs
// get past the size check to the pointer checks and the reads:
//   flags bit 0 set:   .bin has exactly the bytes the .idx's sequence_lengths claim (when its
//                      header can be read and the total stays under 1 MiB), else 0 bytes;
//   flags bit 0 clear: .bin has flags >> 1 bytes (0..127).
// Its contents cycle through the input, so int64/float token values vary with it. A dataset the
// reader accepts is then read whole: every sequence, the stream end to end, every document.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "data/indexed_dataset.h"
#include "fuzz_util.h"

namespace {

constexpr size_t kHeaderBytes = 34;
constexpr uint64_t kMaxBinBytes = uint64_t{1} << 20;

// The .bin size the .idx claims (sum of sequence_lengths × dtype size), or 0 if that cannot be
// read from it or is implausibly large.
uint64_t claimed_bin_bytes(const uint8_t* idx, size_t size) {
  if (size < kHeaderBytes || !mt::data::token_dtype_is_known(idx[17])) return 0;
  uint64_t dtype_size = mt::data::token_dtype_size(static_cast<mt::data::TokenDType>(idx[17]));
  uint64_t sequences = 0;
  std::memcpy(&sequences, idx + 18, sizeof sequences);
  uint64_t total = 0;
  for (uint64_t i = 0; i < sequences && kHeaderBytes + 4 * (i + 1) <= size; ++i) {
    int32_t n = 0;
    std::memcpy(&n, idx + kHeaderBytes + 4 * i, sizeof n);
    if (n < 0) return 0;
    total += static_cast<uint64_t>(n) * dtype_size;
    if (total > kMaxBinBytes) return 0;
  }
  return total;
}

// Every accessor over its whole range. A stored value that does not fit int32 is refused by the
// read that meets it, so each read is tried on its own.
void read_everything(const mt::data::IndexedDataset& ds) {
  auto attempt = [](auto&& fn) { mt::fuzz::expect_ok_or_error(fn); };
  std::vector<int32_t> buf;
  for (uint64_t i = 0; i < ds.num_sequences(); ++i) {
    int64_t n = ds.sequence_length(i);
    buf.resize(static_cast<size_t>(n));
    attempt([&] { ds.read(i, 0, n, buf.data()); });
    if (n > 1) attempt([&] { ds.read(i, 1, n - 1, buf.data()); });
    ds.sequence_start(i);
  }
  buf.resize(ds.total_tokens());
  attempt([&] { ds.read_stream(0, ds.total_tokens(), buf.data()); });
  for (uint64_t d = 0; d <= ds.num_documents(); ++d) ds.document_first_sequence(d);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const std::string prefix = mt::fuzz::temp_path("input");
  const uint8_t flags = data[0];
  const uint8_t* idx = data + 1;
  const size_t idx_size = size - 1;
  uint64_t bin_size = (flags & 1) ? claimed_bin_bytes(idx, idx_size) : flags >> 1;
  std::vector<uint8_t> bin(bin_size);
  for (size_t i = 0; i < bin.size(); ++i) bin[i] = data[i % size];
  mt::fuzz::write_file(mt::data::indexed_dataset_idx_path(prefix), idx, idx_size);
  mt::fuzz::write_file(mt::data::indexed_dataset_bin_path(prefix), bin.data(), bin.size());
  mt::fuzz::expect_ok_or_error([] {
    mt::data::IndexedDataset ds(prefix);
    read_everything(ds);
  });
  return 0;
}
