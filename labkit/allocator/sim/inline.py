"""Generate faster copies of functions by inlining calls of small helpers (CPython calls are costly).

``inline(fn, functions, methods)`` returns ``fn`` recompiled from its own source with the calls of
the helpers replaced by their bodies. A helper is named either as a function (``increase_stat``:
calls by that name) or as a method (``Pool.insert_into_blocks``: calls ``<expr>.insert_into_blocks(...)``
with ``self`` bound to ``<expr>``). Calls are inlined where they are a whole statement
(``helper(...)``), the value of an assignment (``x = helper(...)``) or of a ``return``; each
``return v`` inside the helper becomes ``x = v``, the code after an ``if`` that returns on one
side moving into the other side, so no jump is needed. Helpers inlined into a helper's body are
inlined in turn.

Only transformations that keep the meaning exactly are accepted: positional arguments (missing
ones take the helper's constant defaults), each evaluated once, left to right, before the body (a
plain name or constant is substituted directly when the helper never assigns that parameter); the
helper's locals renamed apart; no ``return`` inside a loop, ``with`` or ``try`` of a helper; no
``yield``, ``global``, ``nonlocal``, nested function or class; a helper's global names must not be
locals of the function they are inlined into; no closures. Anything else raises ``ValueError`` at import time.
The generated code is a derivative: the source stays the only place a rule is written, and tests
run both versions and require identical results.
"""

from __future__ import annotations

import ast
import copy
import inspect
import itertools
import textwrap
from collections.abc import Callable

_counter = itertools.count()
_DISCARD = "_inlined_result"


def _parse_function(fn: Callable) -> ast.FunctionDef:
    if fn.__code__.co_freevars:
        raise ValueError(f"{fn.__qualname__}: a closure (uses {', '.join(fn.__code__.co_freevars)}) cannot be recompiled")
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    fdef = tree.body[0]
    if not isinstance(fdef, ast.FunctionDef):
        raise ValueError(f"{fn.__qualname__}: not a plain function")
    fdef.decorator_list = []
    fdef.returns = None  # annotations are not needed to run, and may name what only a type checker sees
    for a in fdef.args.args:
        a.annotation = None
    return fdef


def _stored_names(nodes: list[ast.AST]) -> set[str]:
    return {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name)
            and isinstance(n.ctx, (ast.Store, ast.Del))}


def _loaded_names(nodes: list[ast.AST]) -> set[str]:
    return {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _has_return(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Return) for n in ast.walk(node))


def _always_returns(stmts: list[ast.stmt]) -> bool:
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, ast.Return):
        return True
    return isinstance(last, ast.If) and _always_returns(last.body) and _always_returns(last.orelse)


def _eliminate_returns(stmts: list[ast.stmt], target: ast.expr | None, where: str) -> list[ast.stmt]:
    """The statements with every ``return v`` turned into ``target = v`` (or ``v`` alone without a target)."""

    def result(value: ast.expr | None) -> list[ast.stmt]:
        value = value if value is not None else ast.Constant(None)
        if target is None:
            return [] if isinstance(value, ast.Constant) else [ast.Expr(value)]
        return [ast.Assign(targets=[copy.deepcopy(target)], value=value)]

    out: list[ast.stmt] = []
    for i, s in enumerate(stmts):
        if isinstance(s, ast.Return):
            return out + result(s.value)
        if isinstance(s, ast.If) and _has_return(s):
            rest = stmts[i + 1:]
            body = s.body if _always_returns(s.body) else s.body + rest
            orelse = s.orelse if _always_returns(s.orelse) else s.orelse + rest
            new_body = _eliminate_returns(body, target, where) or [ast.Pass()]
            out.append(ast.If(test=s.test, body=new_body, orelse=_eliminate_returns(orelse, target, where)))
            return out
        if _has_return(s):
            raise ValueError(f"{where}: a return inside {type(s).__name__} cannot be inlined")
        out.append(s)
    return out + result(None) if target is not None else out


