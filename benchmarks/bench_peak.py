"""The machine's multiply-accumulate peak, measured by generated loops (`torchburn/runtime/peak.py`):
int8 (`dot4_u8i8_acc`, `vpdpbusd` with AVX512-VNNI) and f32 (`fma`), one thread and all threads.

    python benchmarks/bench_peak.py                   # one thread, then all threads
    python benchmarks/bench_peak.py --threads 2 --rounds 5

Best of `--rounds`, wall time; the load average is printed (a loaded machine lowers it).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    os.environ.setdefault("TORCHBURN_CACHE_DIR", "off")
    from torchburn.codegen import host_target
    from torchburn.runtime.peak import host_lanes, measure

    target = host_target()
    lanes = host_lanes()
    print(f"host {target.cpu}, {target.vector_bits}-bit vectors, VNNI "
          f"{'yes' if target.has_feature('avx512vnni') else 'no'}; load average {os.getloadavg()[0]:.1f}")
    print("| loop | threads | G ops/s |")
    print("|---|---:|---:|")
    for kind in ("int8", "f32"):
        for threads in sorted({1, args.threads}):
            print(f"| {kind} ({'dot4_u8i8_acc' if kind == 'int8' else 'fma'}, {lanes} lanes) | {threads} | "
                  f"{measure(kind, lanes, threads, args.rounds):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
