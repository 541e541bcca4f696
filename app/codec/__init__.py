"""The public grid and the histogram wire format: pure functions over numpy, no I/O."""
