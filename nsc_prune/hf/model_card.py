"""The small files of a checkpoint nsc-prune writes: tokenizer, generation config and licence copies, and the model
cards (an extraction's, which a heal extends with its Recovery section, and a super-adapter's)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from nsc_prune._files import GENERATION_CONFIG_NAME, TOKENIZER_DIRS, TOKENIZER_FILES
from nsc_prune._io import checkpoint_record
from nsc_prune.core.budget import format_count
from nsc_prune.errors import ConfigError
from nsc_prune.hf.modeling import KEPT_LAYERS_KEY
from nsc_prune.plan import LayerPlan, layer_plans, point_label, score_reading
from nsc_prune.presets import folder_model_name, hub_repo_id

LICENSE_KEYS = ("license", "license_name", "license_link")  # a model card's licence, as the Hub reads it
LICENSE_FILES = ("LICENSE*", "LICENCE*", "NOTICE*", "USE_POLICY*")  # a base's licence texts, which its terms require


def copy_licence_files(base: Path, out: Path) -> None:
    """Copy the base's licence texts (``LICENSE_FILES``): what is made from its weights is under its terms."""
    for name in sorted({path.name for pattern in LICENSE_FILES for path in base.glob(pattern) if path.is_file()}):
        shutil.copyfile(base / name, out / name)


def copy_side_files(base: Path, out: Path, config: Mapping[str, Any]) -> None:
    """Copy the tokenizer files (named chat templates included), the licence texts and generation config; write a
    minimal generation config if there is none."""
    copy_licence_files(base, out)
    for name in TOKENIZER_FILES:
        if (base / name).is_file():
            shutil.copyfile(base / name, out / name)
    for name in TOKENIZER_DIRS:  # a named chat template was dropped: the checkpoint rendered its name as the chat
        if (base / name).is_dir():
            shutil.copytree(base / name, out / name)
    if (base / GENERATION_CONFIG_NAME).is_file():
        shutil.copyfile(base / GENERATION_CONFIG_NAME, out / GENERATION_CONFIG_NAME)
        return
    tokens = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config.get(k) is not None}
    (out / GENERATION_CONFIG_NAME).write_text(json.dumps(tokens, indent=2, sort_keys=True) + "\n")


def _count(value: Any) -> str:
    return format_count(value) if isinstance(value, int | float) else "n/a"


def _kept_channels(selection: Mapping[str, Any]) -> str:
    """Which channels a selection record keeps, in words; a super-adapter's order says how it was ranked."""
    method = selection.get("method")
    if method == "first":
        return "its first FFN channels and KV groups (supernet order)"
    if method == "adapter":
        trained = selection.get("trained_with")
        ranked = _ranking(trained) if isinstance(trained, Mapping) and trained.get("method") != "first" else None
        return "the FFN channels and KV groups first in the channel order its super-adapter was trained with" + (
            f" (ranked by {ranked})" if ranked else ""
        )
    ranked = _ranking(selection)
    return f"the FFN channels and KV groups with the {ranked}" if ranked else str(method)


def _ranking(selection: Mapping[str, Any]) -> str | None:
    if selection.get("method") == "magnitude":
        return "largest weight norms (data-free)"
    if selection.get("method") == "activation":
        calib = Path(str(selection.get("calib"))).name
        return f"largest mean |activation| over {selection.get('calib_tokens', 'n/a')} calibration tokens of `{calib}`"
    return None


def _selection_text(summary: Mapping[str, Any]) -> str:
    selection = summary.get("selection") or {"method": "first"}
    how = _kept_channels(selection)
    lora = ", and its first LoRA ranks (scaling alpha / r_max)" if summary.get("provenance", {}).get("adapter") else ""
    refit = summary.get("reconstruction")
    refit = (
        f" The matrices reading cut channels ({len(refit['matrices'])}) were refit by ridge least squares (ridge "
        f"{refit['ridge']:g}) on {refit['calib_tokens']} calibration tokens (`--reconstruct`)."
        if refit
        else ""
    )
    return f"Channel selection `{selection['method']}`: each layer keeps {how}{lora}.{refit}"


