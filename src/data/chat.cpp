#include "data/chat.h"

namespace mt::data {

std::vector<std::string> chat_prompt_pieces(const ChatHistory& history, const std::string& prompt) {
  std::vector<std::string> pieces;
  pieces.reserve(history.size() + 1);
  for (const auto& [q, a] : history) pieces.push_back(q + "\n" + a + "\n");
  pieces.push_back(prompt + "\n");
  return pieces;
}

}  // namespace mt::data
