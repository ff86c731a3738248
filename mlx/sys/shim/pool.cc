// The shim's helper threads (see pool.h).
//
// MLX evaluates a CPU stream's ops one after another on one thread, so a kernel that wants
// more cores must bring its own. A decode step runs a few hundred kernels of tens to hundreds
// of microseconds each, back to back: handing work to a sleeping thread costs about as much
// as the work (a futex wake-up, tens of microseconds on a VM), so an idle helper first spins
// for a while, and only then sleeps.
//
// One job runs at a time. Its parts are claimed from one atomic word that also names the job
// (generation | parts | next part), so a helper that wakes late can never claim a part of a
// job that has already finished: its claim fails and it goes back to waiting. The caller
// returns only once every claimed part has run.

#include "pool.h"
#include "spin.h"

#if defined(__linux__)
#include <sched.h>
#elif defined(__APPLE__)
#include <sys/sysctl.h>
#include <sys/types.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace mlxkit {

namespace {

// Threads by default at most: past this, a decode step's kernels are too small to share.
constexpr int kMaxThreads = 8;
// What `MLXKIT_THREADS` or `set_pool_threads` may ask for.
constexpr int kMaxSetThreads = 64;

// The cores worth spreading a kernel over: on Linux the CPUs this process may run on (a
// container's or `taskset`'s limit included); on Apple silicon the performance cores, since a
// kernel split evenly over performance and efficiency cores waits on the slow ones.
int cores_available() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    return CPU_COUNT(&set);
  }
#elif defined(__APPLE__)
  int cores = 0;
  size_t size = sizeof(cores);
  if (sysctlbyname("hw.perflevel0.physicalcpu", &cores, &size, nullptr, 0) == 0 && cores > 0) {
    return cores;
  }
#endif
  return static_cast<int>(std::thread::hardware_concurrency());
}

int threads_wanted() {
  if (const char* env = std::getenv("MLXKIT_THREADS")) {
    const int n = std::atoi(env);
    if (n >= 1) {
      return std::min(n, kMaxSetThreads);
    }
  }
  return std::clamp(cores_available(), 1, kMaxThreads);
}

class Pool {
 public:
  explicit Pool(int threads) : threads_(1) {
    set_threads(threads);
  }

  int threads() const {
    return threads_.load(std::memory_order_relaxed);
  }

  int set_threads(int threads) {
    const int n = std::clamp(threads, 1, kMaxSetThreads);
    std::lock_guard<std::mutex> lock(spawn_);
    for (; helpers_ < n - 1; ++helpers_) {
      // The pool lives as long as the process; its helpers are never joined.
      std::thread([this] { serve(); }).detach();
    }
    threads_.store(n, std::memory_order_relaxed);
    return n;
  }

  void run(int parts, const std::function<void(int)>& part) {
    std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
    if (threads() == 1 || parts <= 1 || !lock.owns_lock()) {
      for (int i = 0; i < parts; ++i) {
        part(i);
      }
      return;
    }
    parts = std::min(parts, 0xFFFF);
    job_ = &part;
    remaining_.store(parts, std::memory_order_relaxed);
    const uint64_t generation = (state_.load(std::memory_order_relaxed) >> 32) + 1;
    state_.store(generation << 32 | static_cast<uint64_t>(parts) << 16,
                 std::memory_order_seq_cst);
    wake_.fetch_add(1, std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst) > 0) {
      wake_.notify_all();
    }
    work(static_cast<uint32_t>(generation));
    while (remaining_.load(std::memory_order_acquire) > 0) {
      relax();
    }
    job_ = nullptr;
  }

 private:
  // Claims and runs parts of job `generation` until none is left (or another job is current).
  void work(uint32_t generation) {
    uint64_t s = state_.load(std::memory_order_acquire);
    for (;;) {
      if (static_cast<uint32_t>(s >> 32) != generation) {
        return;
      }
      const int parts = static_cast<int>((s >> 16) & 0xFFFF);
      const int next = static_cast<int>(s & 0xFFFF);
      if (next >= parts) {
        return;
      }
      if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
        (*job_)(next);
        remaining_.fetch_sub(1, std::memory_order_release);
        s = state_.load(std::memory_order_acquire);
      }
    }
  }

  void serve() {
    uint32_t seen = wake_.load(std::memory_order_acquire);
    for (;;) {
      const auto start = std::chrono::steady_clock::now();
      int spins = 0;
      uint32_t now = wake_.load(std::memory_order_acquire);
      while (now == seen) {
        relax();
        if (++spins % 64 == 0 && std::chrono::steady_clock::now() - start > kSpinBeforeSleep) {
          // `wait` returns at once if a job was published after `sleeping_` went up: the
          // publisher either sees the count and wakes us, or we see its new value.
          sleeping_.fetch_add(1, std::memory_order_seq_cst);
          wake_.wait(seen, std::memory_order_seq_cst);
          sleeping_.fetch_sub(1, std::memory_order_seq_cst);
        }
        now = wake_.load(std::memory_order_acquire);
      }
      seen = now;
      work(static_cast<uint32_t>(state_.load(std::memory_order_acquire) >> 32));
    }
  }

  // Helpers started (under `spawn_`), and the thread count kernels split their work for (with
  // 1, jobs run on the caller alone).
  std::mutex spawn_;
  int helpers_ = 0;
  std::atomic<int> threads_;
  std::mutex busy_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<uint64_t> state_{0};
  std::atomic<int> remaining_{0};
  std::atomic<uint32_t> wake_{0};
  std::atomic<int> sleeping_{0};
};

Pool& pool() {
  // Never destroyed: helpers may still be spinning on it while the process exits.
  static Pool* const instance = new Pool(threads_wanted());
  return *instance;
}

}  // namespace

int pool_threads() {
  return pool().threads();
}

int set_pool_threads(int threads) {
  return pool().set_threads(threads);
}

void parallel_for(int parts, const std::function<void(int)>& part) {
  pool().run(parts, part);
}

}  // namespace mlxkit
