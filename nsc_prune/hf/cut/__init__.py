"""Choosing and cutting channels: which channels a plan keeps (``selection``: first, magnitude, activation), the
kept index sets of each layer (``keep``), the extraction request (``request``) and the tensor engine that slices
every output tensor out of the base (``jobs``). The entry point over cut and export is ``nsc_prune.hf.extract``."""
