// Fuzzes the safetensors reader (checkpoint/safetensors.h): the input is the whole file. A file
// the reader accepts must keep its promises: no two tensors overlap (checked here pairwise), and
// every tensor's bytes are touched and every float or I32 tensor converted, so an extent the
// validation let through out of bounds shows up under ASan.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "checkpoint/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = mt::fuzz::temp_path("input.safetensors");
  mt::fuzz::write_file(path, data, size);
  mt::fuzz::expect_ok_or_error([] {
    using namespace mt::checkpoint;
    SafetensorsFile f(path);
    const std::vector<StTensorInfo>& ts = f.tensors();
    for (size_t i = 0; i < ts.size(); ++i)  // what the reader promises: extents do not overlap
      for (size_t j = i + 1; j < ts.size(); ++j)
        if (std::max(ts[i].begin, ts[j].begin) < std::min(ts[i].end, ts[j].end)) __builtin_trap();
    volatile uint8_t sink = 0;
    for (const StTensorInfo& t : ts) {
      const auto* bytes = static_cast<const uint8_t*>(f.data(t));
      for (size_t i = 0; i < t.end - t.begin; ++i) sink = sink ^ bytes[i];
      if (&f.get(t.name) != &t) __builtin_trap();  // JSON keys are unique, so names are too
      switch (t.dtype) {
        case StDType::kF32:
        case StDType::kF16:
        case StDType::kBF16:
          f.read_f32(t.name, t.shape);
          break;
        case StDType::kI32:
          f.read_i32(t.name);
          break;
        default:
          mt::fuzz::expect_ok_or_error([&] { f.read_f32(t.name); });
          break;
      }
    }
    for (const auto& [key, value] : f.metadata())
      sink = sink ^ static_cast<uint8_t>(key.size() + value.size());
    f.find("no such tensor");
  });
  return 0;
}
