//! Finds or installs MLX, compiles the C++ shim and tells dependents how to link.
//!
//! MLX is looked for in this order:
//! 1. `MLX_DIR`: a folder holding `include/mlx/mlx.h` and `lib/libmlx.*` (a wheel's `mlx`
//!    package folder or a CMake install prefix);
//! 2. an importable Python `mlx` of the pinned version (a namespace package: every entry of its
//!    `submodule_search_locations` is tried);
//! 3. the pinned release wheel, installed by `pip --target` into a per-user cache shared by every
//!    clone (`$XDG_CACHE_HOME/mlxkit`, else `~/.cache/mlxkit`).
//!
//! On a Linux CPU build, OpenBLAS is linked ahead of the wheel's reference BLAS: the system's,
//! else `scipy-openblas32` from PyPI into the same cache (see [`choose_blas`]).
//!
//! The wheel's folder layout is kept intact: `libmlx.so` finds its bundled BLAS through
//! `$ORIGIN/../../mlx_cpu.libs`, and `$ORIGIN` does not follow a symlinked file.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The MLX release this crate's shim is written against.
const MLX_VERSION: &str = "0.32.4";

/// Separates entries of the `link_args` metadata; paths may contain spaces.
const LINK_ARG_SEPARATOR: char = '\u{1f}';

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=shim");
    println!("cargo:rerun-if-changed=src/lib.rs");
    println!("cargo:rerun-if-env-changed=MLX_DIR");
    println!("cargo:rerun-if-env-changed=PYTHON");
    println!("cargo:rerun-if-env-changed=XDG_CACHE_HOME");
    println!("cargo:rerun-if-env-changed=MACOSX_DEPLOYMENT_TARGET");

    let mlx = match locate_mlx() {
        Ok(found) => found,
        Err(reasons) => fail(&reasons),
    };
    let include = mlx.join("include");
    let lib = mlx.join("lib");

    let blas = choose_blas();
    let mut bridge = cxx_build::bridge("src/lib.rs");
    bridge.define(
        "MLXKIT_BLAS_NAME",
        format!("\"{}\"", blas.describe()).as_str(),
    );
    if matches!(blas, Blas::Reference { .. }) {
        bridge.define("MLXKIT_BLAS_REFERENCE", None);
    }
    if let Some(prefix) = blas.symbol_prefix() {
        bridge.define("MLXKIT_GEMV_FORWARD", None);
        bridge.define("MLXKIT_BLAS_PREFIX", format!("\"{prefix}\"").as_str());
    }
    bridge
        .file("shim/shim.cc")
        .file("shim/gemv.cc")
        .file("shim/blas_threads.cc")
        .file("shim/qmv.cc")
        .file("shim/qmv8.cc")
        .file("shim/kblocks.cc")
        .file("shim/kblocks_int8.cc")
        .file("shim/append.cc")
        .file("shim/attend.cc")
        .file("shim/gated.cc")
        .file("shim/softmax.cc")
        .file("shim/norm.cc")
        .file("shim/rope.cc")
        .file("shim/delta.cc")
        .file("shim/ssd.cc")
        .file("shim/pool.cc")
        .file("shim/primitives.cc")
        .file("shim/inputs.cc")
        .file("shim/distributed.cc")
        .include(&include)
        .include("shim")
        .std("c++20")
        // The shim holds hot CPU kernels (`qmv.cc`); unoptimized, a debug build's decode (and
        // so the test suite) runs several times slower.
        .opt_level(2)
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        // clang (a macOS build, zig) flags MLX's own bf16 header for an implicit copy.
        .flag_if_supported("-Wno-deprecated-copy")
        // GCC 12's AVX-512 intrinsics start from `_mm512_undefined_*`, which it then reports
        // as (maybe) uninitialized wherever they are inlined (a known false positive).
        .flag_if_supported("-Wno-maybe-uninitialized")
        .flag_if_supported("-Wno-uninitialized");
    bridge.compile("mlxkit-shim");

    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=mlx");

    let mut link_args = vec![format!("-Wl,-rpath,{}", lib.display())];
    link_args.extend(blas.link_args());
    if let Blas::Reference { why } = &blas {
        // Once, loudly: prefill on the reference BLAS is ~25x slower, and nothing else says so
        // until a user measures it (`mlxkit info` names the BLAS at run time).
        println!(
            "cargo:warning=mlx-sys: MLX's f32 matmuls will run on the wheel's reference BLAS, \
             about 25x slower at prefill than OpenBLAS ({why})"
        );
    }
    for arg in &link_args {
        println!("cargo:rustc-link-arg={arg}");
    }
    // Metadata for dependents (`DEP_MLX_*`): the library folder and the link arguments their
    // binaries and test harnesses need to start without `LD_LIBRARY_PATH`.
    println!("cargo:lib_dir={}", lib.display());
    println!("cargo:include_dir={}", include.display());
    let joined: Vec<&str> = link_args.iter().map(String::as_str).collect();
    println!(
        "cargo:link_args={}",
        joined.join(&LINK_ARG_SEPARATOR.to_string())
    );
}

