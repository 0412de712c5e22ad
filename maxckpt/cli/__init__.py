"""The `maxckpt` command line: a thin layer over the library."""
