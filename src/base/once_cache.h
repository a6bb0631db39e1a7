// A bounded cache of values computed once a key, shared by threads: the first thread to ask for a
// key computes it and the others asking meanwhile wait for that value (or its exception) instead of
// computing it again. The planner's search estimates and times layouts on every thread, and its
// pipeline schedules' lists and checks are the same for many layouts: a cache that let each thread
// miss and compute the same key at once made two threads do 60 % more work than one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

namespace mt {

template <class Key, class Value>
class OnceCache {
 public:
  // At `bound` keys the cache is emptied (a bound for a long-lived process; values already handed
  // out and computations under way are not affected).
  explicit OnceCache(size_t bound) : bound_(bound) {}

  // The value of `key`, made by make() on the first call for it. An exception make() throws is
  // thrown to every caller waiting for that computation, and the key is not kept: the next call
  // makes it again (as a cache that remembers only values would).
  template <class Make>
  Value get(const Key& key, Make&& make) {
    std::shared_future<Value> value;
    std::optional<std::promise<Value>> promise;  // made on a miss only
    uint64_t id = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = known_.find(key);
      if (it != known_.end()) {
        value = it->second.value;
      } else {
        if (known_.size() >= bound_) known_.clear();
        promise.emplace();
        value = promise->get_future().share();
        id = ++made_;
        known_.emplace(key, Entry{value, id});
      }
    }
    if (promise) {
      try {
        promise->set_value(make());
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          auto it = known_.find(key);
          if (it != known_.end() && it->second.id == id) known_.erase(it);  // not a later computation's
        }
        promise->set_exception(std::current_exception());
      }
    }
    return value.get();
  }

 private:
  size_t bound_;
  std::mutex mu_;
  struct Entry {
    std::shared_future<Value> value;
    uint64_t id;  // which computation (a failed one's entry is removed, not a later one's)
  };
  uint64_t made_ = 0;
  std::map<Key, Entry> known_;
};

}  // namespace mt
