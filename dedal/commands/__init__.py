"""CLI subcommands, one module each, discovered by dedal.cli."""
