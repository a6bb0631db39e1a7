// Shared by the tests that talk to a server over a raw socket (serve/'s and the CLI's): a request can
// be left in flight, half-sent or cut, which an HTTP client library does not allow.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <thread>

#include "serve/generator.h"
#include "serve/http_server.h"

namespace mt::serve::testing {

// A server on a free port, run on its own thread until shutdown.
struct Running {
  Running(models::TransformerLM& model, const data::Tokenizer& tok, GeneratorOptions go, ServerOptions so)
      : gen(model, go), server(gen, tok, (so.port = 0, so)) {
    port = server.bind();
    thread = std::thread([this] { server.serve(); });
  }
  ~Running() {
    server.shutdown();
    thread.join();
  }
  Generator gen;
  HttpServer server;
  int port = 0;
  std::thread thread;
};

// A TCP socket connected to 127.0.0.1:port, or -1 (the socket closed) where the connect fails.
inline int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace mt::serve::testing
