"""Command-line entry points. Each module is a thin `main(argv) -> int`; the library never reads argv."""