def _plan_table(plan: list[LayerPlan], with_lora: bool, original: Any = None) -> list[str]:
    """The per-layer table; LoRA and KV columns only when the plan has them, and the original model's layer numbers
    when the base had dropped layers already (``original``: its config's ``nsc_kept_layers``)."""
    with_kv = any(layer.kv_groups is not None for layer in plan)
    numbered = isinstance(original, list) and len(original) == len(plan)
    columns = ["base layer", *(["original layer"] if numbered else []), "FFN channels"]
    columns += [*(["LoRA rank"] if with_lora else []), *(["KV groups"] if with_kv else [])]
    rows = [f"| {' | '.join(columns)} |", "|" + "---|" * len(columns)]
    for i, layer in enumerate(plan):
        kept = layer.keep
        cells = [str(i), *([str(original[i])] if numbered else []), str(layer.ffn) if kept else "dropped"]
        if with_lora:
            cells.append(("full" if layer.lora_rank is None else str(layer.lora_rank)) if kept else "-")
        if with_kv:
            cells.append(("all" if layer.kv_groups is None else str(layer.kv_groups)) if kept else "dropped")
        rows.append(f"| {' | '.join(cells)} |")
    return rows


def _of_original(params: Mapping[str, Any]) -> str:
    """For a cut of a pruned (or healed) base: its share of the model first cut from, else ""."""
    original = params.get("original")
    if not isinstance(original, int) or original <= 0:
        return ""
    return f"; {params['model'] / original * 100:.1f} % of the original model's {_count(original)}"


def _value_row(value: Any, score: str | None) -> str:
    """The plan's value as its score names it: NSC, NSC (psi_W), or a measured front's predicted damage (the
    negated value the DP maximised); a record from before the score was kept is read as psi_MP."""
    try:
        reading = score_reading(score)
    except (KeyError, TypeError):  # a score this version does not know: the value as it stands
        reading = score_reading(None)
    shown = f"{reading.shown(value):.6g}" if isinstance(value, int | float) else "n/a"
    return f"| {reading.label} (plan) | {shown} |"


def _literal(text: str) -> str:
    """``text`` as a Python string literal for the card's snippets (a quote or backslash in a folder name broke them)."""
    return json.dumps(text, ensure_ascii=False)


def model_card(summary: Mapping[str, Any], name: str) -> str:
    """README.md for the checkpoint: what was kept, its size and cost, how to load it, provenance."""
    lora = _lora_text(summary)
    lines = [
        *front_matter(
            summary.get("license"),
            ["pruned", summary.get("model_type", "llama"), _family(summary)],
            base_model=summary.get("base_model"),
        ),
        "",
        f"# {name}",
        "",
        _intro(summary),
        "",
        *_size_table(summary, lora),
        "",
        *_load_lines(summary, name),
        "",
        "## Plan",
        "",
        *_plan_table(
            layer_plans(summary["plan"]), lora != "none", (summary.get("model_config") or {}).get(KEPT_LAYERS_KEY)
        ),
    ]
    record = {
        k: summary[k]
        for k in ("selection", "reconstruction", "options", "params", "export", "provenance")
        if k in summary
    }
    lines += ["", "## Provenance", "", "```json", json.dumps(record, indent=2, sort_keys=True), "```", ""]
    return "\n".join(line for line in lines if line is not None)


def front_matter(
    license: Mapping[str, str] | None,
    tags: list[str | None],
    library: str = "transformers",
    base_model: str | None = None,
) -> list[str]:
    """The card's YAML header for the Hub: library, pipeline, the base's licence (a pruned model is a derivative
    under its terms; ``base_license``), the base's Hub repository where known (``base_model_id``: the Hub's model
    tree links the two) and tags."""
    shown = ", ".join(dict.fromkeys(tag for tag in ["nsc-prune", *tags] if tag))
    terms = [f"{key}: {json.dumps(value)}" for key, value in (license or {}).items() if key in LICENSE_KEYS]
    base = [f"base_model: {json.dumps(base_model)}"] if isinstance(base_model, str) and base_model else []
    return [
        "---",
        f"library_name: {library}",
        "pipeline_tag: text-generation",
        *terms,
        *base,
        f"tags: [{shown}]",
        "---",
    ]


