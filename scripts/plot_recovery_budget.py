"""Plot: what each recovery recipe buys per training token, from scripts/study_recovery_budget.py's results.

One row of three panels (held-out docstrings, prose, code) per budget in the results' rows: held-out perplexity
(log scale) against training tokens, one line per recipe from the pruned, un-healed model at 0 tokens through its
step counts; the dense model dashed and, on prose, issue 31's target of 1.35x the dense model dotted. The top axis
reads the tokens as training minutes at ``--tokens-per-s`` (required: the rows' wall seconds were often measured
beside other jobs, so take an idle measurement, e.g. from scripts/bench_heal.py). The PNG is written atomically and
its path printed; without matplotlib the script prints one line and exits with 2.

    python scripts/plot_recovery_budget.py --tokens-per-s 250              # writes docs/recovery_budget.png
    python scripts/plot_recovery_budget.py --tokens-per-s 250 --recipes lora-kd-w10 full-kd-w10 --out kd.png
    python scripts/plot_recovery_budget.py --tokens-per-s 250 --results runs/budget/budget.json --out runs/budget.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from nsc_prune._io import atomic_file, read_json_object
from nsc_prune.cli.parser import check_file_output, positive_number
from nsc_prune.cli.scripts import run_script
from nsc_prune.errors import InvalidInputError, NSCError

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "recovery_budget.png"
DOMAINS = ("docstrings", "prose", "code")  # the study's held-out domains, in its table order
TARGET = ("prose", 1.35)  # issue 31: prose perplexity within 1.35x the dense model's
MARKERS = "osD^v<>pP*Xh"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=ROOT / "docs" / "recovery_budget_results.json")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the figure (the default is rewritten)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out other than the default")
    parser.add_argument(
        "--tokens-per-s",
        type=positive_number,
        required=True,
        help="training tokens/s for the minutes axis (an idle measurement)",
    )
    parser.add_argument("--recipes", nargs="+", help="only these recipes (default: every recipe in the rows)")
    args = parser.parse_args(argv)
    overwrite = args.overwrite or args.out == DEFAULT_OUT  # the docs figure this script exists to redraw
    check_file_output(parser, args.out, overwrite, inputs=(args.results,))
    return args


def load_rows(path: Path, recipes: list[str] | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The results in ``path`` and their rows of ``recipes`` (all when None); refuses what cannot be drawn."""
    if not path.is_file():
        raise InvalidInputError(f"no results file {path}: run scripts/study_recovery_budget.py first")
    summary = read_json_object(path)
    rows = summary.get("rows") or []
    if not rows:
        raise InvalidInputError(f"{path} has no rows: run scripts/study_recovery_budget.py first")
    fields = {"recipe", "budget", "steps", "tokens", *DOMAINS}
    if not isinstance(rows, list) or not all(isinstance(row, dict) and fields <= set(row) for row in rows):
        raise InvalidInputError(f"{path}: every row must be an object with {', '.join(sorted(fields))}")
    if not all(isinstance(row["recipe"], str) and isinstance(row["budget"], str) for row in rows):
        raise InvalidInputError(f'{path}: every row\'s recipe and budget must be strings (e.g. "80%")')
    known = sorted({row["recipe"] for row in rows})
    unknown = sorted(set(recipes or ()) - set(known))
    if unknown:
        raise InvalidInputError(f"{path} has no rows of recipes {unknown}; it has {known}")
    rows = [row for row in rows if recipes is None or row["recipe"] in recipes]
    missing = sorted({row["budget"] for row in rows} - set(summary.get("pruned", {})))
    if "dense" not in summary or missing:
        raise InvalidInputError(f"{path} lacks the dense model's or the pruned {missing} perplexities")
    measured = [summary["dense"], *(summary["pruned"][row["budget"]] for row in rows)]
    if not all(isinstance(m, dict) and all(isinstance(m.get(d), (int, float)) for d in DOMAINS) for m in measured):
        raise InvalidInputError(f"{path}: the dense and pruned perplexities must be numbers for {', '.join(DOMAINS)}")
    return summary, rows


