"""``LayerPlan``: one option of one decoder layer, the one type for it on every path.

A decoder space's options carry it (``LayerOption.label``), the search's points list it, the weights-based scores,
the latency profile and extraction read it. It is a dict only where it is written: pareto.json's ``layers``, a
latency table's ``space.options`` (``to_dict``, ``from_dict``). Torch-free, so ``core`` can hold it;
``nsc_prune.plan`` re-exports it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from nsc_prune._validation import is_int
from nsc_prune._warn import warn
from nsc_prune.errors import ConfigError

_RENAMED_KEYS = {"kv_heads": "kv_groups"}  # pareto.json schema 1 -> 2


@dataclass(frozen=True)
class LayerPlan(Mapping[str, Any]):
    """How much one decoder layer keeps: ``ffn`` FFN channels, ``kv_groups`` KV groups, ``lora_rank`` ranks.

    It reads as its label, a read-only mapping of the keys it sets (``None`` fields and ``keep=True`` left out),
    so code that shows or writes any space's labels (NAS spaces' are dicts) takes it as one; ``dict(plan)`` is what
    pareto.json and a latency table hold."""

    ffn: int
    lora_rank: int | None = None  # None: the adapter's full rank (plans for plain models omit it)
    kv_groups: int | None = None  # None: the base's; else KV groups kept, each with its query heads
    keep: bool = True  # False drops the whole layer (ffn and kv_groups are then ignored)

    def groups_of(self, base_groups: int) -> int:
        """KV groups this (kept) layer keeps of a base layer with ``base_groups``: ``kv_groups``, or all of them."""
        return base_groups if self.kv_groups is None else self.kv_groups

    def __getitem__(self, key: str) -> Any:
        value = getattr(self, key, None) if key in _KEYS else None
        if value is None or (key == "keep" and value):
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[str]:
        return (key for key, _ in self._items())

    def _items(self) -> Iterator[tuple[str, Any]]:
        for key in _KEYS:
            value = getattr(self, key)
            if value is not None and not (key == "keep" and value):
                yield key, value

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __eq__(self, other: object) -> bool:
        """Equal to a plan of the same fields, and (the ``Mapping`` contract) to a mapping of the same items:
        ``LayerPlan(ffn=96, kv_groups=2) == {"ffn": 96, "kv_groups": 2}``."""
        if isinstance(other, LayerPlan):
            return all(getattr(self, key) == getattr(other, key) for key in _KEYS)
        return dict(self) == dict(other) if isinstance(other, Mapping) else NotImplemented

    def to_dict(self) -> dict[str, Any]:
        """The layer as written: ``{"ffn": 96, "kv_groups": 2}``, ``{"ffn": 0, "kv_groups": 0, "keep": false}``."""
        return dict(self._items())  # not dict(self): the Mapping protocol looked every key up twice

    @classmethod
    def from_dict(cls, layer: Mapping[str, Any], where: str = "plan layer", found_in: str | None = None) -> LayerPlan:
        """A layer of a pareto.json point or a latency table's option: schema 1's ``kv_heads`` is read as
        ``kv_groups``; unknown keys warn (naming ``found_in``, else ``where``: one line for a file's every layer,
        once repeated lines are merged), wrong types fail (naming ``where``)."""
        if isinstance(layer, LayerPlan):
            return layer
        if not isinstance(layer, Mapping):
            raise ConfigError(f'{where} must be an object such as {{"ffn": 1536}}; got {layer!r}')
        layer = upgrade_layer(layer, where)
        unknown = sorted(set(layer) - set(_KEYS))
        if unknown:
            warn(f"{found_in or where}: ignoring unknown keys {unknown} (written by a newer nsc-prune?)")
        ffn, rank, kv, keep = (layer.get(key) for key in _KEYS)
        keep = True if keep is None else keep
        wrong = {
            key: value
            for key, value in (("ffn", ffn), ("lora_rank", rank), ("kv_groups", kv))
            if not ((is_int(value) and value >= 0) or (value is None and key != "ffn"))
        }
        if not isinstance(keep, bool):
            wrong["keep"] = keep
        if wrong:
            got = ", ".join(f"{key}={value!r} ({type(value).__name__})" for key, value in wrong.items())
            raise ConfigError(
                f"{where}: 'ffn', 'lora_rank', 'kv_groups' must be integers >= 0 and 'keep' a bool; got {got}. "
                "Re-run the command that wrote the file (the search, nsc-prune profile) or fix it"
            )
        return cls(ffn=ffn, lora_rank=rank, kv_groups=kv, keep=keep)


_KEYS = tuple(f.name for f in dataclasses.fields(LayerPlan))  # ffn, lora_rank, kv_groups, keep: the written order


def upgrade_layer(layer: Mapping[str, Any], where: str = "plan layer") -> dict[str, Any]:
    """A point's layer in the current schema: schema 1's keys renamed (``kv_heads`` -> ``kv_groups``); a layer
    holding a key and its new name is refused (one would silently win)."""
    both = [(old, new) for old, new in _RENAMED_KEYS.items() if old in layer and new in layer]
    if both:
        raise ConfigError(f"{where} has both {both[0][0]!r} and its new name {both[0][1]!r}; keep one")
    return {(_RENAMED_KEYS.get(key) or key): value for key, value in layer.items()}
