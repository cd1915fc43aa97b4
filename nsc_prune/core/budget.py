"""Budget strings: ``5.7B``, ``5700M``, ``85%`` (of the full model), ``1.4T``, ``40.32M``, ``123456``; latency
budgets (``--cost latency``, integer microseconds inside): ``25ms``, ``0.4s``, ``900us`` or a percentage."""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import ROUND_FLOOR, ROUND_HALF_EVEN, Decimal, localcontext

import numpy as np

from nsc_prune._validation import is_int, must_be
from nsc_prune.errors import InfeasibleBudgetError, InvalidInputError

SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
MAX_BUDGET = 10**30  # past any model's parameters, MACs or microseconds, and within a float
_MAX_DIGITS = 40  # a budget with more digits than this before its point is past MAX_BUDGET, whatever its unit
TIME_UNITS = {"US": 1, "MS": 10**3, "S": 10**6}  # latency budgets, in the DP's microseconds (read case-blind)
_NUMBER = r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*"  # ASCII digits: \d would read other scripts' digits too
# cost kind -> (pattern, units, what to write instead); every other kind is a count
_READINGS = {
    "latency": (
        re.compile(_NUMBER + r"(us|ms|s|%)\s*$", re.IGNORECASE),
        TIME_UNITS,
        "a time with its unit (25ms, 0.4s, 900us) or a percentage of the full model's latency (70%)",
    ),
    "count": (
        re.compile(_NUMBER + r"([KMBGT%]?)\s*$", re.IGNORECASE),
        SUFFIXES,
        "a number with an optional K/M/B/T suffix (5.7B, 5700M, 1.4T) or a percentage (85%)",
    ),
}


def check_cost_kind(text: str, cost: str, latency_table: bool = False) -> None:
    """A time budget (``45ms``) or a latency table (``latency_table``) asks for ``--cost latency``: under another
    ``cost``, raise one error that says to add it (rather than "not a count")."""
    if cost == "latency":
        return
    match = _READINGS["latency"][0].match(str(text))
    given = [f"--budget {text} is a time" if match and match.group(2) != "%" else None]
    given.append("--latency-table is given" if latency_table else None)
    if any(given):
        raise InvalidInputError(
            f"{' and '.join(filter(None, given))}, but the cost is {cost}: add --cost latency to the search to "
            "budget the predicted latency of a profiled table (nsc-prune profile; docs/speed.md)"
        )


def parse_budget(text: str, full: int | None = None, kind: str = "params") -> int:
    """Parse ``text`` into an integer budget; a percentage needs ``full`` (the unpruned cost). ``kind`` latency reads
    times (``25ms``) into microseconds."""
    pattern, units, instead = _READINGS["latency" if kind == "latency" else "count"]
    match = pattern.match(str(text))
    if not match:
        check_cost_kind(text, kind)
        what = "latency budget" if kind == "latency" else "budget"
        raise InvalidInputError(f"cannot read {what} {text!r}; use {instead}")
    number, suffix = Decimal(match.group(1)), match.group(2).upper()  # exact: a count past 2**53 keeps its digits
    if number.adjusted() > _MAX_DIGITS:  # before any arithmetic: 1e1000000000 would be built digit by digit
        raise InvalidInputError(f"budget {text!r} is past any model's cost (at most {MAX_BUDGET:.0e})")
    if suffix == "%" and full is None:
        raise InvalidInputError(f"budget {text!r} is a percentage but there is no full model to take it of")
    if suffix == "%" and not 0 < number:
        raise InvalidInputError(f"budget percentage must be > 0; got {text!r}")
    with localcontext() as exact:  # the default 28 digits rounded 10**30 + 1 down to MAX_BUDGET, which passed
        exact.prec = 2 * _MAX_DIGITS + len(match.group(1))
        scaled = int(full) * number / 100 if suffix == "%" else number * units[suffix]
        value = int(scaled.to_integral_value(ROUND_FLOOR))  # costs are whole: cost <= budget is cost <= floor
    if value <= 0:
        rounded = f" (it rounds to {value})" if number > 0 else ""
        raise InvalidInputError(f"budget must be at least 1; got {text!r}{rounded}")
    if value > MAX_BUDGET:  # its ratio to the full model, a float, would overflow
        raise InvalidInputError(f"budget {text!r} is past any model's cost (at most {MAX_BUDGET:.0e})")
    return value


