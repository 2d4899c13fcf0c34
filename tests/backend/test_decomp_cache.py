"""The decomposition table's torch part rebuilt from the disk cache (`torchburn/backend/decomp_cache.py`)
equals what torch computes, and a bad recipe is never used."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from torchburn.runtime.disk_cache import DiskCache

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import json, torch, torch._dynamo
    from torchburn.backend import decomp_cache
    from torchburn.runtime import config
    from torchburn.frontend import decompositions as dec

    table = decomp_cache.decomposition_table(config.get_config())
    from_disk = dec.torch_table_seconds == 0.0
    fresh = dec.core_table()  # what torch computes, in this same process
    expected = dec._build(fresh)
    # the same ops and functions (the order of entries is not: torch's own varies by process)
    same = set(table) == set(expected) and all(decomp_cache._same(table[op], expected[op]) for op in table)
    print(json.dumps({"from_disk": from_disk, "same": same, "entries": len(table)}))
""")


def run_child(cache_dir: Path) -> tuple[dict[str, object], str]:
    env = dict(os.environ, TORCHBURN_CACHE_DIR=str(cache_dir))
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def test_rebuilt_table_equals_torchs_and_bad_recipes_are_not_used(tmp_path: Path) -> None:
    cold, _ = run_child(tmp_path)
    assert cold == {"from_disk": False, "same": True, "entries": cold["entries"]}
    (recipe,) = [p for p in DiskCache(tmp_path).graph_files() if p.name.startswith("dt")]

    warm, _ = run_child(tmp_path)
    assert warm == {"from_disk": True, "same": True, "entries": cold["entries"]}

    good = recipe.read_bytes()
    recipe.write_bytes(good[:100])  # truncated
    broken, log = run_child(tmp_path)
    assert broken["from_disk"] is False and broken["same"] is True and "is corrupt" in log
    assert recipe.read_bytes() == good  # stored again

    # A recipe that passes its digest but names an op this torch lacks: computed instead.
    cache = DiskCache(tmp_path)
    key = recipe.name[: -len(".tbfx")]
    manifest = cache.load_graph(key)
    assert manifest is not None
    manifest["ops"][0] = ["aten", "no_such_op_anywhere", "default", "r"]
    cache.store_graph(key, manifest)
    odd, _ = run_child(tmp_path)
    assert odd["from_disk"] is False and odd["same"] is True