def supernet_card(record: Mapping[str, Any], name: str, base: Path) -> str:
    """README.md of a super-adapter folder (PEFT's blank template before): what it is, how it was trained, and that
    it is read by ``extract --adapter``, not attached to the whole base."""
    space, budget = record["space"], record["token_budget"]
    sources = (record["data"].get("describe") or {}).get("sources") or []
    files = source_names(sources) or "its text"
    ranked = _ranking(record.get("selection") or {})
    model = folder_model_name(base) or base.name  # not a cache folder's key
    return "\n".join([
        *front_matter(base_license(base), ["super-adapter", "lora"], library="peft", base_model=base_model_id(base)),
        "",
        f"# {name}",
        "",
        f"A LoRA super-adapter of `{model}` trained by `nsc-prune train-supernet` over the `{space['name']}` "
        f"space: {budget['steps']:,} steps, {budget['tokens']:,} tokens of {files}, {record['subnets_per_step']} "
        f"subnets a step, their FFN channels and KV groups in one order (its `nsc_prune_channel_order.json`"
        + (f", ranked by {ranked}" if ranked else "")
        + "). Each subnet it was trained for is cut from the base with this adapter's ranks and channel order, so it "
        "is read by `nsc-prune extract --adapter` with its base (BASE), not attached to the whole base:",
        "",
        "```",
        f"nsc-prune extract --pareto FRONT --budget 80% --base BASE --adapter {name} --out pruned",
        "```",
        "",
        "Its training record: `nsc_prune_supernet.json`.",
        "",
    ])  # fmt: skip


def source_names(sources: Any) -> str:
    """The training files of a data record's ``sources``, by name (not the paths of the machine that trained)."""
    names = [Path(str(s["name"])).name for s in sources or () if isinstance(s, Mapping) and s.get("name")]
    return ", ".join(f"`{name}`" for name in names)


def base_license(folder: Path) -> dict[str, str]:
    """The licence a model folder's card states (``license``, ``license_name``, ``license_link`` of its README's
    YAML header); empty when it states none."""
    readme = folder / "README.md"
    text = readme.read_text(encoding="utf-8", errors="replace") if readme.is_file() else ""
    text = text.removeprefix("\ufeff")  # a byte-order mark before its "---" (huggingface_hub reads past it)
    end = text.find("\n---", 3) if text.startswith("---") else -1
    try:
        header = yaml.safe_load(text[3:end]) if end > 0 else None
    except yaml.YAMLError:
        return {}
    if not isinstance(header, dict):
        return {}
    return {key: str(header[key]) for key in LICENSE_KEYS if isinstance(header.get(key), str | int | float)}


def base_model_id(folder: Path) -> str | None:
    """The Hub repository (``org/name``) of the model in ``folder``, for a card's ``base_model``: a hub cache
    snapshot's, or for a checkpoint nsc-prune wrote, the one its record names (the model it was first cut from).
    None for any other folder: a local folder names no repository (its own card's ``base_model`` is its parent)."""
    repo = hub_repo_id(folder)
    if repo is not None:
        return repo
    try:
        named = checkpoint_record(folder).get("base_model")
    except ConfigError:  # a record that does not read names nothing (a name is no reason to fail)
        return None
    return named if isinstance(named, str) and named else None


def _family(summary: Mapping[str, Any]) -> str | None:
    """The base's model type where the checkpoint's differs (a nemotron-nas export of a llama)."""
    base_type = (summary.get("model_config") or {}).get("model_type")
    return base_type if isinstance(base_type, str) else None


def _lora_text(summary: Mapping[str, Any]) -> str:
    options, params = summary["options"], summary["params"]
    if not summary.get("provenance", {}).get("adapter"):
        return "none"
    if options["keep_adapter"] and not params.get("adapter"):  # every kept rank 0: no adapter is written
        return "none (the plan keeps no LoRA rank; no `adapter/` written)"
    return "kept as a PEFT adapter in `adapter/`" if options["keep_adapter"] else "merged into the weights"


