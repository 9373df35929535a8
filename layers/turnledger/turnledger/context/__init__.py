"""The working context: what the model sees next, assembled from the log to a token
budget (summaries, compaction) and redacted. Imports core, store and providers only.
"""
