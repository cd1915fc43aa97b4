"""Heal one extracted pruned checkpoint: fine-tune it (LoRA or all weights; CE or distillation from a teacher),
merge, and write a pruned checkpoint in extraction's format with a ``recovery`` record.

The output is what ``nsc-prune extract`` writes (config.json with per-layer widths, the shipped modeling file
and ``auto_map``, tokenizer files, safetensors weights) plus, in ``nsc_prune_extract.json``, the input's record
(plan, point, selection, provenance) and ``recovery``: recipe, data, token budget, wall time and held-out loss
before and after. Training checkpoints live in a work folder beside the output (``OUT.heal`` unless given),
so an interrupted run continues with ``resume=True``; it is removed after success unless kept.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from nsc_prune._deprecated import forward_moved
from nsc_prune._files import CONFIG_NAME, RECORD_NAME, has_tokenizer
from nsc_prune._io import (
    WRITTEN_FILES_KEY,
    atomic_dir,
    atomic_write_text,
    check_output,
    check_outside,
    check_work_dir,
    checkpoint_record,
    claimed_work_dir,
    missing_parents,
    provenance,
    read_json_object,
    remove_work_dir,
    sha256_file,
    to_json,
    written_files,
)
from nsc_prune._validation import is_int, must_be
from nsc_prune._warn import say_held_warnings, warn
from nsc_prune.core.spec import require_weights_support
from nsc_prune.errors import ConfigError, InvalidInputError, NSCError, StoppedRun, UnsupportedArchitectureError, require
from nsc_prune.hf.cut.jobs import legacy_rope_keys, tie_as_loaded
from nsc_prune.hf.modeling import DECILM_FILES, MODELING_FILE
from nsc_prune.hf.progress import quiet
from nsc_prune.hf.random_state import keeps_random_state
from nsc_prune.hf.ranks import launcher_rank
from nsc_prune.hf.train.budget import TimeBudget
from nsc_prune.hf.train.data import HF_PREFIX, TextBlocks, TextData, check_outside_datasets
from nsc_prune.hf.train.launch import check_ranks_agree, refuse_sharded_launch, trainer_ranks, training_device
from nsc_prune.hf.train.padding import restore_zero_columns_, zero_columns, zero_columns_masked
from nsc_prune.hf.train.precision import precision_name
from nsc_prune.hf.train.recipe import TrainConfig
from nsc_prune.hf.train.resume import CHECKPOINTS_DIR, check_resume, removed_unless_resumable
from nsc_prune.hf.train.teacher_logits import (
    DEFAULT_TOP_K,
    TeacherLogits,
    check_temperature,
    compute_teacher_logits,
    load_teacher_logits,
    logits_key,
    save_teacher_logits,
    stored_key,
)
from nsc_prune.hf.train.trainer import (
    TrainResult,
    adapted_modules,
    check_blocks,
    evaluate_loss,
    prepare_model,
    train,
    untrained_loss,
)
from nsc_prune.hf.weights.fingerprint import weights_fingerprint
from nsc_prune.hf.weights.loading import (
    check_checkpoint_shapes,
    check_trainable,
    from_pretrained,
    is_rotary_buffer,
    load_pruned,
    load_tokenizer,
    parse_config,
    pruned_classes,
)
from nsc_prune.hf.weights.safetensors_io import (
    DTYPE_NAMES,
    DTYPES,
    TensorSpec,
    index_model_dir,
    with_stored_dtype,
    write_sharded,
)
from nsc_prune.plan import layer_plans
from nsc_prune.presets import read_model_config

torch = require("torch", "hf")

WORK_SUFFIX = ".heal"


def default_work_dir(out: str | os.PathLike) -> Path:
    """The training checkpoints' folder for output ``out``: ``OUT.heal`` beside it."""
    out = Path(out).absolute()  # "." has no name to put a sibling beside
    return out.with_name(out.name + WORK_SUFFIX)


def _tokenizer(folder: Path) -> Any:
    return load_tokenizer(folder, "copy the base's tokenizer files into it")


def check_teacher(student: Path, teacher: Path, student_tokenizer: Any) -> None:
    """Refuse a teacher whose vocabulary (size or tokenizer) differs from the student's."""
    read_model_config(teacher, "--teacher", "a checkpoint folder")
    check_same_vocabulary(
        student,
        teacher,
        student_tokenizer,
        ("student", "teacher"),
        "Distill from the base the checkpoint was pruned from",
    )


