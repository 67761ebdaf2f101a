"""A CUDA image's lock with the CPU torch, for building the CUDA images where the CUDA wheels cannot be had.

    python3 docker/cpu_torch_lock.py CUDA_LOCK RUNTIME_LOCK [--in-place]

Prints (or, with --in-place, writes over CUDA_LOCK) the CUDA lock without its CUDA torch and the wheels only that
torch needs (nvidia-*, cuda-*, triton), with the runtime lock's CPU torch entry in their place, hashes and all:
every other pin is the CUDA lock's own. Used by docker/build.sh --cuda-torch cpu on the host (for the wheelhouse)
and by the CUDA Dockerfiles under the build argument TORCH=cpu (for the install), so both read the same file. Such
an image checks the CUDA image's recipe and its Python imports; it cannot run CUDA, and is never pushed.
Standard library only (it runs in the bare base image).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==")
_CUDA_ONLY = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")


def blocks(text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(header lines, [(package name, its block of lines: pin, hashes, `# via` comments)]) of a pip-compile lock."""
    header: list[str] = []
    found: list[tuple[str, str]] = []
    for line in text.splitlines(keepends=True):
        pin = _PIN.match(line)
        if pin:
            found.append((pin[1].lower(), line))
        elif found:
            found[-1] = (found[-1][0], found[-1][1] + line)
        else:
            header.append(line)
    return header, found


def cpu_torch_lock(cuda_lock: str, runtime_lock: str) -> str:
    header, cuda = blocks(cuda_lock)
    cpu_torch = [block for name, block in blocks(runtime_lock)[1] if name == "torch"]
    if len(cpu_torch) != 1 or "+cpu" not in cpu_torch[0].splitlines()[0]:
        raise SystemExit("cpu_torch_lock: the runtime lock holds no torch==...+cpu entry")
    if not any(name == "torch" for name, _ in cuda):
        raise SystemExit("cpu_torch_lock: the CUDA lock holds no torch entry")
    kept = [block for name, block in cuda if not _CUDA_ONLY.match(name)]
    return "".join(header) + "".join(sorted([*kept, cpu_torch[0]], key=lambda b: b.lower()))


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or (len(argv) == 3 and argv[2] != "--in-place"):
        print(__doc__, file=sys.stderr)
        return 2
    out = cpu_torch_lock(Path(argv[0]).read_text(), Path(argv[1]).read_text())
    if len(argv) == 3:
        Path(argv[0]).write_text(out)
    else:
        sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
