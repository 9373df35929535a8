"""The turn and its execution: its owner (lifecycle: every status and move), the
service behind every route (pipeline) with its domain commands and results, the
session that commits, tool-call steps, drafts and long turns, the inbox, callbacks.
Imports the layers below it, never ops, the composition root or api.
"""