def check_same_vocabulary(reference: Path, other: Path, tokenizer: Any, roles: tuple[str, str], fix: str) -> None:
    """Refuse a model ``other`` whose vocabulary (config's size, or its tokenizer where it has one) differs from
    ``reference``'s (read by ``tokenizer``); ``roles`` name the two in the message (e.g. student, teacher)."""
    sizes = [read_json_object(folder / CONFIG_NAME).get("vocab_size") for folder in (reference, other)]
    if sizes[0] != sizes[1]:
        raise InvalidInputError(
            must_be(
                f"the {roles[1]}'s vocab_size", f"the {roles[0]}'s ({sizes[0]})", sizes[1], f"{fix} (same tokenizer)"
            )
        )
    if has_tokenizer(other) and _tokenizer(other).get_vocab() != tokenizer.get_vocab():
        raise InvalidInputError(
            f"the {roles[1]}'s tokenizer ({other}) must be the {roles[0]}'s; got a different vocabulary. {fix}"
        )


def load_teacher(folder: Path, dtype: torch.dtype) -> Any:
    """The teacher: a pruned checkpoint (``load_pruned``) or any stock causal LM (no remote code)."""
    if read_json_object(folder / CONFIG_NAME).get("model_type") in pruned_classes():  # nemotron-nas too
        model = load_pruned(folder, dtype=dtype)
    else:
        # as eval checks a stock checkpoint: int8 codes refused (loading casts them to floats), no tensor missing
        check_checkpoint_shapes(folder, read_json_object(folder / CONFIG_NAME), index_model_dir(folder), pruned=False)
        transformers = require("transformers", "hf")
        model = from_pretrained(transformers.AutoModelForCausalLM, folder, dtype=dtype, use_safetensors=True)
    peft = require("peft", "hf")
    if isinstance(model, peft.PeftModel):
        model = model.merge_and_unload()
    return check_trainable(model.eval(), f"the teacher {folder}")


def _student(checkpoint: Path) -> Any:
    """The pruned checkpoint to heal, in float32 on the device training uses; a NaN in it is named, not trained."""
    model = check_trainable(_plain(load_pruned(checkpoint, dtype=torch.float32)), f"CKPT {checkpoint}")
    return model.to(training_device())


def _plain(model: Any) -> Any:
    """``model`` with any PEFT adapter merged into its weights."""
    peft = require("peft", "hf")
    return model.merge_and_unload() if isinstance(model, peft.PeftModel) else model


def _check_inputs(
    checkpoint: Path,
    data: TextData,
    out: Path,
    config: TrainConfig,
    teacher: Path | None,
    overwrite: bool,
    work: Path,
    teacher_logits: str | os.PathLike | None,  # as given: a trailing '/' says "a folder"
) -> tuple[dict[str, Any], TrainConfig]:
    model_config = read_model_config(checkpoint, "CKPT", "a checkpoint folder", "Pass nsc-prune extract's output")
    refuse_sharded_launch("heal")
    if teacher_logits is not None and teacher is None:
        raise InvalidInputError("--teacher-logits caches a teacher's logits: pass the teacher with --teacher BASE")
    if teacher_logits is not None:
        check_temperature(config.temperature)
    files = [f for f in data.files if not str(f).startswith(HF_PREFIX)]
    if work.resolve() == out.resolve():
        raise InvalidInputError(f"--work-dir must not be --out ({out}): the work folder is removed after the run")
    check_output(out, (checkpoint, teacher, work, teacher_logits, *files), overwrite)
    check_outside(out, (checkpoint, teacher))
    if teacher_logits is not None:  # read when it holds this teacher's logits, else written: a file, never a folder
        inputs = (checkpoint, teacher, out, work, *files)
        check_output(teacher_logits, inputs, marker=None, rewritable=True, flag="--teacher-logits")
        check_outside(Path(teacher_logits), (checkpoint, teacher), "--teacher-logits")  # a model.safetensors there
        if os.path.islink(teacher_logits) and not os.path.exists(teacher_logits):  # it would replace the link
            raise InvalidInputError(f"--teacher-logits {teacher_logits} is a link to a missing file; name the file")
    check_work_dir(work, (checkpoint, teacher, out, teacher_logits, *files), own=(CHECKPOINTS_DIR,))
    check_outside(work, (checkpoint, teacher), "--work-dir")  # a stopped run would leave its checkpoints there
    for folder, flag in ((out, "--out"), (work, "--work-dir")):
        check_outside_datasets(folder, data.files, flag)
    require_weights_support(model_config, "healing")  # before the tokenizer and the data load
    classes = pruned_classes()
    if model_config.get("model_type") not in classes:
        raise UnsupportedArchitectureError(
            must_be(f"the model_type of CKPT {checkpoint}", f"one of {sorted(classes)}", model_config.get("model_type"))
        )
    try:  # a bad value: one line, before the tokenizer reads the config
        parse_config(classes[model_config["model_type"]][0], model_config)
    except ConfigError as err:
        raise ConfigError(f"CKPT {checkpoint}: {err}") from err
    if (checkpoint / RECORD_NAME).is_file():  # a spoilt record failed only when the healed model was written
        _check_input_record(read_json_object(checkpoint / RECORD_NAME, unique_keys=True), checkpoint, model_config)
    config = _for_contexts(config, model_config, teacher)
    if config.distill and teacher is None:
        raise InvalidInputError("distillation needs a teacher: pass --teacher BASE")
    return model_config, config


