"""Reading and writing files: every file nsc-prune writes goes through here, atomically and with provenance.

``formats`` (strict JSON, YAML, UTF-8 text), ``provenance`` (what produced an output), ``signals`` (stop signals
turned into a clean exit), ``atomic`` (outputs made beside their target and renamed into place under a lock) and
``outputs`` (the one rule for an existing output). Their names are imported from here.
"""

from __future__ import annotations

from nsc_prune._io.atomic import (
    TEMP_NAME_EXTRA,
    atomic_dir,
    atomic_file,
    atomic_files,
    atomic_write_text,
    claimed_work_dir,
    default_dir_mode,
    default_file_mode,
    file_size_limit,
    missing_parents,
    naming_output,
    publish_text,
    recorded_outputs,
    remove_empty,
    safetensors_write_error,
)
from nsc_prune._io.formats import (
    checkpoint_record,
    json_number,
    parse_json,
    parse_yaml,
    read_json_object,
    read_utf8,
    read_yaml,
    sha256_file,
    to_json,
)
from nsc_prune._io.outputs import (
    WRITTEN_FILES_KEY,
    check_cache_path,
    check_not_input,
    check_out_dir,
    check_output,
    check_outside,
    check_work_dir,
    existing_file,
    remove_work_dir,
    written_files,
)
from nsc_prune._io.provenance import (
    command_line,
    context_value,
    provenance,
    recorded_command,
)
from nsc_prune._io.signals import (
    STOP_SIGNALS,
    handling_signals,
    signals_ignored,
    sigterm_exits,
    stop_signal,
)

__all__ = [
    "STOP_SIGNALS",
    "TEMP_NAME_EXTRA",
    "WRITTEN_FILES_KEY",
    "atomic_dir",
    "atomic_file",
    "atomic_files",
    "atomic_write_text",
    "claimed_work_dir",
    "check_cache_path",
    "check_not_input",
    "check_out_dir",
    "check_output",
    "check_outside",
    "check_work_dir",
    "checkpoint_record",
    "command_line",
    "context_value",
    "default_dir_mode",
    "default_file_mode",
    "existing_file",
    "file_size_limit",
    "handling_signals",
    "json_number",
    "missing_parents",
    "naming_output",
    "parse_json",
    "parse_yaml",
    "provenance",
    "publish_text",
    "read_json_object",
    "read_utf8",
    "read_yaml",
    "recorded_command",
    "recorded_outputs",
    "remove_empty",
    "remove_work_dir",
    "safetensors_write_error",
    "sha256_file",
    "signals_ignored",
    "sigterm_exits",
    "stop_signal",
    "to_json",
    "written_files",
]
