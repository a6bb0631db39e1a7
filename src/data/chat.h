// The chat layout of SFT records, shared by training (engine/corpus.h turns prompt/response/history
// records into documents) and serving (serve/http_server.h builds the prompt of a chat request), so
// a served model sees the layout it was fine-tuned on:
//
//   history turn k:   prompt_k + "\n" + response_k + "\n"     (one piece each)
//   this turn:        prompt + "\n"                            (one piece)
//   then the response, which ends with <|endoftext|>.
//
// Each piece is tokenized on its own and the ids are concatenated (so the boundaries are exact
// and training and serving tokenize a prompt the same way).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace mt::data {

using ChatHistory = std::vector<std::pair<std::string, std::string>>;  // (prompt, response) turns

std::vector<std::string> chat_prompt_pieces(const ChatHistory& history, const std::string& prompt);

}  // namespace mt::data
