"""Values the DP can take that need weights: psi_W (``psi_w``, weight spectra) and the measured damage of every
layer option (``sensitivity``, ``--score measured``; its walk in ``probes``, the block errors in ``block_error``,
the table files in ``sensitivity_cache``). psi_MP needs none and lives in ``nsc_prune.core.capacity``."""