def full_name(is_model: bool) -> str:
    """What a front's full cost is the cost of, in words: the full model, or the space's widest plan where the space
    stops below the model (``lonas`` with ``ffn_fractions=[0.75, 0.5]``, say)."""
    return "the full model" if is_model else "the widest plan"


def format_count(value: float) -> str:
    """Human form of a large count: 6738415616 -> '6.738B', 1.7097e12 -> '1.710T'."""
    scales = (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3))
    for i, (suffix, scale) in enumerate(scales):
        if abs(value) >= scale:
            if i > 0 and abs(float(f"{value / scale:.3f}")) >= 1000:  # rounds up: 999,999,999 is 1.000B, not 1000.000M
                suffix, scale = scales[i - 1]
            return f"{value / scale:.3f}{suffix}"
    return f"{value:g}"


def format_cost(value: float, kind: str) -> str:
    """A cost in its kind's words: a count (``6.738B``) or, for latency (microseconds), a time (``23.4 ms``)."""
    if kind != "latency":
        return format_count(value)
    if float(f"{value / 10**3:.3g}") >= 1000:  # as printed: 999.6 ms is 1.000 s, not 1e+03 ms
        return f"{value / 10**6:.3f} s"
    return f"{value / 10**3:.3g} ms" if value >= 999.5 else f"{value:.0f} us"  # 999.5 us prints as 1000 us


def _suffix_of(text: str) -> str | None:
    match = _READINGS["count"][0].match(str(text))
    return match.group(2).upper() if match else None


def _suffix_hint(text: str, smallest: int, full: int) -> str:
    """``" Did you mean 5.7B?"`` for a bare number: the suffixed readings that land on the front."""
    number = str(text).strip()
    fits = [f"{number}{suffix}" for suffix in ("K", "M", "B", "T", "%") if _lands(f"{number}{suffix}", smallest, full)]
    if not fits:
        return "A bare number counts single units; add a suffix: K, M, B, T or %"
    return f"Did you mean {' or '.join(fits)}? A bare number counts single units"


def _lands(text: str, smallest: int, full: int) -> bool:
    try:
        return smallest <= parse_budget(text, full=full) <= full
    except InvalidInputError:  # a reading past MAX_BUDGET: no front reaches it
        return False


