"""The local runner: the template's functions served on this machine (``turnledger local``),
with embedded storage, and the ``turnledger`` command line (export and import too)."""
