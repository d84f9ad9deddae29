"""The command-line programs (``dynjax.programs.console``: their console commands)."""