def _for_contexts(config: TrainConfig, model_config: dict[str, Any], teacher: Path | None) -> TrainConfig:
    """``config`` for the student's context and the teacher's: a teacher's targets past its own context would be
    noise (and cached by --teacher-logits). An unset ``--seq-len`` follows the shorter of them."""
    contexts = {"the model's": model_config.get("max_position_embeddings")}
    if teacher is not None:
        teacher_config = read_model_config(teacher, "--teacher", "a checkpoint folder")
        contexts["the teacher's"] = teacher_config.get("max_position_embeddings")
    if config.seq_len is None:
        return config.for_model(min((n for n in contexts.values() if is_int(n)), default=None))
    for whose, positions in contexts.items():
        config = config.for_model(positions, whose)
    return config


@keeps_random_state
def heal(
    checkpoint: str | os.PathLike,
    data: TextData | str | os.PathLike | Sequence[str | os.PathLike],
    out: str | os.PathLike,
    config: TrainConfig,
    *,
    teacher: str | os.PathLike | None = None,
    resume: bool = False,
    overwrite: bool = False,
    work_dir: str | os.PathLike | None = None,
    keep_checkpoints: bool = False,
    progress: bool = True,
    budget: TimeBudget | None = None,
    teacher_logits: str | os.PathLike | None = None,
    teacher_top_k: int = DEFAULT_TOP_K,
) -> Path:
    """Fine-tune the pruned ``checkpoint`` on ``data`` with ``config`` and write the merged result to ``out``.

    ``teacher`` (a folder) switches to distillation (``config.distill`` is set). Every input is checked before
    anything is written; ``out`` is written atomically. Raises ``StoppedRun`` when SIGTERM (SIGHUP) stopped the run.
    ``budget`` (``--minutes``) sizes ``max_steps`` and the warm-up from measured throughput (``train``).
    ``teacher_logits`` (a file): the teacher's ``teacher_top_k`` log-probabilities of every training position,
    read when the file exists (checked against this teacher, text and tokenizer), else computed once and written
    there before training (``nsc_prune.hf.train.teacher_logits``); the teacher is then not run during training.
    ``progress=False`` draws no bar, as under ``quiet()``; transformers' global bar setting is left as it was.
    """
    checkpoint, out = Path(checkpoint), Path(out)
    data = TextData.of(data)
    teacher = Path(teacher) if teacher is not None else None
    work = Path(work_dir) if work_dir is not None else default_work_dir(out)
    with claimed_work_dir(work), quiet(not progress):  # one run at a time trains in (and removes) it
        if teacher is not None and not config.distill:
            config = TrainConfig.from_dict({**config.to_dict(), "distill": True})
        logits_path = Path(teacher_logits) if teacher_logits is not None else None
        model_config, config = _check_inputs(checkpoint, data, out, config, teacher, overwrite, work, teacher_logits)
        blocks, key, cached = _blocks_and_cache(checkpoint, data, config, teacher, logits_path, teacher_top_k, budget)
        teacher_print = weights_fingerprint(teacher) if teacher is not None else None
        inputs = {"checkpoint": weights_fingerprint(checkpoint), "teacher": teacher_print}
        made = missing_parents(work)  # removed with the work folder where the run leaves them empty
        # a fresh run that stops before its first checkpoint leaves no work folder
        with removed_unless_resumable(work, (CHECKPOINTS_DIR,), made):
            check_resume(work, config, blocks, key or teacher is not None, resume, budget, inputs)  # before the model
            # On the device training will use, so that the held-out loss and the teacher's logits are not a CPU pass
            student = _student(checkpoint)
            check_blocks(blocks, config)
            say_held_warnings()  # the inputs are checked: their warnings come before the teacher's pass and training
            before = _held_out_loss(student, blocks, config, f"CKPT {checkpoint}")
            distill_from, teacher_loss, logits_seconds = _distillation_teacher(
                teacher, cached, key, logits_path, blocks, config
            )
            zeros = zero_columns(student)  # heads and channels a padded or nemotron-nas checkpoint holds as zeros
            student = _wrapped_for_masks(student, config, zeros)
            with _naming_a_computed_cache(logits_path if logits_seconds is not None else None):
                with zero_columns_masked(student, zeros):
                    result = train(
                        student,
                        blocks,
                        config,
                        work,
                        teacher=distill_from,
                        resume=resume,
                        progress=progress,
                        budget=budget,
                        evaluate_at_stop=False,  # ``after`` below measures the merged model on the same blocks
                        inputs=inputs,
                    )
                if result.interrupted:
                    raise StoppedRun(result.steps, result.checkpoint, result.stopped_by)
                with result.kept_on_stop():
                    merged = _as_written(result.model, zeros, checkpoint)
                    after = evaluate_loss(merged, blocks.val, config.batch_size, trainer_ranks())
                    _check_healed(merged, before, after, blocks.val[:1], config, work if result.checkpoint else None)
                    recovery = recovery_record(config, data, blocks, result, before, after, teacher, teacher_loss)
                    recovery["teacher_logits"] = logits_record(
                        distill_from if isinstance(distill_from, TeacherLogits) else None, logits_path, logits_seconds
                    )
                    write_healed(merged, checkpoint, out, model_config, recovery, overwrite)
        if not keep_checkpoints and launcher_rank() == 0:
            remove_work_dir(work, (CHECKPOINTS_DIR,), made)
        return out


