"""A run's work directory: its files (`run_files`), how commands read it (`reader`) and write to
the disk (`disk_writes`)."""
