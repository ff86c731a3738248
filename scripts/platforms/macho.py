"""What the macOS checks read from a Mach-O file's load commands (with LIEF)."""

import lief

lief.logging.disable()

LIBCXX = "/usr/lib/libc++.1.dylib"


def loaded_libraries(binary):
    """The install names of the libraries the binary loads, in load-command order (LIEF's
    `libraries` also lists a dylib's own LC_ID_DYLIB)."""
    return [
        command.name
        for command in binary.commands
        if isinstance(command, lief.MachO.DylibCommand)
        and command.command != lief.MachO.LoadCommand.TYPE.ID_DYLIB
    ]


def bound_library(binary, symbol):
    """The install name of the library an imported symbol binds to, or None for a flat or
    weak lookup (the ordinal in the bind information, 1-based into the load commands)."""
    loaded = loaded_libraries(binary)
    ordinal = symbol.library_ordinal
    if 1 <= ordinal <= len(loaded):
        return loaded[ordinal - 1]
    return None
