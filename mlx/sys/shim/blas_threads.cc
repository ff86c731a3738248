// OpenBLAS's parallel jobs, run on threads of ours that sleep when idle (see blas_threads.h).
//
// OpenBLAS's own threads spin between calls for about 2^28 cycles (its `THREAD_TIMEOUT`, read
// from the environment once, as the library loads) before they sleep. In a prefill, MLX runs
// a matrix product, then our attention kernel on the shim's pool, then the next product: the
// idle BLAS threads spun through every attention kernel, on the cores it ran on. On a 2-core
// x86, smollm2 at a 4,096-token prompt spent 30% of its cycles in `blas_thread_server` and
// prefilled at 105 tok/s; with the spin turned off (`OPENBLAS_THREAD_TIMEOUT=4`), 211 tok/s.
// Handing OpenBLAS a callback instead keeps its products multi-threaded and leaves its own
// threads asleep for good; ours spin only briefly, as the shim's pool does.
//
// Two rules come from how OpenBLAS uses the callback (`exec_blas`, driver/others/
// blas_server.c): its threaded level-3 kernels wait on each other's progress, so every job of
// a call must run at once (a job per thread, never queued behind another); and job `i` of
// every call uses the same static scratch buffer, so calls run one at a time.

#include "blas_threads.h"
#include "spin.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>

namespace mlxkit {

namespace {

// Spins on `word` while it holds `value`, then sleeps on it; returns its new value.
template <typename T>
T await_change(const std::atomic<T>& word, T value) {
  const auto start = std::chrono::steady_clock::now();
  int spins = 0;
  T now = word.load(std::memory_order_acquire);
  while (now == value) {
    relax();
    if (++spins % 64 == 0 && std::chrono::steady_clock::now() - start > kSpinBeforeSleep) {
      word.wait(value, std::memory_order_acquire);
    }
    now = word.load(std::memory_order_acquire);
  }
  return now;
}

struct Call {
  BlasJob dojob = nullptr;
  int jobs = 0;
  std::size_t size = 0;
  char* data = nullptr;
  int argument = 0;
};

class Crew {
 public:
  void run(const Call& call) {
    std::lock_guard<std::mutex> one_call(calls_);
    if (call.jobs <= 1) {
      if (call.jobs == 1) {
        call.dojob(0, call.data, call.argument);
      }
      return;
    }
    parallel_calls_.fetch_add(1, std::memory_order_relaxed);
    while (helpers_ < call.jobs - 1) {
      ++helpers_;
      std::thread([this, index = helpers_, seen = generation_.load()] { serve(index, seen); })
          .detach();
    }
    // Every helper answers every call (those past the call's jobs at once), so none still
    // reads `call_` when the next call rewrites it.
    call_ = call;
    pending_.store(helpers_, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    call.dojob(0, call.data, call.argument);
    int left = pending_.load(std::memory_order_acquire);
    while (left != 0) {
      left = await_change(pending_, left);
    }
  }

 std::uint64_t parallel_calls() const {
    return parallel_calls_.load(std::memory_order_relaxed);
  }

 private:
  void serve(int index, uint64_t seen) {
    for (;;) {
      seen = await_change(generation_, seen);
      const Call call = call_;
      if (index < call.jobs) {
        call.dojob(index, call.data + index * call.size, call.argument);
      }
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        pending_.notify_one();
      }
    }
  }

  std::mutex calls_;
  // Threads started, each serving job `index` (1 to `helpers_`; the caller runs job 0).
  int helpers_ = 0;
  Call call_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<std::uint64_t> parallel_calls_{0};
};

Crew& crew() {
  // Never destroyed: its threads wait on it while the process exits.
  static Crew* const instance = new Crew();
  return *instance;
}

}  // namespace

void run_blas_jobs(int, BlasJob dojob, int jobs, std::size_t size, void* jobdata,
                   int argument) {
  crew().run(Call{dojob, jobs, size, static_cast<char*>(jobdata), argument});
}

std::uint64_t blas_parallel_calls() {
  return crew().parallel_calls();
}

}  // namespace mlxkit
