"""Sweep models through the backend in three modes and say, per model and mode, what happened.

    python tools/sweep_models.py                     # every model of tests/models/zoo_more.py
    python tools/sweep_models.py phi bart convmix    # some of them
    python tools/sweep_models.py --json out.jsonl    # also one JSON line per (model, mode)

Modes: `nograd` (eval under no_grad: outputs), `grad` (eval with grad: outputs and every
parameter's gradient), `train` (train(): outputs, gradients, buffers). Strict mode is on, so an
internal compiler error raises. Each model runs in a process of its own (a crash in native code
takes one model down, not the sweep), one at a time.

Results: `whole` (compiled, nothing in PyTorch outside NOT_COMPILED), `partial: ops (why)`,
`error: ...` (raised), `wrong: ...` (unequal to eager), `crash` (the process died), `timeout`;
`slow x.x` is appended when the compiled model took more than SLOW times eager's time per call.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODES = ("nograd", "grad", "train")
#: Further modes, asked for with --modes: `bf16` (the model and its float inputs in bfloat16,
#: eval under no_grad), `dynamic` (dynamic=True, eval under no_grad, three input sizes).
EXTRA_MODES = ("bf16", "dynamic")
#: Compiled/eager time per call above which a result is flagged slow.
SLOW = 3.0


def _classify(records: list[Any]) -> str:
    from torchburn.frontend.partition import is_deliberate

    if not records:
        return "nothing compiled (Dynamo handed the backend no graph)"
    stray = sorted({f"{op} ({why})" for r in records for op, why in r.fallbacks if not is_deliberate(op, why)})
    stray += sorted({f"subgraph {s.name} ({s.reason})" for r in records for s in r.subgraphs if not s.compiled})
    return "whole" if not stray else "partial: " + "; ".join(stray)


def _per_call(fn: Any, calls: int = 7) -> float:
    """The fastest of `calls` calls after a warm-up: on a shared machine the mean measures the
    neighbours' load more than the code."""
    fn()
    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def run_one(name: str, mode: str) -> dict[str, Any]:
    """Compile and check `name` in `mode`; the outcome as a dict."""
    import torch

    from tests.models import zoo_more
    from tests.models.test_model_suite import GRAD_REL, OUT_TOL, assert_grads_close, projection, recording

    case = zoo_more.CASES[name]
    if mode in EXTRA_MODES:
        return _run_extra(name, mode)
    tol = dict(rtol=2e-2, atol=2e-2) if name in zoo_more.HALF else OUT_TOL
    eager = zoo_more.build(name).train(mode == "train")
    model = zoo_more.build(name).train(mode == "train")  # (weight_norm modules cannot be deep-copied)
    batch, seq = case.shape
    kw = case.inputs(eager, batch, seq, case.sequence)
    torch._dynamo.reset()
    f = torch.compile(model, backend="torchburn")
    result: dict[str, Any] = {"model": name, "mode": mode}
    start = time.perf_counter()
    try:
        if mode == "nograd":
            with torch.no_grad():
                out, records = recording(lambda: case.pick(f(**kw)))
                expected = case.pick(eager(**kw))
        else:
            def step() -> torch.Tensor:
                o = case.pick(f(**kw))
                (o * projection(o)).sum().backward()
                return o
            out, records = recording(step)
            expected = case.pick(eager(**kw))
            (expected * projection(expected)).sum().backward()
        result["compile_s"] = round(time.perf_counter() - start, 1)
    except Exception as e:  # noqa: BLE001 - the sweep reports every failure
        result["result"] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        result["trace"] = traceback.format_exc()[-3000:]
        return result
    try:
        torch.testing.assert_close(out, expected, **tol)
        if mode != "nograd":
            grel = 2e-2 if name in zoo_more.HALF else GRAD_REL
            if grel != GRAD_REL:
                _grads_close(model, eager, grel)
            else:
                assert_grads_close(model, eager)
            for (bname, b), ref in zip(model.named_buffers(), eager.buffers()):
                if b.is_floating_point():
                    torch.testing.assert_close(b, ref, **tol, msg=lambda m: f"{bname}: {m}")
    except AssertionError as e:
        result["result"] = "wrong: " + " ".join(str(e).split())[:400]
        return result
    result["result"] = _classify(records)
    result["graphs"] = len(records)
    if mode == "nograd":
        with torch.no_grad():
            ours, theirs = _per_call(lambda: f(**kw)), _per_call(lambda: eager(**kw))
    else:
        def fwd_bwd(m: Any) -> Any:
            return lambda: case.pick(m(**kw)).float().sum().backward()
        ours, theirs = _per_call(fwd_bwd(f)), _per_call(fwd_bwd(eager))
    result["ms"] = round(1e3 * ours, 2)
    result["eager_ms"] = round(1e3 * theirs, 2)
    if ours > SLOW * theirs:
        result["result"] += f" slow {ours / theirs:.1f}x"
    return result


