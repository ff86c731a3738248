//! Devices, streams, backends and the MLX version.

use mlx_sys::ffi;

use crate::Result;

/// Where MLX runs an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// The host CPU.
    Cpu,
    /// The GPU backend MLX was built with (Metal or CUDA).
    Gpu,
}

impl Device {
    /// The default device of the calling thread.
    pub fn default_device() -> Result<Device> {
        Ok(if ffi::default_device_is_gpu()? {
            Device::Gpu
        } else {
            Device::Cpu
        })
    }

    /// Makes this the default device. MLX keeps the default device and stream per thread, which
    /// is why mlxkit runs all MLX work on one worker thread.
    pub fn set_default(self) -> Result<()> {
        Ok(ffi::set_default_device(self == Device::Gpu)?)
    }

    /// The best device available: the GPU when a GPU backend is present, else the CPU.
    pub fn best_available() -> Result<Device> {
        Ok(if gpu_available()? {
            Device::Gpu
        } else {
            Device::Cpu
        })
    }
}

/// An MLX stream: an ordered queue of work on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stream {
    index: i32,
    device: Device,
}

impl Stream {
    /// A new stream on `device`.
    pub fn new(device: Device) -> Result<Stream> {
        let index = ffi::new_stream(device == Device::Gpu)?;
        Ok(Stream { index, device })
    }

    /// Makes this the calling thread's default stream for its device.
    pub fn set_default(self) -> Result<()> {
        Ok(ffi::set_default_stream(
            self.index,
            self.device == Device::Gpu,
        )?)
    }

    /// The device this stream runs on.
    pub fn device(self) -> Device {
        self.device
    }
}

/// Waits until all scheduled work on the default streams has finished.
pub fn synchronize() -> Result<()> {
    Ok(ffi::synchronize()?)
}

/// The version of the linked MLX library, e.g. `0.32.4`.
pub fn version() -> Result<String> {
    Ok(ffi::version()?)
}

/// Whether this build routes MLX's single-row f32 matmuls (one decode step's projections) to
/// BLAS matrix-vector products instead of `sgemm`, which packs the whole weight matrix first.
/// True on Linux CPU builds that link OpenBLAS.
pub fn blas_gemv_forwarding() -> bool {
    ffi::blas_gemv_forwarding()
}

/// The BLAS this build's f32 matmuls reach: a system OpenBLAS, the one `mlx-sys` installs from
/// PyPI when the system has none, or the MLX wheel's reference BLAS (with a warning at build
/// time); OpenBLAS's own configuration string follows its name.
pub fn blas_name() -> String {
    ffi::blas_name()
}

/// How many multi-threaded BLAS calls have run on mlxkit's own BLAS threads, which sleep when
/// idle, instead of OpenBLAS's, which spin between calls through the kernels that run on the
/// same cores. 0 where OpenBLAS keeps its threads: another BLAS, an OpenBLAS older than 0.3.27,
/// `MLXKIT_BLAS_THREADS=openblas`, one core.
pub fn blas_parallel_calls() -> u64 {
    ffi::blas_parallel_calls()
}

/// True when f32 matmuls run on the MLX wheel's reference BLAS: a Linux CPU build that found
/// no OpenBLAS, where prefill is about 25 times slower.
pub fn blas_is_reference() -> bool {
    ffi::blas_is_reference()
}

/// Threads the shim's CPU kernels (packed matvec, rows attention) spread their work over: the
/// thread MLX evaluates on plus helpers. By default the CPUs this process may use, at most 8;
/// `MLXKIT_THREADS` sets it at start.
pub fn cpu_threads() -> usize {
    usize::try_from(ffi::cpu_threads()).unwrap_or(1)
}

/// Uses `threads` kernel threads from now on (1 to 64), starting helpers if needed; returns the
/// number in effect. A kernel's result does not depend on it.
pub fn set_cpu_threads(threads: usize) -> usize {
    let n = i32::try_from(threads).unwrap_or(i32::MAX);
    usize::try_from(ffi::set_cpu_threads(n)).unwrap_or(1)
}

/// Whether the shim's custom CPU primitives (packed matvec, rows attention, fused norms,
/// rope, softmax, scans) may run: true unless `MLXKIT_CPU_PRIMITIVES=off` was set at start or
/// [`set_cpu_primitives`] turned them off. Off, every one of them declines and callers compose
/// MLX's own ops instead, exactly as on Metal and CUDA, where the primitives never run: that
/// is how the GPU's code path is run and tested on a CPU.
pub fn cpu_primitives_enabled() -> bool {
    ffi::cpu_primitives_enabled()
}

/// Lets the custom CPU primitives run (`true`) or sets them all aside (`false`) for graphs
/// built from now on; returns the setting in effect.
pub fn set_cpu_primitives(enabled: bool) -> bool {
    ffi::set_cpu_primitives(enabled)
}

/// Each custom CPU primitive's name and what it runs on this machine now: which vector kernel,
/// a compiled loop, or MLX's own op and why (a GPU device, the GPU's path asked for, or a
/// kernel vectorised for x86-64 only on another CPU).
pub fn cpu_primitive_paths() -> Vec<(String, String)> {
    ffi::cpu_primitive_paths()
        .into_iter()
        .map(|line| match line.split_once('\t') {
            Some((name, path)) => (name.to_string(), path.to_string()),
            None => (line, String::new()),
        })
        .collect()
}

/// The instruction sets the shim's CPU kernels come in, from least to most capable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CpuKernels {
    /// Plain C++, on any CPU.
    Portable,
    /// x86-64 AVX2 with FMA.
    Avx2,
    /// x86-64 AVX-512 (foundation).
    Avx512,
}

impl CpuKernels {
    fn from_level(level: i32) -> CpuKernels {
        match level {
            l if l >= 2 => CpuKernels::Avx512,
            1 => CpuKernels::Avx2,
            _ => CpuKernels::Portable,
        }
    }
}

/// The kernels in use: the best this CPU runs, capped by `MLXKIT_CPU_KERNELS` (`portable`,
/// `avx2`, `avx512`) at start or [`set_cpu_kernels`]. Results may differ in rounding between
/// instruction sets (summation order), never between row counts or thread counts.
pub fn cpu_kernels() -> CpuKernels {
    CpuKernels::from_level(ffi::cpu_kernel_level())
}

/// Caps the kernels at `most` from now on (tests run every path on one machine this way);
/// returns the kernels in effect.
pub fn set_cpu_kernels(most: CpuKernels) -> CpuKernels {
    let level = match most {
        CpuKernels::Portable => 0,
        CpuKernels::Avx2 => 1,
        CpuKernels::Avx512 => 2,
    };
    CpuKernels::from_level(ffi::set_cpu_kernel_level(level))
}

/// Whether MLX was built with Metal and a Metal device is present.
pub fn metal_available() -> Result<bool> {
    Ok(ffi::metal_is_available()?)
}

/// Whether MLX was built with CUDA and a CUDA device is present.
pub fn cuda_available() -> Result<bool> {
    Ok(ffi::cuda_is_available()?)
}

/// Whether any GPU backend is usable.
pub fn gpu_available() -> Result<bool> {
    Ok(metal_available()? || cuda_available()?)
}