def check_budget(
    text: str,
    smallest: int,
    full: int,
    cost: str,
    other_full: int | None = None,
    allow_above_full: bool = False,
    space: str = "",
    searching: bool = True,
    whole: str = "the full model",
) -> int:
    """Parse ``text`` against a front from ``smallest`` to ``full`` (in ``cost``): a bare number below the front
    hints at the suffix; a budget above the full model is an error (naming ``--cost macs`` when the number
    reads as MACs, ``other_full``: a flag of the search, so ``searching=False`` says to search again with it) unless
    ``allow_above_full``. ``whole``: what ``full`` is in words ("the widest plan" where a space stops below the
    model)."""
    if not isinstance(allow_above_full, bool | np.bool_):  # "no" is truthy: it would accept the full model
        raise InvalidInputError(must_be("allow_above_full", "True or False", allow_above_full))
    allow_above_full = bool(allow_above_full)
    budget = parse_budget(text, full=full, kind=cost)
    suffix = _suffix_of(text) if cost != "latency" else None

    def show(value: int) -> str:
        return format_cost(value, cost)

    def exact(value: int) -> str:  # three digits can hide the comparison: 15,965 us shows as 16 ms
        if cost == "latency":
            return f" ({value:,} us)" if f"{value:,} us" != show(value) else ""
        return f" ({value:,})" if show(budget) == show(full) else ""  # 100.0000001% of 1.000T is 1.000T

    if budget < smallest:
        fix = _suffix_hint(text, smallest, full) if suffix == "" else ""
        count = exact(smallest) if cost == "latency" else f" ({smallest:,})"
        raise InfeasibleBudgetError(
            must_be(
                "--budget",
                f"at least the smallest plan's {show(smallest)}{count} {cost}"
                + (f" in space {space!r}" if space else ""),
                f"{text} = {show(budget)} {cost}",
                fix.strip(),
            ),
            min_cost=smallest,
        )
    if budget > full and not allow_above_full:
        ratio = budget / full
        times = f"{ratio:.0f}x" if ratio >= 10 else f"{_above_100(budget, full)}% of"
        unpruned = " (nothing pruned)" if whole == "the full model" else ""
        fix = f"Pass --allow-above-full to accept {whole}{unpruned}"
        percent = suffix == "%" or str(text).strip().endswith("%")
        if cost == "params" and other_full is not None and ratio >= 10 and budget <= other_full * 1.5:
            macs = f"{whole} is {format_count(other_full)} MACs"
            fix = (
                f"Did you mean --cost macs ({macs})? Or pass --allow-above-full"
                if searching
                else f"The front counts params ({macs}): for a MACs budget, search with --cost macs. Or pass "
                "--allow-above-full"
            )
        elif percent:
            fix = f"A percentage of {whole} is at most 100%; or pass --allow-above-full"
        raise InvalidInputError(
            must_be(
                "--budget",
                f"at most {whole}'s {show(full)}{exact(full)} {cost}",
                f"{text} = {show(budget)}{exact(budget)} {cost}" if percent else f"{text} = {times} {whole}",
                fix,
            )
        )
    return budget


def _above_100(budget: int, full: int) -> str:
    """``budget`` (above ``full``) as a percentage of it in as few decimals as show it above 100 (100.3, or
    100.00000001), never a rounded 100.0; exact, as a float ratio of two large counts is not."""
    with localcontext() as exact:
        exact.prec = 2 * _MAX_DIGITS
        percent = Decimal(budget) * 100 / Decimal(full)
        for decimals in range(1, 2 * _MAX_DIGITS):
            shown = percent.quantize(Decimal(1).scaleb(-decimals), ROUND_HALF_EVEN)
            if shown > 100:
                return str(shown)
    return str(percent)


def index_under(costs: Sequence[int], budget: int) -> int:
    """Index of the costliest point whose cost is ``<= budget`` (the last on ties: on a front sorted by cost, the
    best); raises InfeasibleBudgetError (with ``min_cost``) when even the cheapest costs more."""
    if not is_int(budget):
        raise InvalidInputError(f"budget must be an integer; got {budget!r}")
    fitting = [i for i, cost in enumerate(costs) if cost <= budget]
    if not fitting:
        raise InfeasibleBudgetError(
            f"budget {budget:,} is below the smallest plan, which needs {min(costs):,}", min_cost=int(min(costs))
        )
    return max(fitting, key=lambda i: (costs[i], i))


def select(
    costs: Sequence[int],
    budget: str | int,
    allow_above_full: bool = False,
    cost: str = "params",
    other_full: int | None = None,
    space: str = "",
    full: int | None = None,
    searching: bool = True,
    whole: str = "the full model",
) -> tuple[int, int]:
    """(index, resolved budget) of the best point of a front under ``budget``, read by ``check_budget``: the same
    hints and limits for every command (the search and extraction). ``full``: the full model's cost (default the
    costliest point; a score can cut the full model from the front), ``whole`` it in words. An int ``budget`` is read
    as a bare number."""
    full = int(max(costs)) if full is None else int(full)
    resolved = check_budget(
        str(budget), int(min(costs)), full, cost, other_full, allow_above_full, space, searching, whole
    )
    return index_under(costs, resolved), resolved
