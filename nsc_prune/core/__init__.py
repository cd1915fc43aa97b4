"""The numeric core: psi_MP (``capacity``), configs to matrices and counts (``spec``), the exact DP
(``solver``), budgets (``budget``) and the search over a space (``search``). numpy/scipy only."""
