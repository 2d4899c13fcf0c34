"""Generate `docs/ir.md`, the IR reference, from the IR's own definitions.

    python tools/gen_ir_docs.py            # rewrite docs/ir.md
    python tools/gen_ir_docs.py --check    # exit 1 if docs/ir.md is not current

Tensor-level ops come from `torchburn.ir.ops.OPS` (name, category, arity, doc with an IR
example); the loop-level statements, buffers, kernels and programs, and the expression nodes,
from their classes' docstrings in `torchburn/ir/loop.py` and `torchburn/ir/expr.py`, and the
scalar semantics from `torchburn/ir/semantics.py`'s module docstring. Edit those
docstrings, not the generated file; `tests/test_ir_docs.py` fails while the file is stale.
"""
from __future__ import annotations

import argparse
import inspect
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ir.md"

CATEGORY_TITLES = {
    "elementwise": "Elementwise ops",
    "view": "Views",
    "reduction": "Reductions",
    "contraction": "Contractions",
    "factory": "Factories",
    "data": "Data movement",
    "ordered": "Ordered ops (sorts and scans)",
}


def _doc(obj: Any) -> str:
    return textwrap.dedent(inspect.getdoc(obj) or "").strip()


def _indent_code(text: str) -> str:
    """Docstrings show IR as 4-space-indented blocks; make them fenced blocks for Markdown."""
    out: list[str] = []
    block: list[str] = []

    def flush() -> None:
        if block:
            while block and not block[-1].strip():
                block.pop()
            out.append("```")
            out.extend(line[4:] if line.startswith("    ") else line for line in block)
            out.append("```")
            block.clear()

    for line in text.splitlines():
        if line.startswith("    ") or (block and not line.strip()):
            block.append(line)
        else:
            flush()
            out.append(line)
    flush()
    return "\n".join(out)


def _first_sentence(doc: str) -> str:
    para = doc.split("\n\n")[0]
    return " ".join(para.split())


def _arity(n: int) -> str:
    return "any" if n < 0 else str(n)


def tensor_section() -> list[str]:
    from torchburn.ir import ops, tensor

    lines = ["## Tensor level", "", _indent_code(_doc(tensor)), ""]
    by_category: dict[str, list[Any]] = {}
    for d in ops.OPS.values():
        by_category.setdefault(d.category, []).append(d)
    order = list(CATEGORY_TITLES) + sorted(set(by_category) - set(CATEGORY_TITLES))
    for cat in order:
        defs = sorted(by_category.get(cat, []), key=lambda d: d.name)
        if not defs:
            continue
        lines += [f"### {CATEGORY_TITLES.get(cat, cat.capitalize())}", ""]
        generic = [d for d in defs if _is_generic(d)]
        special = [d for d in defs if not _is_generic(d)]
        if generic:
            lines += ["| op | operands | meaning |", "|---|---|---|"]
            for d in generic:
                meaning = _first_sentence(d.doc).replace("|", "\\|")
                lines.append(f"| `{d.name}` | {_arity(d.arity)} | {meaning} |")
            lines += ["", "Text form:", "", "```", _example(generic[0].doc), "```", ""]
        for d in special:
            lines += [f"#### `{d.name}`", "", f"Operands: {_arity(d.arity)}.", "", _indent_code(d.doc), ""]
    return lines


def _is_generic(d: Any) -> bool:
    """Ops whose doc is the shared template (unary/binary elementwise, plain reductions)."""
    return d.doc.startswith(("Elementwise `", "Reduce with `"))


def _example(doc: str) -> str:
    return "\n".join(line.strip() for line in doc.splitlines() if line.startswith("    "))


def _classes(module: Any, names: Iterable[str]) -> list[str]:
    lines: list[str] = []
    for name in names:
        cls = getattr(module, name)
        lines += [f"### `{name}`", "", _indent_code(_doc(cls)), ""]
        fields = getattr(cls, "__dataclass_fields__", None)
        if fields:
            shown = ", ".join(f"`{f}`" for f in fields)
            lines += [f"Fields: {shown}.", ""]
    return lines


def loop_section() -> list[str]:
    from torchburn.ir import loop

    lines = ["## Loop level", "", _indent_code(_doc(loop)), ""]
    lines += [f"Loop kinds: {', '.join(f'`{k}`' for k in loop.LOOP_KINDS)}. "
              f"Buffer scopes: {', '.join(f'`{s}`' for s in loop.SCOPES)}.", ""]
    lines += _classes(loop, ["Program", "KernelCall", "Kernel", "Buffer", "For", "If", "Store", "Let",
                             "Alloc", "Block"])
    return lines


def expr_section() -> list[str]:
    from torchburn.ir import expr

    lines = ["## Expressions", "", _indent_code(_doc(expr)), ""]
    infix = ", ".join(f"`{sym}` ({name})" for name, sym in expr.INFIX_OPS.items())
    lines += [f"Infix binary operators: {infix}.", "",
              f"Binary operators spelt as calls: {', '.join(f'`{n}`' for n in sorted(expr.NAMED_BINARY_OPS))}.", "",
              f"Unary functions: {', '.join(f'`{n}`' for n in sorted(expr.UNARY_FUNCS))}.", ""]
    nodes = [name for name, obj in vars(expr).items()
             if inspect.isclass(obj) and issubclass(obj, expr.Expr) and obj is not expr.Expr
             and obj.__module__ == expr.__name__]
    lines += _classes(expr, ["ScalarType", *nodes])
    return lines


def semantics_section() -> list[str]:
    from torchburn.ir import semantics

    return ["## Scalar semantics", "", _indent_code(_doc(semantics)), ""]


def generate() -> str:
    header = [
        "# TorchBurn IR reference",
        "",
        "<!-- Generated by tools/gen_ir_docs.py from torchburn/ir/ops.py, loop.py, expr.py and semantics.py. "
        "Do not edit by hand: change the docstrings and run `python tools/gen_ir_docs.py`. -->",
        "",
        "TorchBurn has two IR levels, both with a text form that `torchburn.ir.parse` reads back "
        "exactly (`parse(print_ir(ir)) == ir`) and `torchburn-opt` runs passes on. Comments run "
        "from `//` to the end of a line.",
        "",
        "- [Tensor level](#tensor-level): a graph of ops on typed tensors.",
        "- [Loop level](#loop-level): programs, kernels, loops, loads and stores.",
        "- [Expressions](#expressions): scalar and vector arithmetic inside loops, and symbolic sizes.",
        "- [Scalar semantics](#scalar-semantics): what every scalar op computes, on every dtype.",
        "",
    ]
    body = tensor_section() + loop_section() + expr_section() + semantics_section()
    text = "\n".join(header + body)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/ir.md is not current")
    ap.add_argument("-o", dest="output", default=str(DOC), help="where to write (default: docs/ir.md)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    text = generate()
    out = Path(args.output)
    if args.check:
        if not out.is_file() or out.read_text() != text:
            print(f"{out} is stale: run python tools/gen_ir_docs.py", file=sys.stderr)
            return 1
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
