"""The `lpt` command line: thin click wrappers over the `lpt` library."""