def _intro(summary: Mapping[str, Any]) -> str:
    cost, space = summary.get("cost") or {}, summary.get("space") or {}
    where = point_label(summary["point_index"], summary.get("point_count")) if "point_index" in summary else "point n/a"
    healed = " and healed by `nsc-prune heal` (below)" if summary.get("recovery") else ""
    untrained = ""
    if not summary.get("recovery") and not summary.get("provenance", {}).get("adapter"):
        untrained = " Not trained after the cut, and not evaluated here (`nsc-prune heal`, `nsc-prune eval`)."
    return (
        f"A structurally pruned {summary.get('model_type', 'llama')} checkpoint written by `nsc-prune extract`{healed}: "
        f"Pareto {where} of the `{space.get('name', 'n/a')}` search for "
        f"`{summary.get('base_name') or summary.get('model_name') or 'n/a'}` (cost: {cost.get('kind', 'n/a')}). "
        f"{_selection_text(summary)}" + untrained
    )


def _size_table(summary: Mapping[str, Any], lora: str) -> list[str | None]:
    point, params, cost = summary.get("point") or {}, summary["params"], summary.get("cost") or {}
    share = params["model"] / params["base"] * 100 if params["base"] else 0.0
    with_ranks = any(isinstance(layer, Mapping) and layer.get("lora_rank") is not None for layer in summary["plan"])
    macs = ", LoRA paths counted unmerged, as the search counts them" if with_ranks else ""
    return [
        "| | |",
        "|---|---|",
        f"| parameters in this checkpoint | {_count(params['model'])} "
        f"({share:.1f} % of the base's {_count(params['base'])}{_of_original(params)}) |",
        f"| adapter parameters | {_count(params['adapter'])} |" if params["adapter"] else None,
        f"| parameters (plan) | {_count(point.get('params'))} |",
        f"| MACs at {cost.get('seq_len', 'n/a')} tokens (plan{macs}) | {_count(point.get('macs'))} |",
        _value_row(point.get("nsc"), summary.get("score")),
        f"| LoRA super-adapter (extract --adapter) | {lora} |",
        f"| format | {_format_text(summary)} |",
    ]


def _format_text(summary: Mapping[str, Any]) -> str:
    options, export = summary["options"], summary.get("export") or {}
    if export.get("stock"):  # a homogeneous pruned checkpoint: the stock class
        return f"uniform widths and heads: a stock `{export['stock']}` checkpoint (no remote code)"
    if options["format"] == "nemotron-nas":
        padding = export.get("padding") or {}
        return (
            f"nemotron-nas (vLLM `DeciLMForCausalLM`); zero padding: {_count(padding.get('params'))} params, "
            f"{padding.get('zero_query_heads', 0)} query heads, {padding.get('zero_kv_heads', 0)} KV heads"
        )
    return (
        "padded: full-width weights with zeros (saves nothing)" if options["format"] == "padded" else "per-layer widths"
    )


def _load_lines(summary: Mapping[str, Any], name: str) -> list[str]:
    options, params = summary["options"], summary["params"]
    nas, stock = options["format"] == "nemotron-nas", (summary.get("export") or {}).get("stock")
    shipped = "modeling_nsc_decilm.py (transformers >= 4.57)" if nas else "modeling_nsc_llama.py (transformers >= 5.14)"
    lines = [
        "## Load",
        "",
        "```python",
        "# the folder as saved (from the Hub: huggingface_hub.snapshot_download(repo_id) gives it)",
        "from nsc_prune import load_pruned",
        f"model = load_pruned({_literal(name)})  # no remote code"
        + ("; attaches adapter/" if params["adapter"] else ""),
        "",
        "from transformers import AutoModelForCausalLM",
        f"model = AutoModelForCausalLM.from_pretrained({_literal(name)}"
        + (
            ")"
            if options["format"] == "padded" or stock
            else f", trust_remote_code=True)  # runs the shipped {shipped}"
        ),
    ]
    if nas:
        lines += [
            "",
            "from vllm import LLM  # or: vllm serve DIR --trust-remote-code",
            f"llm = LLM(model={_literal(name)}, trust_remote_code=True)",
        ]
    if params["adapter"]:
        lines += [
            "from peft import PeftModel",
            f"model = PeftModel.from_pretrained(model, {_literal(name + '/adapter')})",
        ]
    return [*lines, "```"]