def _wrapped_for_masks(student: Any, config: TrainConfig, zeros: dict[str, Any]) -> Any:
    """``student`` as it will train (``prepare_model``, seeded as ``train`` seeds it) when ``zeros`` must be
    masked on its projections as PEFT wraps them; else as it is (``train`` prepares it)."""
    if not zeros:
        return student
    require("transformers", "hf").set_seed(config.seed)
    return prepare_model(student, config)


def _blocks_and_cache(
    checkpoint: Path,
    data: TextData,
    config: TrainConfig,
    teacher: Path | None,
    logits_path: Path | None,
    top_k: int,
    budget: Any,
) -> tuple[TextBlocks, dict[str, Any] | None, TeacherLogits | None]:
    """The text blocks (checked equal on every rank of a launcher's run), the cached teacher logits' key (None
    without ``logits_path``) and the cache, read only when every rank finds it (caches may be per node: else every
    rank computes its share; an untimed run, ``budget`` None, that trains on far less than it says so)."""
    tokenizer = _tokenizer(checkpoint)
    if teacher is not None:
        check_teacher(checkpoint, teacher, tokenizer)
    blocks = data.load(tokenizer, config.seq_len, config.seed)
    blocks.check_ids_fit(read_json_object(checkpoint / CONFIG_NAME)["vocab_size"], checkpoint)
    if blocks.val.shape[0] == 0:
        raise InvalidInputError(must_be("val_fraction", "> 0 for heal (it reports held-out loss)", data.val_fraction))
    check_ranks_agree("heal", blocks, config, checkpoint, teacher)
    if logits_path is None:
        return blocks, None, None
    key = logits_key(teacher, checkpoint, blocks, top_k)
    cached = load_teacher_logits(logits_path, key, blocks) if logits_path.exists() else None
    if not trainer_ranks().every(cached is not None):
        cached = None
        if budget is None:
            _warn_if_the_cache_outgrows_the_run(blocks, config, top_k, data.val_fraction)
    return blocks, key, cached


UNTRAINED_TOKENS_SAID = 1 << 20  # about a million tokens more than the run trains on: minutes of a teacher's pass


def _warn_if_the_cache_outgrows_the_run(
    blocks: TextBlocks, config: TrainConfig, top_k: int, val_fraction: float
) -> None:
    """The teacher's pass covers every training block: say so when an untimed run trains on fewer (a 10 MB text
    for 16 blocks set the teacher 5,018 batches, about half an hour), with the cache's size and the --max-tokens that
    reads enough."""
    trained = config.max_steps * config.batch_size * config.grad_accum * trainer_ranks().count
    held = blocks.train.shape[0]
    if (held - trained) * blocks.seq_len < UNTRAINED_TOKENS_SAID:
        return
    size = blocks.train[:, :-1].numel() * top_k * 6  # int32 index and float16 log-probability
    tokens = math.ceil((trained + 1) * blocks.seq_len / (1 - val_fraction))  # a block more: the split rounds
    warn(
        f"--teacher-logits runs the teacher over all {held:,} training blocks ({size / 2**30:.2f} GiB cached) where "
        f"this run trains on {trained:,} ({config.max_steps:,} step{'s' if config.max_steps > 1 else ''}): "
        f"--max-tokens {tokens:,} reads the text they need"
    )


