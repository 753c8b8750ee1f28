// Ranks as threads of one test process: each with its own TCPStore client and Gloo process group
// on 127.0.0.1 (a free port per run).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "framework/dist/world.h"

namespace qforge::dist {

// Ranks are threads here, and LibTorch's default generator is one per process: a rank seeding it
// and building its model holds this lock, so every rank gets the same initial weights.
inline std::mutex g_init_mutex;

// A port the kernel just handed out on 127.0.0.1 (closed again; the store binds it next).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("no free port");
  ::close(fd);
  return ntohs(a.sin_port);
}

// Runs body(world) on `size` ranks (threads); rethrows the first rank's exception.
inline void run_ranks(int size, const std::function<void(World&)>& body,
               std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  const int port = free_port();
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        WorldOptions o;
        o.timeout = timeout;
        World w = World::connect(r, size, "127.0.0.1", port, o);
        body(w);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace qforge::dist
