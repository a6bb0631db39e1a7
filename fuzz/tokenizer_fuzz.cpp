// Fuzzes the tokenizer loaders (data/tokenizer.h). Input: one mode byte, then the file(s):
//   mode bit 0 clear: a Hugging Face tokenizer.json          -> Tokenizer::load_hf_json
//   mode bit 0 set:   encoder.json, a NUL byte, vocab.bpe    -> Tokenizer::load_gpt2
// (JSON text cannot hold a raw NUL, so the first NUL is always the split.) Whatever loads then
// encodes a short string (ASCII, contractions, digits, runs of whitespace, multi-byte UTF-8 and
// invalid UTF-8) and decodes the ids back, and decode/eot_id are tried on ids it may lack.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"
#include "fuzz_util.h"

namespace {

constexpr std::string_view kSample =
    "Hello world, it's 2024!  \t\n\nThe cat's 42 caf\xc3\xa9s \xf0\x9f\x98\x80 <|endoftext|> "
    "bad \xff\xfe\xc3 bytes\r\n";

void exercise(const mt::data::Tokenizer& t) {
  std::vector<int32_t> ids = t.encode(kSample);
  for (int32_t id : ids)
    if (id < 0 || id >= t.vocab_size()) __builtin_trap();  // encode only yields known ids
  t.decode(ids);
  t.encode("");
  mt::fuzz::expect_ok_or_error([&] { t.eot_id(); });
  const int32_t outside[] = {t.vocab_size()};
  mt::fuzz::expect_ok_or_error([&] { t.decode(outside); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const std::string hf_json = mt::fuzz::temp_path("tokenizer.json");
  static const std::string encoder_json = mt::fuzz::temp_path("encoder.json");
  static const std::string vocab_bpe = mt::fuzz::temp_path("vocab.bpe");
  const uint8_t* body = data + 1;
  const size_t body_size = size - 1;
  if ((data[0] & 1) == 0) {
    mt::fuzz::write_file(hf_json, body, body_size);
    mt::fuzz::expect_ok_or_error([] { exercise(mt::data::Tokenizer::load_hf_json(hf_json)); });
  } else {
    const void* nul = std::memchr(body, 0, body_size);
    size_t split = nul ? static_cast<size_t>(static_cast<const uint8_t*>(nul) - body) : body_size;
    mt::fuzz::write_file(encoder_json, body, split);
    size_t rest = split < body_size ? split + 1 : body_size;
    mt::fuzz::write_file(vocab_bpe, body + rest, body_size - rest);
    mt::fuzz::expect_ok_or_error([] {
      exercise(mt::data::Tokenizer::load_gpt2(encoder_json, vocab_bpe));
    });
  }
  return 0;
}