@contextlib.contextmanager
def _naming_a_computed_cache(computed: Path | None) -> Iterator[None]:
    """An error after this run computed the cached teacher logits (``computed``: a budget the probe refuses, a run
    that diverged) names the cache, which is kept (complete and keyed, not a partial output: losing it would cost the
    rerun the same pass)."""
    try:
        yield
    except InvalidInputError as err:
        if computed is None:
            raise
        err.args = (f"{err}; the teacher logits computed for it are in {computed}, a rerun reads them",)
        raise


def _distillation_teacher(
    teacher: Path | None,
    cached: TeacherLogits | None,
    key: dict[str, Any] | None,
    logits_path: Path | None,
    blocks: TextBlocks,
    config: TrainConfig,
) -> tuple[Any, float | None, float | None]:
    """What training distils from: the cached logits (read, or computed here once and written to ``logits_path``;
    the teacher model is then freed), the live teacher model, or None; with the teacher's held-out loss and the
    seconds computing the cache took (None when it was read or not asked for)."""
    if teacher is None:
        return None, None, None
    if cached is not None:
        return cached, cached.record["val_loss_teacher"], None
    model = load_teacher(teacher, torch.float32).to(training_device())
    if key is None:
        return model, _held_out_loss(model, blocks, config, f"the teacher {teacher}"), None
    started = time.perf_counter()
    existed = os.path.lexists(logits_path)  # rank 0's cache, read and valid, when another rank lacked it
    cached = compute_teacher_logits(model, blocks, key, config, trainer_ranks())  # refuses NaN log-probabilities
    # A file made at FILE while they were computed is kept: one of these inputs (a heal of another point of the
    # front, started at once) is this run's own; anything else is not replaced, and this run's is kept beside it.
    made_meanwhile = not existed and logits_path.is_file() and stored_key(logits_path) == key
    if launcher_rank() == 0 and not made_meanwhile:
        save_teacher_logits(cached, logits_path, overwrite=existed, checked=True)
    return cached, cached.record["val_loss_teacher"], time.perf_counter() - started


def recovery_record(
    config: TrainConfig,
    data: TextData,
    blocks: TextBlocks,
    result: TrainResult,
    before: float,
    after: float,
    teacher: Path | None,
    teacher_loss: float | None,
) -> dict[str, Any]:
    """The ``recovery`` entry of the healed checkpoint's record."""
    return {
        "recipe": result.recipe(config),
        "lora_modules": adapted_modules(result.model),  # what recipe.lora_targets adapted (phi3: the fused modules)
        "precision": precision_name(config),
        "loss": "distillation" if config.distill else "cross-entropy",
        "teacher": str(teacher.resolve()) if teacher is not None else None,
        "data": {**blocks.describe(), **data.settings()},
        "data_sha256": blocks.sha256,
        "tokens": result.tokens,
        "steps": result.steps,
        "world_size": result.world_size,
        "resumed_from_step": result.resumed_from_step,  # > 0: seconds and tokens_per_s are of the steps after it
        "seconds": round(result.seconds, 3),
        "tokens_per_s": round(result.tokens_per_s, 1),
        "val_loss_before": before,
        "val_loss_after": after,
        "val_loss_teacher": teacher_loss,
        "train_loss": [list(p) for p in result.train_loss],
        "val_loss": [list(p) for p in result.val_loss],
        "time_budget": time_budget_record(result),
    }


def logits_record(cached: TeacherLogits | None, path: Path | None, seconds: float | None) -> dict[str, Any] | None:
    """``--teacher-logits``: the file, top k, the probability mass it covers, and whether this run computed it."""
    if cached is None or path is None:
        return None
    return {
        "path": str(path.resolve()),
        "top_k": cached.key["top_k"],
        "top_k_mass": cached.record.get("top_k_mass"),
        "precision": cached.record.get("precision"),  # the teacher's when the cache was computed (None before)
        "computed_here": seconds is not None,
        "seconds": round(seconds, 3) if seconds is not None else None,
    }


