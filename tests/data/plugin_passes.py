"""A pass plugin for `torchburn-opt --load-pass-plugin` (used by tests/test_opt.py)."""
from dataclasses import dataclass
from typing import ClassVar, Sequence

from torchburn.ir.tensor import Op
from torchburn.passes import register_pass
from torchburn.passes.pattern import DeadOp, Pattern, PatternPass, RewritePattern, Rewriter, is_constant


class SquareToMul(RewritePattern):
    """pow(x, 2) -> mul(x, x)"""

    op_name = "pow"

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        x, exponent = op.operands
        if not is_constant(exponent, 2):
            return False
        rewriter.replace_op_with(op, "mul", [x, x])
        return True


@register_pass
@dataclass(frozen=True)
class TestSquare(PatternPass):
    """Strength-reduce pow(x, 2) to mul(x, x) (test plugin)."""

    name: ClassVar[str] = "test-square"

    def patterns(self) -> Sequence[Pattern]:
        return [SquareToMul(), DeadOp()]