class _Helper:
    def __init__(self, fn: Callable) -> None:
        fdef = _parse_function(fn)
        self.name = fn.__name__
        a = fdef.args
        if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs:
            raise ValueError(f"{fn.__qualname__}: only plain positional parameters can be inlined")
        try:
            a.defaults = [ast.Constant(ast.literal_eval(d)) for d in a.defaults]
        except ValueError:
            raise ValueError(f"{fn.__qualname__}: only constant defaults can be inlined") from None
        self.params = [x.arg for x in a.args]
        self.defaults = dict(zip(self.params[len(self.params) - len(a.defaults):], a.defaults))
        body = fdef.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring
        for node in ast.walk(ast.Module(body=body, type_ignores=[])):
            if isinstance(node, (ast.Yield, ast.YieldFrom, ast.Global, ast.Nonlocal, ast.FunctionDef,
                                 ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                raise ValueError(f"{fn.__qualname__}: {type(node).__name__} cannot be inlined")
        self.body = body
        self.assigned = _stored_names(body)
        self.free = _loaded_names(body) - self.assigned - set(self.params)

    def expand(self, args: list[ast.expr], target: ast.expr | None) -> list[ast.stmt]:
        if len(args) > len(self.params) or any(p not in self.defaults for p in self.params[len(args):]):
            raise ValueError(f"{self.name}: called with {len(args)} arguments, takes {len(self.params)}")
        args = args + [copy.deepcopy(self.defaults[p]) for p in self.params[len(args):]]
        tag = f"_{self.name.lstrip('_')}{next(_counter)}_"
        names: dict[str, ast.expr | str] = {v: tag + v for v in self.assigned if v not in self.params}
        pre: list[ast.stmt] = []
        for p, arg in zip(self.params, args):
            if p not in self.assigned and isinstance(arg, (ast.Name, ast.Constant)):
                names[p] = arg
            else:
                pre.append(ast.Assign(targets=[ast.Name(tag + p, ast.Store())], value=arg))
                names[p] = tag + p
        body = [_Rename(names).visit(copy.deepcopy(s)) for s in self.body]
        return pre + _eliminate_returns(body, target, self.name)


class _Rename(ast.NodeTransformer):
    def __init__(self, names: dict[str, ast.expr | str]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.expr:
        new = self.names.get(node.id)
        if new is None:
            return node
        if isinstance(new, str):
            return ast.copy_location(ast.Name(new, node.ctx), node)
        return ast.copy_location(copy.deepcopy(new), node)


class _Inliner(ast.NodeTransformer):
    def __init__(self, functions: dict[str, _Helper], methods: dict[str, _Helper], caller_locals: set[str]) -> None:
        self.functions, self.methods, self.caller_locals = functions, methods, caller_locals

    def _helper_call(self, value: ast.expr | None) -> tuple[_Helper, list[ast.expr]] | None:
        if not isinstance(value, ast.Call):
            return None
        f = value.func
        if isinstance(f, ast.Name) and f.id in self.functions:
            helper, args = self.functions[f.id], list(value.args)
        elif isinstance(f, ast.Attribute) and f.attr in self.methods:
            helper, args = self.methods[f.attr], [f.value, *value.args]
        else:
            return None
        if value.keywords or any(isinstance(a, ast.Starred) for a in args):
            raise ValueError(f"{helper.name}: keyword or starred arguments cannot be inlined")
        clash = helper.free & self.caller_locals
        if clash:
            raise ValueError(f"{helper.name}: its global names {sorted(clash)} are locals where it would be inlined")
        return helper, args

    def _expand(self, stmt: ast.stmt) -> list[ast.stmt] | None:
        if isinstance(stmt, ast.Expr):
            call, target = self._helper_call(stmt.value), None
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            call, target = self._helper_call(stmt.value), stmt.targets[0]
        elif isinstance(stmt, ast.Return) and stmt.value is not None:
            call = self._helper_call(stmt.value)
            if call is None:
                return None
            name = ast.Name(f"_returned{next(_counter)}", ast.Store())
            return self._statements(call[0].expand(call[1], name)) + [ast.Return(ast.Name(name.id, ast.Load()))]
        else:
            return None
        if call is None:
            return None
        return self._statements(call[0].expand(call[1], target))

    def _statements(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        self.caller_locals |= _stored_names(stmts)
        out: list[ast.stmt] = []
        for s in stmts:
            expanded = self._expand(s)
            out.extend(expanded if expanded is not None else [self.visit(s)])
        return out

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field, value in ast.iter_fields(node):
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                setattr(node, field, self._statements(value))
            elif isinstance(value, ast.AST):
                self.visit(value)
        return node


def inline(fn: Callable, functions: list[Callable] = (), methods: list[Callable] = ()) -> Callable:
    """``fn`` recompiled with calls of ``functions`` (by name) and ``methods`` (by attribute name) inlined."""
    fdef = _parse_function(fn)
    caller_locals = _stored_names(fdef.body) | {a.arg for a in fdef.args.args}
    inliner = _Inliner({h.__name__: _Helper(h) for h in functions}, {h.__name__: _Helper(h) for h in methods},
                       caller_locals)
    fdef = inliner.visit(fdef)
    module = ast.fix_missing_locations(ast.Module(body=[fdef], type_ignores=[]))
    namespace: dict = {}
    exec(compile(module, f"<{fn.__qualname__}, helpers inlined>", "exec"), fn.__globals__, namespace)
    out = namespace[fdef.name]
    out.__qualname__ = fn.__qualname__
    out.__doc__ = fn.__doc__
    out.generated_source = ast.unparse(module)  # what runs, for reading and debugging
    return out