def _run_extra(name: str, mode: str) -> dict[str, Any]:
    """`bf16`: the error of the compiled bf16 model against eager float32 is at most twice eager
    bf16's own error (plus 1e-2), so rounding in a different order passes and a wrong result
    does not. `dynamic`: outputs equal eager's at three sizes, one compilation."""
    import torch

    from tests.models import zoo_more
    from tests.models.test_model_suite import OUT_TOL, recording

    case = zoo_more.CASES[name]
    model = zoo_more.build(name)
    batch, seq = case.shape
    result: dict[str, Any] = {"model": name, "mode": mode}
    torch._dynamo.reset()
    start = time.perf_counter()
    try:
        with torch.no_grad():
            if mode == "bf16":
                kw = case.inputs(model, batch, seq, case.sequence)
                reference = case.pick(model(**kw)).float()
                model = model.to(torch.bfloat16)
                kw = {k: v.to(torch.bfloat16) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                      for k, v in kw.items()}
                f = torch.compile(model, backend="torchburn")
                out, records = recording(lambda: case.pick(f(**kw)).float())
                expected = case.pick(model(**kw)).float()
                ours, theirs = (out - reference).abs().max().item(), (expected - reference).abs().max().item()
                ok = ours <= 2 * theirs + 1e-2 and torch.isfinite(out).all().item()
                verdict = None if ok else f"wrong: error {ours:.3g} against float32, eager bf16's {theirs:.3g}"
            else:
                f = torch.compile(model, backend="torchburn", dynamic=True)
                sizes = [(batch, seq), (batch + 1, seq), (batch, seq + 8 if seq else seq)]
                pairs, records = recording(lambda: [(case.pick(f(**kw)), case.pick(model(**kw))) for kw in
                                                    [case.inputs(model, b, s, case.sequence) for b, s in sizes]])
                verdict = None
                for (b, s), (got, want) in zip(sizes, pairs):
                    try:
                        torch.testing.assert_close(got, want, **OUT_TOL)
                    except AssertionError as e:
                        verdict = f"wrong at batch {b}, length {s}: " + " ".join(str(e).split())[:300]
                        break
    except Exception as e:  # noqa: BLE001
        result["result"] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        result["trace"] = traceback.format_exc()[-3000:]
        return result
    result["compile_s"] = round(time.perf_counter() - start, 1)
    result["result"] = verdict or _classify(records)
    return result


def _grads_close(model: Any, eager: Any, rel: float) -> None:
    import torch

    pairs = [(n, p, q) for (n, p), q in zip(model.named_parameters(), eager.parameters()) if q.grad is not None]
    scale = max(q.grad.abs().max().item() for _, _, q in pairs)
    for n, p, q in pairs:
        assert p.grad is not None, f"{n}: no gradient"
        torch.testing.assert_close(p.grad, q.grad, rtol=rel, atol=rel * scale, msg=lambda m: f"{n}: {m}")


def _child(name: str, modes: list[str]) -> None:
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    torch._dynamo.config.allow_rnn = True  # else Dynamo hands the backend nothing of an LSTM
    for mode in modes:
        print(json.dumps(run_one(name, mode)), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per model, all modes")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    modes = args.modes.split(",")
    if args.child:
        _child(args.models[0], modes)
        return
    sys.path.insert(0, str(ROOT))
    from tests.models import zoo_more

    names = args.models or list(zoo_more.CASES)
    env = dict(os.environ, TORCHBURN_STRICT="1", TORCHBURN_CACHE_DIR="off",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    sink = args.json.open("a") if args.json else None
    for name in names:
        try:
            proc = subprocess.run([sys.executable, __file__, "--child", "--modes", args.modes, name], env=env,
                                  capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
            rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
            if proc.returncode != 0:
                done = {r["mode"] for r in rows}
                tail = proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
                rows += [{"model": name, "mode": m, "result": f"crash: {tail[0][:300]}"} for m in modes if m not in done]
        except subprocess.TimeoutExpired:
            rows = [{"model": name, "mode": m, "result": "timeout"} for m in modes]
        for row in rows:
            extra = f"  ({row['compile_s']}s compile, {row.get('ms')} ms vs eager {row.get('eager_ms')} ms)" \
                if "compile_s" in row else ""
            print(f"{name:18} {row['mode']:7} {row['result']}{extra}", flush=True)
            if sink:
                sink.write(json.dumps(row) + "\n")
                sink.flush()


if __name__ == "__main__":
    main()
