"""Config of a ``nemotron-nas`` (DeciLM) checkpoint written by ``nsc-prune extract --format nemotron-nas``.

A LLaMA config plus ``block_configs``: one entry per decoder layer,
``{"attention": {"no_op": bool, "n_heads_in_group": int}, "ffn": {"no_op": bool, "intermediate_size": int}}``
(or ``"ffn_mult"`` instead of ``intermediate_size``, as in NVIDIA's checkpoints). The number of query heads is
global (``num_attention_heads``); a layer has ``num_attention_heads / n_heads_in_group`` KV heads. A ``no_op``
part has no weights and passes the residual stream through.

The entries are dicts that also allow attribute access (``config.block_configs[3].attention.no_op``), as vLLM's
``DeciLMForCausalLM`` reads them; a key that is absent is absent as an attribute too (vLLM tests
``hasattr(block.ffn, "ffn_mult")``). They serialise to JSON as plain dicts.

nsc-prune copies this file into the checkpoint (``auto_map`` ``AutoConfig``); ``nsc_prune.load_pruned`` imports it
from the installed package. Keep it self-contained: it may import transformers only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from transformers import LlamaConfig

MODEL_TYPE = "nemotron-nas"


class BlockPart(dict):
    """A dict whose keys are also attributes (missing ones raise AttributeError, so ``hasattr`` is False)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def as_blocks(blocks: list[Any] | None) -> list[BlockPart] | None:
    """``block_configs`` as a list of ``BlockPart`` with ``attention`` and ``ffn`` ``BlockPart`` entries."""
    if blocks is None:
        return None
    return [
        BlockPart({k: BlockPart(v) if isinstance(v, dict) else v for k, v in dict(block).items()}) for block in blocks
    ]


if dataclasses.is_dataclass(LlamaConfig):  # transformers >= 5: configs are (strict) dataclasses
    from huggingface_hub.dataclasses import strict

    @strict
    class DeciLMConfig(LlamaConfig):
        """LLaMA config with heterogeneous blocks (``block_configs``, one per layer)."""

        model_type = MODEL_TYPE
        block_configs: list | None = None

        def __post_init__(self, **kwargs: Any) -> None:
            self.block_configs = as_blocks(self.block_configs)
            super().__post_init__(**kwargs)

else:  # transformers 4.x

    class DeciLMConfig(LlamaConfig):  # type: ignore[no-redef]
        """LLaMA config with heterogeneous blocks (``block_configs``, one per layer)."""

        model_type = MODEL_TYPE

        def __init__(self, block_configs: list | None = None, **kwargs: Any) -> None:
            self.block_configs = as_blocks(block_configs)
            super().__init__(**kwargs)


__all__ = ["DeciLMConfig"]
