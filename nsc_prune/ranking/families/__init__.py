"""Spec builders for the paper's architecture families beyond LLaMA (sections 4.1-4.2).

Each family turns architecture configs into an ``ArchBatch`` (the matrices of many
architectures at once) under an options dataclass that fixes the scoring conventions:

=============  ===================================  =========================================
family         configs                              paper conventions (defaults)
=============  ===================================  =========================================
flexibert      hidden_size + encoder_layers         Xavier, merged QKV, declared FFN branches
gpt2           d_model, n_layer, n_head, d_inner    std 0.02, per-head Q/K/V
autoformer     layer_num, embed_dim, heads, ratio   Xavier, per-head Q/K/V (head dim 64)
nats-sss       "8:16:32:48:64"                      Kaiming, conv as c_out x c_in k^2
ofa-mbv3       {"ks", "e", "d", "r"}                Kaiming, depthwise as c x k^2
=============  ===================================  =========================================

``score(family, configs)`` is the one-call entry point; ``layer_options`` gives one
architecture's spec as ``LayerOption`` s (the same objects the LLaMA builder returns).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nsc_prune.core.spec import LayerOption
from nsc_prune.errors import InvalidInputError
from nsc_prune.ranking.families import autoformer, cnn, flexibert, gpt2
from nsc_prune.ranking.families.base import AGGREGATIONS, ArchBatch, aggregate


@dataclass(frozen=True)
class Family:
    """A family: its options dataclass, a parser (ids, configs) -> parsed arrays, and a builder."""

    name: str
    options_class: type
    parse: Callable[[Sequence[str], Sequence[Any]], Any]
    build: Callable[[Any, Any], ArchBatch]
    description: str


FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> None:
    """Add a family; duplicates are refused."""
    if family.name in FAMILIES:
        raise ValueError(f"family {family.name!r} is already registered")
    FAMILIES[family.name] = family


for _family in (
    Family(
        "flexibert", flexibert.FlexiBERTOptions, flexibert.parse, flexibert.build, "FlexiBERT encoders (GLUE benchmark)"
    ),
    Family("gpt2", gpt2.GPT2Options, gpt2.parse, gpt2.build, "LiteTransformerSearch GPT-2 / Transformer-XL decoders"),
    Family(
        "autoformer", autoformer.AutoFormerOptions, autoformer.parse, autoformer.build, "AutoFormer vision Transformers"
    ),
    Family("nats-sss", cnn.NatsOptions, cnn.parse_nats, cnn.build_nats, "NATS-Bench size search space CNNs"),
    Family("ofa-mbv3", cnn.OfaOptions, cnn.parse_ofa, cnn.build_ofa, "Once-for-All MobileNetV3"),
):
    register_family(_family)


def get_family(name: str) -> Family:
    """The registered family ``name``; unknown names list the close matches."""
    if name not in FAMILIES:
        close = difflib.get_close_matches(name, list(FAMILIES), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise InvalidInputError(f"unknown family {name!r}.{hint} Known families: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[name]


def make_options(family: str | Family, **overrides: Any) -> Any:
    """The family's options dataclass with ``overrides`` (``None`` values keep the default).

    Unknown option names raise InvalidInputError listing the family's options.
    """
    fam = get_family(family) if isinstance(family, str) else family
    given = {k: v for k, v in overrides.items() if v is not None}
    known = {f.name for f in dataclasses.fields(fam.options_class)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise InvalidInputError(f"family {fam.name!r} has no option(s) {unknown}; its options are {sorted(known)}")
    try:
        return fam.options_class(**given)
    except TypeError as err:
        raise InvalidInputError(f"bad options for family {fam.name!r}: {err}") from err


def build_batch(
    family: str, configs: Sequence[Any], ids: Sequence[str] | None = None, options: Any = None
) -> ArchBatch:
    """Parse ``configs`` of ``family`` and build their batched spec; ``options`` is the family's options
    dataclass (``make_options``), its defaults when ``None``."""
    fam = get_family(family)
    ids = tuple(str(i) for i in (ids if ids is not None else range(len(configs))))
    if len(ids) != len(configs):
        raise InvalidInputError(f"got {len(ids)} ids for {len(configs)} configs")
    return fam.build(fam.parse(ids, configs), checked_options(fam, options))


def checked_options(family: Family, options: Any) -> Any:
    """``options``, the family's options dataclass (its defaults for None); InvalidInputError for anything else (a
    dict or another family's options failed deep inside with an AttributeError)."""
    if options is None:
        return family.options_class()
    if not isinstance(options, family.options_class):
        raise InvalidInputError(
            f"options for family {family.name!r} must be its {family.options_class.__name__} "
            f"(make_options({family.name!r}, ...)); got {type(options).__name__}"
        )
    return options


def score(family: str, configs: Sequence[Any], options: Any = None, aggregation: str = "sum") -> np.ndarray:
    """NSC (Eq. 6) of every config of ``family``; ``aggregation`` ``min``/``product`` for the
    appendix C ablation."""
    batch = build_batch(family, configs, options=options)
    return aggregate(batch.layer_capacity(), batch.mask, aggregation)


def layer_options(family: str, config: Any, options: Any = None) -> tuple[LayerOption, ...]:
    """One architecture's spec: a LayerOption (matrices, label ``{"layer": l}``) per layer."""
    return build_batch(family, [config], options=options).layer_options(0)


__all__ = [
    "AGGREGATIONS",
    "FAMILIES",
    "ArchBatch",
    "Family",
    "aggregate",
    "build_batch",
    "checked_options",
    "get_family",
    "layer_options",
    "make_options",
    "register_family",
    "score",
]