/// Returns the MLX folder (with `include/` and `lib/`), or every reason each way failed.
fn locate_mlx() -> Result<PathBuf, Vec<String>> {
    let mut reasons = Vec::new();

    if let Some(dir) = env::var_os("MLX_DIR") {
        let dir = PathBuf::from(dir);
        if is_mlx_dir(&dir) {
            return Ok(dir);
        }
        reasons.push(format!(
            "MLX_DIR={} has no include/mlx/mlx.h and lib/{}",
            dir.display(),
            library_file_name()
        ));
    } else {
        reasons.push("MLX_DIR is not set".to_string());
    }

    if cross_compiling() {
        reasons.push(format!(
            "Python's `mlx` was not tried: it is built for this machine, not {}",
            target_triple()
        ));
    } else {
        match python_mlx() {
            Ok(dir) => return Ok(dir),
            Err(reason) => reasons.push(reason),
        }
    }

    match cached_wheel() {
        Ok(dir) => return Ok(dir),
        Err(reason) => reasons.push(reason),
    }
    Err(reasons)
}

fn fail(reasons: &[String]) -> ! {
    let mut message = format!(
        "mlx-sys could not find MLX {MLX_VERSION}. Provide it in one of three ways:\n  \
         1. set MLX_DIR to a folder holding include/mlx/mlx.h and lib/{lib};\n  \
         2. install it into Python: `python3 -m pip install mlx-cpu=={MLX_VERSION}` (Linux) or \
         `mlx=={MLX_VERSION}` (macOS);\n  \
         3. let this build install the release wheel itself, which needs python3 with pip and \
         access to PyPI.\nWhat was tried:",
        lib = library_file_name()
    );
    for reason in reasons {
        message.push_str("\n  - ");
        message.push_str(reason);
    }
    // A build script's panic message is shown in full by cargo, which is what we want here.
    panic!("{message}");
}

fn library_file_name() -> &'static str {
    if target_os() == "macos" {
        "libmlx.dylib"
    } else {
        "libmlx.so"
    }
}

fn target_os() -> String {
    env::var("CARGO_CFG_TARGET_OS").unwrap_or_default()
}

fn target_triple() -> String {
    env::var("TARGET").unwrap_or_default()
}

fn is_mlx_dir(dir: &Path) -> bool {
    dir.join("include/mlx/mlx.h").is_file() && dir.join("lib").join(library_file_name()).is_file()
}

/// Reads the version macros of an MLX include folder.
fn header_version(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("include/mlx/version.h")).ok()?;
    let component = |name: &str| -> Option<String> {
        text.lines()
            .find_map(|line| line.trim().strip_prefix(&format!("#define {name} ")))
            .map(|value| value.trim().to_string())
    };
    Some(format!(
        "{}.{}.{}",
        component("MLX_VERSION_MAJOR")?,
        component("MLX_VERSION_MINOR")?,
        component("MLX_VERSION_PATCH")?
    ))
}

