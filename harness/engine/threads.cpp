#include "engine/threads.hpp"

#include <algorithm>
#include <exception>
#include <utility>

namespace smoe::harness::engine {

ThreadPool::ThreadPool(unsigned threads) {
    for (unsigned w = 1; w < threads; ++w)
        workers_.emplace_back([this, w] { work(w); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    start_.notify_all();
    for (auto& t : workers_)
        t.join();
}

void ThreadPool::run_range(unsigned worker) {
    const size_t per = (n_ + size() - 1) / size();
    const size_t begin = std::min(n_, per * worker), end = std::min(n_, begin + per);
    if (begin >= end)
        return;
    try {
        (*job_)(begin, end, worker);
    } catch (...) {
        std::lock_guard lock(mu_);
        if (!error_)
            error_ = std::current_exception();
    }
}

void ThreadPool::work(unsigned worker) {
    unsigned long seen = 0;
    for (;;) {
        {
            std::unique_lock lock(mu_);
            start_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_)
                return;
            seen = generation_;
        }
        run_range(worker);
        std::lock_guard lock(mu_);
        if (--pending_ == 0)
            done_.notify_one();
    }
}

void ThreadPool::parallel_for(size_t n, const Range& fn) {
    if (workers_.empty() || n < 2) {
        if (n > 0)
            fn(0, n, 0);
        return;
    }
    {
        std::lock_guard lock(mu_);
        job_ = &fn;
        n_ = n;
        pending_ = static_cast<unsigned>(workers_.size());
        error_ = nullptr;
        ++generation_;
    }
    start_.notify_all();
    run_range(0);
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (error_)
        std::rethrow_exception(std::exchange(error_, nullptr));
}

}  // namespace smoe::harness::engine
