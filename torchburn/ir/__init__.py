"""TorchBurn's IR: a tensor-level graph and a loop-nest IR, with text forms, a verifier and a
structural hash. This package imports nothing from torch (or from the rest of torchburn)."""
from . import dtypes, expr, loop, ops, tensor
from .dtypes import DType
from .expr import Expr, ScalarType, Var, Const
from .hashing import hash_key, structural_hash
from .loop import Buffer, Kernel, Program
from .parser import (IRParseError, parse, parse_all, parse_expr, parse_graph, parse_kernel,
                     parse_program, parse_stmt)
from .printer import print_ir
from .tensor import Graph, Op, TensorType, Value
from .verifier import VerificationError, verify

__all__ = ["dtypes", "expr", "loop", "ops", "tensor", "DType", "Expr", "ScalarType", "Var", "Const",
           "Buffer", "Kernel", "Program", "print_ir", "Graph", "Op", "TensorType", "Value",
           "parse", "parse_all", "parse_expr", "parse_stmt", "parse_graph", "parse_kernel",
           "parse_program", "IRParseError", "verify", "VerificationError", "structural_hash",
           "hash_key"]
