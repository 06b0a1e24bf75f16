"""CPU time of a thread of this process, or of a whole process, for benchmarks and tests (Linux /proc)."""

from __future__ import annotations

import os
import threading


def _stat_cpu_s(stat_path: str) -> float | None:
    """utime + stime in seconds from a /proc ``stat`` file (None off Linux or when gone)."""
    try:
        with open(stat_path) as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def thread_cpu_s(native_id: int | None) -> float | None:
    """CPU seconds a thread of this process has used (None off Linux or when gone)."""
    return _stat_cpu_s(f"/proc/self/task/{native_id}/stat")


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds a process has used, all its threads together (None off Linux or when gone)."""
    return _stat_cpu_s(f"/proc/{pid}/stat")


def named_thread_cpu_s(name: str) -> float | None:
    """CPU seconds of this process's thread called ``name`` (None when there is none)."""
    thread = next((t for t in threading.enumerate() if t.name == name), None)
    return None if thread is None else thread_cpu_s(thread.native_id)