def time_budget_record(result: TrainResult) -> dict[str, Any] | None:
    """``--minutes``: minutes asked and used, the measured tokens/s, the probe's steps, the steps and warm-up as
    re-sized from the run's own steps, and the seconds a step took in each (None without a budget)."""
    if result.budget is None:
        return None
    sized = result.budget
    return {
        "minutes_asked": sized.minutes,
        "minutes_used": round((result.probe_seconds + result.seconds) / 60, 3),
        "resumed": result.resumed_from_step > 0,
        "sizing_read_back": result.probe_seconds == 0,  # a resumed run's: minutes_used then leaves out the probe
        "tokens_per_s_measured": round(sized.tokens_per_s, 1),
        "step_seconds_measured": round(sized.step_seconds, 4),
        "probe_passes": sized.probe_passes,
        "probe_seconds": round(sized.probe_seconds, 3),
        "probe_max_steps": sized.probe_max_steps,
        "run_step_seconds": round(sized.run_step_seconds, 4) if sized.run_step_seconds is not None else None,
        "max_steps": sized.max_steps,
        "warmup_steps": sized.warmup_steps,
    }


def _merged_adapter(record: dict[str, Any]) -> dict[str, Any]:
    """The extraction record's ``options`` and ``params`` as the healed folder holds them: an adapter kept beside
    the input's weights (``--keep-adapter``) is merged into the healed ones, and no ``adapter/`` is written (the
    card named that folder and the code to attach it)."""
    options, params = record.get("options"), record.get("params")
    if not (isinstance(options, dict) and options.get("keep_adapter")):
        return {}
    merged = {"options": {**options, "keep_adapter": False}}
    return merged | ({"params": {**params, "adapter": 0}} if isinstance(params, dict) else {})


def _check_input_record(record: dict[str, Any], checkpoint: Path, model_config: dict[str, Any]) -> None:
    """InvalidInputError, before any training, for an extraction record the healed model's card and record cannot
    use: a field of another type (it failed after training, with the run's checkpoints left behind), or a plan
    for another number of layers (copied into the healed record)."""
    from nsc_prune.hf.model_card import model_card

    try:
        model_card(record, checkpoint.name)  # reads every field the healed card and record read
    except KeyError:  # not extraction's record: the healed card says less (``_card``)
        return
    except (TypeError, AttributeError, ValueError) as err:
        raise InvalidInputError(
            f"{checkpoint / RECORD_NAME} is damaged ({' '.join(str(err).split())}); extract the checkpoint again"
        ) from err
    plans = layer_plans(record["plan"])
    removed = record["options"]["format"] == "pruned"  # padded and nemotron-nas keep a dropped layer's place
    layers = sum(plan.keep for plan in plans) if removed else len(plans)
    if layers != model_config.get("num_hidden_layers"):
        raise InvalidInputError(
            f"{checkpoint / RECORD_NAME} plans {layers} {'kept ' if removed else ''}layers for a model of "
            f"{model_config.get('num_hidden_layers')} (config.json): one of the two was edited or replaced"
        )


def _card(record: dict[str, Any], name: str) -> str:
    from nsc_prune.hf.model_card import model_card

    try:
        card = model_card(record, name)
    except (KeyError, TypeError):  # an input without extraction's record: a model nsc-prune did not cut
        card = _plain_card(record, name)
    return card.rstrip("\n") + "\n\n## Recovery\n\n" + "\n\n".join(_recovery_lines(record)) + "\n"


def _plain_card(record: dict[str, Any], name: str) -> str:
    """The card of a heal of a checkpoint nsc-prune did not cut: a fine-tuned model, loaded as it is."""
    from nsc_prune.hf.model_card import front_matter

    return "\n".join([
        *front_matter(record.get("license"), ["fine-tuned"], base_model=record.get("base_model")),
        "",
        f"# {name}",
        "",
        "A checkpoint fine-tuned by `nsc-prune heal` (not pruned by nsc-prune).",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM",
        f"model = AutoModelForCausalLM.from_pretrained({json.dumps(name)})",
        "```",
    ])  # fmt: skip


