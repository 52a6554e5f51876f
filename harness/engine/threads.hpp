// A small pool of worker threads for the decoder's matrix-vector products (std::thread only):
// parallel_for splits [0, n) into one contiguous range per worker and waits for all.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace smoe::harness::engine {

class ThreadPool {
public:
    /// `threads` workers in all, the calling thread included (1: no thread is started).
    explicit ThreadPool(unsigned threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    unsigned size() const { return static_cast<unsigned>(workers_.size()) + 1; }

    /// fn(begin, end, worker) over contiguous ranges of [0, n); returns when all are done.
    /// An exception of a range is rethrown here (the first one).
    using Range = std::function<void(size_t, size_t, unsigned)>;
    void parallel_for(size_t n, const Range& fn);

private:
    void work(unsigned worker);
    void run_range(unsigned worker);

    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable start_, done_;
    const Range* job_ = nullptr;
    size_t n_ = 0;
    unsigned pending_ = 0;
    unsigned long generation_ = 0;
    bool stop_ = false;
    std::exception_ptr error_;
};

}  // namespace smoe::harness::engine
