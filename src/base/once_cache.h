// A bounded cache of values computed once a key, shared by threads: the first thread to ask for a
// key computes it and the others asking meanwhile wait for that value (or its exception) instead of
// computing it again. The planner's search estimates and times layouts on every thread, and its
// pipeline schedules' lists and checks are the same for many layouts: a cache that let each thread
// miss and compute the same key at once made two threads do 60 % more work than one.
#pragma once

#include <cstddef>
#include <exception>
#include <future>
#include <map>
#include <mutex>
#include <utility>

namespace mt {

template <class Key, class Value>
class OnceCache {
 public:
  // At `bound` keys the cache is emptied (a bound for a long-lived process; values already handed
  // out and computations under way are not affected).
  explicit OnceCache(size_t bound) : bound_(bound) {}

  // The value of `key`, made by make() on the first call for it; an exception make() threw is
  // thrown to every caller of that key.
  template <class Make>
  Value get(const Key& key, Make&& make) {
    std::shared_future<Value> value;
    std::promise<Value> promise;
    bool mine = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = known_.find(key);
      if (it != known_.end()) {
        value = it->second;
      } else {
        if (known_.size() >= bound_) known_.clear();
        value = promise.get_future().share();
        known_.emplace(key, value);
        mine = true;
      }
    }
    if (mine) {
      try {
        promise.set_value(make());
      } catch (...) {
        promise.set_exception(std::current_exception());
      }
    }
    return value.get();
  }

 private:
  size_t bound_;
  std::mutex mu_;
  std::map<Key, std::shared_future<Value>> known_;
};

}  // namespace mt
