"""A run's work directory: its files, how it is read, and how commands write to the disk.

- `run_files`: the names of a run's files and directories, its layout, and config.json's text.
- `reader`: `Workdir`, the work directory as every command reads it (and the small results side
  commands write there); `training.run_writer.RunWriter` extends it to train there.
- `pins`: a reader beside a live run reads a checkpoint pinned against the run's retention;
  pins that killed readers left are removed.
- `checksums`: the checksums of a training state's arrays, saved with each checkpoint and checked
  by every read.
- `shape_diff`: how the variables saved in a checkpoint differ from those a model wants.
- `disk_writes`: a write the file system refuses as one line naming the path, why and what it
  needs (`Unwritable`), checked before the work; files written whole or not at all.
"""
