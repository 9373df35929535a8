"""turnledger: durable, multi-turn conversation state for LLM applications on AWS.

Its folders are layers, and a module imports only its own folder and the layers below
it (tests/unit/test_layering.py), lowest first: ``core`` (models, errors, settings,
deadline, observability) and ``entry`` (handlers loaded on the first event); ``store``
and ``providers``; ``tools`` and ``context``; ``turn`` (the turn's owner and the
service); ``ops`` (sweep, transfer, notifications); ``runtime`` (the composition root);
``api`` (the HTTP edge) and ``handlers`` (the sweep function's entry point).
"""

__version__ = "0.1.0"
