"""Benchmarks of turnledger: turn storage cost, cold start (and the sweep); see RESULTS.md."""
