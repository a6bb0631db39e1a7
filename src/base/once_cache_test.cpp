#include "base/once_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace mt {
namespace {

// Eight threads ask for the same two keys at once while the first computation of each is slow:
// each key is made once, and every thread gets its value.
TEST(OnceCache, ThreadsAskingForOneKeyAtOnceWaitForTheOneComputation) {
  OnceCache<int, std::string> cache(16);
  std::atomic<int> made{0};
  std::vector<std::string> got(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      got[static_cast<size_t>(t)] = cache.get(t % 2, [&] {
        ++made;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        return "value " + std::to_string(t % 2);
      });
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(made.load(), 2);
  for (int t = 0; t < 8; ++t) EXPECT_EQ(got[static_cast<size_t>(t)], "value " + std::to_string(t % 2));
  // Asked again: remembered.
  EXPECT_EQ(cache.get(1, [&] { ++made; return std::string("again"); }), "value 1");
  EXPECT_EQ(made.load(), 2);
}

// An exception is thrown to its caller and not kept (the next call makes the key again, as the
// caches before this one did); the bound empties the cache, which then makes values again.
TEST(OnceCache, AnExceptionIsNotKeptAndTheBoundEmptiesIt) {
  OnceCache<int, int> cache(2);
  int made = 0;
  EXPECT_THROW(cache.get(7, [&]() -> int { ++made; throw std::runtime_error("no"); }), std::runtime_error);
  EXPECT_EQ(cache.get(7, [&] { ++made; return 1; }), 1);
  EXPECT_EQ(made, 2);
  EXPECT_EQ(cache.get(1, [&] { ++made; return 10; }), 10);  // two keys: at the bound
  EXPECT_EQ(cache.get(2, [&] { ++made; return 20; }), 20);  // emptied first, then 2 kept
  EXPECT_EQ(made, 4);
  EXPECT_EQ(cache.get(1, [&] { ++made; return 11; }), 11);  // made again
  EXPECT_EQ(cache.get(2, [&] { ++made; return 21; }), 20);  // still kept
  EXPECT_EQ(made, 5);
}

// Threads waiting for a computation that fails all get its exception, and one made once.
TEST(OnceCache, ThreadsWaitingForAFailedComputationAllGetItsException) {
  OnceCache<int, int> cache(16);
  std::atomic<int> made{0}, thrown{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&] {
      try {
        cache.get(3, [&]() -> int {
          ++made;
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          throw std::runtime_error("no");
        });
      } catch (const std::runtime_error&) {
        ++thrown;
      }
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(thrown.load(), 6);
  EXPECT_GE(made.load(), 1);  // a thread that came after the failure was let go makes it again
  EXPECT_EQ(cache.get(3, [] { return 4; }), 4);
}

}  // namespace
}  // namespace mt