def _recovery_lines(record: dict[str, Any]) -> list[str]:
    """What the heal trained on and measured: text, steps, the held-out loss and how it is measured, the teacher,
    the time budget (and a resume), and the heals before it."""
    from nsc_prune.hf.model_card import source_names

    rec = record["recovery"]
    weights = "all weights" if rec["recipe"]["full"] else f"LoRA r={rec['recipe']['lora_rank']}, merged"
    data = rec.get("data") or {}
    files = source_names(data.get("sources"))
    held = f"{data['val_tokens']:,} held-out tokens" if isinstance(data.get("val_tokens"), int) else "held-out tokens"
    lines = [
        f"Healed by `nsc-prune heal` ({rec['loss']}, {weights}) on {rec['tokens']:,} tokens of {files or 'its text'} "
        f"in {rec['steps']} steps: held-out loss {rec['val_loss_before']:.4f} -> {rec['val_loss_after']:.4f} "
        f"(cross-entropy in nats per token, on {held} of the same text, not trained on)."
    ]
    if rec.get("teacher"):
        cached = rec.get("teacher_logits") or {}
        mass = cached.get("top_k_mass")
        lines.append(
            f"Teacher `{Path(rec['teacher']).name}`, held-out loss {rec.get('val_loss_teacher', float('nan')):.4f}"
            + (f"; its top {cached['top_k']} log-probabilities per token cached" if cached.get("top_k") else "")
            + (f" ({mass:.0%} of its probability mass)" if isinstance(mass, float) else "")
            + "."
        )
    timed = rec.get("time_budget")
    if timed:
        lines.append(
            f"Time budget: {timed['minutes_asked']:g} minute{'' if timed['minutes_asked'] == 1 else 's'} asked, "
            f"{timed['minutes_used']:g} used; "
            f"{timed['probe_passes']} probe passes ({timed['step_seconds_measured']:.3g} s a step) sized the run to "
            f"{timed['probe_max_steps']} steps with {timed['warmup_steps']} warm-up steps{_resized(timed)}."
        )
    if rec.get("resumed_from_step"):
        lines.append(f"Resumed at step {rec['resumed_from_step']}: times and tokens/s are those after the resume.")
    earlier = [s["recovery"] for s in record.get("history", []) if s.get("step") == "heal" and "recovery" in s]
    if earlier:
        runs = "; ".join(
            f"{r['tokens']:,} tokens, held-out loss {r['val_loss_before']:.4f} -> {r['val_loss_after']:.4f}"
            for r in earlier
        )
        lines.append(f"Healed before this run ({runs}; `history` in {RECORD_NAME}).")
    return lines


def _resized(timed: dict[str, Any]) -> str:
    """How the run's own steps re-sized it (a time budget's record), or "" when they did not."""
    if timed.get("run_step_seconds") is None:
        return ""
    return (
        f"; its own steps took {timed['run_step_seconds']:.3g} s each ({timed['tokens_per_s_measured']:,.0f} "
        f"tokens/s), re-sizing it to {timed['max_steps']} steps"
    )


def write_weights(model: Any, checkpoint: Path, folder: Path) -> None:
    """Write ``model``'s weights into ``folder`` as extraction does (``write_sharded``: shards plus index, at
    extraction's default shard size), holding exactly the tensors of ``checkpoint`` (less a rotary buffer an old
    base stores), in its order."""
    from nsc_prune.hf.cut.request import MAX_SHARD_SIZE

    state, stored = model.state_dict(), stored_dtypes(checkpoint)
    names = [name for name in stored if not is_rotary_buffer(name)]
    missing = [name for name in names if name not in state]
    if missing:
        raise NSCError(f"the trained model has no tensor {missing[0]} of {checkpoint} ({len(missing)} missing)")
    specs = [TensorSpec(name, DTYPE_NAMES[stored[name]], tuple(state[name].shape)) for name in names]
    # each in the dtype it was stored in, cast one at a time: a list of them all held half a float32 model more
    write_sharded(folder, specs, (state[name].detach().to("cpu", stored[name]) for name in names), MAX_SHARD_SIZE)


def _held_out_loss(model: Any, blocks: TextBlocks, config: TrainConfig, name: str) -> float:
    """``model``'s loss on the held-out blocks before any training (``untrained_loss``)."""
    return untrained_loss(model, blocks.val, config.batch_size, name, trainer_ranks())


def _check_healed(model: Any, before: float, after: float, block: Any, config: TrainConfig, work: Path | None) -> None:
    """InvalidInputError when the trained, merged and rounded ``model`` diverged where training could not see it:
    weights past the output dtype's range (float16's 65504) or the merge's, or hidden states that overflowed inside
    RMSNorm after the last logged step (every logit of the held-out ``block`` [1, seq_len] equal: a loss of
    ln(vocabulary) whatever the loss before). ``work``: the run's folder when its checkpoints are kept (a --resume
    would only write the same weights)."""
    from nsc_prune.hf.train.callbacks import tensors_finite

    why = None
    if not (math.isfinite(after) and tensors_finite(model.parameters())):
        why = "its merged weights overflow the output's dtype"
    else:
        with torch.inference_mode():
            logits = model(block.to(next(model.parameters()).device)).logits
        if bool((logits.amax(-1) == logits.amin(-1)).all()):
            why = "it predicts every token alike (its hidden states overflowed)"
    if why is None:
        return
    raise InvalidInputError(
        f"training diverged: {why} (held-out loss {before:.4f} -> {after:.4f}; learning rate "
        f"{config.learning_rate:g}); lower --learning-rate"
        + (f", and remove {work} (the run's checkpoints) first or pass another --work-dir" if work else "")
    )