def panel(ax: Any, rows: list[dict[str, Any]], recipes: list[str], domain: str, pruned: float, dense: float) -> None:
    """One budget's lines on one domain: each recipe from the pruned model at 0 tokens, the dense model (and target)."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator, NullLocator

    for i, name in enumerate(recipes):
        mine = sorted((row for row in rows if row["recipe"] == name), key=lambda row: row["steps"])
        if mine:
            xs, ys = [0.0] + [row["tokens"] / 1e3 for row in mine], [pruned] + [row[domain] for row in mine]
            ax.plot(xs, ys, marker=MARKERS[i % len(MARKERS)], ms=5, lw=1.4, color=f"C{i}", label=name)
    lines = [(dense, "dense", "--")] + (
        [(TARGET[1] * dense, f"{TARGET[1]}x dense", ":")] if domain == TARGET[0] else []
    )
    for value, label, style in lines:
        ax.axhline(value, color="black", ls=style, lw=1.1, label=label)
        ax.annotate(
            f"{label} {value:.2f}",
            (1, value),
            xycoords=("axes fraction", "data"),
            xytext=(-4, 3),
            textcoords="offset points",
            ha="right",
            va="bottom",
            fontsize=8,
        )
    ax.set_yscale("log")  # a ratio to the dense model reads the same on every panel
    ax.yaxis.set_major_locator(MaxNLocator(7, steps=[1, 2, 2.5, 5, 10]))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    ax.set(xlabel="training tokens (thousands)", ylabel="held-out perplexity (log scale)")


def draw(summary: dict[str, Any], rows: list[dict[str, Any]], tokens_per_s: float) -> Any:
    """The figure: for each budget in ``rows`` a row of one panel per domain."""
    from nsc_prune.plot import require_matplotlib

    plt = require_matplotlib()
    budgets = list(dict.fromkeys(row["budget"] for row in rows))
    recipes = list(dict.fromkeys(row["recipe"] for row in rows))
    fig, axes = plt.subplots(len(budgets), len(DOMAINS), figsize=(15, 4.4 * len(budgets)), squeeze=False)
    for ax_row, budget in zip(axes, budgets):
        mine = [row for row in rows if row["budget"] == budget]
        params = summary.get("params", {}).get(budget)
        for ax, domain in zip(ax_row, DOMAINS):
            panel(ax, mine, recipes, domain, summary["pruned"][budget][domain], summary["dense"][domain])
            ax.set_title(f"{domain}: budget {budget}" + (f" ({params / 1e6:.1f}M params)" if params else ""))
            minutes = ax.secondary_xaxis(
                "top", functions=(lambda k: k * 1e3 / tokens_per_s / 60, lambda m: m * 60 * tokens_per_s / 1e3)
            )
            minutes.set_xlabel(f"minutes at {tokens_per_s:g} tokens/s", fontsize=9)
    handles = {
        label: h for ax in axes[:, DOMAINS.index(TARGET[0])] for h, label in zip(*ax.get_legend_handles_labels())
    }
    labels = sorted(handles, key=lambda label: recipes.index(label) if label in recipes else len(recipes))
    fig.legend(
        [handles[label] for label in labels],
        labels,
        loc="lower center",
        ncol=min(7, -(-len(labels) // 2)),
        fontsize=9,
        frameon=False,
    )
    fig.suptitle("Held-out perplexity against training tokens, from the pruned model at 0 tokens (one run each)")
    fig.tight_layout(rect=(0, 0.6 / fig.get_figheight(), 1, 1))  # 0.6 inch below for the legend
    return fig


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        summary, rows = load_rows(args.results, args.recipes)
        fig = draw(summary, rows, args.tokens_per_s)
    except NSCError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    import matplotlib.pyplot as plt

    try:
        with atomic_file(args.out, overwrite=True) as tmp:  # checked by parse_args
            fig.savefig(tmp, format="png", dpi=110)
    finally:
        plt.close(fig)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
