"""The public API: nsc-prune 0.1's module paths still import (with a DeprecationWarning naming the new home) for
one release (docs/library.md's snippet runs in tests/test_readme.py)."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from nsc_prune import _deprecated


def test_old_module_paths_import_with_a_deprecation_warning():
    code = (
        "import warnings, importlib\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "import nsc_prune\n"  # the new paths import without any warning
        "import nsc_prune.core.front, nsc_prune.plan, nsc_prune.spaces.registry\n"
        "warnings.simplefilter('always', DeprecationWarning)\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    from nsc_prune.space import build_space, search, ParetoResult\n"
        "    from nsc_prune.subnet import LayerPlan, layer_index, select_point\n"
        "    from nsc_prune.families.base import aggregate\n"
        "    from nsc_prune.supernets.lonas import read_adapter_config\n"
        "print(sorted({str(w.message).split()[0] for w in caught if w.category is DeprecationWarning}))\n"
        "print(build_space.__module__, LayerPlan.__module__, layer_index.__module__, aggregate.__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == str(
        sorted(
            [
                "nsc_prune.space",
                "nsc_prune.subnet",
                "nsc_prune.families",
                "nsc_prune.families.base",
                "nsc_prune.supernets",
                "nsc_prune.supernets.lonas",
            ]
        )
    )
    # LayerPlan lives in core (re-exported by nsc_prune.plan)
    assert (
        out[1]
        == "nsc_prune.spaces.registry nsc_prune.core.layer_plan nsc_prune.hf.cut.keep nsc_prune.ranking.families.base"
    )


def test_an_old_path_warns_under_the_default_filters_at_the_importing_line(tmp_path):
    """The warning was charged to 'sys:1' (its stack level walked past the importer, warnings already skips
    importlib's frames), which Python's default filters hide: no user ever saw it."""
    script = tmp_path / "old_user.py"
    script.write_text("import nsc_prune.space\nfrom nsc_prune.hf import keep\n")
    err = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True).stderr
    assert f"{script}:1: DeprecationWarning: nsc_prune.space is deprecated" in err, err
    assert f"{script}:2: DeprecationWarning: nsc_prune.hf.keep is deprecated" in err, err


def test_an_old_path_offers_the_names_its_new_home_forwards():
    """nsc_prune.hf.sensitivity copied its new home's attributes only: the names that home forwards since it was
    split (anchor_cuts, ...) were an ImportError on the old path."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = importlib.import_module("nsc_prune.hf.sensitivity")
        from nsc_prune.hf.score.probes import anchor_cuts

        assert old.anchor_cuts is anchor_cuts
        with pytest.raises(AttributeError, match="module 'nsc_prune.hf.sensitivity' has no attribute 'nothing'"):
            old.nothing  # noqa: B018


def test_the_public_solver_imports_by_its_module_path_without_a_warning():
    code = (
        "import warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "import nsc_prune.solver\n"
        "from nsc_prune import solver\n"
        "import nsc_prune.core.solver as core\n"
        "print(nsc_prune.solver is solver is core)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"


@pytest.mark.parametrize("old", sorted(_deprecated.MOVED))
def test_every_old_path_keeps_its_public_names(old):
    with warnings.catch_warnings():  # the warning itself is checked above
        warnings.simplefilter("ignore", DeprecationWarning)
        module = importlib.import_module(old)
    for new in _deprecated.MOVED[old]:
        public = [name for name in vars(importlib.import_module(new)) if not name.startswith("_")]
        assert all(hasattr(module, name) for name in public), (old, new)


SPLIT_MODULES = {  # a module split by job -> the public names it had, each with its new home (and name)
    "nsc_prune.hf.score.sensitivity": {
        **dict.fromkeys(["MIN_PROBE_TOKENS", "anchor_cuts", "probe_token_count", "scaled_errors"], "probes"),
        **dict.fromkeys(["cut_outputs", "gated_activation", "relative_error_sums"], "block_error"),
        "PROBE_BATCH_TOKENS": "block_error:BATCH_TOKENS",
        **dict.fromkeys(["MEASURE", "MEASURE_KL", "TABLE_FORMAT"], "sensitivity_cache"),
    },
    "nsc_prune.hf.train.trainer": {
        **dict.fromkeys(
            ["SHARDED_LAUNCHES", "agreed_sizing", "check_ranks_agree", "refuse_sharded_launch", "trainer_ranks"],
            "launch",
        ),
        "check_resume": "resume",
        "cpu_has_native_bf16": "precision",
    },
    "nsc_prune.hf.train.supernet": dict.fromkeys(
        ["ELASTIC_KINDS", "Plan", "decoder_of", "subnet_context", "suspended_masks"], "subnets"
    ),
    "nsc_prune.hf.train.recipe": dict.fromkeys(  # the recipe is torch-free: --help reads it
        [
            "TopKTeacher",
            "causal_lm_loss",
            "distill_from_teacher",
            "distill_from_top_k",
            "distillation_loss",
            "teacher_distribution",
            "top_k_teacher",
        ],
        "losses",
    ),
}


@pytest.mark.parametrize(
    ("old", "name"), [(old, name) for old, names in sorted(SPLIT_MODULES.items()) for name in sorted(names)]
)
def test_a_split_modules_old_names_forward_with_a_warning(old, name):
    pytest.importorskip("torch")
    module = importlib.import_module(old)
    home, _, new = SPLIT_MODULES[old][name].partition(":")
    home = f"{old.rsplit('.', 1)[0]}.{home}"
    with pytest.warns(DeprecationWarning, match=rf"{re.escape(old)}.{name} is deprecated.*{re.escape(home)}"):
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(home), new or name)
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        module.nothing  # noqa: B018


def test_heal_s_old_stop_error_name_forwards_to_stopped_run_with_a_warning():
    """``HealInterrupted`` was a bare alias: no warning ever said it would go."""
    pytest.importorskip("torch")
    from nsc_prune.errors import StoppedRun
    from nsc_prune.hf.train import heal

    with pytest.warns(DeprecationWarning, match=r"heal.HealInterrupted is deprecated.*nsc_prune.errors.StoppedRun"):
        assert heal.HealInterrupted is StoppedRun


def test_old_ranking_names_forward_to_metrics():
    from nsc_prune.ranking import metrics

    with pytest.warns(
        DeprecationWarning, match="nsc_prune.ranking.kendall_tau is deprecated.*nsc_prune.ranking.metrics"
    ):
        import nsc_prune.ranking as ranking

        assert ranking.kendall_tau is metrics.kendall_tau


def test_the_old_hf_latency_module_names_forward_with_a_warning():
    """``nsc_prune.hf.latency`` was one module; it is now the package of latency profiling."""
    pytest.importorskip("torch")
    from nsc_prune.hf.latency import profile as entry
    from nsc_prune.hf.latency import transformers_backend

    with pytest.warns(DeprecationWarning, match=r"nsc_prune.hf.latency.profile_latency is deprecated.*profile"):
        from nsc_prune.hf.latency import profile_latency
    assert profile_latency is entry.profile_latency
    with pytest.warns(DeprecationWarning, match="transformers_backend.prefill_seconds"):
        from nsc_prune.hf.latency import prefill_seconds
    assert prefill_seconds is transformers_backend.prefill_seconds
    with pytest.raises(ImportError, match="cannot import name 'nothing'"):
        from nsc_prune.hf.latency import nothing  # noqa: F401


def test_a_star_import_stays_torch_free_and_the_lazy_names_are_listed():
    """``from nsc_prune import *`` imported every lazy name, so torch (and failed on the core install)."""
    code = (
        "import sys; from nsc_prune import *; import nsc_prune; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "assert {'extract_subnet', 'load_pruned', 'evaluate_checkpoints', 'search_plan'} <= set(dir(nsc_prune))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_dir_lists_the_public_names_and_submodules_not_the_package_s_own_imports():
    """``dir(nsc_prune)`` (tab completion) listed ``Any``, ``sys``, ``importlib``, ``annotations`` and ``_LAZY``."""
    import nsc_prune
    import nsc_prune.presets  # noqa: F401

    listed = set(dir(nsc_prune))
    assert {*nsc_prune.__all__, "extract_subnet", "load_pruned", "evaluate_checkpoints", "presets"} <= listed
    assert not {"Any", "sys", "importlib", "annotations", "_LAZY", "_deprecated"} & listed


def test_the_reprs_of_a_search_s_objects_are_one_short_line():
    """A notebook cell ending in a search result printed the whole front: 1.8 MB for LLaMA-7B, 123 MB at 70B."""
    import nsc_prune
    from nsc_prune.ranking.benchmarks import load_benchmark

    found = nsc_prune.search_plan("llama-7b", "5.7B")
    shown = {type(x).__name__: repr(x) for x in (found, found.document, found.result, found.space)}
    huge = nsc_prune.build_space("ffn-heads-depth", {**found.model.config, "num_hidden_layers": 400})
    assert repr(huge) == "SearchSpace('ffn-heads-depth', 1 subspaces, up to 400 layers)"  # its size: OverflowError
    assert shown == {
        "PlanSearch": "PlanSearch(model='llama-7b', space='lonas', budget=5,700,000,000, selected point 66 of 129)",
        "ParetoDocument": "ParetoDocument(model='llama-7b', space='lonas', cost='params', 129 points, selected=66)",
        "ParetoResult": f"ParetoResult(space='lonas', cost='params', 129 points, seconds={found.result.seconds:.3g})",
        "SearchSpace": "SearchSpace('lonas', 1 subspaces, up to 32 layers)",
    }
    bench = load_benchmark(Path(__file__).parents[1] / "evals" / "ranking" / "flexibert_glue_500.json")
    assert repr(bench) == (
        "Benchmark('flexibert_glue_500.json', format='flexibert-glue', family='flexibert', 500 architectures, "
        f"target={bench.target_name!r})"
    )
