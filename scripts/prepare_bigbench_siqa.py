"""Convert BIG-bench's copy of Social IQa (one of the eight tasks) into an lm-eval task in the cache.

The ``bigbench==1.0.0`` sdist on PyPI carries ``bigbench/benchmark_tasks/social_iqa/task.json``: the
1,954 SIQA validation questions. This script reads that one member out of the sdist (the package is
never installed), writes it in the ``lighteval/siqa`` record format that lm-eval's ``social_iqa`` task
reads, and renders a task YAML with the same prompt, all under the nsc-prune cache (never the repo):

    python -m pip download --no-deps bigbench==1.0.0 -d /tmp/bb        # 358 MB; pip < 26, see below
    python scripts/prepare_bigbench_siqa.py --sdist /tmp/bb/bigbench-1.0.0.tar.gz
    nsc-prune eval CKPT --tasks ~/.cache/nsc-prune/bigbench-siqa        # the folder it prints

pip 26 refuses to prepare this sdist's metadata (it declares a direct-URL dependency); download it
with an older pip, e.g. ``python -m venv /tmp/p && /tmp/p/bin/pip install 'pip<26'`` and use
``/tmp/p/bin/pip download ...``. Without ``--sdist`` the script tries ``pip download`` itself.
BIG-bench keeps answer order; the 4 two-choice items are dropped (SIQA's format has three answers).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

from nsc_prune._files import cache_dir
from nsc_prune._io import atomic_dir, atomic_write_text, check_output, provenance, sha256_file, to_json
from nsc_prune.cli.scripts import run_script
from nsc_prune.errors import InvalidInputError, NSCError

SDIST = "bigbench-1.0.0.tar.gz"
MEMBER = "bigbench-1.0.0/bigbench/benchmark_tasks/social_iqa/task.json"
TASK = "social_iqa_bigbench"
OUT_NAME = "bigbench-siqa"
# lm-eval's siqa.yaml prompt and targets, on a local JSONL file.
YAML = """\
# Social IQa validation questions from the bigbench==1.0.0 sdist (BIG-bench task social_iqa),
# converted by nsc-prune's scripts/prepare_bigbench_siqa.py. Same prompt as lm-eval's social_iqa.
task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    validation: "{data}"
output_type: multiple_choice
validation_split: validation
doc_to_text: "Q: {{{{context}}}} {{{{question}}}}\\nA:"
target_delimiter: " "
doc_to_choice: "{{{{[answerA, answerB, answerC]}}}}"
doc_to_target: "{{{{ (label|int) - 1 }}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""
_QUESTION = re.compile(r"^(?P<context>.*?[.!?\"')])\s+(?P<question>[^.!?]*\?)$", re.DOTALL)


def read_task(sdist: Path) -> dict:
    """The social_iqa task.json, streamed out of the sdist without unpacking the rest."""
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            for member in tar:
                if member.name == MEMBER:
                    handle = tar.extractfile(member)
                    if handle is None:
                        raise InvalidInputError(
                            f"{sdist}: {MEMBER} is not a regular file; expected the bigbench 1.0.0 sdist"
                        )
                    return json.load(handle)
    except (OSError, tarfile.TarError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InvalidInputError(
            f"cannot read {MEMBER} from {sdist} ({err}); expected the bigbench 1.0.0 sdist, {SDIST}"
        ) from err
    raise InvalidInputError(f"{sdist} has no {MEMBER}; expected the bigbench 1.0.0 sdist, {SDIST}")


def convert(example: dict) -> dict | None:
    """BIG-bench {input, target_scores} -> lighteval/siqa {context, question, answerA-C, label '1'-'3'};
    ``None`` for an item that is not three-way with one gold answer."""
    if not (
        isinstance(example, dict)
        and isinstance(example.get("input"), str)
        and isinstance(example.get("target_scores"), dict)
    ):
        raise InvalidInputError(
            "a BIG-bench example must be an object with 'input' (text) and 'target_scores' (answer -> score); "
            f"got {example!r}"
        )
    answers = list(example["target_scores"])
    if len(answers) != 3:
        return None
    text = example["input"].strip()
    match = _QUESTION.match(text)
    context, question = (match["context"], match["question"]) if match else (text, "")
    if not question:  # keep the rendered prompt "Q: <input>\nA:" exact
        context, question = text.rsplit(" ", 1) if " " in text else ("", text)
    gold = [i for i, a in enumerate(answers) if example["target_scores"][a] == 1]
    if len(gold) != 1:
        return None
    return {
        "context": context,
        "question": question,
        "answerA": answers[0],
        "answerB": answers[1],
        "answerC": answers[2],
        "label": str(gold[0] + 1),
    }


def convert_task(task: dict) -> list[dict]:
    """Every convertible example of a BIG-bench task.json; a malformed one is named by its index."""
    examples = task.get("examples") if isinstance(task, dict) else None
    if not isinstance(examples, list):
        raise InvalidInputError("task.json must be an object with an 'examples' list")
    rows = []
    for i, example in enumerate(examples):
        try:
            row = convert(example)
        except InvalidInputError as err:
            raise InvalidInputError(f"example #{i}: {err}") from err
        if row is not None:
            rows.append(row)
    return rows


def download(dest: Path) -> Path:
    """``pip download --no-deps bigbench==1.0.0`` into ``dest`` (fails under pip >= 26, see the module doc)."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "bigbench==1.0.0", "-d", str(dest)]
    if subprocess.run(cmd, check=False).returncode != 0 or not (dest / SDIST).is_file():
        raise NSCError(
            "pip download failed (its reason is above); offline, or with pip >= 26, download the sdist elsewhere "
            "(see --help) and pass --sdist"
        )
    return dest / SDIST


def prepare(sdist: Path | None, cache: Path, overwrite: bool = False) -> int:
    """Convert the sdist's social_iqa task into ``cache / OUT_NAME`` (downloading the sdist when ``None``)."""
    out = cache / OUT_NAME
    # before a 358 MB download; a conversion holds source.json
    check_output(out, [sdist], overwrite, marker="source.json", owner="a conversion of this script", flag="--cache")
    sdist = sdist or download(cache / "downloads")
    task = read_task(sdist)
    rows = convert_task(task)
    with atomic_dir(out, overwrite=overwrite) as tmp:
        data = out / f"{TASK}.jsonl"  # the final path: the YAML must name it absolutely
        atomic_write_text(tmp / data.name, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        atomic_write_text(tmp / f"{TASK}.yaml", YAML.format(task=TASK, data=data.resolve().as_posix()))
        record = provenance(
            sdist=str(sdist),
            sdist_sha256=sha256_file(sdist),
            member=MEMBER,
            canary=task.get("canary"),
            examples=len(task["examples"]),
            kept=len(rows),
            dropped=len(task["examples"]) - len(rows),
        )
        atomic_write_text(tmp / "source.json", to_json(record))
    print(f"wrote {len(rows)} of {len(task['examples'])} questions to {out}; run: nsc-prune eval CKPT --tasks {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sdist", type=Path, help=f"path to {SDIST} (default: pip download it into the cache)")
    parser.add_argument(
        "--cache", type=Path, default=None, help="cache folder (default: $NSC_PRUNE_CACHE or ~/.cache/nsc-prune)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing conversion")
    args = parser.parse_args(argv)
    try:
        return prepare(args.sdist, args.cache or cache_dir(), args.overwrite)
    except NSCError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(run_script(main))
