// OpenBLAS's parallel jobs, run on threads of ours that sleep when idle.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mlxkit {

// The job OpenBLAS hands out: job `index` of a call, with its slice of the job data.
using BlasJob = void (*)(int index, void* data, int job_argument);

// OpenBLAS's threading callback (`openblas_set_threads_callback_function`): runs
// `dojob(i, jobdata + i * size, argument)` for every `i` in `[0, jobs)`, all of them at once,
// and returns when every one has. `sync` is always 1 from OpenBLAS.
void run_blas_jobs(int sync, BlasJob dojob, int jobs, std::size_t size, void* jobdata,
                   int argument);

// Calls whose jobs ran on these threads (more than one job) since the process started: 0
// where OpenBLAS keeps its own threads.
std::uint64_t blas_parallel_calls();

}  // namespace mlxkit
