"""The task-agnostic sharded trainer: mesh and PartitionSpecs, embedding tables and lookups, the train
state, the jitted step (sync or async embedding updates) and the loop. Tasks plug in through
``runner.tasks.Task``; nothing here knows a feature or a metric."""
