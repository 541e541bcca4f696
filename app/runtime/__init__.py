"""Process orchestration: the ``dpquant`` command, web processes, release workers and their
supervisor."""