def _as_written(model: Any, zeros: dict[str, Any], checkpoint: Path) -> Any:
    """The trained ``model`` as it will be written: its adapter merged, the units the input held as zeros zero
    again, each weight rounded to the dtype ``checkpoint`` stores it in (so the loss after is the output's own)."""
    merged = _plain(model).eval()
    restore_zero_columns_(merged, zeros)
    stored = stored_dtypes(checkpoint)
    with torch.no_grad():  # parameters only: RoPE's frequencies (a buffer) are recomputed on loading, never written
        for name, parameter in merged.named_parameters():
            parameter.copy_(parameter.to(stored.get(name, parameter.dtype)))  # (a tied head is not stored)
    return merged


def stored_dtypes(checkpoint: Path) -> dict[str, Any]:
    """The torch dtype of each tensor ``checkpoint`` stores: a healed checkpoint is written in them (config.json's
    ``dtype`` may be absent or wrong, and a checkpoint may keep float32 norms beside bfloat16 matrices)."""
    return {name: DTYPES[info.dtype] for name, info in index_model_dir(checkpoint).items()}


def earlier_steps(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The steps that made a checkpoint before the heal that writes ``record`` again, oldest first: its extraction's
    provenance, then each earlier heal's provenance, ``recovery`` and ``healed_from`` (a heal replaces them)."""
    history = [step for step in record.get("history", []) if isinstance(step, dict)]
    if "recovery" in record:
        step = {key: record[key] for key in ("provenance", "recovery", "healed_from") if key in record}
        return [*history, {"step": "heal", **step}]
    return [*history, {"step": "extract", "provenance": record.get("provenance")}]


def write_healed(
    model: Any, checkpoint: Path, out: Path, model_config: dict[str, Any], recovery: dict[str, Any], overwrite: bool
) -> Path:
    """Write ``model`` (merged, same shapes as ``checkpoint``) as a pruned checkpoint with the input's config,
    modeling file, tokenizer and record plus ``recovery``; atomically, from rank 0 only."""
    from nsc_prune.hf.model_card import base_license, base_model_id, copy_side_files

    if launcher_rank() != 0:
        return out
    old = checkpoint_record(checkpoint)
    if not old:
        warn(f"{checkpoint} has no {RECORD_NAME}: the healed checkpoint's record has no plan")
    record = {
        **old,
        **_merged_adapter(old),
        **({"history": earlier_steps(old)} if old else {}),
        **({"license": licence} if (licence := old.get("license") or base_license(checkpoint)) else {}),
        **({"base_model": base} if (base := base_model_id(checkpoint)) else {}),
        "recovery": recovery,
        "healed_from": {
            "path": str(checkpoint.resolve()),
            "sha256": {CONFIG_NAME: sha256_file(checkpoint / CONFIG_NAME)},
            "weights": weights_fingerprint(checkpoint),
        },
        "provenance": provenance(
            **{
                k: v
                for k, v in (old["provenance"] if isinstance(old.get("provenance"), dict) else {}).items()
                if k not in ("nsc_prune_version", "command", "time_utc", "python")
            }
        ),
    }
    with atomic_dir(out, overwrite, lambda found: check_output(found, (), True), checked=True) as tmp:
        write_weights(model, checkpoint, tmp)
        # the input's config (same architecture), with the rope keys transformers 4.x reads, as extract writes them
        stored = index_model_dir(checkpoint)
        config = with_stored_dtype(model_config, stored)  # the key said what the tensors are
        config = {**config, **legacy_rope_keys(config), **tie_as_loaded(config, stored)}
        atomic_write_text(tmp / CONFIG_NAME, to_json(config))
        for shipped in (MODELING_FILE, *DECILM_FILES):  # this version's, as extract writes them (auto_map's code)
            if (checkpoint / shipped.name).is_file():
                shutil.copyfile(shipped, tmp / shipped.name)
        copy_side_files(checkpoint, tmp, model_config)
        atomic_write_text(tmp / "README.md", _card(record, out.name))
        # last, with what the folder holds (not the extraction's list): --overwrite checks it
        atomic_write_text(tmp / RECORD_NAME, to_json({**record, WRITTEN_FILES_KEY: written_files(tmp, RECORD_NAME)}))
    return out


__getattr__ = forward_moved(
    __name__, {"HealInterrupted": "nsc_prune.errors:StoppedRun"}
)  # train-supernet raises it too
