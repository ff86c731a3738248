"""Checks a cross-linked macOS binary the way the dynamic loader on a Mac would see it.

Usage: macho_check.py BINARY

It reads the binary's load commands (with LIEF) and fails, naming the problem, unless:
- every library it loads is libmlx.dylib through @rpath, a system library under /usr/lib or a
  system framework: nothing from the build machine, no second copy of anything;
- no libc++ was linked in statically, and a binary that loads libmlx.dylib takes the system's
  libc++.1.dylib, the one libmlx.dylib itself uses (C++ objects and exceptions cross between
  the two), and has an LC_RPATH entry that resolves to a folder holding libmlx.dylib (and
  mlx.metallib beside it); binaries of the crates that need no MLX load neither;
- every imported symbol is bound to a named library (two-level namespace): none is left for a
  flat lookup that would only fail when first called on the Mac;
- the libmlx.dylib it finds is built for the binary's oldest macOS or an older one, as on a Mac
  of that version the loader requires.
"""

import os
import sys

import lief

from macho import LIBCXX, bound_library, loaded_libraries

SYSTEM_PREFIXES = ("/usr/lib/", "/System/Library/Frameworks/")
MLX = "@rpath/libmlx.dylib"


def fail(message):
    print(f"macOS link check: {message}", file=sys.stderr)
    sys.exit(1)


def check_rpath(binary, path):
    """The first LC_RPATH entry that holds libmlx.dylib with mlx.metallib beside it."""
    rpaths = [cmd.path for cmd in binary.commands if isinstance(cmd, lief.MachO.RPathCommand)]
    here = os.path.dirname(os.path.abspath(path))
    resolved = [
        rpath for rpath in rpaths
        if os.path.isfile(os.path.join(rpath.replace("@loader_path", here).replace(
            "@executable_path", here), "libmlx.dylib"))
    ]
    if not resolved:
        fail(f"no rpath holds libmlx.dylib (rpaths: {rpaths or 'none'})")
    metallib = os.path.join(resolved[0].replace("@loader_path", here), "mlx.metallib")
    if not os.path.isfile(metallib):
        fail(f"{resolved[0]} has libmlx.dylib but no mlx.metallib beside it")
    return resolved[0]


def minimum_macos(binary):
    """The oldest macOS a Mach-O binary says it runs on, as a tuple, or None."""
    if binary.has_build_version:
        return tuple(binary.build_version.minos)
    if binary.has_version_min:
        return tuple(binary.version_min.version)
    return None


def check_mlx_minimum(binary, folder):
    """libmlx.dylib in `folder` runs on every macOS the binary runs on."""
    library = lief.MachO.parse(os.path.join(folder, "libmlx.dylib"))
    needed = minimum_macos(library.at(0)) if library is not None else None
    oldest = minimum_macos(binary)
    if needed is None or oldest is None:
        fail("the binary or libmlx.dylib names no minimum macOS")
    if needed > oldest:
        show = lambda version: ".".join(map(str, version))
        fail(f"libmlx.dylib needs macOS {show(needed)}, newer than the binary's {show(oldest)}: "
             "the MLX wheel is not the one for the deployment target")


def main(path):
    binary = lief.MachO.parse(path)
    if binary is None:
        fail(f"{path} is not a Mach-O file")
    binary = binary.at(0)
    if binary.header.cpu_type != lief.MachO.Header.CPU_TYPE.ARM64:
        fail(f"{path} is built for {binary.header.cpu_type}, not arm64")

    libraries = loaded_libraries(binary)
    foreign = [name for name in libraries if name != MLX and not name.startswith(SYSTEM_PREFIXES)]
    if foreign:
        fail(f"loads libraries a Mac does not have: {', '.join(foreign)}")
    uses_mlx = MLX in libraries
    if uses_mlx and LIBCXX not in libraries:
        fail(f"does not load {LIBCXX}: the C++ runtime was linked some other way")

    # A statically linked libc++ defines its own copies of the runtime's symbols.
    own_runtime = sorted(
        s.name
        for s in binary.exported_symbols
        if s.name.startswith(("__ZNSt3__1", "___cxa_throw", "___cxa_allocate_exception"))
        and "basic_string" not in s.name  # inline template instances are fine
    )
    libcxx_defined = [n for n in own_runtime if n.startswith("___cxa")]
    if libcxx_defined:
        fail(f"defines the C++ runtime itself ({', '.join(libcxx_defined[:3])}): "
             "libc++ was linked statically")

    resolved = check_rpath(binary, path) if uses_mlx else None
    if resolved:
        here = os.path.dirname(os.path.abspath(path))
        check_mlx_minimum(binary, resolved.replace("@loader_path", here).replace(
            "@executable_path", here))

    by_library = {}
    unbound = []
    for symbol in binary.imported_symbols:
        if symbol.library_ordinal == 0:
            continue  # bound to the binary itself
        library = bound_library(binary, symbol)
        if library is None:
            unbound.append(symbol.name)
        else:
            by_library.setdefault(library, 0)
            by_library[library] += 1
    if unbound:
        fail(f"{len(unbound)} imported symbols are bound to no library (flat lookup), "
             f"e.g. {', '.join(sorted(unbound)[:5])}")
    if uses_mlx and by_library.get(LIBCXX, 0) == 0:
        fail(f"imports nothing from {LIBCXX}")

    what = "" if uses_mlx else " (no MLX)"
    print(f"macOS link check: {os.path.basename(path)}: arm64{what}; loads {len(libraries)} "
          "libraries:")
    for name in libraries:
        print(f"  {name} ({by_library.get(name, 0)} symbols)")
    if resolved:
        print(f"  rpath {resolved} holds libmlx.dylib and mlx.metallib")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        fail("usage: macho_check.py BINARY")
    main(sys.argv[1])
