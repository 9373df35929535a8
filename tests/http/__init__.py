"""HTTP tests: the deployed routes through the local runner, over real HTTP on 127.0.0.1."""