fn python() -> String {
    env::var("PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// Finds an importable Python `mlx` of the pinned version.
fn python_mlx() -> Result<PathBuf, String> {
    const PROBE: &str = "import importlib.util\n\
        spec = importlib.util.find_spec('mlx')\n\
        print('\\n'.join(spec.submodule_search_locations or []) if spec else '')";
    let output = Command::new(python())
        .args(["-c", PROBE])
        .output()
        .map_err(|e| format!("could not run {}: {e}", python()))?;
    if !output.status.success() {
        return Err(format!(
            "{} could not look for an `mlx` package: {}",
            python(),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let candidates: Vec<PathBuf> = stdout.lines().map(PathBuf::from).collect();
    if candidates.is_empty() {
        return Err(format!("{} has no importable `mlx` package", python()));
    }
    let mut seen = Vec::new();
    for dir in candidates {
        if !is_mlx_dir(&dir) {
            seen.push(format!("{} (no headers or library)", dir.display()));
            continue;
        }
        match header_version(&dir) {
            Some(version) if version == MLX_VERSION => return Ok(dir),
            version => seen.push(format!(
                "{} (version {}, need {MLX_VERSION})",
                dir.display(),
                version.as_deref().unwrap_or("unknown")
            )),
        }
    }
    Err(format!("Python's `mlx` is not usable: {}", seen.join("; ")))
}

fn cache_root() -> Result<PathBuf, String> {
    if let Some(dir) = env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir).join("mlxkit"));
    }
    env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|home| PathBuf::from(home).join(".cache/mlxkit"))
        .ok_or_else(|| "neither XDG_CACHE_HOME nor HOME is set, so there is no cache".to_string())
}

/// The wheels that make up MLX for this target, and whether their dependencies are needed.
fn wheel_requirements() -> (String, Vec<String>, bool) {
    if target_os() == "macos" {
        // `mlx-metal` holds the library, its headers and `mlx.metallib`; the `mlx` wheel is
        // only the Python binding, which nothing here needs. A cross build's wheel is the one
        // for its deployment target, so the cache keeps one per target.
        let variant = if cross_compiling() {
            format!("metal-macos{}", macos_deployment_major())
        } else {
            "metal".to_string()
        };
        (variant, vec![format!("mlx-metal=={MLX_VERSION}")], false)
    } else if let Some(cuda) = cuda_major() {
        // The CUDA wheel needs the NVIDIA runtime wheels it depends on, so pip resolves them.
        (
            format!("cuda{cuda}"),
            vec![format!("mlx-cuda-{cuda}=={MLX_VERSION}")],
            true,
        )
    } else {
        (
            "cpu".to_string(),
            vec![format!("mlx-cpu=={MLX_VERSION}")],
            false,
        )
    }
}

/// The oldest macOS a cross-built binary must run on: `MACOSX_DEPLOYMENT_TARGET`'s major
/// version, and at least 14, the oldest the mlx-metal wheels are built for. pip would otherwise
/// pick the newest wheel, whose library is built for a newer macOS than the binary and imports
/// more of libc++: the macOS 26 wheel imports `std::bad_function_call`'s type information,
/// which the shim also defines privately (zig's libc++ headers), and zig's linker then binds
/// the shim's direct references to the library's copy and fails with "Overflow".
fn macos_deployment_major() -> u32 {
    env::var("MACOSX_DEPLOYMENT_TARGET")
        .ok()
        .and_then(|target| target.split('.').next()?.parse().ok())
        .unwrap_or(14)
        .max(14)
}

/// The CUDA major version to link (`cuda` feature: 12; `cuda13`: 13), or `None` for no CUDA.
fn cuda_major() -> Option<u32> {
    if env::var_os("CARGO_FEATURE_CUDA13").is_some() {
        Some(13)
    } else if env::var_os("CARGO_FEATURE_CUDA").is_some() {
        Some(12)
    } else {
        None
    }
}

/// Whether this build's target differs from the machine running it: then a Python `mlx` or a
/// system library found here is the wrong one, and wheels are fetched for the target.
fn cross_compiling() -> bool {
    env::var("HOST").ok() != env::var("TARGET").ok()
}

/// The platform tags pip may install wheels for when cross-compiling. pip takes a tag it is
/// given literally (a wheel tagged `manylinux_2_28` does not match `manylinux_2_35`), so every
/// glibc the target's MLX wheel allows is named, from the newest the wheels need down.
fn wheel_platforms() -> Result<Vec<String>, String> {
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    match (target_os().as_str(), arch.as_str()) {
        ("macos", "aarch64") => Ok((14..=macos_deployment_major())
            .rev()
            .map(|major| format!("macosx_{major}_0_arm64"))
            .collect()),
        ("linux", "aarch64" | "x86_64") => {
            let mut tags: Vec<String> = (17..=35)
                .rev()
                .map(|minor| format!("manylinux_2_{minor}_{arch}"))
                .collect();
            tags.push(format!("manylinux2014_{arch}"));
            Ok(tags)
        }
        (os, arch) => Err(format!(
            "MLX publishes no release wheel for {arch} {os}; set MLX_DIR to an MLX build"
        )),
    }
}

/// Installs (once per user) and returns the pinned release wheel's `mlx` folder.
fn cached_wheel() -> Result<PathBuf, String> {
    let (variant, requirements, with_deps) = wheel_requirements();
    let target = pip_install_cached(
        &format!("mlx-{MLX_VERSION}-{variant}-{}", target_triple()),
        &requirements,
        with_deps,
        |dir| is_mlx_dir(&dir.join("mlx")),
    )?;
    Ok(target.join("mlx"))
}

/// Installs `requirements` with `pip --target` into `<cache>/<folder>` once per user and
/// returns that folder; `complete` says whether an install holds what the caller needs.
fn pip_install_cached(
    folder: &str,
    requirements: &[String],
    with_deps: bool,
    complete: impl Fn(&Path) -> bool,
) -> Result<PathBuf, String> {
    let root = cache_root()?;
    let target = root.join(folder);
    if complete(&target) {
        return Ok(target);
    }
    std::fs::create_dir_all(&root)
        .map_err(|e| format!("could not create the cache {}: {e}", root.display()))?;
    // Install beside the final folder and rename it into place, so a concurrent build or an
    // interrupted install never leaves a half-written package where the next build looks.
    let staging = root.join(format!(".{folder}.{}.partial", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let mut pip = Command::new(python());
    pip.args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--quiet",
    ]);
    if !with_deps {
        pip.arg("--no-deps");
    }
    if cross_compiling() {
        pip.args(["--only-binary", ":all:"]);
        for tag in wheel_platforms()? {
            pip.args(["--platform", &tag]);
        }
    }
    pip.arg("--target").arg(&staging).args(requirements);
    println!(
        "cargo:warning=installing {} into {}",
        requirements.join(" "),
        target.display()
    );
    let output = pip
        .output()
        .map_err(|e| format!("could not run {} -m pip: {e}", python()))?;
    if !output.status.success() {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(format!(
            "`{} -m pip install {}` failed: {}",
            python(),
            requirements.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    if !complete(&staging) {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(format!(
            "the installed package {} does not hold what mlx-sys needs",
            requirements.join(" ")
        ));
    }
    match std::fs::rename(&staging, &target) {
        Ok(()) => {}
        // Another build finished first: use its copy.
        Err(_) if complete(&target) => {
            let _ = std::fs::remove_dir_all(&staging);
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(format!(
                "could not move {} into {}: {e}",
                requirements.join(" "),
                target.display()
            ));
        }
    }
    Ok(target)
}

/// The PyPI OpenBLAS used when the system has none: its symbols carry a `scipy_` prefix, so it
/// never clashes with another BLAS in the process, and `shim/gemv.cc` forwards to it by name.
const PYPI_OPENBLAS: &str = "scipy-openblas32==0.3.34.481.3";

/// The BLAS that MLX's f32 matmuls reach on a Linux CPU build.
///
/// The CPU wheel bundles reference BLAS, ~36x slower for f32 matmul than OpenBLAS. The
/// executable defines `cblas_sgemm` itself (`shim/gemv.cc`) and exports it, so `libmlx` binds
/// to it; it forwards to the OpenBLAS chosen here.
enum Blas {
    /// A system `libopenblas.so.0` in `dir`, unprefixed symbols.
    System { dir: PathBuf },
    /// `PYPI_OPENBLAS` installed into the cache, its library in `dir`.
    Pypi { dir: PathBuf },
    /// No OpenBLAS: MLX keeps its reference BLAS, for the reason given.
    Reference { why: String },
    /// Not a Linux CPU build: MLX's own BLAS (Accelerate, cuBLAS) is used as it is.
    Native,
}

impl Blas {
    /// Names this BLAS for `mlxkit info` (a C string literal's contents: no quotes).
    fn describe(&self) -> &'static str {
        match self {
            Blas::System { .. } => "system OpenBLAS",
            Blas::Pypi { .. } => "OpenBLAS from PyPI (scipy-openblas32)",
            Blas::Reference { .. } => {
                "the MLX wheel's reference BLAS: about 25x slower prefill than OpenBLAS"
            }
            Blas::Native => "MLX's own",
        }
    }

    /// The prefix of the forwarded-to CBLAS symbols, when the shim forwards at all.
    fn symbol_prefix(&self) -> Option<&'static str> {
        match self {
            Blas::System { .. } => Some(""),
            Blas::Pypi { .. } => Some("scipy_"),
            Blas::Reference { .. } | Blas::Native => None,
        }
    }

    fn link_args(&self) -> Vec<String> {
        let (dir, library) = match self {
            Blas::System { dir } => (dir, "libopenblas.so.0"),
            Blas::Pypi { dir } => (dir, "libscipy_openblas.so"),
            Blas::Reference { .. } | Blas::Native => return Vec::new(),
        };
        let dir = dir.display();
        vec![
            format!("-Wl,--no-as-needed,-L{dir},-l:{library},--as-needed"),
            format!("-Wl,-rpath,{dir}"),
            // Pull the shim's `cblas_sgemm` into every executable and export it, so libmlx
            // binds to it ahead of any other.
            "-Wl,--undefined=cblas_sgemm".to_string(),
            "-Wl,--export-dynamic-symbol=cblas_sgemm".to_string(),
        ]
    }
}

/// `MLXKIT_BLAS` picks (`system`, `pypi`, `reference`); unset, the system's OpenBLAS is
/// preferred, then the PyPI one, then the reference BLAS with a warning.
fn choose_blas() -> Blas {
    if target_os() != "linux" || cuda_major().is_some() {
        return Blas::Native;
    }
    println!("cargo:rerun-if-env-changed=MLXKIT_BLAS");
    println!("cargo:rerun-if-env-changed=MLXKIT_NO_OPENBLAS");
    let choice = env::var("MLXKIT_BLAS").unwrap_or_default();
    if choice == "reference" || env::var_os("MLXKIT_NO_OPENBLAS").is_some() {
        return Blas::Reference {
            why: "asked for by MLXKIT_BLAS=reference or MLXKIT_NO_OPENBLAS".to_string(),
        };
    }
    let system = || system_openblas().map(|dir| Blas::System { dir });
    let pypi = || {
        pip_install_cached(
            &format!(
                "blas-{}-{}",
                PYPI_OPENBLAS.replace("==", "-"),
                target_triple()
            ),
            &[PYPI_OPENBLAS.to_string()],
            false,
            |dir| {
                pypi_openblas_lib(dir)
                    .join("libscipy_openblas.so")
                    .is_file()
            },
        )
        .map(|dir| Blas::Pypi {
            dir: pypi_openblas_lib(&dir),
        })
    };
    match choice.as_str() {
        "system" => system().unwrap_or_else(|| Blas::Reference {
            why: "MLXKIT_BLAS=system, and no libopenblas.so.0 was found".to_string(),
        }),
        "pypi" => pypi().unwrap_or_else(|why| Blas::Reference { why }),
        _ => system()
            .map(Ok)
            .unwrap_or_else(pypi)
            .unwrap_or_else(|why| Blas::Reference {
                why: format!(
                    "no system libopenblas.so.0 (Debian: libopenblas0-pthread), and {why}"
                ),
            }),
    }
}

/// The library folder of `scipy-openblas32` installed into `dir`.
fn pypi_openblas_lib(dir: &Path) -> PathBuf {
    dir.join("scipy_openblas32/lib")
}

/// The folder holding a system `libopenblas.so.0` built for the target.
fn system_openblas() -> Option<PathBuf> {
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let mut dirs = vec![PathBuf::from(format!("/usr/lib/{arch}-linux-gnu"))];
    // The unqualified folders hold the build machine's own libraries.
    if !cross_compiling() {
        dirs.extend(["/usr/lib64", "/usr/lib", "/usr/local/lib"].map(PathBuf::from));
    }
    let found = dirs
        .iter()
        .map(|dir| dir.join("libopenblas.so.0"))
        .find(|path| path.exists())?;
    println!("cargo:rerun-if-changed={}", found.display());
    found.parent().map(Path::to_path_buf)
}
