"""Built-in tasks (train.task.BUILTIN_TASKS)."""
