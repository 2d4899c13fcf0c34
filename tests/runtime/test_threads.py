"""TORCHBURN_NUM_THREADS sets the team size of generated parallel loops (runtime/threads.py)
and leaves torch's own thread setting alone.

Each case runs in a child process that routes the JIT's `omp_get_num_threads` through a
probe (`llvmlite.binding.add_symbol`): the parallel loop's OpenMP wrapper calls it inside the
parallel region, so the probe records the size of the team that really ran the kernel.
"""
from __future__ import annotations

import os
import subprocess
import sys
import pytest

from torchburn.runtime import threads

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = r'''
import ctypes, os, sys
import llvmlite.binding as llvm
import torch
from torchburn.runtime import jit, threads
from torchburn.runtime.config import reload_config

gomp = jit._openmp(required=True)
real = gomp.omp_get_num_threads
real.restype = ctypes.c_int
seen = set()

@ctypes.CFUNCTYPE(ctypes.c_int)
def probe():
    n = real()
    seen.add(n)
    return n

llvm.add_symbol("omp_get_num_threads", ctypes.cast(probe, ctypes.c_void_p).value)
torch_threads = torch.get_num_threads()
x = torch.randn(256, 2048)


def run(fn, expected):
    seen.clear()
    torch.testing.assert_close(fn(x), expected(x))
    return sorted(seen)


f1 = lambda t: (t * 2.0 + 1.0).exp()
f2 = lambda t: (t * 3.0).tanh()
teams = [run(torch.compile(f1, backend="torchburn"), f1)]  # TORCHBURN_NUM_THREADS as given
os.environ.pop("TORCHBURN_NUM_THREADS")
reload_config()
fn2 = torch.compile(f2, backend="torchburn")
teams.append(run(fn2, f2))  # unset: a module loaded now takes OpenMP's default, for all modules
threads.set_num_threads(1)  # changes every loaded module at once
teams.append(run(fn2, f2))
f3 = lambda t: (t - 0.5).sigmoid()
teams.append(run(torch.compile(f3, backend="torchburn"), f3))  # a module loaded later keeps it
print("TEAMS", teams, torch_threads == torch.get_num_threads())
'''


def run_child(num_threads: str) -> str:
    env = dict(os.environ, TORCHBURN_CACHE_DIR="off", PYTHONPATH=ROOT, TORCHBURN_NUM_THREADS=num_threads)
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env,
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("TEAMS")]
    assert line, proc.stdout[-2000:]
    return line[0]


def test_num_threads_sets_the_team_of_generated_loops() -> None:
    import torch

    # the team inside the kernel: as set (3, more than this machine's cores), OpenMP's default
    # once unset, 1 after set_num_threads(1), also in a module loaded after that; torch's own
    # setting unchanged throughout
    assert run_child("3") == f"TEAMS [[3], [{torch.get_num_threads()}], [1], [1]] True"


def test_set_num_threads_rejects_negative_counts() -> None:
    with pytest.raises(ValueError):
        threads.set_num_threads(-1)


def test_runtime_and_codegen_agree_on_the_global() -> None:
    from torchburn.codegen.llvm import parallel

    assert threads.THREADS_GLOBAL == parallel.THREADS_GLOBAL
