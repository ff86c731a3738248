"""Writes a text stub (.tbd) of macOS's /usr/lib/libc++.1.dylib for linking from Linux.

Usage: libcxx_stub.py LIBMLX_DYLIB EXTRA_SYMBOLS OUT_TBD

zig links its own libc++ statically unless it is given the system's, and the macOS SDK that
holds the real stub cannot be fetched here. A static copy would split the C++ runtime in two on
a Mac (libmlx.dylib uses the system's; C++ objects and exceptions cross between them), so we
link against a stub instead: it lists the symbols Apple's libc++ is known to export, namely
every symbol the macOS build of libmlx.dylib imports from it, plus EXTRA_SYMBOLS (one per
line, `#` comments), each checked by hand to be exported by the libc++ of macOS 14 and later.
A symbol in neither list fails the link by name rather than failing on a Mac at run time.
Never list a symbol our own objects define (an inline function's out-of-line copy, say): zig
then binds their references to the stub and fails with an unexplained "Overflow".
"""

import sys

import lief

from macho import LIBCXX, bound_library, loaded_libraries


def main(libmlx, extra, out):
    binary = lief.MachO.parse(libmlx).at(0)
    symbols = {s.name for s in binary.imported_symbols if bound_library(binary, s) == LIBCXX}
    if not symbols:
        sys.exit(f"{libmlx} imports nothing from {LIBCXX}: is it the macOS MLX library?")
    with open(extra) as f:
        for line in f:
            name = line.split("#", 1)[0].strip()
            if name:
                symbols.add(name)
    with open(out, "w") as f:
        f.write("--- !tapi-tbd\n")
        f.write("tbd-version:     4\n")
        f.write("targets:         [ arm64-macos ]\n")
        f.write(f"install-name:    '{LIBCXX}'\n")
        f.write("exports:\n")
        f.write("  - targets:         [ arm64-macos ]\n")
        f.write("    symbols:         [ ")
        f.write(",\n                       ".join(f"'{s}'" for s in sorted(symbols)))
        f.write(" ]\n...\n")
    print(f"libc++ stub: {len(symbols)} symbols")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: libcxx_stub.py LIBMLX_DYLIB EXTRA_SYMBOLS OUT_TBD")
    main(*sys.argv[1:])
