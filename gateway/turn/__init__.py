"""One turn: the runner's loop (prompt, model call, tool rounds), its history cache,
compaction / reset / undo with the memory flush before it, previews while the model streams,
and the outbox that delivers the reply."""
