"""The allocator settings every local service starts with: glibc malloc keeps freed memory for reuse.

glibc serves an allocation above its mmap threshold (128 KiB at start, raised as such blocks are freed, 32 MiB at
most) with a fresh mmap, and gives heap memory above its trim threshold back to the OS on free. Either way the next
tensor of that size lands on pages the kernel must fault in and zero on first touch, and a torch step allocates and
frees the same activation sizes every time: on the addition example's trainer step (one thread, a 1.3 MB MLP
activation) an elementwise mul took ~1.5 ms inside the step against ~35 us on reused memory, and the step went
90 -> 83 ms (same run, alternated) with these settings. MALLOC_TUNABLES fixes the mmap threshold at its maximum and
never trims, so freed activations stay in the heap for the next step. What it costs: a process's resident memory
stays at its peak instead of shrinking between steps (the peak is reached again every step anyway).

A GLIBC_TUNABLES already in the launcher's environment is kept as it is; the container images set the same
(docker/*-cpu.Dockerfile, *-cuda.Dockerfile). Other C libraries ignore the variable.
"""

from __future__ import annotations

MALLOC_TUNABLES = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=17179869184"

