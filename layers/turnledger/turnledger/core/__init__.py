"""The vocabulary every layer speaks: the stored state's models, the domain errors,
the settings, the request deadline, logs, metrics and traces. Imports nothing else
of turnledger.
"""
