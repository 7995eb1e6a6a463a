"""labkit.allocator.sim.inline: generated copies behave exactly like the functions they come from, or are refused."""

import itertools

import pytest

from labkit.allocator.sim.inline import inline


def bump(stat, i, n):
    stat[i] += n
    if stat[i] > stat[i + 1]:
        stat[i + 1] = stat[i]


def clamp(x, lo, hi=10):
    """Early returns on several paths."""
    if x < lo:
        return lo
    if x > hi:
        if x > 100:
            return -1
        x = hi
    return x


def first_even(xs):
    for x in xs:
        if x % 2 == 0:
            break
    else:
        x = None
    return x


class Box:
    def __init__(self):
        self.items = []

    def put(self, x):
        self.items.append(x)
        self.items.sort()


def caller(stat, values, box):
    out = []
    for v in values:
        bump(stat, 0, v)
        c = clamp(v, 2)
        box.put(c)
        e = first_even(values)
        out.append((c, e))
    r = clamp(values[0] if values else 0, 3, 5)
    return out, r


def returns_a_call(v):
    return clamp(v, 0)


def test_generated_copy_gives_the_same_results():
    fast = inline(caller, functions=[bump, clamp, first_even], methods=[Box.put])
    src = fast.generated_source
    assert "bump(" not in src and "clamp(" not in src and ".put(" not in src and "first_even(" not in src
    for values in ([], [1], [5, 0, 200, 11, 3], list(range(-3, 120, 7)), [101, 4, 4]):
        s1, s2, b1, b2 = [0, 0], [0, 0], Box(), Box()
        assert fast(s1, values, b1) == caller(s2, values, b2)
        assert s1 == s2 and b1.items == b2.items
    fast_ret = inline(returns_a_call, functions=[clamp])
    assert all(fast_ret(v) == returns_a_call(v) for v in (-5, 0, 7, 50, 500))


CALLS = []


def arg(x):
    CALLS.append(x)
    return x


def uses(a, b):
    return a + a + b


def evaluates_args():
    r = uses(arg(1), arg(2))
    return r


def test_each_argument_is_evaluated_once_in_order():
    fast = inline(evaluates_args, functions=[uses])
    CALLS.clear()
    assert fast() == evaluates_args() == 4
    assert CALLS == [1, 2, 1, 2]  # once per argument per call, left to right, in both versions


def assigns_its_parameter(a):
    tmp = a * 2
    a = tmp + 1  # the caller's variable must not change
    bump([0, 0], 0, a)


def keeps_its_variables(a, tmp):
    assigns_its_parameter(a)
    return a, tmp


def test_helper_locals_do_not_leak_into_the_caller():
    fast = inline(keeps_its_variables, functions=[assigns_its_parameter, bump])
    assert "assigns_its_parameter(" not in fast.generated_source
    assert fast(3, "mine") == keeps_its_variables(3, "mine") == (3, "mine")


def test_closures_are_refused():
    n = 3

    def closure():
        return n

    with pytest.raises(ValueError, match="closure"):
        inline(closure)


def loop_return(xs):
    for x in xs:
        if x:
            return x
    return None


def uses_loop_return(xs):
    y = loop_return(xs)
    return y


G = 1


def reads_global():
    return G


def shadows(G):
    v = reads_global()
    return v, G


def kw_call():
    v = clamp(1, lo=2)
    return v


@pytest.mark.parametrize("fn, functions, why", [
    (uses_loop_return, [loop_return], "return inside For"),
    (shadows, [reads_global], "global names"),
    (kw_call, [clamp], "keyword"),
])
def test_what_cannot_be_inlined_exactly_is_refused(fn, functions, why):
    with pytest.raises(ValueError, match=why):
        inline(fn, functions=functions)


def prog(a, b, c):
    x = clamp(a, b, c)
    y = clamp(x + 1, b)
    return x, y


def test_a_grid_of_clamp_calls():
    """clamp's early returns turned into assignments, over a grid of inputs."""
    fast = inline(prog, functions=[clamp])
    for a, b, c in itertools.product(range(-3, 130, 11), range(-2, 6, 3), (4, 10, 120)):
        assert fast(a, b, c) == prog(a, b, c)
