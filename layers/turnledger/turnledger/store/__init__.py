"""Storage: the conversation store (its contract and the DynamoDB, SQLite and memory
backends), keys, the item codec, indexes and the approval inbox, idempotency records and
side items, offloaded payloads (S3, files) and tenant-scoped clients. It knows nothing of
turn rules: the turn hands it what to write."""
