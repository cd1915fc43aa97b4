"""Search spaces: one registry (``registry``) and every space kind, each in its own module (``lonas``,
``elastic``, ``nas``), with their YAMLs in ``nsc_prune/configs/spaces``. numpy/scipy only."""

from nsc_prune.spaces.registry import build_space, bundled_spaces, load_space_yaml, register_space_kind

__all__ = ["build_space", "bundled_spaces", "load_space_yaml", "register_space_kind"]
