"""turnledger: durable, multi-turn conversation state for LLM applications on AWS."""

__version__ = "0.1.0"
